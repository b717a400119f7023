"""AMQP 1.0 frames and performatives (OASIS AMQP 1.0 part 2, "Transport"; part 5, "SASL").

A frame is ``size (u32) | doff (u8) | type (u8: 0 AMQP, 1 SASL) | channel (u16)``, an extended
header of ``doff * 4 - 8`` octets, then a body: a performative (a described list) and, for
``transfer``, the payload octets after it. :func:`parse_body` turns a body into a
:class:`Performative` and its payload; :func:`frame` builds one frame's octets.

Each performative is a :class:`Performative` subclass with its fields as attributes in spec
order (``Open.container_id`` ...), absent trailing fields ``None``; the ``_types`` tuple names
how each field is encoded (part 2.7 and part 5.3.3 field types).
"""
from __future__ import annotations

import struct
from typing import Any

from shoal.router.amqp10.codec import (Described, DecodeError, Symbol, Typed, _enc, _enc_typed,
                                       _ulong, _value, decode)
from shoal.router.amqp10.codec import _uint as _uint_out

HEADER_AMQP = b"AMQP\x00\x01\x00\x00"
HEADER_SASL = b"AMQP\x03\x01\x00\x00"
HEADER_TLS = b"AMQP\x02\x01\x00\x00"
FRAME_AMQP, FRAME_SASL = 0, 1
MIN_MAX_FRAME_SIZE = 512                    #: part 2.7.1: no peer may ask for less
EMPTY_FRAME = b"\x00\x00\x00\x08\x02\x00\x00\x00"   #: the heartbeat (part 2.4.5)

_FRAME = struct.Struct(">IBBH")


class Performative:
    """A described list: ``descriptor`` is its code, ``_fields`` its fields in order."""
    __slots__ = ()
    descriptor = 0
    label = ""
    _fields: tuple[str, ...] = ()
    _types: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kw: Any) -> None:
        for i, f in enumerate(self._fields):
            setattr(self, f, args[i] if i < len(args) else kw.get(f))

    @classmethod
    def from_list(cls, values: list) -> "Performative":
        obj = cls.__new__(cls)
        n = len(values)
        for i, f in enumerate(cls._fields):
            setattr(obj, f, values[i] if i < n else None)
        return obj

    def encode_into(self, out: bytearray) -> None:
        values = [getattr(self, f) for f in self._fields]
        while values and values[-1] is None:
            values.pop()
        body = bytearray()
        for v, t in zip(values, self._types):
            _field(body, v, t)
        out.append(0x00)
        _ulong(out, self.descriptor)
        if not values:
            out.append(0x45)
        elif len(body) + 1 < 256:
            out += bytes((0xc0, len(body) + 1, len(values)))
        else:
            out.append(0xd0)
            out += struct.pack(">II", len(body) + 4, len(values))
        out += body

    def encode(self) -> bytes:
        out = bytearray()
        self.encode_into(out)
        return bytes(out)

    def __repr__(self) -> str:
        shown = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields
                          if getattr(self, f) is not None)
        return f"{self.label}({shown})"


def _field(out: bytearray, v: Any, t: str) -> None:
    """Encode field value ``v`` as type ``t``. A value of the wrong type (a client's field
    echoed back, say) is encoded as null rather than as something the type forbids."""
    if v is None:
        out.append(0x40)
    elif type(v) is Typed:
        _enc_typed(out, v)
    elif t == "any":
        if isinstance(v, Performative):
            v.encode_into(out)
        else:
            try:
                _enc(out, v)
            except TypeError:
                out.append(0x40)
    elif t == "symarray":
        if isinstance(v, (list, tuple)) and all(isinstance(x, str) and x.isascii() for x in v):
            _enc_typed(out, Typed("array", ("symbol", [str(x) for x in v])))
        elif isinstance(v, str) and v.isascii():
            _enc(out, Symbol(v))
        else:
            out.append(0x40)
    elif t == "symbol":
        if isinstance(v, str) and v.isascii():
            _enc(out, Symbol(v))
        else:
            out.append(0x40)
    elif t == "bool":
        out.append((0x41 if v else 0x42) if type(v) is bool else 0x40)
    elif type(v) is int and 0 <= v < _LIMITS[t]:    # uint, ushort, ubyte, ulong
        _enc_typed(out, Typed(t, v))
    else:
        out.append(0x40)


_LIMITS = {"ubyte": 1 << 8, "ushort": 1 << 16, "uint": 1 << 32, "ulong": 1 << 64}


_REGISTRY: dict[Any, type[Performative]] = {}


def _performative(name: str, code: int, fields: str) -> type[Performative]:
    """A Performative subclass; ``fields``: "name:type ..." in spec order."""
    pairs = [f.split(":") for f in fields.split()]
    cls = type(name.title().replace("-", ""), (Performative,), {
        "__slots__": tuple(p[0] for p in pairs), "descriptor": code, "label": name,
        "_fields": tuple(p[0] for p in pairs), "_types": tuple(p[1] for p in pairs)})
    if pairs:
        cls.from_list = classmethod(_from_list_of(cls._fields))  # type: ignore[method-assign]
    _REGISTRY[code] = cls
    _REGISTRY[Symbol(f"amqp:{name}:list")] = cls
    return cls


def _from_list_of(fields: tuple[str, ...]) -> Any:
    """``from_list`` for a performative with these fields, written out (as namedtuple writes
    its methods): one unpacking assignment instead of a setattr per field, since every frame
    a client sends goes through it."""
    n = len(fields)
    src = (f"def from_list(cls, values):\n"
           f"    obj = cls.__new__(cls)\n"
           f"    if len(values) < {n}:\n"
           f"        values = list(values) + [None] * ({n} - len(values))\n"
           f"    {', '.join('obj.' + f for f in fields)}, = values[:{n}]\n"
           f"    return obj\n")
    ns: dict[str, Any] = {}
    exec(src, ns)                           # noqa: S102 - fields are this module's constants
    return ns["from_list"]


# part 2.7: the transport performatives
Open = _performative("open", 0x10, "container_id:any hostname:any max_frame_size:uint "
                     "channel_max:ushort idle_time_out:uint outgoing_locales:symarray "
                     "incoming_locales:symarray offered_capabilities:symarray "
                     "desired_capabilities:symarray properties:any")
Begin = _performative("begin", 0x11, "remote_channel:ushort next_outgoing_id:uint "
                      "incoming_window:uint outgoing_window:uint handle_max:uint "
                      "offered_capabilities:symarray desired_capabilities:symarray "
                      "properties:any")
Attach = _performative("attach", 0x12, "name:any handle:uint role:bool snd_settle_mode:ubyte "
                       "rcv_settle_mode:ubyte source:any target:any unsettled:any "
                       "incomplete_unsettled:bool initial_delivery_count:uint "
                       "max_message_size:ulong offered_capabilities:symarray "
                       "desired_capabilities:symarray properties:any")
Flow = _performative("flow", 0x13, "next_incoming_id:uint incoming_window:uint "
                     "next_outgoing_id:uint outgoing_window:uint handle:uint "
                     "delivery_count:uint link_credit:uint available:uint drain:bool "
                     "echo:bool properties:any")
Transfer = _performative("transfer", 0x14, "handle:uint delivery_id:uint delivery_tag:any "
                         "message_format:uint settled:bool more:bool rcv_settle_mode:ubyte "
                         "state:any resume:bool aborted:bool batchable:bool")
Disposition = _performative("disposition", 0x15, "role:bool first:uint last:uint settled:bool "
                            "state:any batchable:bool")
Detach = _performative("detach", 0x16, "handle:uint closed:bool error:any")
End = _performative("end", 0x17, "error:any")
Close = _performative("close", 0x18, "error:any")
Error = _performative("error", 0x1d, "condition:symbol description:any info:any")
# part 3.5: source, target and the delivery states
Source = _performative("source", 0x28, "address:any durable:uint expiry_policy:symbol "
                       "timeout:uint dynamic:bool dynamic_node_properties:any "
                       "distribution_mode:symbol filter:any default_outcome:any "
                       "outcomes:symarray capabilities:symarray")
Target = _performative("target", 0x29, "address:any durable:uint expiry_policy:symbol "
                       "timeout:uint dynamic:bool dynamic_node_properties:any "
                       "capabilities:symarray")
Received = _performative("received", 0x23, "section_number:uint section_offset:ulong")
Accepted = _performative("accepted", 0x24, "")
Rejected = _performative("rejected", 0x25, "error:any")
Released = _performative("released", 0x26, "")
Modified = _performative("modified", 0x27, "delivery_failed:bool undeliverable_here:bool "
                         "message_annotations:any")
# part 5.3.3: SASL frames
SaslMechanisms = _performative("sasl-mechanisms", 0x40, "sasl_server_mechanisms:symarray")
SaslInit = _performative("sasl-init", 0x41, "mechanism:symbol initial_response:any "
                         "hostname:any")
SaslChallenge = _performative("sasl-challenge", 0x42, "challenge:any")
SaslResponse = _performative("sasl-response", 0x43, "response:any")
SaslOutcome = _performative("sasl-outcome", 0x44, "code:ubyte additional_data:any")

ROLE_SENDER, ROLE_RECEIVER = False, True
SND_UNSETTLED, SND_SETTLED, SND_MIXED = 0, 1, 2
RCV_FIRST, RCV_SECOND = 0, 1


def lift(value: Any) -> Any:
    """A decoded value, with a described list of a known descriptor (error, source, target,
    a delivery state) made its Performative; anything else unchanged."""
    if type(value) is Described:
        cls = _registered(value.descriptor)
        if cls is not None and type(value.value) is list:
            return cls.from_list(value.value)
    return value


def _registered(descriptor: Any) -> type[Performative] | None:
    """The Performative class of a descriptor (a code or a symbol); None for anything else,
    a list or a map included."""
    t = type(descriptor)
    return _REGISTRY.get(descriptor) if t is int or t is Symbol else None


def parse_body(buf: bytes, start: int, end: int) -> tuple[Performative, int]:
    """The performative at ``buf[start:end]`` and where its payload starts. Raises
    DecodeError for a body that is not a known performative."""
    if end - start > 5 and buf[start] == 0x00 and buf[start + 1] == 0x53 \
            and buf[start + 3] == 0xc0:
        cls = _HOT.get(buf[start + 2])
        if cls is not None:
            done = _parse_hot(cls, buf, start + 4, end)
            if done is not None:
                return done
    value, pos = decode(buf, start, end)
    if type(value) is not Described:
        raise DecodeError("frame body is not a described performative")
    cls = _registered(value.descriptor)
    if cls is None or cls.descriptor not in _FRAME_BODIES or type(value.value) is not list:
        raise DecodeError(f"frame body is not a performative: {value.descriptor!r}")
    perf = cls.from_list(value.value)
    for f in _LIFTED[cls]:
        setattr(perf, f, lift(getattr(perf, f)))
    return perf, pos


def _parse_hot(cls: type[Performative], buf: bytes, pos: int,
               end: int) -> tuple[Performative, int] | None:
    """The fast path of :func:`parse_body` for the performatives of every message (flow,
    transfer, disposition) as clients encode them: a list8 of small scalars, a delivery
    state decoded by the codec. The same result as the general path; None when the body
    is anything else or malformed (the general path then decodes it, or raises)."""
    try:
        stop = pos + 1 + buf[pos]
        count = buf[pos + 1]
        if stop > end or count > len(cls._fields):
            return None
        q = pos + 2
        lifted = _LIFTED_AT[cls]
        values: list = []
        add = values.append
        for _ in range(count):
            code = buf[q]
            if code == 0x52:                    # smalluint
                add(buf[q + 1])
                q += 2
            elif code == 0x43:                  # uint0
                add(0)
                q += 1
            elif code == 0x40:
                add(None)
                q += 1
            elif code == 0x42:
                add(False)
                q += 1
            elif code == 0x41:
                add(True)
                q += 1
            elif code == 0x70:                  # uint
                add(_UINT(buf, q + 1)[0])
                q += 5
            elif code == 0xa0:                  # vbin8: a delivery tag
                n = buf[q + 1]
                add(bytes(buf[q + 2:q + 2 + n]))
                q += 2 + n
            elif code == 0x00 and buf[q + 1] == 0x53 and buf[q + 3] == 0x45 \
                    and len(values) in lifted:  # accepted, released: a described list0
                state = _REGISTRY.get(buf[q + 2])
                add(state.from_list([]) if state is not None
                    else Described(buf[q + 2], []))
                q += 4
            else:                               # anything rarer
                v, q = _value(buf, q, stop, 1)
                add(lift(v) if len(values) in lifted else v)
            if q > stop:
                return None
        if q != stop:
            return None
    except (IndexError, struct.error, DecodeError):
        return None
    return cls.from_list(values), stop


_UINT = struct.Struct(">I").unpack_from
_LIFTED = {cls: tuple(f for f in ("error", "source", "target", "state") if f in cls._fields)
           for cls in set(_REGISTRY.values())}
_LIFTED_AT = {cls: {cls._fields.index(f) for f in fields} for cls, fields in _LIFTED.items()}
_HOT = {0x13: Flow, 0x14: Transfer, 0x15: Disposition}

_FRAME_BODIES = {0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18,
                 0x40, 0x41, 0x42, 0x43, 0x44}


def frame(channel: int, perf: Performative, payload: bytes = b"",
          kind: int = FRAME_AMQP) -> bytes:
    """One frame's octets: ``perf`` on ``channel``, then ``payload``."""
    body = bytearray(b"\x00" * 8)
    perf.encode_into(body)
    body += payload
    _FRAME.pack_into(body, 0, len(body), 2, kind, channel)
    return bytes(body)


def transfer_frame(channel: int, handle: int, delivery_id: int, tag: bytes, settled: bool,
                   more: bool, payload: bytes) -> bytes:
    """A delivery's first ``transfer`` frame, encoded directly (the hot path: the same octets
    as ``frame(channel, Transfer(handle, delivery_id, tag, 0, settled, more), payload)``)."""
    fields = bytearray()
    _uint_out(fields, handle)
    _uint_out(fields, delivery_id)
    fields.append(0xa0)
    fields.append(len(tag))
    fields += tag
    fields.append(0x43)                     # message-format 0
    fields.append(0x41 if settled else 0x42)
    count = 5
    if more:
        fields.append(0x41)
        count = 6
    head = _FRAME.pack(11 + 3 + len(fields) + len(payload), 2, FRAME_AMQP, channel)
    return b"".join((head, b"\x00\x53\x14\xc0", bytes((len(fields) + 1, count)), fields,
                     payload))


def error(condition: str, description: str = "", info: dict | None = None) -> Performative:
    """An ``error`` (part 2.8.14) with ``condition`` (``amqp:not-found`` ...)."""
    return Error(condition, description or None, info)
