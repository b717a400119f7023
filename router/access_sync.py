"""The router's side of the cluster's users, vhosts and permissions, kept by the first node
(node/access_store.py; wire ACCESS_GET, ACCESS_SET, EV_ACCESS).

At start a router reads the stored document: when there is none it seeds it with what it
loaded (the ``load_definitions`` file or the ``users`` setting); when there is one, that wins
over the ``users`` setting, and a ``load_definitions`` file is merged into it (its entries
replace stored ones of the same name, as RabbitMQ's import at boot does). A change (the
management API) is a compare-and-set on the stored document: every router applies the new
version (:func:`apply`) before the change is answered. Applying it replaces the router's
UserStore and limits, recomputes the permissions of open connections, and closes (320
CONNECTION_FORCED) connections whose user or vhost is gone or whose user lost the vhost.
"""
from __future__ import annotations

import asyncio
import copy
import logging
from typing import Callable

from shoal.shared.definitions import (Definitions, access_document, merge_access,
                                      parse_definitions)
from shoal.shared.errors import AMQPError, CONNECTION_FORCED, ConfigError
from shoal.shared.wire import T

from shoal.router.access.users import UserStore
from shoal.router.broker import Broker
from shoal.router.access.limits import Limits

log = logging.getLogger("shoal.router.access.users")

ASK_TIMEOUT_S = 5.0
RETRIES = 5


def owner_link(broker: Broker):
    """The link to the node that keeps the store (the first node)."""
    return broker.links[broker.node_ids[0]]


async def sync_at_start(broker: Broker) -> None:
    """Read (and seed, or merge ``load_definitions`` into) the stored document: an empty store
    gets what this router loaded; a ``load_definitions`` file is merged into a stored one;
    otherwise the stored one is used as it is. The first node down or slow: logged, the
    router goes on with what it loaded."""
    if broker.settings.load_definitions:
        def edit(current: Definitions) -> Definitions:
            return merge_access(current, broker.definitions)
    else:
        def edit(current: Definitions) -> Definitions:
            return current
    try:
        await change(broker, edit)
    except (asyncio.TimeoutError, AMQPError, ConfigError) as exc:
        log.warning("users and permissions not read from %s (%s): using what this router "
                    "loaded until that node comes", owner_link(broker).node_id, exc)
        broker.on_owner_up = lambda: _read_when_up(broker)


def _read_when_up(broker: Broker) -> None:
    """The first node came after the start's read failed (a whole cluster restarted, the
    router first): read the stored document now, as at start but merging nothing, so that
    users made before the restart log in (they were refused until a change before). Once
    read, later reconnects of that node read nothing."""
    async def read() -> None:
        try:
            await change(broker, lambda current: current)
        except (asyncio.TimeoutError, AMQPError, ConfigError) as exc:
            log.warning("users and permissions not read from %s (%s): asking again when it "
                        "comes back", owner_link(broker).node_id, exc)
            return
        broker.on_owner_up = lambda: None
        log.info("users and permissions read from %s", owner_link(broker).node_id)
    asyncio.ensure_future(read())


async def change(broker: Broker, edit: Callable[[Definitions], Definitions | None]) -> None:
    """Read the stored document (none yet: start from what this router loaded), let ``edit``
    change a copy (it may raise, e.g. the API's 404, or return None for "no change"), and
    store the result by compare-and-set, again from the start if another router changed it
    meanwhile; a result equal to the stored document is only applied here. Raises AMQPError
    (the node's refusal, 406 when it kept changing; NodeDown), asyncio.TimeoutError or
    ConfigError (the result does not check)."""
    link = owner_link(broker)
    for attempt in range(RETRIES):
        version, doc = await asyncio.wait_for(link.request([T.ACCESS_GET]), ASK_TIMEOUT_S)
        current = parse_definitions(copy.deepcopy(doc), "stored access") if doc is not None \
            else copy.deepcopy(broker.definitions)
        new = edit(current)
        new_doc = access_document(new if new is not None else current)
        if new_doc == doc:
            apply(broker, version, doc)
            return
        parse_definitions(copy.deepcopy(new_doc), "the change")     # checks it (ConfigError)
        try:
            await asyncio.wait_for(link.request([T.ACCESS_SET, version, new_doc]),
                                   ASK_TIMEOUT_S)
            return
        except AMQPError as err:
            if "changed meanwhile" not in err.text or attempt == RETRIES - 1:
                raise


def apply(broker: Broker, version: int, doc: dict) -> None:
    """Use version ``version`` of the stored document (EV_ACCESS, or read at start)."""
    if version <= broker.access_version:
        return
    try:
        defs = parse_definitions(doc, f"stored access version {version}")
    except ConfigError as exc:
        log.error("ignoring users and permissions that do not check: %s", exc)
        return
    broker.access_version = version
    old_limits = broker.limits
    broker.users = UserStore(defs, tuple(broker.settings.loopback_users))
    broker.limits = Limits(defs)
    broker.limits.connections_by_user = old_limits.connections_by_user
    broker.limits.connections_by_vhost = old_limits.connections_by_vhost
    broker.definitions.users, broker.definitions.vhosts = defs.users, defs.vhosts
    broker.definitions.permissions = defs.permissions
    broker.definitions.topic_permissions = defs.topic_permissions
    broker.definitions.vhost_limits = defs.vhost_limits
    broker.definitions.default_queue_types = defs.default_queue_types
    for vhost in defs.vhosts:
        broker.topology.add_builtins(vhost)
    for client in list(broker.connections):
        amqp = client.amqp
        if amqp is None or not amqp.user or amqp.is_closed:
            continue
        access = broker.users.vhost_access(amqp.user, client.vhost)
        if amqp.user not in defs.users or client.vhost not in defs.vhosts or access is None:
            why = (f"user '{amqp.user}' was deleted" if amqp.user not in defs.users else
                   f"vhost '{client.vhost}' was deleted" if client.vhost not in defs.vhosts
                   else f"user '{amqp.user}' has no permissions in vhost '{client.vhost}'")
            client.shutdown(CONNECTION_FORCED, f"CONNECTION_FORCED - {why}")
        else:
            client.access = access
