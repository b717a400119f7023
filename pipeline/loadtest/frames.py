"""Pre-encoded AMQP 0-9-1 frames and struct parsers for the load tool's hot path.

Frame layout (AMQP 0-9-1 section 2.3.5 / 4.2.3): ``type u8, channel u16, size u32, payload,
0xCE``. A publish is three or more frames: ``basic.publish`` method (class 60, method 40),
content header (type 2: class u16, weight u16, body_size u64, property flags + properties),
then body frames (type 3) of at most ``frame_max - 8`` bytes each.

``PublishTemplate`` encodes all of that once per (queue, size): a message is then
``pre + BODY_HEADER.pack(run_token, producer, sent_ns, seq) + post``. Everything else the tool
receives on the hot path (``basic.deliver``, ``basic.ack``/``basic.nack``, ``basic.return``,
content frames) is parsed with ``struct``; the tests check every builder and parser against
pamqp's full codec.
"""
from __future__ import annotations

import struct

from pamqp import commands
from pamqp import frame as pframe
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from .schema import BODY_HEADER

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = b"\xce"
FRAME_HEAD = struct.Struct(">BHI")     # type, channel, payload size
FRAME_OVERHEAD = FRAME_HEAD.size + 1   # 8 bytes around every payload

CLASS_METHOD = struct.Struct(">HH")
BASIC_DELIVER = (60, 60)
BASIC_ACK = (60, 80)
BASIC_NACK = (60, 120)
BASIC_RETURN = (60, 50)

_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
_ACK_FRAME = struct.Struct(">BHIHHQBB")   # method frame of basic.ack, end byte included
_HEADER_BODY_SIZE = struct.Struct(">HHQ")  # class, weight, body_size


class PublishTemplate:
    """The bytes of one publish of ``size`` body bytes to ``routing_key``, minus the stamp.

    ``frame(run_token, producer, sent_ns, seq)`` returns the full frames of one message;
    ``pre``/``post`` let a producer build a batch with one ``b"".join``. ``size`` is in bytes
    and must be at least ``BODY_HEADER.size`` (24); ``frame_max`` is the negotiated maximum
    frame size in bytes (body frames are split to fit). Raises ``ValueError`` otherwise.
    """

    def __init__(self, channel: int, exchange: str, routing_key: str, size: int,
                 persistent: bool = False, mandatory: bool = False,
                 frame_max: int = 131072) -> None:
        if size < BODY_HEADER.size:
            raise ValueError(f"message size must be at least {BODY_HEADER.size} bytes")
        if frame_max < BODY_HEADER.size + FRAME_OVERHEAD + 1:
            raise ValueError(f"frame_max {frame_max} too small")
        self.size = size
        method = pframe.marshal(commands.Basic.Publish(
            exchange=exchange, routing_key=routing_key, mandatory=mandatory), channel)
        props = commands.Basic.Properties(delivery_mode=2 if persistent else 1)
        header = pframe.marshal(ContentHeader(0, size, props), channel)
        chunk = frame_max - FRAME_OVERHEAD
        pieces = []
        for start in range(0, size, chunk):
            n = min(chunk, size - start)
            pieces.append(FRAME_HEAD.pack(FRAME_BODY, channel, n)
                          + bytes(n if start else n - BODY_HEADER.size) + FRAME_END)
        first = pieces[0]
        self.pre = method + header + first[:FRAME_HEAD.size]
        self.post = first[FRAME_HEAD.size:] + b"".join(pieces[1:])

    def frame(self, run_token: int, producer: int, sent_ns: int, seq: int) -> bytes:
        return self.pre + BODY_HEADER.pack(run_token, producer, sent_ns, seq) + self.post


def body_frames_reference(channel: int, body: bytes, frame_max: int) -> bytes:
    """pamqp's encoding of ``body`` as body frames (for tests)."""
    chunk = frame_max - FRAME_OVERHEAD
    return b"".join(pframe.marshal(ContentBody(body[i:i + chunk]), channel)
                    for i in range(0, len(body), chunk))


def encode_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """A ``basic.ack`` method frame (client -> broker), 21 bytes."""
    return _ACK_FRAME.pack(FRAME_METHOD, channel, 13, 60, 80, delivery_tag, int(multiple),
                           0xCE)


def split_frames(buf: bytes | bytearray, start: int = 0):
    """Yield ``(frame_type, channel, payload_start, payload_end)`` for every complete frame
    of ``buf`` from ``start``; the caller keeps ``buf[consumed:]``, where ``consumed`` is the
    last ``payload_end + 1`` (see ``FrameSplitter``). Raises ``ValueError`` on a bad frame end.
    """
    n = len(buf)
    unpack = FRAME_HEAD.unpack_from
    while n - start >= 8:
        ftype, channel, size = unpack(buf, start)
        end = start + 7 + size
        if end >= n:
            return
        if buf[end] != 0xCE:
            raise ValueError(f"bad frame end byte at offset {end}")
        yield ftype, channel, start + 7, end
        start = end + 1


def parse_deliver(payload, offset: int = 4) -> tuple[bytes, int, bool, bytes, bytes]:
    """Fields of a ``basic.deliver`` payload after class/method ids: ``(consumer_tag,
    delivery_tag, redelivered, exchange, routing_key)`` (shortstrs as bytes)."""
    n = payload[offset]
    tag = bytes(payload[offset + 1:offset + 1 + n])
    offset += 1 + n
    delivery_tag, = _U64.unpack_from(payload, offset)
    redelivered = bool(payload[offset + 8] & 1)
    offset += 9
    n = payload[offset]
    exchange = bytes(payload[offset + 1:offset + 1 + n])
    offset += 1 + n
    n = payload[offset]
    routing_key = bytes(payload[offset + 1:offset + 1 + n])
    return tag, delivery_tag, redelivered, exchange, routing_key


def parse_ack(payload, offset: int = 4) -> tuple[int, bool]:
    """``(delivery_tag, multiple)`` of a ``basic.ack`` or ``basic.nack`` payload."""
    delivery_tag, = _U64.unpack_from(payload, offset)
    return delivery_tag, bool(payload[offset + 8] & 1)


def parse_return(payload, offset: int = 4) -> tuple[int, bytes, bytes, bytes]:
    """``(reply_code, reply_text, exchange, routing_key)`` of a ``basic.return`` payload."""
    code, = _U16.unpack_from(payload, offset)
    offset += 2
    out = []
    for _ in range(3):
        n = payload[offset]
        out.append(bytes(payload[offset + 1:offset + 1 + n]))
        offset += 1 + n
    return code, out[0], out[1], out[2]


def parse_header_body_size(payload, offset: int = 0) -> int:
    """``body_size`` (bytes) of a content header payload."""
    return _HEADER_BODY_SIZE.unpack_from(payload, offset)[2]
