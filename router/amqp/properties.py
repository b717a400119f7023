"""Checking a published content header's property list without decoding it (spec 4.2.6.1,
1.8 "basic" properties; field tables: spec 4.2.5.5 and RabbitMQ's field types).

Shoal keeps the content header as the bytes the publisher sent and hands the same bytes to
every consumer (design.md section 4). So a header that does not parse must be refused when it
is published; otherwise each consumer's client library fails on it instead. RabbitMQ decodes
the properties of every publish for the same reason.

:func:`check_properties` walks the property list as a decoder would, but builds nothing: the
property flags, each present property's length, and field tables and arrays with their field
types, lengths and UTF-8 keys. A header with the usual few properties and no table costs a
dict lookup and a few index operations.
"""
from __future__ import annotations

import struct

from shoal.shared.errors import FRAME_ERROR, AMQPError, hard_error

#: Basic properties in flag order, bit 15 first (spec 1.8): a shortstr, a field table, or
#: a fixed size in octets (delivery-mode and priority: octet; timestamp: 64 bits).
_SHORTSTR, _TABLE = "s", "F"
_BASIC = ((0x8000, _SHORTSTR), (0x4000, _SHORTSTR), (0x2000, _TABLE), (0x1000, 1),
          (0x0800, 1), (0x0400, _SHORTSTR), (0x0200, _SHORTSTR), (0x0100, _SHORTSTR),
          (0x0080, _SHORTSTR), (0x0040, 8), (0x0020, _SHORTSTR), (0x0010, _SHORTSTR),
          (0x0008, _SHORTSTR), (0x0004, _SHORTSTR))
#: Bits 1 and 0: no such property in class basic, and no further flag word (bit 0 is the
#: continuation bit, which 14 properties never need).
_RESERVED = 0x0003
#: Field value types with a fixed size in octets (RabbitMQ's and pamqp's set).
_FIXED = {ord("t"): 1, ord("b"): 1, ord("B"): 1, ord("s"): 2, ord("u"): 2, ord("I"): 4,
          ord("i"): 4, ord("f"): 4, ord("l"): 8, ord("L"): 8, ord("d"): 8, ord("T"): 8,
          ord("D"): 5, ord("V"): 0, 0: 0}
_LONG_BYTES = (ord("S"), ord("x"))          # long string, byte array: u32 length + octets
_NESTED_TABLE, _ARRAY = ord("F"), ord("A")
#: Tables and arrays nested deeper than this are refused (a decoder recursing on them could
#: run out of stack).
MAX_DEPTH = 64

_U32 = struct.Struct(">I").unpack_from
_layouts: dict[int, tuple | int] = {}


class _Bad(Exception):
    """Internal: the property list is malformed (turned into one AMQPError below)."""


def check_properties(buf: bytes, start: int, end: int) -> None:
    """Check the property list of the content header payload ``buf[start:end]`` (``start``
    at the class id; the 14 fixed octets already checked).

    Raises AMQPError 501 FRAME_ERROR (hard: RabbitMQ closes the connection when it cannot
    decode a frame) when the flags set bits 1 or 0, a property or table entry runs past the
    payload, a field type is unknown, a shortstr or table key is not UTF-8, or tables nest
    deeper than :data:`MAX_DEPTH`. Octets after the last property are tolerated, as decoders
    ignore them.
    """
    flags = (buf[start + 12] << 8) | buf[start + 13]
    if not flags:
        return
    if flags & _RESERVED:
        raise _error(f"property flags {flags:#06x} set reserved bits")
    layout = _layouts.get(flags)
    if layout is None:
        layout = _layouts[flags] = _layout(flags)
    pos = start + 14
    if type(layout) is int:             # octets and timestamp only: a length check
        if end - pos < layout:
            raise _error("malformed property list")
        return
    try:
        for kind in layout:
            if kind is _SHORTSTR:
                if pos >= end:
                    raise _Bad
                nxt = pos + 1 + buf[pos]
                if nxt > end:
                    raise _Bad
                buf[pos + 1:nxt].decode()
                pos = nxt
            elif kind is _TABLE:
                pos = _table(buf, pos, end, 0)
            else:
                pos += kind
                if pos > end:
                    raise _Bad
    except (_Bad, UnicodeDecodeError, struct.error, IndexError):
        raise _error("malformed property list") from None


def _layout(flags: int) -> tuple | int:
    """The kinds of the properties ``flags`` announces, in order; or, when all of them have
    a fixed size, their total size in octets."""
    kinds = tuple(kind for bit, kind in _BASIC if flags & bit)
    if all(type(k) is int for k in kinds):
        return sum(kinds)
    return kinds


def _error(why: str) -> AMQPError:
    err = hard_error(FRAME_ERROR, f"cannot decode content header: {why}")
    err.class_id = 60
    return err


def _table(buf: bytes, pos: int, end: int, depth: int, keyed: bool = True) -> int:
    """Skip a field table (``keyed``: name, value pairs) or a field array (values) at
    ``pos``: a u32 length, then entries that must end exactly there. Returns the position
    after it."""
    if depth > MAX_DEPTH:
        raise _Bad
    stop = pos + 4 + _U32(buf, pos)[0]
    if stop > end:
        raise _Bad
    pos += 4
    while pos < stop:
        if keyed:
            key_end = pos + 1 + buf[pos]
            if key_end > stop:
                raise _Bad
            buf[pos + 1:key_end].decode()
            pos = key_end
        pos = _value(buf, pos, stop, depth)
    return stop


def _value(buf: bytes, pos: int, end: int, depth: int) -> int:
    """Skip one field value (type octet first) that must end by ``end``."""
    if pos >= end:
        raise _Bad
    kind = buf[pos]
    pos += 1
    size = _FIXED.get(kind)
    if size is not None:
        pos += size
    elif kind in _LONG_BYTES:
        pos += 4 + _U32(buf, pos)[0]
    elif kind == _NESTED_TABLE:
        pos = _table(buf, pos, end, depth + 1)
    elif kind == _ARRAY:
        pos = _table(buf, pos, end, depth + 1, keyed=False)
    else:
        raise _Bad
    if pos > end:
        raise _Bad
    return pos


#: property flag bits of the shortstr properties read by :func:`shortstr_property`
EXPIRATION, USER_ID = 0x0100, 0x0010


def shortstr_property(header: bytes, bit: int) -> bytes | None:
    """The octets of the shortstr property ``bit`` (:data:`EXPIRATION`, :data:`USER_ID`, ...)
    of a content header payload that :func:`check_properties` accepted, or None when the
    flags do not announce it. Builds nothing but the value."""
    flags = (header[12] << 8) | header[13]
    if not flags & bit:
        return None
    pos = 14
    for b, kind in _BASIC:
        if b == bit:
            return bytes(header[pos + 1:pos + 1 + header[pos]])
        if flags & b:
            if kind is _SHORTSTR:
                pos += 1 + header[pos]
            elif kind is _TABLE:
                pos += 4 + _U32(header, pos)[0]
            else:
                pos += kind
    return None
