"""Messages the router publishes itself, with no client to answer.

- Confirmed dead letters (at-least-once dead-lettering of quorum queues, issue 44 point 4):
  a node's REPUBLISH that carries a ``confirm`` id is routed like a basic.publish with
  publisher confirms, and the node is answered REPUBLISH_RESULT once every queue it was
  routed to confirmed it (on disk where durable; a quorum queue's majority), or not (an
  unknown exchange, no route, a nack). The node keeps the message until then and sends it
  again (node/replication/dead_letters.py), as RabbitMQ's ``rabbit_fifo_dlx_worker`` does.
- Given-back deliveries (:func:`give_back`): a no-ack delivery the router cannot write to
  its client goes back to its queue.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from shoal.shared.errors import AMQPError
from shoal.shared.header_table import text as _text
from shoal.shared.wire import T

from shoal.router.amqp.fastpath import parse_properties
from shoal.router.sender_selected import stored_routes

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


def without_cycles(queues: set[str], header: bytes) -> set[str]:
    """The queues a dead letter is routed to, less those it would cycle back into: a queue
    already in its ``x-death`` history (newest first, the death just added included) with no
    ``rejected`` death from the newest back to that queue's latest one (RabbitMQ's
    ``rabbit_dead_letter:detect_cycles``; such a copy is dropped, logged). A queue that
    dead-letters into itself through its own DLX is so dropped at once, unless rejected."""
    if not queues or b"x-death" not in header:
        return queues
    try:
        deaths = parse_properties(header).headers.get("x-death")
    except (AMQPError, AttributeError):
        return queues
    if not isinstance(deaths, list):
        return queues
    out = set()
    for q in queues:
        for d in deaths:
            if not isinstance(d, dict):
                out.add(q)              # RabbitMQ: an entry that is no table breaks the cycle
                break
            if _text(d.get("reason")) == "rejected":
                out.add(q)
                break
            if _text(d.get("queue")) == q:
                log.info("dropping dead letter for queue '%s': it would cycle back into it "
                         "with no rejection on the way", q)
                break
        else:
            out.add(q)
    return out



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
            routed = broker.topology.route(vhost, exchange, routing_key, None, header,
                                           stored_routes(header))
            queues = without_cycles(routed, header)
            if routed and not queues:   # only cycles: dropped (rabbit_fifo_dlx_worker)
                ok = True
            elif queues:
                done: asyncio.Future = asyncio.get_running_loop().create_future()
                broker.publish(DeadLetterChannel(vhost), 0,
                               DeadLetter(exchange, routing_key, header, body), queues, done)
                p = await done
                ok = not p.failed and p.routed > 0
    except Exception:  # noqa: BLE001 - the node keeps the message and sends it again
        log.exception("cannot publish a confirmed dead letter")
    if link.up:
        link.send([int(T.REPUBLISH_RESULT), confirm, ok])


def give_back(broker: Any, c: Any, exchange: str, routing_key: str, header: bytes,
              body: bytes) -> None:
    """A no-ack (pre-settled) delivery to consumer ``c`` (router/consumers.py) that never
    reached its client goes back to its queue (``c.queue``), at its tail, as a publish with
    its exchange, routing key and content. That is one the router cannot write: its link
    detached, or its session, channel or connection closed, while it was on its way from
    the node; or it came past an AMQP 1.0 link's lowered credit and the link ended. Its
    node let it go when it sent it, so a requeue there would find nothing: without this it
    would be lost though the client never had it. A stream's delivery stays where it is,
    in the stream's log."""
    if not c.stream:
        broker.publish(DeadLetterChannel(c.target.vhost), 0,
                       DeadLetter(exchange, routing_key, header, body), {c.queue},
                       count=False)
