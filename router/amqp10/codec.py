"""The AMQP 1.0 type system: decoding and encoding values (OASIS AMQP 1.0 part 1, "Types").

Decoded values are plain Python objects: null ``None``, boolean ``bool``, the integer types
``int``, float and double ``float``, timestamp :class:`Timestamp` (ms since the epoch, an
``int``), uuid ``uuid.UUID``, binary ``bytes``, string ``str``, symbol :class:`Symbol` (a
``str``), list and array ``list``, map ``dict``, a described value :class:`Described`. A
decimal or char keeps its type in :class:`Typed`. Encoding needs the type where Python's is
ambiguous: :class:`Symbol`, :class:`Timestamp`, and :class:`Typed` for ``ubyte``, ``uint``,
``ulong`` and the other fixed-width integers (a plain ``int`` encodes as ``long``, a
``str`` as ``string``). A ``bool`` is written in its one-octet form (0x56 0x01 or 0x00), as
RabbitMQ 4 writes ``{boolean, B}`` (a queue's map from its management node, values
converted from AMQP 0-9-1): rhea reads that form as 1 or 0, and RabbitMQ's JavaScript client
compares with 1.

Errors: :class:`DecodeError` for bytes that are not a valid encoding (the connection answers
it with ``amqp:decode-error``, part 2.8.15).
"""
from __future__ import annotations

import struct
import uuid
from typing import Any

_B = struct.Struct(">b").unpack_from
_H = struct.Struct(">H").unpack_from
_h = struct.Struct(">h").unpack_from
_I = struct.Struct(">I").unpack_from
_i = struct.Struct(">i").unpack_from
_Q = struct.Struct(">Q").unpack_from
_q = struct.Struct(">q").unpack_from
_f = struct.Struct(">f").unpack_from
_d = struct.Struct(">d").unpack_from
_II = struct.Struct(">II").unpack_from

#: Compound values nested deeper than this are refused (the decoder recurses).
MAX_DEPTH = 32


class DecodeError(ValueError):
    """Bytes that are not a valid AMQP 1.0 encoding (``amqp:decode-error``)."""


class Symbol(str):
    """An AMQP ``symbol`` (ASCII)."""
    __slots__ = ()


class Timestamp(int):
    """An AMQP ``timestamp``: milliseconds since the Unix epoch."""
    __slots__ = ()


class Typed:
    """A value with its AMQP type named: ``Typed("uint", 5)``, ``Typed("ubyte", 1)``."""
    __slots__ = ("type", "value")

    def __init__(self, type_: str, value: Any) -> None:
        self.type, self.value = type_, value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Typed) and (self.type, self.value) == (other.type, other.value)

    def __hash__(self) -> int:
        return hash((self.type, self.value))

    def __repr__(self) -> str:
        return f"Typed({self.type!r}, {self.value!r})"


class Described:
    """A described value: ``descriptor`` (an ``int`` code or a :class:`Symbol`) and ``value``."""
    __slots__ = ("descriptor", "value")

    def __init__(self, descriptor: Any, value: Any) -> None:
        self.descriptor, self.value = descriptor, value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Described) and \
            (self.descriptor, self.value) == (other.descriptor, other.value)

    def __hash__(self) -> int:
        return hash(self.descriptor)

    def __repr__(self) -> str:
        return f"Described({self.descriptor!r}, {self.value!r})"


# ---- decoding ------------------------------------------------------------------------------
def decode(buf: bytes, pos: int = 0, end: int | None = None) -> tuple[Any, int]:
    """Decode one value at ``buf[pos:end]``: ``(value, position after it)``. Raises
    DecodeError."""
    if end is None:
        end = len(buf)
    try:
        return _value(buf, pos, end, 0)
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise DecodeError(f"malformed value at octet {pos}: {exc}") from None


def _need(pos: int, n: int, end: int) -> int:
    if pos + n > end:
        raise DecodeError("value runs past the end of its frame")
    return pos + n


def _value(buf: bytes, pos: int, end: int, depth: int) -> tuple[Any, int]:
    if pos >= end:
        raise DecodeError("value runs past the end of its frame")
    code = buf[pos]
    pos += 1
    if code == 0x00:                      # described
        if depth > MAX_DEPTH:
            raise DecodeError("values nest too deeply")
        descriptor, pos = _value(buf, pos, end, depth + 1)
        value, pos = _value(buf, pos, end, depth + 1)
        return Described(descriptor, value), pos
    fn = _DECODERS.get(code)
    if fn is None:
        raise DecodeError(f"unknown type code 0x{code:02x}")
    return fn(buf, pos, end, depth)


def _fixed(n: int, unpack):
    def f(buf, pos, end, depth):
        return unpack(buf, pos)[0], _need(pos, n, end)
    return f


def _const(v):
    return lambda buf, pos, end, depth: (v, pos)


def _ubyte(buf, pos, end, depth):
    return buf[pos], _need(pos, 1, end)


def _var(width: int, kind: str):
    def f(buf, pos, end, depth):
        if width == 1:
            n = buf[pos]
        else:
            n = _I(buf, pos)[0]
        start = _need(pos, width, end)
        stop = _need(start, n, end)
        raw = bytes(buf[start:stop])
        if kind == "b":
            return raw, stop
        if kind == "s":
            return raw.decode("utf-8"), stop
        return Symbol(raw.decode("ascii")), stop
    return f


def _compound(width: int, is_map: bool):
    def f(buf, pos, end, depth):
        if width == 1:
            size, count = buf[pos], buf[pos + 1]
        else:
            size, count = _II(buf, pos)
        start = _need(pos, width, end)
        stop = _need(start, size, end)
        if depth > MAX_DEPTH:
            raise DecodeError("values nest too deeply")
        p = start + width
        if count > size:
            raise DecodeError("compound value counts more items than its size holds")
        items = []
        for _ in range(count):
            v, p = _value(buf, p, stop, depth + 1)
            items.append(v)
        if p != stop:
            raise DecodeError("compound value's size does not match its items")
        if not is_map:
            return items, stop
        if count % 2:
            raise DecodeError("map with an odd number of items")
        try:
            return {items[i]: items[i + 1] for i in range(0, count, 2)}, stop
        except TypeError:
            raise DecodeError("map key of an unhashable type") from None
    return f


def _array(width: int):
    def f(buf, pos, end, depth):
        if width == 1:
            size, count = buf[pos], buf[pos + 1]
        else:
            size, count = _II(buf, pos)
        start = _need(pos, width, end)
        stop = _need(start, size, end)
        if depth > MAX_DEPTH:
            raise DecodeError("values nest too deeply")
        p = start + width
        if count > size:
            raise DecodeError("array counts more items than its size holds")
        descriptor = None
        if count and buf[p] == 0x00:
            descriptor, p = _value(buf, p + 1, stop, depth + 1)
        if p >= stop:
            if count:
                raise DecodeError("array without an element constructor")
            return [], stop
        code = buf[p]
        fn = _DECODERS.get(code)
        if fn is None or code == 0x00:
            raise DecodeError(f"unknown array element type 0x{code:02x}")
        p += 1
        items = []
        for _ in range(count):
            v, p = fn(buf, p, stop, depth + 1)
            items.append(v if descriptor is None else Described(descriptor, v))
        return items, stop
    return f


def _uuid(buf, pos, end, depth):
    stop = _need(pos, 16, end)
    return uuid.UUID(bytes=bytes(buf[pos:stop])), stop


def _timestamp(buf, pos, end, depth):
    return Timestamp(_q(buf, pos)[0]), _need(pos, 8, end)


def _typed(type_: str, n: int):
    def f(buf, pos, end, depth):
        stop = _need(pos, n, end)
        return Typed(type_, bytes(buf[pos:stop])), stop
    return f


def _char(buf, pos, end, depth):
    stop = _need(pos, 4, end)
    return Typed("char", chr(_I(buf, pos)[0] & 0x1FFFFF) if _I(buf, pos)[0] < 0x110000
                 else "\ufffd"), stop


_DECODERS: dict[int, Any] = {
    0x40: _const(None), 0x41: _const(True), 0x42: _const(False),
    0x43: _const(0), 0x44: _const(0),
    0x56: lambda buf, pos, end, depth: (bool(buf[pos]), _need(pos, 1, end)),
    0x50: _ubyte, 0x51: _fixed(1, _B), 0x60: _fixed(2, _H), 0x61: _fixed(2, _h),
    0x70: _fixed(4, _I), 0x52: _ubyte, 0x71: _fixed(4, _i),
    0x54: lambda buf, pos, end, depth: (_B(buf, pos)[0], _need(pos, 1, end)),
    0x80: _fixed(8, _Q), 0x53: _ubyte, 0x81: _fixed(8, _q),
    0x55: lambda buf, pos, end, depth: (_B(buf, pos)[0], _need(pos, 1, end)),
    0x72: _fixed(4, _f), 0x82: _fixed(8, _d),
    0x74: _typed("decimal32", 4), 0x84: _typed("decimal64", 8), 0x94: _typed("decimal128", 16),
    0x73: _char, 0x83: _timestamp, 0x98: _uuid,
    0xa0: _var(1, "b"), 0xb0: _var(4, "b"), 0xa1: _var(1, "s"), 0xb1: _var(4, "s"),
    0xa3: _var(1, "y"), 0xb3: _var(4, "y"),
    0x45: _const([]), 0xc0: _compound(1, False), 0xd0: _compound(4, False),
    0xc1: _compound(1, True), 0xd1: _compound(4, True),
    0xe0: _array(1), 0xf0: _array(4),
}


# ---- encoding ------------------------------------------------------------------------------
_pB = struct.Struct(">B").pack
_pb = struct.Struct(">b").pack
_pH = struct.Struct(">H").pack
_ph = struct.Struct(">h").pack
_pI = struct.Struct(">I").pack
_pi = struct.Struct(">i").pack
_pQ = struct.Struct(">Q").pack
_pq = struct.Struct(">q").pack
_pf = struct.Struct(">f").pack
_pd = struct.Struct(">d").pack
_pBB = struct.Struct(">BB").pack
_pII = struct.Struct(">II").pack


def encode(v: Any) -> bytes:
    """The AMQP 1.0 encoding of ``v`` (see the module docstring for the types). Raises
    TypeError for a Python type with no AMQP type."""
    out = bytearray()
    _enc(out, v)
    return bytes(out)


def _enc(out: bytearray, v: Any) -> None:
    t = type(v)
    if v is None:
        out.append(0x40)
    elif t is bool:             # 0x56 as RabbitMQ 4 writes {boolean, B}: rhea reads 1 or 0
        out += b"\x56\x01" if v else b"\x56\x00"
    elif t is Symbol:
        raw = v.encode("ascii")
        _var_out(out, raw, 0xa3, 0xb3)
    elif t is str:
        _var_out(out, v.encode("utf-8"), 0xa1, 0xb1)
    elif t is bytes or t is bytearray or t is memoryview:
        _var_out(out, bytes(v), 0xa0, 0xb0)
    elif t is Timestamp:
        out.append(0x83)
        out += _pq(v)
    elif t is int:
        if -128 <= v <= 127:
            out.append(0x55)
            out += _pb(v)
        elif -(1 << 63) <= v < (1 << 63):
            out.append(0x81)
            out += _pq(v)
        else:
            out.append(0x80)
            out += _pQ(v & ((1 << 64) - 1))
    elif t is float:
        out.append(0x82)
        out += _pd(v)
    elif t is Typed:
        _enc_typed(out, v)
    elif t is Described:
        out.append(0x00)
        d = v.descriptor
        if type(d) is int:
            _ulong(out, d)
        else:
            _enc(out, d)
        _enc(out, v.value)
    elif t is uuid.UUID:
        out.append(0x98)
        out += v.bytes
    elif isinstance(v, (list, tuple)):
        _compound_out(out, v, False)
    elif isinstance(v, dict):
        _compound_out(out, v, True)
    elif isinstance(v, str):
        _var_out(out, v.encode("utf-8"), 0xa1, 0xb1)
    elif isinstance(v, int):
        _enc(out, int(v))
    else:
        raise TypeError(f"no AMQP 1.0 type for {t.__name__}")


def _var_out(out: bytearray, raw: bytes, small: int, large: int) -> None:
    n = len(raw)
    if n < 256:
        out.append(small)
        out.append(n)
    else:
        out.append(large)
        out += _pI(n)
    out += raw


def _compound_out(out: bytearray, v: Any, is_map: bool) -> None:
    body = bytearray()
    if is_map:
        for k, x in v.items():
            _enc(body, k)
            _enc(body, x)
        count = 2 * len(v)
    else:
        if not v:
            out.append(0x45)
            return
        for x in v:
            _enc(body, x)
        count = len(v)
    if len(body) + 1 < 256 and count < 256:
        out.append(0xc1 if is_map else 0xc0)
        out += _pBB(len(body) + 1, count)
    else:
        out.append(0xd1 if is_map else 0xd0)
        out += _pII(len(body) + 4, count)
    out += body


def _ulong(out: bytearray, v: int) -> None:
    if v == 0:
        out.append(0x44)
    elif v < 256:
        out.append(0x53)
        out.append(v)
    else:
        out.append(0x80)
        out += _pQ(v)


def _uint(out: bytearray, v: int) -> None:
    if v == 0:
        out.append(0x43)
    elif v < 256:
        out.append(0x52)
        out.append(v)
    else:
        out.append(0x70)
        out += _pI(v & 0xFFFFFFFF)


def _enc_typed(out: bytearray, v: Typed) -> None:
    t, x = v.type, v.value
    if t == "ulong":
        _ulong(out, x)
    elif t == "uint":
        _uint(out, x)
    elif t in _FIXED_WIDTH:
        code, pack = _FIXED_WIDTH[t]
        out.append(code)
        out += pack(x & 0xFF if t == "ubyte" else x)
    elif t == "char":
        out.append(0x73)
        out += _pI(ord(x))
    elif t in ("decimal32", "decimal64", "decimal128"):
        out.append({"decimal32": 0x74, "decimal64": 0x84, "decimal128": 0x94}[t])
        out += x
    elif t == "array":        # x: (element type name, [values]) of one simple type
        _array_out(out, *x)
    else:
        raise TypeError(f"unknown AMQP type name {t!r}")


#: fixed-width types by name: (constructor code, struct packer)
_FIXED_WIDTH = {"ubyte": (0x50, _pB), "ushort": (0x60, _pH), "byte": (0x51, _pb),
                "short": (0x61, _ph), "int": (0x71, _pi), "long": (0x81, _pq),
                "float": (0x72, _pf)}


def _array_out(out: bytearray, elem: str, values: list) -> None:
    """An array of symbols (``elem`` "symbol"), of maps ("map": RabbitMQ 4's
    ``x-opt-deaths``) or of strings (any other ``elem``)."""
    body = bytearray()
    if elem == "map":
        body.append(0xd1)
        for x in values:
            entries = bytearray()
            for k, v in x.items():
                _enc(entries, k)
                _enc(entries, v)
            body += _pII(len(entries) + 4, 2 * len(x))
            body += entries
    else:
        body.append(0xb3 if elem == "symbol" else 0xb1)
        for x in values:
            raw = x.encode("utf-8")
            body += _pI(len(raw))
            body += raw
    out.append(0xf0)
    out += _pII(len(body) + 4, len(values))
    out += body


def symbols(values: list[str]) -> Typed:
    """An ``array`` of symbols (offered/desired capabilities, SASL mechanisms)."""
    return Typed("array", ("symbol", list(values)))


def uint(v: int) -> Typed:
    return Typed("uint", v)


def ubyte(v: int) -> Typed:
    return Typed("ubyte", v)


def ulong(v: int) -> Typed:
    return Typed("ulong", v)
