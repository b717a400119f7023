"""Hand-written codec for the hot frames (design.md section 4, "the hot path").

Inbound: ``basic.publish``, ``basic.ack`` and the content header's ``body_size`` are read with
struct straight from the receive buffer. Outbound: ``basic.deliver``, ``basic.get-ok``,
``basic.return`` and ``basic.ack``/``basic.nack`` are written from byte templates; the content
header and body pass through as the bytes the publisher sent. Everything else uses pamqp.

Inbound parsers take ``(buf, start, end)``: the frame payload is ``buf[start:end]`` (``start``
points at the class id). They raise AMQPError 501 FRAME_ERROR (hard, as RabbitMQ: "cannot decode") on a short or malformed
payload (spec 4.2.6 "Method Payloads"), never IndexError/struct.error.
"""
from __future__ import annotations

import struct

from pamqp import commands
from pamqp.header import ContentHeader

from shoal.shared.errors import AMQPError, FRAME_ERROR, hard_error

from shoal.router.amqp.framing import (FRAME_BODY, FRAME_END_BYTE, FRAME_HEADER, FRAME_METHOD, FRAME_OVERHEAD,
                      pack_frame_header, pamqp_guard, shortstr)

#: ``class_id << 16 | method_id`` of the hot methods (spec 1.8 "Class basic").
BASIC_PUBLISH = 0x003C0028   # 60, 40
BASIC_ACK = 0x003C0050       # 60, 80
BASIC_NACK = 0x003C0078      # 60, 120
BASIC_DELIVER = 0x003C003C   # 60, 60
BASIC_GET_OK = 0x003C0047    # 60, 71
BASIC_RETURN = 0x003C0032    # 60, 50
BASIC_CLASS = 60

_U32 = struct.Struct(">I")
_QB = struct.Struct(">QB")
_HHQ = struct.Struct(">HHQ")
_H = struct.Struct(">H")
_CONFIRM = struct.Struct(">BHIIQB")  # frame header, class+method, delivery-tag, bits

unpack_method_id = _U32.unpack_from
_DELIVER_ID = _U32.pack(BASIC_DELIVER)
_GET_OK_ID = _U32.pack(BASIC_GET_OK)
_RETURN_ID = _U32.pack(BASIC_RETURN)
_U32_pack = _U32.pack
_QB_pack = _QB.pack
_FRAME_END = FRAME_END_BYTE


def _syntax(what: str, method_id: int) -> AMQPError:
    err = hard_error(FRAME_ERROR, f"cannot decode {what} frame")
    err.class_id, err.method_id = method_id >> 16, method_id & 0xFFFF
    return err


def parse_publish(buf: bytes, start: int, end: int) -> tuple[str, str, bool, bool]:
    """``basic.publish`` payload -> ``(exchange, routing_key, mandatory, immediate)``.

    Layout: class/method (4), ticket short (2), exchange shortstr, routing-key shortstr,
    bits octet (mandatory = bit 0, immediate = bit 1). Raises 501 FRAME_ERROR.
    """
    i = start + 6
    if i >= end:
        raise _syntax("basic.publish", BASIC_PUBLISH)
    j = i + 1 + buf[i]
    if j >= end:
        raise _syntax("basic.publish", BASIC_PUBLISH)
    k = j + 1 + buf[j]
    if k >= end:
        raise _syntax("basic.publish", BASIC_PUBLISH)
    try:
        exchange = buf[i + 1:j].decode()
        routing_key = buf[j + 1:k].decode()
    except UnicodeDecodeError:
        raise _syntax("basic.publish", BASIC_PUBLISH) from None
    bits = buf[k]
    return exchange, routing_key, bool(bits & 1), bool(bits & 2)


def parse_ack(buf: bytes, start: int, end: int) -> tuple[int, bool]:
    """``basic.ack`` payload (delivery-tag longlong, bits: multiple = bit 0) ->
    ``(delivery_tag, multiple)``. Raises 501 FRAME_ERROR."""
    if end - start < 13:
        raise _syntax("basic.ack", BASIC_ACK)
    tag, bits = _QB.unpack_from(buf, start + 4)
    return tag, bool(bits & 1)


def parse_content_header(buf: bytes, start: int, end: int) -> tuple[int, int]:
    """Content header payload -> ``(class_id, body_size)`` (spec 4.2.6.1: class id short,
    weight short, body size longlong, property flags...). Raises 501 FRAME_ERROR when the
    payload is shorter than the 14 fixed octets."""
    if end - start < 14:
        err = hard_error(FRAME_ERROR, "content header frame shorter than 14 octets")
        err.class_id = BASIC_CLASS
        raise err
    class_id, _weight, body_size = _HHQ.unpack_from(buf, start)
    return class_id, body_size


#: ``(channel, consumer tag, exchange, routing key)`` -> the fixed parts of a delivery's
#: frames: the method frame up to the delivery tag (frame header, method id, consumer tag),
#: the method frame after the redelivered flag (exchange, routing key, frame end), and the
#: starts of the content header and body frames (type and channel; the body's after the
#: header frame's end). A consumer's deliveries differ only in tag, flag, header and body.
_DELIVER_PARTS: dict[tuple, tuple[bytes, bytes, bytes, bytes]] = {}
_DELIVER_PARTS_MAX = 4096


def _deliver_parts(key: tuple) -> tuple[bytes, bytes, bytes, bytes]:
    channel, consumer_tag, exchange, routing_key = key
    ct, ex, rk = shortstr(consumer_tag), shortstr(exchange), shortstr(routing_key)
    chan = _H.pack(channel)
    parts = (pack_frame_header(FRAME_METHOD, channel, 13 + len(ct) + len(ex) + len(rk))
             + _DELIVER_ID + ct,
             ex + rk + _FRAME_END,
             bytes((FRAME_HEADER,)) + chan,
             _FRAME_END + bytes((FRAME_BODY,)) + chan)
    if len(_DELIVER_PARTS) >= _DELIVER_PARTS_MAX:
        _DELIVER_PARTS.clear()
    _DELIVER_PARTS[key] = parts
    return parts


def deliver(channel: int, consumer_tag: str, delivery_tag: int, redelivered: bool,
            exchange: str, routing_key: str, header: bytes, body: bytes,
            frame_max: int) -> bytes:
    """``basic.deliver`` (spec 1.8.3.9) + content header + body frames of at most
    ``frame_max`` octets each, as one bytes object. ``header`` is the header frame payload.
    Raises ValueError for a consumer tag, exchange or routing key over 255 octets."""
    key = (channel, consumer_tag, exchange, routing_key)
    head, tail, header_start, body_start = _DELIVER_PARTS.get(key) or _deliver_parts(key)
    bl = len(body)
    if bl and bl <= frame_max - FRAME_OVERHEAD:
        return b"".join((head, _QB_pack(delivery_tag, redelivered), tail, header_start,
                         _U32_pack(len(header)), header, body_start, _U32_pack(bl), body,
                         _FRAME_END))
    return b"".join((head, _QB_pack(delivery_tag, redelivered), tail,
                     *_content(channel, header, body, frame_max)))


def get_ok(channel: int, delivery_tag: int, redelivered: bool, exchange: str,
           routing_key: str, message_count: int, header: bytes, body: bytes,
           frame_max: int) -> bytes:
    """``basic.get-ok`` (spec 1.8.3.11) + content frames, as one bytes object."""
    ex, rk = shortstr(exchange), shortstr(routing_key)
    size = 17 + len(ex) + len(rk)
    return b"".join((pack_frame_header(FRAME_METHOD, channel, size), _GET_OK_ID,
                     _QB.pack(delivery_tag, 1 if redelivered else 0), ex, rk,
                     _U32_pack(message_count), _FRAME_END,
                     *_content(channel, header, body, frame_max)))


def basic_return(channel: int, reply_code: int, reply_text: str, exchange: str,
                 routing_key: str, header: bytes, body: bytes, frame_max: int) -> bytes:
    """``basic.return`` (spec 1.8.3.8) + content frames, as one bytes object."""
    rt, ex, rk = shortstr(reply_text[:255]), shortstr(exchange), shortstr(routing_key)
    size = 6 + len(rt) + len(ex) + len(rk)
    return b"".join((pack_frame_header(FRAME_METHOD, channel, size), _RETURN_ID,
                     _H.pack(reply_code), rt, ex, rk, _FRAME_END,
                     *_content(channel, header, body, frame_max)))


def confirm(channel: int, delivery_tag: int, multiple: bool, ack: bool) -> bytes:
    """Publisher confirm: ``basic.ack`` or ``basic.nack`` (requeue=0) from the server
    (RabbitMQ confirm extension), one 21-octet frame."""
    return _CONFIRM.pack(FRAME_METHOD, channel, 13, BASIC_ACK if ack else BASIC_NACK,
                         delivery_tag, 1 if multiple else 0) + _FRAME_END


def _content(channel: int, header: bytes, body: bytes, frame_max: int) -> list:
    parts = [pack_frame_header(FRAME_HEADER, channel, len(header)), header, _FRAME_END]
    size = len(body)
    if size:
        chunk = frame_max - FRAME_OVERHEAD
        view = memoryview(body) if size > chunk else body
        for start in range(0, size, chunk):
            piece = view[start:start + chunk]
            parts += (pack_frame_header(FRAME_BODY, channel, len(piece)), piece, _FRAME_END)
    return parts


def parse_properties(header: bytes) -> commands.Basic.Properties:
    """The ``basic`` properties of a content header payload, decoded by pamqp (for routing
    on headers, TTL, priority). Raises AMQPError 501 FRAME_ERROR (hard) if undecodable."""
    content_header = ContentHeader()
    pamqp_guard(content_header.unmarshal, bytes(header), what="content header")
    return content_header.properties
