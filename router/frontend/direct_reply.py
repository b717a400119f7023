"""Direct reply-to: an RPC requester gets its replies without declaring a queue (RabbitMQ's
``amq.rabbitmq.reply-to``, https://www.rabbitmq.com/docs/direct-reply-to).

RabbitMQ hands a reply straight to the requester's channel. Shoal's routers share nothing
but the nodes, and a responder may be on another router, so a reply goes through a node:
each requesting channel (0-9-1) or link (AMQP 1.0) gets its own queue, exclusive, auto-delete
and not durable, named ``amq.rabbitmq.reply-to.<token>``: it goes when its consumer or its
connection goes, and a reply to a requester that is gone is unroutable, as in RabbitMQ.

- AMQP 0-9-1 (RabbitMQ 3's form): ``basic.consume`` on ``amq.rabbitmq.reply-to`` with
  ``no-ack``; a ``basic.publish`` from that channel with ``reply_to``
  ``amq.rabbitmq.reply-to`` has it replaced by the reply queue's name, to which a responder
  publishes on the default exchange (0-9-1 or AMQP 1.0: ``/queues/NAME``).
- AMQP 1.0 (RabbitMQ 4.2's form): a receiving link with a dynamic source and the capability
  ``rabbitmq:volatile-queue`` gets a reply queue; its source address ``/queues/NAME`` is the
  requester's ``reply-to``.

Errors, with RabbitMQ's texts: 406 PRECONDITION_FAILED "reply consumer cannot acknowledge"
(consuming with acknowledgements), "reply consumer already set" (a second reply consumer
on the channel), "fast reply consumer does not exist" (publishing with the pseudo-queue as
``reply_to`` before consuming from it).
"""
from __future__ import annotations

import secrets
from typing import Any

from pamqp.header import ContentHeader

from shoal.shared.errors import PRECONDITION_FAILED, soft_error
from shoal.shared.wire import T

#: the pseudo-queue's name (0-9-1 consume and ``reply_to``)
PSEUDO_QUEUE = "amq.rabbitmq.reply-to"
#: the prefix of every reply queue's name
PREFIX = PSEUDO_QUEUE + "."
#: the AMQP 1.0 source capability of a direct reply-to receiver (RabbitMQ 4.2)
VOLATILE = "rabbitmq:volatile-queue"
#: the pseudo-queue as a content header's ``reply_to`` shortstr: publishes carrying it are
#: parsed, no other
MARK = bytes((len(PSEUDO_QUEUE),)) + PSEUDO_QUEUE.encode()


async def declare(ch: Any) -> str:
    """A new reply queue for channel ``ch`` (its connection's exclusive queue); its name."""
    name = PREFIX + secrets.token_urlsafe(16)
    await ch.broker.declare_request(ch.vhost, name, [
        T.QUEUE_DECLARE, ch.vhost, name, False, False, True, True, {}, ch.client.owner])
    ch.client.exclusive_queues.add(name)
    return name


def wants_volatile(capabilities: Any) -> bool:
    """Whether an AMQP 1.0 source's capabilities (a symbol or an array of them) ask for a
    direct reply-to queue."""
    if isinstance(capabilities, str):
        return capabilities == VOLATILE
    return isinstance(capabilities, (list, tuple)) and VOLATILE in capabilities


async def consume_queue(ch: Any, no_ack: bool) -> str:
    """The queue a 0-9-1 ``basic.consume`` on the pseudo-queue consumes: the channel's new
    reply queue (``ch.reply_queue``). Raises 406 (see the module docstring)."""
    if not no_ack:
        raise soft_error(PRECONDITION_FAILED, "reply consumer cannot acknowledge")
    if _consuming(ch):
        raise soft_error(PRECONDITION_FAILED, "reply consumer already set")
    ch.reply_queue = await declare(ch)
    return ch.reply_queue


def _consuming(ch: Any) -> bool:
    q = ch.reply_queue
    return q is not None and any(not t.cancelled and t.queues == [q]
                                 for t in ch.pool.targets.values())


def rewrite(ch: Any, ev: Any) -> None:
    """A 0-9-1 publish whose header holds :data:`MARK`: a ``reply_to`` of the pseudo-queue
    becomes the channel's reply queue. Raises 406 when the channel does not consume from
    it."""
    head = ContentHeader()
    head.unmarshal(ev.header)
    props = head.properties
    if props.reply_to != PSEUDO_QUEUE:
        return
    if not _consuming(ch):
        raise soft_error(PRECONDITION_FAILED, "fast reply consumer does not exist")
    props.reply_to = ch.reply_queue
    ev.header = ContentHeader(head.weight, head.body_size, props).marshal()
