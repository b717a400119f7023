"""The channel methods of the exchange and queue classes (AMQP 0-9-1 spec 1.6 and 1.7):
declare, delete, bind, unbind, purge.

Each is a request to the node that owns the exchange or queue, which stores it (design.md
section 1, "Topology lives on the nodes too"); the routers' caches follow the owning node's
change feed. They are the ``on_<class>_<method>`` handlers of router/frontend/channel.py's ``Channel``
for those classes, run as tasks in the channel's order, and raise AMQPError.
"""
from __future__ import annotations

import asyncio
import secrets
from typing import Any, Protocol

from pamqp import commands as C

from shoal.shared import wire
from shoal.shared.errors import (ACCESS_REFUSED, NOT_FOUND, PRECONDITION_FAILED, AMQPError,
                                 soft_error)
from shoal.shared.selector import check_arguments as check_selector
from shoal.shared.topology import (BUILTIN_EXCHANGES, EXCHANGE_TYPES, LOCAL_RANDOM,
                                   check_local_random_binding)
from shoal.shared.wire import T

from shoal.router import quorum
from shoal.router.access.users import CONFIGURE, READ, WRITE
from shoal.router.amqp.methods import QueueDeclareOk
from shoal.router.broker import Broker
from shoal.router.links.node_link import NodeDown
from shoal.router.routing import check_x_match
from shoal.router.session import ChannelClient


class TopologyChannel(Protocol):
    """What these handlers use of a channel (router/frontend/channel.py's ``Channel``)."""

    broker: Broker
    vhost: str
    last_queue: str   #: the queue an empty queue name means (queue_name)
    deleting: dict[str, list[Any]]    #: see on_queue_delete

    @property
    def client(self) -> ChannelClient: ...

    def send(self, method: Any) -> None: ...

    def check_access(self, perm: str, kind: str, name: str) -> None: ...


# ---- exchanges -------------------------------------------------------------------------------
async def on_exchange_declare(ch: TopologyChannel, m: C.Exchange.Declare) -> None:
    """exchange.declare (spec 1.6.2.1). Raises 406 (an unknown type: RabbitMQ 4's answer,
    rabbit_exchange ``check_type``; 3.10 closed the connection with 503), 403 (the default
    exchange, an ``amq.`` name, no configure permission on the exchange; with an
    ``alternate-exchange``, no read on the exchange or write on the alternate), 406/404 from
    the owning node (RabbitMQ's order of checks, rabbit_channel)."""
    b = ch.broker
    strip_cr_lf(m, "exchange")
    name, type_ = m.exchange, m.exchange_type
    if name in BUILTIN_EXCHANGES:
        if name == "" or not (m.passive or type_ == BUILTIN_EXCHANGES[name]):
            raise soft_error(ACCESS_REFUSED, "operation not permitted on exchange "
                                             f"'{name}' in vhost '{ch.vhost}'"
                             if name == "" else
                             f"exchange name '{name}' contains reserved prefix 'amq.*'")
        if not m.passive:
            ch.check_access(CONFIGURE, "exchange", name)
    elif not m.passive:
        if type_ not in EXCHANGE_TYPES:
            raise soft_error(PRECONDITION_FAILED, f"unknown exchange type '{type_}'")
        ch.check_access(CONFIGURE, "exchange", name)
        check_name("exchange", name)
        alternate = (m.arguments or {}).get("alternate-exchange")
        if isinstance(alternate, str):
            ch.check_access(READ, "exchange", name)
            ch.check_access(WRITE, "exchange", alternate)
        await _declare_exchange(b, ch.vhost, m, [T.EXCHANGE_DECLARE, ch.vhost, name, type_,
                                                 False, m.durable, m.auto_delete, m.internal,
                                                 m.arguments or {}])
    else:
        await _declare_exchange(b, ch.vhost, m, [T.EXCHANGE_DECLARE, ch.vhost, name, type_,
                                                 True, False, False, False, {}])
    if not m.nowait:
        ch.send(C.Exchange.DeclareOk())


async def _declare_exchange(b: Broker, vhost: str, m: C.Exchange.Declare, msg: list) -> None:
    """Ask the exchange's node. When that node is unreachable, an exchange this router knows
    (from it, or from a peer's catalogue: router/node_events.py) is still declared-ok for a
    passive declare or an equivalent redeclare, as RabbitMQ's exchanges live on every node
    (issue 36); anything else raises its NodeDown (404)."""
    try:
        await b.exchange_link(vhost, m.exchange).request(msg)
    except NodeDown:
        ex = b.topology.get(vhost, m.exchange)
        if ex is None or not m.passive and (ex.type, ex.durable, ex.auto_delete, ex.internal,
                                             ex.arguments) != (
                m.exchange_type, m.durable, m.auto_delete, m.internal, m.arguments or {}):
            raise


async def on_exchange_delete(ch: TopologyChannel, m: C.Exchange.Delete) -> None:
    """exchange.delete (spec 1.6.2.3). Raises 403 (a built-in exchange, no configure
    permission), 406 (if-unused and bound) from the owning node."""
    strip_cr_lf(m, "exchange")
    if m.exchange in BUILTIN_EXCHANGES:
        raise soft_error(ACCESS_REFUSED, f"operation not permitted on exchange "
                                         f"'{m.exchange}' in vhost '{ch.vhost}'")
    ch.check_access(CONFIGURE, "exchange", m.exchange)
    await ch.broker.exchange_link(ch.vhost, m.exchange).request(
        [T.EXCHANGE_DELETE, ch.vhost, m.exchange, m.if_unused])
    if not m.nowait:
        ch.send(C.Exchange.DeleteOk())


async def on_exchange_bind(ch: TopologyChannel, m: C.Exchange.Bind) -> None:
    strip_cr_lf(m, "source", "destination")
    await _bind(ch, T.BIND, m.source, wire.DEST_EXCHANGE, m.destination, m.routing_key,
                m.arguments)
    if not m.nowait:
        ch.send(C.Exchange.BindOk())


async def on_exchange_unbind(ch: TopologyChannel, m: C.Exchange.Unbind) -> None:
    strip_cr_lf(m, "source", "destination")
    await _bind(ch, T.UNBIND, m.source, wire.DEST_EXCHANGE, m.destination, m.routing_key,
                m.arguments)
    if not m.nowait:
        ch.send(C.Exchange.UnbindOk())


async def _bind(ch: TopologyChannel, tag: int, exchange: str, kind: str, dest: str, key: str,
                arguments: dict | None) -> None:
    """BIND / UNBIND. Raises 403 (no write permission on the destination, the default
    exchange, no read permission on the source, or no topic read permission on the binding
    key; in that order, as RabbitMQ's binding_action), 404 (a missing exchange or queue, on
    bind only: unbinding what does not exist is unbind-ok, as RabbitMQ 3.10 answers), 405
    (another connection's exclusive queue), 406 (a bad selector or x-match; a local-random
    exchange's binding with a key, to an exchange or to a replicated queue)."""
    b = ch.broker
    ch.check_access(WRITE, "queue" if kind == wire.DEST_QUEUE else "exchange", dest)
    if exchange == "" or (kind == wire.DEST_EXCHANGE and dest == ""):
        raise soft_error(ACCESS_REFUSED, "operation not permitted on the default exchange")
    ch.check_access(READ, "exchange", exchange)
    source = b.topology.get(ch.vhost, exchange)
    acc = ch.client.access
    if source is not None and source.type == "topic" and acc is not None and acc.topics:
        acc.check_topic(READ, exchange, key)
    for name in (exchange, dest) if kind == wire.DEST_EXCHANGE else (exchange,):
        if b.topology.get(ch.vhost, name) is None:
            if tag == T.UNBIND:
                return
            raise soft_error(NOT_FOUND, f"no exchange '{name}' in vhost '{ch.vhost}'")
    if kind == wire.DEST_QUEUE:
        # The queue must exist and be ours to use (404 / 405), asked of its node.
        try:
            await b.queue_request(ch.vhost, dest,
                [T.QUEUE_DECLARE, ch.vhost, dest, True, False, False, False, {},
                 ch.client.owner])
        except AMQPError as err:
            if tag == T.UNBIND and err.reply_code == NOT_FOUND:
                return
            raise
    if tag == T.BIND:
        check_selector(arguments)   # 406 naming the error position (x-filter-jms-selector)
        source_type = b.topology.get(ch.vhost, exchange).type
        if source_type == "headers":
            check_x_match(arguments)
        elif source_type == LOCAL_RANDOM:
            check_local_random_binding(kind, key, quorum.queue_type(b, ch.vhost, dest)
                                       if kind == wire.DEST_QUEUE else "classic")
    await b.exchange_link(ch.vhost, exchange).request(
        [tag, ch.vhost, exchange, kind, dest, key, arguments or {}])


# ---- names -----------------------------------------------------------------------------------
def strip_cr_lf(m: Any, *fields: str) -> None:
    """RabbitMQ's ``strip_cr_lf`` (rabbit_channel): CR and LF are taken out of the names a
    declare, delete, bind or unbind gives (queue.purge, basic.publish and basic.consume keep
    theirs), before anything reads them, so ``"que\nue"`` declares ``queue`` and declare-ok
    names it so."""
    for f in fields:
        v = getattr(m, f)
        if "\n" in v or "\r" in v:
            setattr(m, f, v.replace("\n", "").replace("\r", ""))


def check_name(kind: str, name: str) -> None:
    """The broker's rule for a new exchange or queue name (RabbitMQ's ``check_name``): any
    UTF-8 string of at most 255 octets (the shortstr limit, so the frame reader already holds
    it), except the reserved prefix ``amq.``: 403 ACCESS_REFUSED (soft), worded as RabbitMQ.
    The 0-9-1 spec's narrower name patterns are not applied, as RabbitMQ does not."""
    if name.startswith("amq."):
        raise soft_error(ACCESS_REFUSED,
                         f"{kind} name '{name}' contains reserved prefix 'amq.*'")


# ---- queues ----------------------------------------------------------------------------------
def queue_name(ch: TopologyChannel, name: str) -> str:
    """The queue a method names: ``name``, or if it is empty the queue last declared on the
    channel (spec 1.7.2). Raises 404 when there is none."""
    if name == "":
        if not ch.last_queue:
            raise soft_error(NOT_FOUND, "no previously declared queue")
        return ch.last_queue
    return name


async def on_queue_declare(ch: TopologyChannel, m: C.Queue.Declare) -> None:
    strip_cr_lf(m, "queue")
    name = m.queue
    if name == "":
        if m.passive:
            raise soft_error(NOT_FOUND, "no previously declared queue")
        name = "amq.gen-" + secrets.token_urlsafe(16)
    elif not m.passive:
        check_name("queue", name)
    if not m.passive:
        ch.check_access(CONFIGURE, "queue", name)
        dlx = (m.arguments or {}).get("x-dead-letter-exchange")
        if isinstance(dlx, str):    # RabbitMQ checks these for a new queue only
            ch.check_access(READ, "queue", name)
            ch.check_access(WRITE, "exchange", dlx)
        cap = ch.broker.limits.max_queues(ch.vhost)
        if cap is not None:
            await _check_queue_limit(ch, name, cap)
    ask = ch.broker.queue_request if m.passive else ch.broker.declare_request
    payload = await ask(ch.vhost, name,
        [T.QUEUE_DECLARE, ch.vhost, name, m.passive, m.durable, m.exclusive,
         m.auto_delete, m.arguments or {}, ch.client.owner])
    ch.last_queue = name
    if m.exclusive:
        ch.client.exclusive_queues.add(name)
    if not m.nowait:
        ch.send(QueueDeclareOk(payload[0], payload[1], payload[2]))


async def _check_queue_limit(ch: TopologyChannel, name: str, cap: int) -> None:
    """The vhost's ``max-queues`` for a queue that does not exist yet: 406 PRECONDITION_FAILED
    (soft) with RabbitMQ's text when the vhost holds ``cap`` queues (counted on every node;
    two routers declaring at once may both pass, as two RabbitMQ nodes may)."""
    b = ch.broker
    try:
        await b.queue_request(ch.vhost, name,
            [T.QUEUE_DECLARE, ch.vhost, name, True, False, False, False, {}, ch.client.owner])
        return                      # it exists: a redeclare is not a new queue
    except AMQPError as err:
        if err.reply_code != NOT_FOUND:
            raise
    counts = await asyncio.gather(*(link.request([T.QUEUE_LIST, ch.vhost])
                                    for link in b.links.values() if link.up))
    if sum(len(c) for c in counts) >= cap:
        raise soft_error(PRECONDITION_FAILED, f"cannot declare queue '{name}': queue limit "
                                              f"in vhost '{ch.vhost}' ({cap}) is reached")


async def on_queue_bind(ch: TopologyChannel, m: C.Queue.Bind) -> None:
    strip_cr_lf(m, "queue", "exchange")
    await _bind(ch, T.BIND, m.exchange, wire.DEST_QUEUE, *_bound_queue(ch, m),
                m.arguments)
    if not m.nowait:
        ch.send(C.Queue.BindOk())


async def on_queue_unbind(ch: TopologyChannel, m: C.Queue.Unbind) -> None:
    strip_cr_lf(m, "queue", "exchange")
    await _bind(ch, T.UNBIND, m.exchange, wire.DEST_QUEUE, *_bound_queue(ch, m),
                m.arguments)
    ch.send(C.Queue.UnbindOk())


def _bound_queue(ch: TopologyChannel, m: Any) -> tuple[str, str]:
    """``(queue, routing key)`` of a queue.bind or unbind: no queue name is the channel's
    last declared queue, and then no routing key is that queue's name too (spec 1.7.2.3
    "routing-key"; RabbitMQ's ``expand_queue_name_shortcut``)."""
    queue = queue_name(ch, m.queue)
    return queue, (queue if m.queue == "" and m.routing_key == "" else m.routing_key)


async def on_queue_purge(ch: TopologyChannel, m: C.Queue.Purge) -> None:
    name = queue_name(ch, m.queue)
    ch.check_access(READ, "queue", name)
    payload = await ch.broker.queue_request(ch.vhost, name,
        [T.QUEUE_PURGE, ch.vhost, name, ch.client.owner])
    if not m.nowait:
        ch.send(C.Queue.PurgeOk(payload[0]))


async def on_queue_delete(ch: TopologyChannel, m: C.Queue.Delete) -> None:
    """queue.delete (spec 1.7.2.9). Raises 403 (no configure permission), 404, 405, 406
    (if-unused, if-empty) from the queue's node. The basic.cancel of this channel's own
    consumers of the queue follow its delete-ok, as RabbitMQ sends them (the queue's node
    cancels them before it answers; they are held in ``ch.deleting`` meanwhile); amqplib's
    tests close the connection on the cancel, before a delete-ok that came second."""
    strip_cr_lf(m, "queue")
    name = queue_name(ch, m.queue)
    ch.check_access(CONFIGURE, "queue", name)
    held = ch.deleting.setdefault(name, [])
    try:
        payload = await ch.broker.queue_request(ch.vhost, name,
            [T.QUEUE_DELETE, ch.vhost, name, m.if_unused, m.if_empty, ch.client.owner])
        if not m.nowait:
            ch.send(C.Queue.DeleteOk(payload[0]))
    finally:
        if ch.deleting.get(name) is held:
            del ch.deleting[name]
        for cancel in held:
            ch.send(cancel)
