"""Method ids and the tables the connection dispatches on (spec 0-9-1 section 1, "classes").

A method is named by ``class_id << 16 | method_id`` (pamqp's ``index``), read as one unsigned
32-bit integer from the first four payload octets.
"""
from __future__ import annotations

import struct

from pamqp import commands

from shoal.shared.errors import NOT_IMPLEMENTED, AMQPError, hard_error

from shoal.router.amqp.framing import FRAME_END_BYTE, FRAME_METHOD, pack_frame_header

CONNECTION_CLASS = 10
CONNECTION_START_OK, CONNECTION_TUNE_OK, CONNECTION_OPEN = 0x000A000B, 0x000A001F, 0x000A0028
CONNECTION_CLOSE, CONNECTION_CLOSE_OK = 0x000A0032, 0x000A0033
CONNECTION_UPDATE_SECRET = 0x000A0046
CHANNEL_OPEN, CHANNEL_FLOW, CHANNEL_FLOW_OK = 0x0014000A, 0x00140014, 0x00140015
CHANNEL_CLOSE, CHANNEL_CLOSE_OK = 0x00140028, 0x00140029
BASIC_CANCEL_OK = 0x003C001F

#: Methods a client may send on a channel that reach the broker as MethodReceived (the
#: methods whose chassis is "server"; basic.publish comes as MessagePublished instead).
CLIENT_CHANNEL_METHODS = frozenset(m.index for m in (
    commands.Exchange.Declare, commands.Exchange.Delete, commands.Exchange.Bind,
    commands.Exchange.Unbind, commands.Queue.Declare, commands.Queue.Bind,
    commands.Queue.Purge, commands.Queue.Delete, commands.Queue.Unbind,
    commands.Basic.Qos, commands.Basic.Consume, commands.Basic.Cancel, commands.Basic.Get,
    commands.Basic.Ack, commands.Basic.Reject, commands.Basic.RecoverAsync,
    commands.Basic.Recover, commands.Basic.Nack, commands.Tx.Select, commands.Tx.Commit,
    commands.Tx.Rollback, commands.Confirm.Select))

#: Every class/method pair the spec defines.
KNOWN = frozenset(commands.INDEX_MAPPING)

_CLOSE_ARGS = struct.Struct(">IH")  # class+method id, reply code
_CLASS_METHOD = struct.Struct(">HH")


def name(mid: int) -> str:
    """``"queue.declare"`` for a known id, ``"method 60/99"`` otherwise."""
    cls = commands.INDEX_MAPPING.get(mid)
    return cls.name.lower() if cls is not None else f"method {mid >> 16}/{mid & 0xFFFF}"


def with_ids(err: AMQPError, mid: int) -> AMQPError:
    """Set the error's class/method id (reported in the close) to ``mid``; returns it."""
    err.class_id, err.method_id = mid >> 16, mid & 0xFFFF
    return err


def require_known(mid: int) -> None:
    """Raise 540 NOT_IMPLEMENTED (hard) for a class/method pair the spec does not define."""
    if mid not in KNOWN:
        raise with_ids(hard_error(NOT_IMPLEMENTED, f"unknown method: class {mid >> 16}, "
                                                   f"method {mid & 0xFFFF}"), mid)


def close_frame(channel: int, close_mid: int, reply_code: int, reply_text: str,
                class_id: int, method_id: int) -> bytes:
    """``connection.close`` (channel 0) / ``channel.close`` frame: reply-code, reply-text
    (shortstr, cut to 255 octets), class-id and method-id of the failing method (0, 0 if none)
    (spec 1.4.2.7, 1.5.2.5)."""
    raw = reply_text.encode("utf-8")[:255]
    payload = b"".join((_CLOSE_ARGS.pack(close_mid, reply_code), bytes((len(raw),)), raw,
                        _CLASS_METHOD.pack(class_id, method_id)))
    return pack_frame_header(FRAME_METHOD, channel, len(payload)) + payload + FRAME_END_BYTE


class QueueDeclareOk(commands.Queue.DeclareOk):
    """``queue.declare-ok`` (spec 1.7.2.2) without pamqp's client-side name check.

    pamqp checks a queue name against the 0-9-1 spec's ``queue-name`` pattern
    (``^[a-zA-Z0-9-_.:]*$``), which RabbitMQ never enforced: it accepts any UTF-8 string of at
    most 255 octets (``ünïcode``, ``q#*``). The broker's own rule is checked where the name
    comes in (:func:`shoal.router.frontend.topology_methods.check_name`); here only the shortstr limit.
    Raises ValueError for a name longer than 255 octets (a programming error).
    """

    def validate(self) -> None:
        if len(self.queue.encode("utf-8")) > 255:
            raise ValueError("queue name longer than 255 octets")
