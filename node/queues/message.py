"""What a node reads from (and, rarely, writes into) a message's content header.

The node keeps every header as the bytes the publisher sent (design.md section 4). Features
that need a property read the 16-bit property flags first (AMQP 0-9-1 spec 4.2.6.1: class u16,
weight u16, body size u64, then the flags at payload offset 12) and decode with pamqp only when
the flag says the property is present. Headers are re-encoded only to add ``x-death``
(dead-lettering) or ``x-delivery-count`` (delivery limit), as RabbitMQ does.
"""
from __future__ import annotations

import logging
import struct
from typing import Any

from pamqp.commands import Basic
from pamqp.header import ContentHeader

log = logging.getLogger("shoal.node")

# Property flag bits (spec 1.8 "basic" class properties, in order).
F_DELIVERY_MODE = 0x1000
F_PRIORITY = 0x0800
F_CORRELATION_ID = 0x0400
F_REPLY_TO = 0x0200
F_EXPIRATION = 0x0100

_BODY_SIZE = struct.Struct(">Q")


def property_flags(header: bytes) -> int:
    """The property flags of a content-header payload (0 when it is too short)."""
    if len(header) < 14:
        return 0
    return (header[12] << 8) | header[13]


def body_size(header: bytes) -> int:
    return _BODY_SIZE.unpack_from(header, 4)[0] if len(header) >= 12 else 0


def parse_properties(header: bytes) -> Basic.Properties | None:
    """Decode the properties with pamqp; None when the header is undecodable (the message is
    then treated as having no properties, never dropped)."""
    ch = ContentHeader()
    try:
        ch.unmarshal(bytes(header))
    except Exception:  # noqa: BLE001 - pamqp raises several types on bad input
        log.debug("undecodable content header (%d bytes)", len(header))
        return None
    return ch.properties


def encode_header(props: Basic.Properties, size: int) -> bytes:
    """A content-header payload for ``props`` and a body of ``size`` bytes (pamqp)."""
    return ContentHeader(0, size, props).marshal()


def header_value(props: Basic.Properties | None, key: str) -> Any:
    """``props.headers[key]`` (bytes decoded as UTF-8), or None."""
    if props is None or not props.headers:
        return None
    v = props.headers.get(key)
    if isinstance(v, (bytes, bytearray)):
        v = bytes(v).decode("utf-8", "replace")
    return v


def expiration_ms(props: Basic.Properties | None) -> int | None:
    """The per-message TTL (``expiration``, a decimal string of ms; RabbitMQ), or None when
    absent or not a non-negative integer."""
    if props is None or props.expiration is None:
        return None
    try:
        v = int(props.expiration)
    except (TypeError, ValueError):
        return None
    return v if v >= 0 else None


def is_persistent(header: bytes) -> bool:
    """Whether a content-header payload (class u16, weight u16, body size u64, property flags
    u16, properties; AMQP 0-9-1 spec 4.2.6.1) carries ``delivery_mode`` 2: flag 0x1000 set and
    the delivery-mode octet, after content-type (shortstr, 0x8000), content-encoding (shortstr,
    0x4000) and headers (table, 0x2000), equal to 2. Malformed headers: False (transient)."""
    try:
        flags = (header[12] << 8) | header[13]
        if not flags & 0x1000:
            return False
        pos = 14
        word = flags
        while word & 1:                     # continuation flag words follow
            word = (header[pos] << 8) | header[pos + 1]
            pos += 2
        if flags & 0x8000:
            pos += 1 + header[pos]
        if flags & 0x4000:
            pos += 1 + header[pos]
        if flags & 0x2000:
            pos += 4 + int.from_bytes(header[pos:pos + 4], "big")
        return header[pos] == 2
    except IndexError:
        return False
