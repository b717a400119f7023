"""AMQP 1.0 messages kept whole: stored as published, converted only for a 0-9-1 consumer.

RabbitMQ 4 keeps a message in the form it was published in (its ``mc`` modules) and converts
it only for a consumer of the other protocol. Shoal's nodes hold a 0-9-1 content header and
a body (design.md section 4), so a message published over AMQP 1.0 is kept as (the router <->
node contract, shared/wire.py "Messages kept whole"):

* **header**: the 0-9-1 conversion of its header, properties, message annotations and
  application properties (convert.py :func:`~.convert.to_091`), with ``type`` ``amqp-1.0``:
  everything a node or an exchange reads (TTL, priority, headers, groups, selectors) is there;
* **body**: its sections as published from the message annotations on (message-annotations,
  properties, application-properties, the body sections, footer), byte for byte. Not kept:
  the header section (a delivery's header is the broker's: durable, priority, ttl,
  first-acquirer, delivery-count; AMQP 1.0 part 3.2.1) and the delivery annotations (for one
  hop, part 3.2.2).

A body of ``type`` ``amqp-1.0`` without the sections a 1.0 publisher sends (a 0-9-1 publisher
that wrote AMQP 1.0 body sections itself) is read the same way; what it lacks is made from
its 0-9-1 header, as for any 0-9-1 message.

For an AMQP 1.0 consumer (:func:`to_amqp10`) the bare message (properties, application
properties, body, footer) goes out as stored; the message annotations are the stored ones,
with ``x-exchange`` and ``x-routing-key`` set, and with what a node added since: the ``x-``
headers that are not the message's own (dead-lettering's ``x-death`` as RabbitMQ 4's
``x-opt-deaths``, ``x-first-death-*``, ``x-delivery-count``, a ``modified`` outcome's
annotations), as RabbitMQ 4's ``mc_amqp:protocol_state`` does.

For a 0-9-1 consumer (:func:`to_091_delivery`): the header as stored, with ``type`` the
``x-basic-type`` annotation (or none) and the data section's bytes as body; a body that is
not one data section stays its encoded sections with ``type`` ``amqp-1.0`` (docs/amqp10.md).

Errors: :class:`~.codec.DecodeError` from a stored body that is not AMQP 1.0 sections (a
0-9-1 publisher's ``amqp-1.0`` body); callers then deliver it as it is.
"""
from __future__ import annotations

import datetime
from functools import lru_cache
from typing import Any

from pamqp.header import ContentHeader

from shoal.router.amqp10.codec import (DecodeError, Symbol, Timestamp, Typed, _enc, _pII,
                                       decode)
from shoal.router.amqp10.convert import (AMQP10_TYPE, APP_PROPERTIES, DATA, FOOTER, MESSAGE_ANN,
                                         PROPERTIES, _from_header, _mapped, _skip,
                                         content_header, from_field, sections, to_field)

#: the ``type`` property ``amqp-1.0`` as a content header encodes it (a shortstr)
_MARK = b"\x08" + AMQP10_TYPE.encode()
#: basic properties by pamqp name, in flag order (convert.content_header's)
_NAMES = ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
          "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
          "message_type", "user_id", "app_id")
_EPOCH = datetime.timezone.utc


def is_whole(header: bytes) -> bool:
    """Whether a stored message's ``header`` (a 0-9-1 content header payload) says its body
    is AMQP 1.0 sections (``type`` ``amqp-1.0``). Every 0-9-1 delivery asks: the ``type``
    property's flag (0x0020 of the property flags, octets 12-13) is tested first."""
    if len(header) < 14 or not header[13] & 0x20:
        return False
    return _MARK in header and _props(header[12:]).message_type == AMQP10_TYPE


@lru_cache(maxsize=4096)
def _props(tail: bytes) -> Any:
    """The basic properties of a content header, from its flags on (``header[12:]``: the
    class, weight and body size do not matter, so messages of any size share an entry)."""
    ch = ContentHeader()
    ch.unmarshal(b"\x00\x3c\x00\x00" + bytes(8) + tail)
    return ch.properties


class Stored:
    """A stored body's sections: the values (encoded) of its message-annotations,
    properties and application-properties sections (``b""`` when absent), where the
    sections after the message annotations start (``rest_at``), where the body sections
    start and end, and, when the body is one data section, its bytes (``data``)."""
    __slots__ = ("ma", "props", "app", "rest_at", "body_at", "body_end", "data")

    def __init__(self, body: bytes, data: bool = False) -> None:
        self.ma = self.props = self.app = b""
        self.rest_at = 0
        self.body_at = self.body_end = -1
        self.data: bytes | None = None
        if not data and self._before_body(body):
            self.body_at = self.body_end = len(body)
            return
        parts = 0
        for code, at, start, end in sections(body):
            if code == MESSAGE_ANN:
                self.ma = body[start:end]
                self.rest_at = end
            elif code == PROPERTIES:
                self.props = body[start:end]
            elif code == APP_PROPERTIES:
                self.app = body[start:end]
            elif code == FOOTER:
                continue
            else:
                if not data:        # a 1.0 delivery reads no further (the body goes as is)
                    break
                if self.body_at < 0:
                    self.body_at = at
                self.body_end = end
                parts += 1
                if code == DATA and parts == 1:
                    self.data = decode(body, start, end)[0]
        if parts != 1:
            self.data = None
        if self.body_at < 0:
            self.body_at = self.body_end = len(body)

    def _before_body(self, body: bytes) -> bool:
        """For a delivery (which reads no further than the sections before the body): the
        sections up to the first that is not message annotations, properties or application
        properties, each with the short descriptor (``0x00 0x53 code``, as every stored body
        has them). False when one has another form: the general walk reads it then."""
        pos, n = 0, len(body)
        while pos + 3 <= n and body[pos] == 0 and body[pos + 1] == 0x53:
            code = body[pos + 2]
            if code == MESSAGE_ANN:
                end = _skip(body, pos + 3, n)
                self.ma, self.rest_at = body[pos + 3:end], end
            elif code == PROPERTIES:
                end = _skip(body, pos + 3, n)
                self.props = body[pos + 3:end]
            elif code == APP_PROPERTIES:
                end = _skip(body, pos + 3, n)
                self.app = body[pos + 3:end]
            else:
                return True
            pos = end
        if pos < n:
            self.ma = self.props = self.app = b""
            self.rest_at = 0
            return False
        return True


# ---- for a 0-9-1 consumer -----------------------------------------------------------------
def for_091(header: bytes, body: bytes) -> tuple[bytes, bytes]:
    """``(header, body)`` as a 0-9-1 consumer (or the management API's get) gets a stored
    message: converted when it is kept whole (:func:`to_091_delivery`), else as stored,
    as is one whose body is not AMQP 1.0 sections after all."""
    if is_whole(header):
        try:
            return to_091_delivery(header, body)
        except DecodeError:
            pass
    return header, body


def to_091_delivery(header: bytes, body: bytes) -> tuple[bytes, bytes]:
    """A stored message of ``type`` ``amqp-1.0`` as a 0-9-1 consumer gets it: ``(header,
    body)``. Raises DecodeError (the caller delivers it as stored)."""
    st = Stored(body, data=True)
    if st.data is not None:
        out = st.data
        head = _header_091(header[12:], _basic_type(st.ma))
    else:
        out = body[st.body_at:st.body_end]
        head = _header_091(header[12:], AMQP10_TYPE)
    return head[:4] + len(out).to_bytes(8, "big") + head[12:], out


@lru_cache(maxsize=1024)
def _header_091(tail: bytes, message_type: str | None) -> bytes:
    props = _props(tail)
    if props.message_type == message_type:
        return b"\x00\x3c\x00\x00" + bytes(8) + tail
    p = {name: getattr(props, name) for name in _NAMES}
    p["message_type"] = message_type
    return content_header(0, p)


@lru_cache(maxsize=1024)
def _basic_type(ma: bytes) -> str | None:
    """The ``x-basic-type`` message annotation (a 0-9-1 ``type`` carried over 1.0)."""
    if not ma:
        return None
    v = _map(ma).get("x-basic-type")
    return str(v) if isinstance(v, str) else None


# ---- for an AMQP 1.0 consumer -------------------------------------------------------------
def to_amqp10(header: bytes, body: bytes, exchange: str, routing_key: str,
              redelivered: bool) -> bytes | None:
    """The AMQP 1.0 message sections for a delivery of a stored message of ``type``
    ``amqp-1.0``; None for any other message (convert.to_amqp10 then: the header is parsed
    once, by the cache both share). Raises DecodeError."""
    first, again, _, _, rest, kept_whole = _from_header(header)
    if not kept_whole:
        return None
    st = Stored(body)
    keys, added = _added(header[12:], st.ma, st.app, st.props)
    out = bytearray(again if redelivered else first)
    out += _message_annotations(st.ma, exchange, routing_key, keys, added)
    if not (st.props or st.app):    # a 0-9-1 publisher's body sections: from its header
        out += rest
    out += body[st.rest_at:]
    return bytes(out)


@lru_cache(maxsize=2048)
def _added(tail: bytes, ma: bytes, app: bytes, props: bytes) -> tuple[tuple[str, ...], bytes]:
    """What a node added to a message kept whole: its header's ``x-`` headers that are not
    the message's own (its ``x-`` annotations as published, its application properties, the
    ``x-message-id`` and ``x-correlation-id`` of ids 0-9-1 cannot carry), or whose value a
    node changed: ``(keys, their entries encoded as AMQP 1.0 map entries)``. ``x-death``
    becomes ``x-opt-deaths`` (RabbitMQ 4's ``mc_amqp``)."""
    if b"x-" not in tail:           # no x- header at all (most messages): nothing to parse
        return (), b""
    headers = _props(tail).headers
    if not headers:
        return (), b""
    own_ma = _map(ma) if ma else {}
    own_app = set(_map(app)) if app else set()
    own_ids = set(_mapped(b"", props)[1]) if props else set()
    keys = []
    out = bytearray()
    for k, v in headers.items():
        if not k.startswith("x-") or k in own_app or k in own_ids:
            continue
        if k in own_ma and to_field(own_ma[k]) == v:
            continue
        if k == "x-death":
            k, value = "x-opt-deaths", _deaths(v)
        else:
            value = from_field(v)
        keys.append(k)
        _enc(out, Symbol(k))
        _enc(out, value)
    return tuple(keys), bytes(out)


def _map(value: bytes) -> dict:
    """An encoded map section's value (message annotations, application properties) as a
    dict ({} for anything else)."""
    v = decode(value)[0]
    return v if isinstance(v, dict) else {}


def _deaths(deaths: Any) -> Typed:
    """0-9-1 ``x-death`` tables as RabbitMQ 4's ``x-opt-deaths``: an array of maps (queue,
    reason, count, first-time, last-time, exchange, routing-keys, ttl)."""
    maps = []
    for d in deaths if isinstance(deaths, list) else []:
        if not isinstance(d, dict):
            continue
        t = d.get("time")
        ms = Timestamp(int(t.replace(tzinfo=t.tzinfo or _EPOCH).timestamp() * 1000)) \
            if isinstance(t, datetime.datetime) else Timestamp(0)
        m = {Symbol("queue"): str(d.get("queue") or ""),
             Symbol("reason"): Symbol(str(d.get("reason") or "")),
             Symbol("count"): Typed("ulong", int(d.get("count") or 0)),
             Symbol("first-time"): ms, Symbol("last-time"): ms,
             Symbol("exchange"): str(d.get("exchange") or ""),
             Symbol("routing-keys"): Typed("array", ("string", [
                 str(k) for k in d.get("routing-keys") or []]))}
        ttl = d.get("original-expiration")
        if ttl is not None:
            try:
                m[Symbol("ttl")] = Typed("uint", int(ttl))
            except ValueError:
                pass
        maps.append(m)
    return Typed("array", ("map", maps))


@lru_cache(maxsize=1024)
def _message_annotations(ma: bytes, exchange: str, routing_key: str, keys: tuple[str, ...],
                         added: bytes) -> bytes:
    """The message-annotations section of a delivery: the stored entries as published (byte
    for byte), less those replaced, then ``x-exchange``, ``x-routing-key`` and the entries
    ``added`` (encoded; their ``keys``)."""
    replaced = {"x-exchange", "x-routing-key", *keys}
    body = bytearray()
    n = 0
    if ma and ma[0] in (0xc1, 0xd1):
        pos = 3 if ma[0] == 0xc1 else 9
        end = len(ma)
        while pos < end:
            key, vpos = decode(ma, pos, end)
            vend = _skip(ma, vpos, end)
            if key not in replaced:
                body += ma[pos:vend]
                n += 2
            pos = vend
    for k, v in (("x-exchange", exchange), ("x-routing-key", routing_key)):
        _enc(body, Symbol(k))
        _enc(body, v)
    body += added
    n += 4 + 2 * len(keys)
    if len(body) + 1 < 256 and n < 256:
        return b"\x00\x53\x72\xc1" + bytes((len(body) + 1, n)) + body
    return b"\x00\x53\x72\xd1" + _pII(len(body) + 4, n) + body
