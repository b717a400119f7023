"""A stream's chunk: the unit a stream writes, replicates and reads.

The layout is Osiris's (RabbitMQ's stream log, ``osiris_log.erl``'s "Chunk format"), so
that the RabbitMQ Stream protocol's deliveries (port 5552, a later issue) can send a stored
chunk as it is. All integers are big-endian; times are epoch ms:

=====  ============================================================================
bytes  field
=====  ============================================================================
1      magic 5 (high 4 bits) and version 0 (low 4 bits): ``0x50``
1      chunk type: 0 user (:data:`USER`); 1, 2 Osiris's tracking chunks (unused here)
2      number of entries (here one entry per record: simple entries)
4      number of records
8      timestamp (signed): the writer's clock when it wrote the chunk
8      epoch (unsigned): the writer's term (the leader's epoch)
8      chunk id (unsigned): the offset of the chunk's first record
4      CRC-32 of the data entries (zlib's, as ``erlang:crc32``)
4      data length (bytes)
4      trailer length (bytes)
1      bloom filter size (bytes; 0 when no record has a filter value)
3      reserved (0)
=====  ============================================================================

then the bloom filter, then the data entries: each a simple entry, a 4-byte length whose top
bit is 0 and then the record (:func:`encode_record`), then the trailer.

The trailer says which publishes the chunk holds, so that one sent again after a leader
change is stored once (Osiris's writer deduplication; docs/streams.md, "A publish sent
again"). Osiris's trailer entries are ``type (1 byte), writer id size (1), writer id,
sequence (8)`` with types 0-2 (a writer's last sequence, an offset, a timestamp); Shoal's
use types of their own, :data:`TRK_SENT` and :data:`TRK_RESENT`, and hold every sequence:
``type (1), writer id size (1), writer id, count (4), count x sequence (8)``. A writer is a
router process (its random id), a sequence its publish id: first sent (TRK_SENT), or sent
again (TRK_RESENT).

The bloom filter holds each record's filter value (``x-stream-filter-value``; RabbitMQ's
stream filtering): bit 0 says the chunk has a record without one, and each value sets two
bits (osiris_bloom.erl's layout; the hash is ours, CRC-32 based, as nothing outside the
broker reads it). A reader with a filter skips a chunk whose bloom cannot match, then
checks each record's own value (RabbitMQ does the same: the bloom has false positives).
"""
from __future__ import annotations

import struct
import zlib
from typing import Iterable, Iterator

HEADER = struct.Struct(">BBHIqQQIIIB3x")
HEADER_SIZE = HEADER.size           # 48, as Osiris's HEADER_SIZE_B
MAGIC_VERSION = 0x50
USER = 0
#: Shoal's own chunk type: a replication log entry that is not a publish (a new leader's
#: empty entry, a membership change: node/streams/replica.py). It holds one entry and no
#: record, so it takes no offset (its chunk id is the next chunk's): offsets stay dense, as
#: RabbitMQ's, and a lookup by offset finds the USER chunk written after it.
CONTROL = 0x10
#: x-stream-filter-size-bytes: RabbitMQ's default and bounds (osiris_bloom.erl)
DEFAULT_FILTER_SIZE = 16
MIN_FILTER_SIZE = 16
MAX_FILTER_SIZE = 255
_ENTRY = struct.Struct(">I")
_RECORD = struct.Struct(">BBHHI")
#: trailer entry types (above): a writer's publishes sent for the first time, and sent again
TRK_SENT = 0x10
TRK_RESENT = 0x11
_TRK = struct.Struct(">BB")
_COUNT = struct.Struct(">I")


class ChunkError(ValueError):
    """Bytes that are not a whole, valid chunk (a torn write, a wrong magic, a bad CRC)."""


class ChunkHeader:
    """A chunk's parsed header (the fields of the table above); ``size`` is the whole
    chunk's length in bytes and ``data_at`` where its data entries start."""

    __slots__ = ("type", "entries", "records", "timestamp", "epoch", "chunk_id", "crc",
                 "data_length", "trailer_length", "bloom_size")

    def __init__(self, raw: bytes | memoryview) -> None:
        if len(raw) < HEADER_SIZE:
            raise ChunkError(f"chunk header needs {HEADER_SIZE} bytes, got {len(raw)}")
        (magic, self.type, self.entries, self.records, self.timestamp, self.epoch,
         self.chunk_id, self.crc, self.data_length, self.trailer_length,
         self.bloom_size) = HEADER.unpack_from(raw)
        if magic != MAGIC_VERSION:
            raise ChunkError(f"not a chunk: magic/version byte {magic:#04x}")

    @property
    def data_at(self) -> int:
        return HEADER_SIZE + self.bloom_size

    @property
    def size(self) -> int:
        return HEADER_SIZE + self.bloom_size + self.data_length + self.trailer_length

    @property
    def next_offset(self) -> int:
        return self.chunk_id + self.records


def encode_record(exchange: str, routing_key: str, header: bytes, body: bytes,
                  filter_value: bytes | None = None) -> bytes:
    """One stored message, as published: ``version 0 (1 byte), len(exchange) (1),
    len(routing_key) (2), len(filter_value) (2), len(header) (4)``, then exchange, routing
    key, filter value, the 0-9-1 content header and the body, byte for byte (an AMQP 1.0
    message kept whole is a header of type ``amqp-1.0`` and its sections:
    router/amqp10/whole.py). ``filter_value``: its ``x-stream-filter-value`` (UTF-8), kept
    here so that a filtering reader need not parse the header; it also goes into the
    chunk's bloom (:func:`build`). Raises ValueError for a name or value too long."""
    ex = exchange.encode()
    rk = routing_key.encode()
    fv = filter_value or b""
    if len(ex) > 255 or len(rk) > 0xFFFF or len(fv) > 0xFFFF:
        raise ValueError("exchange, routing key or filter value too long for a record")
    return b"".join((_RECORD.pack(0, len(ex), len(rk), len(fv), len(header)), ex, rk, fv,
                     header, body))


def decode_record(rec: memoryview) -> tuple[str, str, bytes | None, memoryview, memoryview]:
    """``(exchange, routing_key, filter_value, header, body)`` of :func:`encode_record`'s
    bytes (``filter_value`` None when the message had none); header and body are views of
    ``rec`` (no copy). Raises :class:`ChunkError` for an unknown version."""
    version, lex, lrk, lfv, lh = _RECORD.unpack_from(rec)
    if version != 0:
        raise ChunkError(f"unknown stream record version {version}")
    at = _RECORD.size
    ex = bytes(rec[at:at + lex]).decode()
    at += lex
    rk = bytes(rec[at:at + lrk]).decode()
    at += lrk
    fv = bytes(rec[at:at + lfv]) if lfv else None
    at += lfv
    return ex, rk, fv, rec[at:at + lh], rec[at + lh:]


def _hashes(value: bytes, bits: int) -> tuple[int, int]:
    """The two bits ``value`` sets in a bloom of ``bits`` bits: in 1..bits-1 (bit 0 marks a
    chunk with an unfiltered record, as in osiris_bloom.erl)."""
    h = zlib.crc32(value)
    return h % (bits - 1) + 1, zlib.crc32(value, 0x5bd1e995) % (bits - 1) + 1


def bloom(values: Iterable[bytes | None], size: int = DEFAULT_FILTER_SIZE) -> bytes:
    """The bloom filter of a chunk whose records have these filter values (None: no
    value), ``size`` bytes; empty when no record has a value (Osiris writes none then)."""
    vals = list(values)
    if all(v is None for v in vals):
        return b""
    bits = size * 8
    buf = bytearray(size)
    for v in vals:
        if v is None or v == b"":
            buf[0] |= 0x80
            continue
        for b in _hashes(v, bits):
            buf[b >> 3] |= 0x80 >> (b & 7)
    return bytes(buf)


def may_match(bloom_bytes: bytes | memoryview, values: list[bytes], unfiltered: bool) -> bool:
    """Whether a chunk whose bloom is ``bloom_bytes`` may hold a record whose filter value is
    one of ``values`` (or, with ``unfiltered``, a record without one: RabbitMQ's
    ``x-stream-match-unfiltered``). A chunk without a bloom has only unfiltered records."""
    if not bloom_bytes:
        return unfiltered
    if unfiltered and bloom_bytes[0] & 0x80:
        return True
    bits = len(bloom_bytes) * 8
    for v in values:
        if all(bloom_bytes[b >> 3] & (0x80 >> (b & 7)) for b in _hashes(v, bits)):
            return True
    return False


def build(records: list[bytes], chunk_id: int, epoch: int, timestamp: int,
          filter_values: list[bytes | None] | None = None,
          filter_size: int = DEFAULT_FILTER_SIZE, chunk_type: int = USER,
          trailer: bytes = b"") -> bytes:
    """A chunk of ``records`` (each :func:`encode_record`'s bytes, or a CONTROL chunk's
    one record) whose first offset is ``chunk_id``. ``filter_values``: one per record (None:
    no value), for the bloom; ``trailer``: :func:`encode_trailer`'s bytes.
    Raises ValueError for no records or more than 65,535 (the entry count's 16 bits)."""
    if not records or len(records) > 0xFFFF:
        raise ValueError(f"a chunk holds 1 to 65535 records, not {len(records)}")
    parts = []
    for r in records:
        parts.append(_ENTRY.pack(len(r)))
        parts.append(r)
    data = b"".join(parts)
    bl = bloom(filter_values, filter_size) if filter_values else b""
    head = HEADER.pack(MAGIC_VERSION, chunk_type, len(records),
                       len(records) if chunk_type != CONTROL else 0, timestamp, epoch,
                       chunk_id, zlib.crc32(data), len(data), len(trailer), len(bl))
    return head + bl + data + trailer


def encode_trailer(sent: dict[str, tuple[list[int], list[int]]]) -> bytes:
    """The trailer of a chunk whose records include, for each writer id (ASCII, at most
    255 bytes), the publishes ``(first sent, sent again)`` (sequences, 0 to 2**64-1)."""
    parts = []
    for writer, lists in sent.items():
        wid = writer.encode()
        for kind, seqs in zip((TRK_SENT, TRK_RESENT), lists):
            if seqs:
                parts.append(_TRK.pack(kind, len(wid)) + wid + _COUNT.pack(len(seqs)) +
                             struct.pack(f">{len(seqs)}Q", *seqs))
    return b"".join(parts)


def decode_trailer(trailer: bytes | memoryview) -> dict[str, tuple[list[int], list[int]]]:
    """:func:`encode_trailer`'s input back; entries of other types (Osiris's) are skipped.
    Raises :class:`ChunkError` for a trailer cut short."""
    out: dict[str, tuple[list[int], list[int]]] = {}
    at, end = 0, len(trailer)
    try:
        while at < end:
            kind, n = _TRK.unpack_from(trailer, at)
            at += 2
            wid = bytes(trailer[at:at + n]).decode()
            at += n
            if kind in (TRK_SENT, TRK_RESENT):
                (count,) = _COUNT.unpack_from(trailer, at)
                at += 4
                seqs = list(struct.unpack_from(f">{count}Q", trailer, at))
                at += 8 * count
                out.setdefault(wid, ([], []))[kind - TRK_SENT].extend(seqs)
            else:
                at += 8     # Osiris's: one 8-byte value
    except (struct.error, UnicodeDecodeError) as exc:
        raise ChunkError(f"chunk trailer cut short or invalid: {exc}") from None
    if at != end:
        raise ChunkError("chunk trailer cut short")
    return out


def trailer_of(chunk: bytes | memoryview, h: ChunkHeader | None = None) -> bytes | memoryview:
    """The trailer bytes of a whole chunk (empty when it has none)."""
    if h is None:
        h = ChunkHeader(chunk)
    if not h.trailer_length:
        return b""
    at = h.data_at + h.data_length
    return chunk[at:at + h.trailer_length]


def check(chunk: bytes | memoryview) -> ChunkHeader:
    """The header of ``chunk`` after checking that it is whole and its CRC matches. Raises
    :class:`ChunkError`."""
    h = ChunkHeader(chunk)
    if len(chunk) < h.size:
        raise ChunkError(f"chunk {h.chunk_id} is torn: {len(chunk)} of {h.size} bytes")
    if zlib.crc32(chunk[h.data_at:h.data_at + h.data_length]) != h.crc:
        raise ChunkError(f"chunk {h.chunk_id}: CRC mismatch")
    return h


def records(chunk: bytes | memoryview) -> Iterator[tuple[int, memoryview]]:
    """``(offset, record)`` for each record of ``chunk`` (a view: no copy)."""
    view = memoryview(chunk)
    h = ChunkHeader(view)
    at = h.data_at
    end = at + h.data_length
    offset = h.chunk_id
    while at < end:
        (n,) = _ENTRY.unpack_from(view, at)
        if n & 0x80000000:
            raise ChunkError("sub-batch entries are not supported")
        at += 4
        yield offset, view[at:at + n]
        at += n
        offset += 1

