"""A message's ``headers`` table read and rewritten entry by entry, on the raw content-header
payload (the node's dead letters and stream offsets, the router's CC and BCC): what the publisher wrote stays as
the bytes it sent, and what the broker adds is written with RabbitMQ's field types.

Decoding a field table into Python values and encoding it again loses the publisher's types
(pamqp writes the smallest integer type: a Java client's long 5 would come back as a byte,
and its code casting ``x-death``'s ``count`` to Long would fail). RabbitMQ keeps each header's
type, and writes ``x-death`` with ``count`` as a signed 64-bit integer ('l'), ``time`` as a
timestamp ('T'), names as long strings ('S') and ``routing-keys`` as an array of them.

Field types are the 0-9-1 spec's as RabbitMQ reads them (its errata: 's' is a short int,
'u' a short uint, 'l' a long long). :func:`splice_headers` returns None for a table it cannot
split; callers then fall back to re-encoding.
"""
from __future__ import annotations

import datetime
import struct
from typing import Any

from pamqp import encode

#: the first three property flags of the ``basic`` class (spec 1.8: content-type,
#: content-encoding, headers, in that order)
F_CONTENT_TYPE = 0x8000
F_CONTENT_ENCODING = 0x4000
F_HEADERS = 0x2000

#: type octet -> size of its value (fixed-size types)
_FIXED = {0x74: 1, 0x62: 1, 0x42: 1, 0x73: 2, 0x75: 2, 0x49: 4, 0x69: 4, 0x6C: 8, 0x4C: 8,
          0x66: 4, 0x64: 8, 0x44: 5, 0x54: 8, 0x56: 0}
_SIZED = frozenset(b"SFAx")     # a 4-octet length, then that many octets
_U32 = struct.Struct(">I")


class Long(int):
    """An integer written as a signed 64-bit field ('l'), as RabbitMQ writes counts."""


def _value_end(raw: bytes, pos: int, end: int) -> int:
    """Where the field value whose type octet is at ``pos`` ends. Raises ValueError."""
    kind = raw[pos]
    pos += 1
    if kind in _FIXED:
        pos += _FIXED[kind]
    elif kind in _SIZED:
        pos += 4 + _U32.unpack_from(raw, pos)[0]
    else:
        raise ValueError(f"unknown field type {chr(kind)!r}")
    if pos > end:
        raise ValueError("field runs past its table or array")
    return pos


def split_table(raw: bytes) -> list[tuple[str, bytes]]:
    """A field table's content (without its length) as ``[(key, type octet + value)]``.
    Raises ValueError on a table that does not parse."""
    out, pos, end = [], 0, len(raw)
    while pos < end:
        klen = raw[pos]
        key = raw[pos + 1:pos + 1 + klen].decode("utf-8")
        start = pos + 1 + klen
        pos = _value_end(raw, start, end)
        out.append((key, raw[start:pos]))
    return out


def split_array(raw: bytes) -> list[bytes]:
    """A field array's content (without its length) as its items, each a type octet and its
    value. Raises ValueError on an array that does not parse."""
    out, pos, end = [], 0, len(raw)
    while pos < end:
        start, pos = pos, _value_end(raw, pos, end)
        out.append(raw[start:pos])
    return out


def array_items(value: bytes) -> list[bytes] | None:
    """The items (type octet and value each) of a field value given as its type octet and
    value, when that is an array ('A'); None for any other value, or an array that does not
    parse."""
    if value[:1] != b"A":
        return None
    try:
        return split_array(value[5:5 + _U32.unpack_from(value, 1)[0]])
    except (IndexError, ValueError, struct.error):
        return None


def array_of(items: list[bytes]) -> bytes:
    """A field array ('A', length, items) of items already encoded (type octet and value)."""
    data = b"".join(items)
    return b"A" + _U32.pack(len(data)) + data


def array_strings(value: bytes) -> list[str]:
    """The long-string items ('S') of a field value given as its type octet and value, when
    that is an array ('A'); other items are left out. [] for any other value, or an array
    that does not parse."""
    return [item[5:].decode("utf-8", "replace") for item in array_items(value) or ()
            if item[:1] == b"S"]


def text(value: Any) -> Any:
    """A decoded field value as text when it came as bytes (pamqp decodes a long string
    that is not valid UTF-8, and RabbitMQ's binary 'x', as bytes), else as it is."""
    return bytes(value).decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) \
        else value


def typed(value: Any) -> bytes:
    """``value`` as a type octet and its encoding: :class:`Long` as 'l', str as 'S',
    datetimes as 'T', lists and dicts item by item (so Longs inside stay 'l'), anything else
    as pamqp chooses."""
    if isinstance(value, Long):
        return b"l" + struct.pack(">q", value)
    if isinstance(value, str):
        data = value.encode("utf-8")
        return b"S" + _U32.pack(len(data)) + data
    if isinstance(value, datetime.datetime):
        return b"T" + struct.pack(">Q", int(value.timestamp()))
    if isinstance(value, list):
        data = b"".join(typed(v) for v in value)
        return b"A" + _U32.pack(len(data)) + data
    if isinstance(value, dict):
        data = table(list(value.items()))
        return b"F" + _U32.pack(len(data)) + data
    return encode.encode_table_value(value)


def table(entries: list[tuple[str, Any]]) -> bytes:
    """A table's content from ``(key, value)`` pairs, a value given as ``bytes`` taken as
    already encoded (type octet and value)."""
    out = []
    for key, value in entries:
        k = key.encode("utf-8")
        out.append(bytes((len(k),)) + k + (value if isinstance(value, bytes) else typed(value)))
    return b"".join(out)


def _headers_at(header: bytes) -> int:
    """Where the headers field is, or would be, in a content-header payload."""
    flags = (header[12] << 8) | header[13]
    pos = 14
    if flags & F_CONTENT_TYPE:
        pos += 1 + header[pos]
    if flags & F_CONTENT_ENCODING:
        pos += 1 + header[pos]
    return pos


def raw_headers(header: bytes) -> list[tuple[str, bytes]] | None:
    """The ``headers`` entries of a content-header payload as :func:`split_table` gives
    them ([] without headers), or None when they do not parse."""
    try:
        if not (header[13] | (header[12] << 8)) & F_HEADERS:
            return []
        pos = _headers_at(header)
        n = _U32.unpack_from(header, pos)[0]
        return split_table(header[pos + 4:pos + 4 + n])
    except (IndexError, ValueError, struct.error, UnicodeDecodeError):
        return None


def splice_headers(encoded: bytes, entries: list[tuple[str, Any]]) -> bytes:
    """``encoded`` (a content-header payload encoded without a headers field) with a headers
    table of ``entries`` (see :func:`table`) put in its place."""
    data = table(entries)
    pos = _headers_at(encoded)
    flags = ((encoded[12] << 8) | encoded[13]) | F_HEADERS
    return (encoded[:12] + bytes((flags >> 8, flags & 0xFF)) + encoded[14:pos] +
            _U32.pack(len(data)) + data + encoded[pos:])


def add_header(header: bytes, key: str, value: Any) -> bytes:
    """``header`` (a content-header payload) with one more entry ``key`` = ``value`` (see
    :func:`table`) at the end of its headers table, every other byte as it was; a header
    without a headers field gets one. Cheap: no property is decoded (a stream's
    ``x-stream-offset`` on every delivery)."""
    flags = (header[12] << 8) | header[13]
    if not flags & F_HEADERS:
        return splice_headers(header, [(key, value)])
    entry = table([(key, value)])
    pos = _headers_at(header)
    n = _U32.unpack_from(header, pos)[0]
    end = pos + 4 + n
    return header[:pos] + _U32.pack(n + len(entry)) + header[pos + 4:end] + entry + \
        header[end:]


def without_headers(header: bytes, keys: frozenset[str]) -> bytes:
    """``header`` (a content-header payload) with the entries named in ``keys`` taken out of
    its headers table, every other byte as it was (an emptied table stays, empty). Raises
    ValueError when its headers do not parse."""
    entries = raw_headers(header)
    if entries is None:
        raise ValueError("headers table does not parse")
    pos = _headers_at(header)
    end = pos + 4 + _U32.unpack_from(header, pos)[0]
    data = table([(k, v) for k, v in entries if k not in keys])
    return header[:pos] + _U32.pack(len(data)) + data + header[end:]
