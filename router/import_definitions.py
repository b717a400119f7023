"""The topology of a definitions file (``exchanges``, ``queues``, ``bindings``, in RabbitMQ's
format) declared when a router starts, as RabbitMQ imports ``load_definitions`` at boot.

Each object is declared through its owning node like a client's declare, so a router started
later (or again) finds them there and redeclares the same thing; one that conflicts with what
exists (406, a different type or arguments) or names an unknown vhost is logged and skipped,
and start-up goes on. Returns what it declared and what it skipped, for the log.
"""
from __future__ import annotations

import logging

from shoal.shared import wire
from shoal.shared.definitions import Definitions
from shoal.shared.errors import AMQPError
from shoal.shared.wire import T

from shoal.router.broker import Broker

log = logging.getLogger("shoal.router.definitions")


async def declare_topology(broker: Broker, defs: Definitions) -> tuple[int, int]:
    """Declare ``defs``' exchanges, then queues, then bindings. Returns (declared, skipped)."""
    done = skipped = 0
    requests = []
    for x in defs.exchanges:
        vhost, name = x.get("vhost", "/"), x.get("name", "")
        requests.append((f"exchange '{name}' in vhost '{vhost}'", vhost,
                         broker.exchange_link, name,
                         [T.EXCHANGE_DECLARE, vhost, name, x.get("type", "direct"), False,
                          bool(x.get("durable", True)), bool(x.get("auto_delete", False)),
                          bool(x.get("internal", False)), x.get("arguments") or {}]))
    for q in defs.queues:
        vhost, name = q.get("vhost", "/"), q.get("name", "")
        requests.append((f"queue '{name}' in vhost '{vhost}'", vhost, None, name,
                         [T.QUEUE_DECLARE, vhost, name, False, bool(q.get("durable", True)),
                          False, bool(q.get("auto_delete", False)), q.get("arguments") or {},
                          None]))
    for b in defs.bindings:
        vhost, source = b.get("vhost", "/"), b.get("source", "")
        kind = wire.DEST_EXCHANGE if b.get("destination_type") == "exchange" \
            else wire.DEST_QUEUE
        requests.append((f"binding of '{b.get('destination')}' to '{source}' in vhost "
                         f"'{vhost}'", vhost, broker.exchange_link, source,
                         [T.BIND, vhost, source, kind, b.get("destination", ""),
                          b.get("routing_key", ""), b.get("arguments") or {}]))
    for what, vhost, link_of, name, msg in requests:
        if vhost not in broker.users.vhosts:
            log.warning("definitions: skipped %s: no such vhost", what)
            skipped += 1
            continue
        try:
            if link_of is None:         # a queue: its node, or a quorum queue's leader
                await broker.declare_request(vhost, name, msg)
            else:
                await link_of(vhost, name).request(msg)
            done += 1
        except AMQPError as err:
            log.warning("definitions: skipped %s: %s", what, err.reply_text)
            skipped += 1
    if requests:
        log.info("definitions: declared %d exchanges, queues and bindings (%d skipped)", done,
                 skipped)
    return done, skipped
