"""One message, two protocols: AMQP 1.0 message sections <-> AMQP 0-9-1 content header and body.

Shoal's nodes keep every message as AMQP 0-9-1 holds it: the content header payload as
published and the body (design.md section 4). A message published over AMQP 1.0 is converted
once, on the way in (:func:`to_091`); one consumed over AMQP 1.0 once, on the way out
(:func:`to_amqp10`). The rules are RabbitMQ 4's (https://www.rabbitmq.com/docs/conversions,
tables "AMQP 1.0 -> AMQP 0.9.1" and "AMQP 0.9.1 -> AMQP 1.0"); docs/amqp10.md has the table and
where Shoal differs.

A message published over AMQP 1.0 is kept whole: the body the nodes store is its sections as
published, with ``type`` "amqp-1.0" (whole.py has the form and the conversions for a
delivery); the header is the 0-9-1 conversion of its sections, which is what nodes and
exchanges read.

Errors: :class:`~.codec.DecodeError` for a payload that is not a sequence of message sections
(the transfer is rejected with ``amqp:decode-error``).
"""
from __future__ import annotations

import datetime
import struct
import uuid
from functools import lru_cache
from urllib.parse import quote, unquote
from typing import Any

from pamqp.header import ContentHeader

from shoal.router.amqp10.codec import (_I, DecodeError, Described, Symbol, Timestamp, Typed,
                                       _enc, _pII, _uint, _var_out, decode)

HEADER, DELIVERY_ANN, MESSAGE_ANN, PROPERTIES, APP_PROPERTIES = 0x70, 0x71, 0x72, 0x73, 0x74
DATA, SEQUENCE, VALUE, FOOTER = 0x75, 0x76, 0x77, 0x78
AMQP10_TYPE = "amqp-1.0"       #: ``type`` of a body that holds encoded AMQP 1.0 sections
_SECTION_NAMES = {0x70: HEADER, 0x71: DELIVERY_ANN, 0x72: MESSAGE_ANN, 0x73: PROPERTIES,
                  0x74: APP_PROPERTIES, 0x75: DATA, 0x76: SEQUENCE, 0x77: VALUE, 0x78: FOOTER}
_EPOCH = datetime.timezone.utc


class Incoming:
    """A message published over AMQP 1.0, as the router needs it: the 0-9-1 ``header`` and
    ``body``, the ``to`` and ``subject`` properties (addresses and routing keys), and ``cc``:
    the routing keys of its ``x-cc`` message annotation (RabbitMQ 4's sender-selected
    distribution), ``()`` without one, None when it is not a list of strings."""
    __slots__ = ("header", "body", "to", "subject", "cc")

    def __init__(self, header: bytes, body: bytes, to: str | None, subject: str | None,
                 cc: tuple[str, ...] | None = ()):
        self.header, self.body, self.to, self.subject = header, body, to, subject
        self.cc = cc


def sections(payload: bytes) -> list[tuple[int, int, int, int]]:
    """The message's sections in order: ``(code, start, start of its value, end)``, found by
    their sizes without decoding them. Raises DecodeError."""
    out = []
    pos, n = 0, len(payload)
    while pos < n:
        if payload[pos] != 0x00:
            raise DecodeError("message section is not a described value")
        if payload[pos + 1:pos + 2] == b"\x53" and pos + 2 < n:
            code, vstart = payload[pos + 2], pos + 3
        else:
            descriptor, vstart = decode(payload, pos + 1)
            code = descriptor if type(descriptor) is int else \
                _SYMBOLIC.get(descriptor) if type(descriptor) is Symbol else None
        if code not in _SECTION_NAMES:
            raise DecodeError(f"unknown message section 0x{code or 0:x}")
        end = _skip(payload, vstart, n)
        out.append((code, pos, vstart, end))
        pos = end
    return out


#: fixed-width constructors (AMQP 1.0 part 1.2: the width is in the code's high nibble) whose
#: value needs no check: octets after the code (char, 0x73, is decoded: it is checked)
_FIXED_WIDTH = {**dict.fromkeys((0x40, 0x41, 0x42, 0x43, 0x44, 0x45), 0),
                **dict.fromkeys((0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56), 1),
                0x60: 2, 0x61: 2, **dict.fromkeys((0x70, 0x71, 0x72, 0x74), 4),
                **dict.fromkeys((0x80, 0x81, 0x82, 0x83, 0x84), 8), 0x94: 16, 0x98: 16}


def _skip(buf: bytes, pos: int, n: int) -> int:
    """Where the value at ``pos`` ends: compound and variable-width values by their size
    octets, fixed-width ones by their code, others by decoding."""
    if pos >= n:
        raise DecodeError("message section without a value")
    c = buf[pos]
    if c in (0xa0, 0xa1, 0xa3, 0xc0, 0xc1, 0xe0):
        end = pos + 2 + buf[pos + 1] if pos + 1 < n else n + 1
    elif c in (0xb0, 0xb1, 0xb3, 0xd0, 0xd1, 0xf0):
        end = pos + 5 + _I(buf, pos + 1)[0] if pos + 4 < n else n + 1
    else:
        w = _FIXED_WIDTH.get(c)
        if w is None:
            return decode(buf, pos, n)[1]
        end = pos + 1 + w
    if end > n:
        raise DecodeError("message section runs past the end of the message")
    return end


_SYMBOLIC = {Symbol("amqp:header:list"): 0x70, Symbol("amqp:delivery-annotations:map"): 0x71,
             Symbol("amqp:message-annotations:map"): 0x72,
             Symbol("amqp:properties:list"): 0x73,
             Symbol("amqp:application-properties:map"): 0x74,
             Symbol("amqp:data:binary"): 0x75, Symbol("amqp:amqp-sequence:list"): 0x76,
             Symbol("amqp:amqp-value:*"): 0x77, Symbol("amqp:footer:map"): 0x78}


def _at(values: Any, i: int) -> Any:
    return values[i] if type(values) is list and i < len(values) else None


def _shortstr(v: Any) -> str | None:
    if isinstance(v, str) and len(v.encode("utf-8")) < 256 and "\x00" not in v:
        return str(v)
    return None


def _id_text(v: Any) -> tuple[str | None, Any]:
    """A message-id/correlation-id as a 0-9-1 shortstr, or (None, value for x- header)."""
    if isinstance(v, str):
        s = _shortstr(v)
        return (s, None) if s is not None else (None, str(v))
    if isinstance(v, uuid.UUID):
        return f"urn:uuid:{v}", None
    if type(v) is int:
        return str(v), None
    if isinstance(v, (bytes, bytearray)):
        return None, bytes(v)
    return None, None


def to_091(payload: bytes) -> Incoming:
    """An AMQP 1.0 message (a transfer's joined payload) as the router publishes it: the
    0-9-1 header converted from its sections, with ``type`` ``amqp-1.0``, and as body its
    sections kept whole (whole.py: all but the header and the delivery annotations)."""
    head_raw = props_raw = b""
    app = ann = None
    kept = []
    for code, at, start, end in sections(payload):
        if code == HEADER:
            head_raw = payload[start:end]
            continue
        if code == DELIVERY_ANN:
            continue
        kept.append((at, end))
        if code == PROPERTIES:
            props_raw = payload[start:end]
        elif code == APP_PROPERTIES:
            app = decode(payload, start, end)[0]
        elif code == MESSAGE_ANN:
            ann = decode(payload, start, end)[0]
        elif code == DATA and payload[start] not in (0xa0, 0xb0):
            raise DecodeError("a data section that is not binary")
    if not kept:
        body = b""
    elif kept[-1][1] == len(payload) and all(a[1] == b[0] for a, b in zip(kept, kept[1:])):
        body = payload[kept[0][0]:] if kept[0][0] else payload
    else:
        body = b"".join(payload[a:e] for a, e in kept)
    if app is None and ann is None:
        # the header then depends only on these: publishers repeat theirs
        key = (head_raw, props_raw, len(body))
        done = _HEADERS.get(key)
        if done is None:
            if len(_HEADERS) >= _HEADERS_MAX:
                _HEADERS.clear()
            done = _HEADERS[key] = _converted(head_raw, props_raw, None, None, len(body))
        return Incoming(done[0], body, done[1], done[2])
    header, to, subject = _converted(head_raw, props_raw, ann, app, len(body))
    return Incoming(header, body, to, subject, _cc(ann))


def _cc(ann: Any) -> tuple[str, ...] | None:
    """The keys of an ``x-cc`` annotation: a list of strings (RabbitMQ 4's
    ``rabbit_amqp_session``), ``()`` without one, None for any other value."""
    if not isinstance(ann, dict) or "x-cc" not in ann:
        return ()
    value = ann["x-cc"]
    if isinstance(value, list) and all(type(k) is str for k in value):
        return tuple(value)
    return None


#: to_091's headers of messages without annotations or application properties, by their
#: header and properties sections (as encoded) and body size
_HEADERS: dict[tuple, tuple[bytes, Any, Any]] = {}
_HEADERS_MAX = 1024


def _converted(head_raw: bytes, props_raw: bytes, ann: Any, app: Any,
               body_size: int) -> tuple[bytes, Any, Any]:
    """The 0-9-1 content header of a message (to_091), and its ``to`` and ``subject``."""
    fixed, extra, to, subject = _mapped(head_raw, props_raw)
    p = dict(fixed)
    headers = dict(extra)
    if isinstance(ann, dict):
        for k, v in ann.items():
            if isinstance(k, str) and k.startswith("x-") and _shortstr(k) and \
                    k not in ("x-exchange", "x-routing-key"):
                headers["CC" if k == "x-cc" else str(k)] = to_field(v)    # as mc_amqpl
    if isinstance(app, dict):
        for k, v in app.items():
            if isinstance(k, str) and _shortstr(k):
                headers[str(k)] = to_field(v)
    p["message_type"] = AMQP10_TYPE
    if headers:
        p["headers"] = headers
    return content_header(body_size, p), to, subject


#: basic properties in flag order (AMQP 0-9-1 spec 1.8): name, flag, kind
_PROPS = (("content_type", 0x8000, "s"), ("content_encoding", 0x4000, "s"),
          ("headers", 0x2000, "F"), ("delivery_mode", 0x1000, "o"), ("priority", 0x0800, "o"),
          ("correlation_id", 0x0400, "s"), ("reply_to", 0x0200, "s"),
          ("expiration", 0x0100, "s"), ("message_id", 0x0080, "s"),
          ("timestamp", 0x0040, "T"), ("message_type", 0x0020, "s"), ("user_id", 0x0010, "s"),
          ("app_id", 0x0008, "s"))
_HEAD091 = struct.Struct(">HHQH")


def content_header(body_size: int, p: dict) -> bytes:
    """The AMQP 0-9-1 content header payload (spec 4.2.6.1: class 60, weight 0, body size,
    property flags, properties) of properties ``p`` (pamqp's names). Header table values:
    str as longstr ``S``, int ``l``, float ``d``, bool ``t``, bytes ``x``, None ``V``,
    datetime ``T``, dict ``F``, list ``A`` (RabbitMQ's field types)."""
    flags = 0
    out = bytearray()
    for name, flag, kind in _PROPS:
        v = p.get(name)
        if v is None:
            continue
        flags |= flag
        if kind == "s":
            raw = v.encode("utf-8")
            out.append(len(raw))
            out += raw
        elif kind == "o":
            out.append(v & 0xFF)
        elif kind == "T":
            out += _Q64(int(v.timestamp()))
        else:
            _table(out, v)
    return _HEAD091.pack(60, 0, body_size, flags) + out


_Q64 = struct.Struct(">Q").pack
_I32 = struct.Struct(">I").pack
_q64 = struct.Struct(">q").pack
_d64 = struct.Struct(">d").pack


def field_table(table: dict) -> bytes:
    """``table`` as an encoded AMQP 0-9-1 field table (4-octet size, then entries; the
    value types of :func:`content_header`)."""
    out = bytearray()
    _table(out, table)
    return bytes(out)


def _table(out: bytearray, table: dict) -> None:
    body = bytearray()
    for k, v in table.items():
        raw = k.encode("utf-8")[:255]
        body.append(len(raw))
        body += raw
        _field_value(body, v)
    out += _I32(len(body))
    out += body


def _field_value(out: bytearray, v: Any) -> None:
    t = type(v)
    if t is str:
        raw = v.encode("utf-8")
        out += b"S"
        out += _I32(len(raw))
        out += raw
    elif t is bool:
        out += b"t\x01" if v else b"t\x00"
    elif t is int:
        if -(1 << 63) <= v < (1 << 63):
            out += b"l"
            out += _q64(v)
        else:               # a ulong past long's range: as its text (RabbitMQ: overflow)
            _field_value(out, str(v))
    elif t is float:
        out += b"d"
        out += _d64(v)
    elif t is bytes:
        out += b"x"
        out += _I32(len(v))
        out += v
    elif v is None:
        out += b"V"
    elif t is datetime.datetime:
        out += b"T"
        out += _Q64(int(v.timestamp()))
    elif t is dict:
        out += b"F"
        _table(out, v)
    elif t is list:
        body = bytearray()
        for x in v:
            _field_value(body, x)
        out += b"A"
        out += _I32(len(body))
        out += body
    else:
        _field_value(out, str(v))


@lru_cache(maxsize=1024)
def _mapped(head_raw: bytes, props_raw: bytes) -> tuple[dict, dict, Any, Any]:
    """The 0-9-1 properties (and x- headers) from a message's header and properties
    sections, as encoded: publishers repeat theirs, so this is cached."""
    header = decode(head_raw)[0] if head_raw else None
    props = decode(props_raw)[0] if props_raw else None
    headers: dict[str, Any] = {}
    p: dict[str, Any] = {}
    if type(header) is list:
        durable = _at(header, 0)
        p["delivery_mode"] = 2 if durable else 1
        prio = _at(header, 1)
        if type(prio) is int:
            p["priority"] = prio & 0xFF
        ttl = _at(header, 2)
        if type(ttl) is int:
            p["expiration"] = str(ttl)
    to = subject = None
    if type(props) is list:
        mid, extra = _id_text(_at(props, 0))
        if mid is not None:
            p["message_id"] = mid
        elif extra is not None:
            headers["x-message-id"] = extra
        uid = _at(props, 1)
        if isinstance(uid, (bytes, bytearray)):
            try:
                s = _shortstr(bytes(uid).decode("utf-8"))
            except UnicodeDecodeError:
                s = None
            if s is not None:
                p["user_id"] = s
        to = _at(props, 2) if isinstance(_at(props, 2), str) else None
        subject = _at(props, 3) if isinstance(_at(props, 3), str) else None
        reply_to = _shortstr(_reply_to_091(_at(props, 4)))
        if reply_to is not None:
            p["reply_to"] = reply_to
        cid, extra = _id_text(_at(props, 5))
        if cid is not None:
            p["correlation_id"] = cid
        elif extra is not None:
            headers["x-correlation-id"] = extra
        for i, name in ((6, "content_type"), (7, "content_encoding")):
            v = _shortstr(_at(props, i))
            if v is not None:
                p[name] = v
        created = _at(props, 9)
        if type(created) is Timestamp:
            p["timestamp"] = datetime.datetime.fromtimestamp(created // 1000, _EPOCH)
        group = _shortstr(_at(props, 10))
        if group is not None:
            p["app_id"] = group
    return p, headers, to, subject


def _reply_to_091(v: Any) -> Any:
    """A 1.0 ``reply-to`` for 0-9-1: the queue of a ``/queues/Q`` address (URL-decoded),
    anything else as it is; the other way a 0-9-1 ``reply_to`` Q becomes ``/queues/Q``
    (RabbitMQ 4's ``mc_amqpl``: a 0-9-1 requester's queue is a 1.0 responder's address)."""
    if isinstance(v, str) and v.startswith("/queues/"):
        try:
            return unquote(v[8:], errors="strict")
        except UnicodeDecodeError:
            return None
    return v


def to_field(v: Any) -> Any:
    """An AMQP 1.0 value as a 0-9-1 field value (RabbitMQ 4's type conversions)."""
    t = type(v)
    if t is Timestamp:
        return datetime.datetime.fromtimestamp(v // 1000, _EPOCH)
    if t is Symbol:
        return str(v)
    if t is uuid.UUID:
        return str(v)
    if t is Typed:
        return str(v.value) if not isinstance(v.value, bytes) else v.value
    if t is Described:
        return to_field(v.value)
    if t is list:
        return [to_field(x) for x in v]
    if t is dict:
        return {str(k): to_field(x) for k, x in v.items()}
    return v


# ---- 0-9-1 -> 1.0 ----------------------------------------------------------------------------
def to_amqp10(header: bytes, body: bytes, exchange: str, routing_key: str,
              redelivered: bool) -> bytes:
    """The AMQP 1.0 message sections for a delivery of a 0-9-1 message."""
    first, again, ann, count, rest, raw = _from_header(header)
    out = bytearray(again if redelivered else first)
    out += _annotations(exchange, routing_key, ann, count)
    out += rest
    if raw:
        out += body
    else:
        out += b"\x00\x53\x75"
        _var_out(out, body, 0xa0, 0xb0)
    return bytes(out)


@lru_cache(maxsize=1024)
def _annotations(exchange: str, routing_key: str, items: bytes, count: int) -> bytes:
    """The message-annotations section: ``x-exchange``, ``x-routing-key`` and ``items``
    (``count`` more keys and values, encoded)."""
    body = bytearray()
    _enc(body, Symbol("x-exchange"))
    _enc(body, exchange)
    _enc(body, Symbol("x-routing-key"))
    _enc(body, routing_key)
    body += items
    n = 4 + 2 * count
    if len(body) + 1 < 256 and n < 256:
        return b"\x00\x53\x72\xc1" + bytes((len(body) + 1, n)) + body
    return b"\x00\x53\x72\xd1" + _pII(len(body) + 4, n) + body


def _header_section(durable: bool, priority: int | None, ttl: int | None, first: bool,
                    count: int) -> bytes:
    b = bytearray((0x41 if durable else 0x42,))
    if priority is None:
        b.append(0x40)
    else:
        b += bytes((0x50, priority & 0xFF))
    if ttl is None:
        b.append(0x40)
    else:
        _uint(b, ttl)
    b.append(0x41 if first else 0x42)
    _uint(b, count)
    return b"\x00\x53\x70\xc0" + bytes((len(b) + 1, 5)) + b


@lru_cache(maxsize=2048)
def _from_header(header: bytes) -> tuple[bytes, bytes, bytes, int, bytes, bool]:
    """What a content header gives every delivery of it (publishers repeat theirs): the header
    section for a first delivery and a redelivery, the message annotations from its ``x-``
    headers and type (encoded items, and how many), the properties and application-properties
    sections, and whether the body is already AMQP 1.0 sections."""
    ch = ContentHeader()
    ch.unmarshal(header)
    pr = ch.properties
    headers = pr.headers if isinstance(pr.headers, dict) else {}
    ttl = None
    if pr.expiration:
        try:
            ttl = min(max(0, int(pr.expiration)), 0xFFFFFFFF)
        except ValueError:
            ttl = None
    count = headers.get("x-delivery-count")
    durable = pr.delivery_mode == 2
    first = _header_section(durable, pr.priority, ttl, True,
                            count if type(count) is int else 0)
    again = _header_section(durable, pr.priority, ttl, False,
                            count if type(count) is int else 1)
    ann = bytearray()
    n = 0
    if pr.message_type and pr.message_type != AMQP10_TYPE:
        _enc(ann, Symbol("x-basic-type"))
        _enc(ann, pr.message_type)
        n += 1
    app: dict = {}
    for k, v in headers.items():
        if k.startswith("x-"):
            _enc(ann, Symbol(k))
            _enc(ann, from_field(v))
            n += 1
        elif not isinstance(v, (dict, list)):
            app[k] = from_field(v)
    rest = bytearray()
    props = [_id_value(pr.message_id), pr.user_id.encode() if pr.user_id else None, None, None,
             "/queues/" + quote(pr.reply_to, safe="") if pr.reply_to else None,
             _id_value(pr.correlation_id),
             Symbol(pr.content_type) if pr.content_type else None,
             Symbol(pr.content_encoding) if pr.content_encoding else None, None,
             Timestamp(int(pr.timestamp.replace(tzinfo=pr.timestamp.tzinfo or _EPOCH)
                           .timestamp()) * 1000) if pr.timestamp else None,
             pr.app_id or None]
    while props and props[-1] is None:
        props.pop()
    if props:
        rest += b"\x00\x53\x73"
        _enc(rest, props)
    if app:
        rest += b"\x00\x53\x74"
        _enc(rest, app)
    return first, again, bytes(ann), n, bytes(rest), pr.message_type == AMQP10_TYPE


def _id_value(v: str | None) -> Any:
    if not v:
        return None
    if v.startswith("urn:uuid:"):
        try:
            return uuid.UUID(v[9:])
        except ValueError:
            pass
    return v


def from_field(v: Any) -> Any:
    """A 0-9-1 field value as an AMQP 1.0 value (RabbitMQ 4's type conversions)."""
    if isinstance(v, datetime.datetime):
        return Timestamp(int(v.replace(tzinfo=v.tzinfo or _EPOCH).timestamp() * 1000))
    if isinstance(v, dict):
        return {str(k): from_field(x) for k, x in v.items()}
    if isinstance(v, list):
        return [from_field(x) for x in v]
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, (str, bytes, int, float, bool)) or v is None:
        return v
    return str(v)

