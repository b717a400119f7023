"""AMQP 0-9-1 frame constants and frame writing (spec section 2.3.5 "Frame Details", 4.2.3).

A frame is ``type:octet channel:short size:long payload:size-octets frame-end:0xCE``; the
negotiated ``frame_max`` bounds the *whole* frame (7 header octets + payload + end octet).
Reading frames lives in :mod:`.connection` (one loop, struct on the receive buffer); the hot
frames are built in :mod:`.fastpath`.
"""
from __future__ import annotations

import struct

from pamqp import commands, frame as pamqp_frame

from shoal.shared.errors import AMQPError, FRAME_ERROR, NOT_IMPLEMENTED, hard_error

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
FRAME_HEADER_SIZE = 7
#: header (7) + end octet (1): payload size = frame size - FRAME_OVERHEAD
FRAME_OVERHEAD = 8
#: how far past frame_max a frame received may run, as RabbitMQ allows (rabbit_reader's
#: FRAME_SIZE_FUDGE: clients are often off by 1 or by the 8 octets of framing, e.g.
#: AMQPStorm's body frames of frame_max octets): a payload of up to frame_max octets is read.
#: Frames Shoal sends keep to frame_max.
FRAME_SIZE_FUDGE = FRAME_OVERHEAD


def payload_limit(frame_max: int) -> int:
    """The largest payload (octets) read from a peer that negotiated ``frame_max`` (octets,
    whole frame): frame_max less the framing, plus :data:`FRAME_SIZE_FUDGE`."""
    return frame_max - FRAME_OVERHEAD + FRAME_SIZE_FUDGE


def frame_limit(max_payload: int) -> int:
    """The frame_max (octets) whose :func:`payload_limit` is ``max_payload``."""
    return max_payload + FRAME_OVERHEAD - FRAME_SIZE_FUDGE


#: spec 4.2.3: peers must accept frames up to this size before and after tuning
FRAME_MIN_SIZE = 4096

#: spec 4.2.2: what a 0-9-1 client sends first, and what we answer a bad header with.
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
#: the headers served as 0-9-1: its own, and AMQP 0-9's ``AMQP 1 1 0 9``, which RabbitMQ
#: serves as 0-9-1 too (rabbit_reader ``handshake({1, 1, 0, 9})``; Perl's
#: AnyEvent::RabbitMQ sends it). 0-8's headers are refused: Shoal speaks no 0-8.
ACCEPTED_HEADERS = (PROTOCOL_HEADER, b"AMQP\x01\x01\x00\x09")

HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"

FRAME_TYPES = frozenset({FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT})

#: ``>BHI``: frame type, channel, payload size.
FRAME_HEADER_STRUCT = struct.Struct(">BHI")
pack_frame_header = FRAME_HEADER_STRUCT.pack
unpack_frame_header = FRAME_HEADER_STRUCT.unpack_from


def decode_method(method_id: int, payload: bytes):
    """Decode a method frame payload (after the 4 class/method octets) with pamqp.

    Returns the ``pamqp.commands`` object. Raises AMQPError 540 NOT_IMPLEMENTED (hard) for an
    unknown class/method id, 501 FRAME_ERROR (hard) when pamqp cannot decode the arguments
    (spec 4.2.6; RabbitMQ answers ``FRAME_ERROR - cannot decode``).
    """
    cls = commands.INDEX_MAPPING.get(method_id)
    if cls is None:
        raise _with_ids(hard_error(NOT_IMPLEMENTED, f"unknown method: class {method_id >> 16},"
                                                    f" method {method_id & 0xFFFF}"), method_id)
    method = cls()
    pamqp_guard(method.unmarshal, payload, what=cls.name, method_id=method_id)
    return method


def pamqp_guard(decode, data, what: str, method_id: int = 0, code: int = FRAME_ERROR):
    """THE one broad guard: run a pamqp decoder on client bytes and turn whatever it raises
    (struct.error, ValueError, UnicodeDecodeError, KeyError, ...) into a hard AMQPError
    ``code``: 501 FRAME_ERROR for frame contents, as RabbitMQ does ("cannot decode"). Returns what ``decode`` returns."""
    try:
        return decode(data)
    except Exception as exc:  # noqa: BLE001 - pamqp raises assorted decode errors
        err = hard_error(code, f"cannot decode {what}: {type(exc).__name__}")
        raise _with_ids(err, method_id) from None


def _with_ids(err: AMQPError, method_id: int) -> AMQPError:
    err.class_id, err.method_id = method_id >> 16, method_id & 0xFFFF
    return err


def method_frame(channel: int, method) -> bytes:
    """One method frame for a pamqp method object (``pamqp.commands.*``).

    Raises ValueError/TypeError (programming errors) when pamqp cannot encode ``method``.
    """
    return pamqp_frame.marshal(method, channel)


def frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    """One frame of ``frame_type`` carrying ``payload`` (bytes-like)."""
    return b"".join((pack_frame_header(frame_type, channel, len(payload)), payload,
                     FRAME_END_BYTE))


#: channel.open-ok's payload as RabbitMQ sends it: class 20, method 11, an empty longstr
#: (the reserved ``channel-id``). pamqp's ``Channel.OpenOk`` writes "0" there and refuses an
#: empty one; clients that skip the field as empty (@cloudamqp/amqp-client) then misread the
#: rest of the read as another frame.
CHANNEL_OPEN_OK_PAYLOAD = b"\x00\x14\x00\x0b\x00\x00\x00\x00"


def channel_open_ok(channel: int) -> bytes:
    """The channel.open-ok frame for ``channel`` (spec 1.5.2.2), as RabbitMQ writes it."""
    return frame(FRAME_METHOD, channel, CHANNEL_OPEN_OK_PAYLOAD)


_SHORTSTR_CACHE: dict[str, bytes] = {}
_SHORTSTR_CACHE_MAX = 4096


def shortstr(value: str) -> bytes:
    """``value`` encoded as an AMQP shortstr (length octet + UTF-8), cached.

    Raises ValueError if the UTF-8 form is longer than 255 octets (spec 4.2.5.3).
    """
    enc = _SHORTSTR_CACHE.get(value)
    if enc is None:
        raw = value.encode("utf-8")
        if len(raw) > 255:
            raise ValueError(f"shortstr longer than 255 octets: {value[:40]!r}...")
        enc = bytes((len(raw),)) + raw
        if len(_SHORTSTR_CACHE) >= _SHORTSTR_CACHE_MAX:
            _SHORTSTR_CACHE.clear()
        _SHORTSTR_CACHE[value] = enc
    return enc
