"""Confirmed dead letters (at-least-once dead-lettering of quorum queues, issue 44 point 4):
a node's REPUBLISH that carries a ``confirm`` id is routed like a basic.publish with
publisher confirms, and the node is answered REPUBLISH_RESULT once every queue it was routed
to confirmed it (on disk where durable; a quorum queue's majority), or not (an unknown
exchange, no route, a nack). The node keeps the message until then and sends it again
(node/replication/dead_letters.py), as RabbitMQ's ``rabbit_fifo_dlx_worker`` does.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from shoal.shared.wire import T

log = logging.getLogger("shoal.router")


class _NoClient:
    """The connection of the dead-letter channel: there is none to write to."""

    owner = ""

    def flush(self) -> None:
        pass


_NO_CLIENT = _NoClient()


class DeadLetterChannel:
    """What Broker.publish uses of a channel, for a dead letter: its vhost, and nothing to
    confirm or return to (the answer goes to the node through the publish's future)."""

    number = 0
    closed = False
    client = _NO_CLIENT

    def __init__(self, vhost: str) -> None:
        self.vhost = vhost

    def confirmed(self, seq: int, ack: bool) -> None:
        pass

    def returned(self, ev: Any) -> None:
        pass


class DeadLetter:
    """The routed message (what Broker.publish reads of a basic.publish)."""

    __slots__ = ("exchange", "routing_key", "header", "body", "mandatory")

    def __init__(self, exchange: str, routing_key: str, header: bytes, body: bytes) -> None:
        self.exchange, self.routing_key = exchange, routing_key
        self.header, self.body = header, body
        self.mandatory = False


async def republish_confirmed(broker: Any, link: Any, confirm: int, vhost: str,
                              exchange: str, routing_key: str, header: bytes,
                              body: bytes) -> None:
    """Route and publish a confirmed dead letter; answer REPUBLISH_RESULT to ``link``'s
    node. Never raises: a bug answers "not confirmed" (the node sends it again)."""
    ok = False
    try:
        if broker.topology.get(vhost, exchange) is None:
            log.info("dead letter not routed: no exchange '%s' in vhost '%s' (kept by its "
                     "queue and sent again)", exchange, vhost)
        else:
            queues = broker.topology.route(vhost, exchange, routing_key, None, header)
            if queues:
                done: asyncio.Future = asyncio.get_running_loop().create_future()
                broker.publish(DeadLetterChannel(vhost), 0,
                               DeadLetter(exchange, routing_key, header, body), queues, done)
                p = await done
                ok = not p.failed and p.routed > 0
    except Exception:  # noqa: BLE001 - the node keeps the message and sends it again
        log.exception("cannot publish a confirmed dead letter")
    if link.up:
        link.send([int(T.REPUBLISH_RESULT), confirm, ok])
