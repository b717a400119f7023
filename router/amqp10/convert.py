"""One message, two protocols: AMQP 1.0 message sections <-> AMQP 0-9-1 content header and body.

Shoal's nodes keep every message as AMQP 0-9-1 holds it: the content header payload as
published and the body (design.md section 4). A message published over AMQP 1.0 is converted
once, on the way in (:func:`to_091`); one consumed over AMQP 1.0 once, on the way out
(:func:`to_amqp10`). The rules are RabbitMQ 4's (https://www.rabbitmq.com/docs/conversions,
tables "AMQP 1.0 -> AMQP 0.9.1" and "AMQP 0.9.1 -> AMQP 1.0"); docs/amqp10.md has the table and
where Shoal differs.

Body: one data section is the 0-9-1 body as is. Any other body (amqp-value, amqp-sequence,
several data sections) becomes its AMQP-encoded sections with ``type`` "amqp-1.0", and is
given back to an AMQP 1.0 consumer as those sections.

Errors: :class:`~.codec.DecodeError` for a payload that is not a sequence of message sections
(the transfer is rejected with ``amqp:decode-error``).
"""
from __future__ import annotations

import datetime
import uuid
from functools import lru_cache
from typing import Any

from pamqp import commands as C
from pamqp.header import ContentHeader

from shoal.router.amqp10.codec import (DecodeError, Described, Symbol, Timestamp, Typed,
                                       _var_out, decode, encode)

HEADER, DELIVERY_ANN, MESSAGE_ANN, PROPERTIES, APP_PROPERTIES = 0x70, 0x71, 0x72, 0x73, 0x74
DATA, SEQUENCE, VALUE, FOOTER = 0x75, 0x76, 0x77, 0x78
AMQP10_TYPE = "amqp-1.0"       #: ``type`` of a body that holds encoded AMQP 1.0 sections
_SECTION_NAMES = {0x70: HEADER, 0x71: DELIVERY_ANN, 0x72: MESSAGE_ANN, 0x73: PROPERTIES,
                  0x74: APP_PROPERTIES, 0x75: DATA, 0x76: SEQUENCE, 0x77: VALUE, 0x78: FOOTER}
_EPOCH = datetime.timezone.utc


class Incoming:
    """A message published over AMQP 1.0, as the router needs it: the 0-9-1 ``header`` and
    ``body``, and the ``to`` and ``subject`` properties (addresses and routing keys)."""
    __slots__ = ("header", "body", "to", "subject")

    def __init__(self, header: bytes, body: bytes, to: str | None, subject: str | None):
        self.header, self.body, self.to, self.subject = header, body, to, subject


def sections(payload: bytes) -> list[tuple[int, Any, int, int]]:
    """The message's sections in order: ``(code, value, start, end)``. Raises DecodeError."""
    out = []
    pos, n = 0, len(payload)
    while pos < n:
        start = pos
        value, pos = decode(payload, pos)
        if type(value) is not Described:
            raise DecodeError("message section is not a described value")
        d = value.descriptor
        code = d if type(d) is int else _SYMBOLIC.get(d)
        if code not in _SECTION_NAMES:
            raise DecodeError(f"unknown message section {d!r}")
        out.append((code, value.value, start, pos))
    return out


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
    """An AMQP 1.0 message (a transfer's joined payload) as 0-9-1 header and body."""
    secs = sections(payload)
    header = props = app = ann = None
    body_parts = []
    for code, value, start, end in secs:
        if code == HEADER:
            header = value
        elif code == PROPERTIES:
            props = value
        elif code == APP_PROPERTIES:
            app = value
        elif code == MESSAGE_ANN:
            ann = value
        elif code in (DATA, SEQUENCE, VALUE):
            body_parts.append((code, value, start, end))
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
        reply_to = _shortstr(_at(props, 4))
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
    if isinstance(ann, dict):
        for k, v in ann.items():
            if isinstance(k, str) and k.startswith("x-") and _shortstr(k) and \
                    k not in ("x-exchange", "x-routing-key"):
                headers[str(k)] = _to_field(v)
    if isinstance(app, dict):
        for k, v in app.items():
            if isinstance(k, str) and _shortstr(k):
                headers[str(k)] = _to_field(v)
    if len(body_parts) == 1 and body_parts[0][0] == DATA and \
            isinstance(body_parts[0][1], bytes):
        body = body_parts[0][1]
    else:       # amqp-value, amqp-sequence, several data sections: kept AMQP-encoded
        body = b"".join(payload[s:e] for _, _, s, e in body_parts)
        p["message_type"] = AMQP10_TYPE
    if headers:
        p["headers"] = headers
    head = ContentHeader(0, len(body), C.Basic.Properties(**p)).marshal()
    return Incoming(head, body, to, subject)


def _to_field(v: Any) -> Any:
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
        return _to_field(v.value)
    if t is list:
        return [_to_field(x) for x in v]
    if t is dict:
        return {str(k): _to_field(x) for k, x in v.items()}
    return v


# ---- 0-9-1 -> 1.0 ----------------------------------------------------------------------------
def to_amqp10(header: bytes, body: bytes, exchange: str, routing_key: str,
              redelivered: bool) -> bytes:
    """The AMQP 1.0 message sections for a delivery of a 0-9-1 message."""
    head, rest, raw = _prefix(header, exchange, routing_key)
    out = bytearray(head[1] if redelivered else head[0])
    out += rest
    if raw:
        out += body
    else:
        out += b"\x00\x53\x75"
        _var_out(out, body, 0xa0, 0xb0)
    return bytes(out)


@lru_cache(maxsize=2048)
def _prefix(header: bytes, exchange: str, routing_key: str) -> tuple[tuple[bytes, bytes],
                                                                     bytes, bool]:
    """Everything before the body, for header bytes seen before (publishers repeat theirs):
    the header section (first delivery, redelivery), the other sections, whether the body is
    already AMQP-encoded sections."""
    ch = ContentHeader()
    ch.unmarshal(header)
    pr = ch.properties
    headers = pr.headers if isinstance(pr.headers, dict) else {}
    durable = pr.delivery_mode == 2
    ttl = None
    if pr.expiration:
        try:
            ttl = Typed("uint", max(0, int(pr.expiration)))
        except ValueError:
            ttl = None
    count = headers.get("x-delivery-count")
    heads = tuple(encode(Described(HEADER, [durable, Typed("ubyte", pr.priority)
                                            if pr.priority is not None else None, ttl,
                                            not again,
                                            Typed("uint", count if type(count) is int
                                                  else int(again))]))
                  for again in (False, True))
    ann: dict = {Symbol("x-exchange"): exchange, Symbol("x-routing-key"): routing_key}
    if pr.message_type and pr.message_type != AMQP10_TYPE:
        ann[Symbol("x-basic-type")] = pr.message_type
    app: dict = {}
    for k, v in headers.items():
        if k.startswith("x-"):
            ann[Symbol(k)] = _from_field(v)
        elif not isinstance(v, (dict, list)):
            app[k] = _from_field(v)
    rest = bytearray(encode(Described(MESSAGE_ANN, ann)))
    props = [_id_value(pr.message_id), pr.user_id.encode() if pr.user_id else None, None, None,
             pr.reply_to or None, _id_value(pr.correlation_id),
             Symbol(pr.content_type) if pr.content_type else None,
             Symbol(pr.content_encoding) if pr.content_encoding else None, None,
             Timestamp(int(pr.timestamp.replace(tzinfo=pr.timestamp.tzinfo or _EPOCH)
                           .timestamp()) * 1000) if pr.timestamp else None,
             pr.app_id or None]
    while props and props[-1] is None:
        props.pop()
    if props:
        rest += encode(Described(PROPERTIES, props))
    if app:
        rest += encode(Described(APP_PROPERTIES, app))
    return heads, bytes(rest), pr.message_type == AMQP10_TYPE


def _id_value(v: str | None) -> Any:
    if not v:
        return None
    if v.startswith("urn:uuid:"):
        try:
            return uuid.UUID(v[9:])
        except ValueError:
            pass
    return v


def _from_field(v: Any) -> Any:
    """A 0-9-1 field value as an AMQP 1.0 value (RabbitMQ 4's type conversions)."""
    if isinstance(v, datetime.datetime):
        return Timestamp(int(v.replace(tzinfo=v.tzinfo or _EPOCH).timestamp() * 1000))
    if isinstance(v, dict):
        return {str(k): _from_field(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_from_field(x) for x in v]
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, (str, bytes, int, float, bool)) or v is None:
        return v
    return str(v)

