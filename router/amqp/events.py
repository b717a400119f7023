"""Events produced by :class:`shoal.router.amqp.connection.AMQPConnection.receive_data`.

The connection object handles everything of connection class 10 (handshake, SASL, tune,
heartbeats, close), channel class 20 lifecycle, frame assembly of published content, and frame
level errors itself. What it cannot decide alone reaches the broker logic as these events.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(slots=True)
class ConnectionOpened:
    """``connection.open`` accepted: the client may now open channels.

    ``client_properties``: the table from ``connection.start-ok`` (``capabilities`` inside).
    """
    vhost: str
    user: str
    client_properties: dict


@dataclass(slots=True)
class ChannelOpened:
    channel: int


@dataclass(slots=True)
class ChannelClosed:
    """The channel is gone (client ``channel.close``, or ``close-ok`` after a server close).

    The broker must release its consumers and unacknowledged deliveries.
    """
    channel: int


@dataclass(slots=True)
class ChannelCloseRequested:
    """The client's ``channel.close`` came behind frames of that channel read with it, which
    the broker has yet to handle: once they are, it answers with
    ``AMQPConnection.answer_client_close`` (so an error of theirs goes out first, as
    RabbitMQ's channel process answers them in order), and the channel is gone when that
    says so (else at the client's close-ok: ChannelClosed). It is the last event of its
    read: what came behind it is parsed by that answer, which returns its events."""
    channel: int


@dataclass(slots=True)
class ConnectionCloseRequested:
    """The client's ``connection.close`` came behind channel frames read with it, which the
    broker has yet to handle: once they are, it answers with
    ``AMQPConnection.answer_connection_close`` (so a channel error of theirs, a publish's 404
    say, goes out before the ``close-ok``, as RabbitMQ's reader answers once its channels
    have), whose events (one ConnectionClosed) follow. Nothing read after it is handled."""
    reply_code: int
    reply_text: str


@dataclass(slots=True)
class MethodReceived:
    """Any other method on an open channel, as a pamqp frame object
    (``pamqp.commands.Queue.Declare``, ``Basic.Ack`` ...). ``basic.publish`` comes as
    :class:`MessagePublished` once its content is complete."""
    channel: int
    method: Any


@dataclass(slots=True)
class AcksReceived:
    """A run of ``basic.ack`` (spec 1.8.3.13) on one open channel, read in one go with
    nothing between them: ``acks`` is ``[(delivery_tag, multiple), ...]`` in arrival order.
    The hot path (design.md section 4); an ack the fast path does not take (a channel not
    yet open, say) comes as :class:`MethodReceived` with a ``pamqp.commands.Basic.Ack``."""
    channel: int
    acks: list


@dataclass(slots=True)
class MessagePublished:
    """A complete ``basic.publish``: method fields, then the content header frame payload
    (``header``: bytes exactly as received: class id, weight, body size, property flags and
    property list) and the body (all body frames joined)."""
    #: basic.publish's class and method ids, for the close an error on it sends (as a pamqp
    #: method's ``index``)
    index: ClassVar[int] = 0x003C0028
    channel: int
    exchange: str
    routing_key: str
    mandatory: bool
    immediate: bool
    header: bytes
    body: bytes


@dataclass(slots=True)
class ConnectionClosed:
    """The connection is over (client close, hard error, missed heartbeats, EOF).

    After this the transport writes what ``data_to_send()`` still returns and closes.
    ``reply_code``/``reply_text`` tell why (200 for a clean client close).
    """
    reply_code: int
    reply_text: str
