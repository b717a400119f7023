"""On-disk format of the node journal (design.md section 5; layout in docs/durability.md).

A segment file (``NNNNNNNN.seg``) is a 12-byte header then records, back to back::

    segment header: magic b"SHOALJ1\\n" (8 bytes) | salt u32 little-endian (random per segment)
    record:         length u32 | crc u32 | hcrc u32 | type u8 | payload (length - 1 bytes)

``length`` counts type + payload. ``crc`` is ``zlib.crc32`` (CRC-32/ISO-HDLC, the zlib/PNG
polynomial, not CRC32C) of type + payload, started from the segment's salt instead of 0;
``hcrc`` is ``zlib.crc32`` of the first 8 header bytes, started from the salt. The salt makes a
record copied into a message body (or left over from an older file) invalid in any other
segment; the header checksum lets a scan reject a garbled length without reading a payload.
Payloads are msgpack arrays (:class:`Record` subclasses, fields in declaration order).

Each commit's write starts with a BATCH record (payload ``[bytes_that_follow]``) so recovery
knows which records were written by the last, possibly unsynced, write.

This module is pure: framing, the record classes and :func:`scan`, which finds the last good
record of a segment image and decides whether a bad record is a torn tail or corruption.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field, fields
from enum import IntEnum
from typing import ClassVar, Iterable, Protocol, TypeVar

import msgpack

from shoal.shared.errors import ShoalError
from shoal.shared.wire import Packer

SEGMENT_MAGIC = b"SHOALJ1\n"
SEGMENT_HEADER = struct.Struct("<8sI")          # magic, salt: 12 bytes
RECORD_HEADER = struct.Struct("<III")           # length, crc, hcrc: 12 bytes
_LEN_CRC = struct.Struct("<II")
HEADER_BYTES = SEGMENT_HEADER.size
RECORD_OVERHEAD = RECORD_HEADER.size + 1        # header + type byte
MAX_RECORD_BYTES = 1 << 30                      # type + payload; bigger is a garbled length


class JournalError(ShoalError):
    """Root of the journal's errors."""


class JournalCorrupt(JournalError):
    """A journal file is damaged where a crash cannot explain it (not a torn tail).

    ``path``: the segment file; ``offset``: byte offset of the bad record (or header) in it;
    ``reason``: what is wrong. The node must not start: an operator has to look (docs/durability.md).
    """

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"journal corrupt: {path} at byte {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class JournalUnavailable(JournalError):
    """The journal cannot write (disk full, unwritable or locked directory, I/O error).

    ``os_error``: the OSError (also ``__cause__``), None for a lock held by another process.
    Nothing committed before is lost; uncommitted records stay buffered and the next commit
    retries them, so publisher confirms are withheld, never sent falsely (AMQP: the node answers
    the publish with no confirm; the router may block publishers, 506 RESOURCE_ERROR is not used).
    """

    def __init__(self, text: str, os_error: OSError | None = None) -> None:
        detail = f": {os_error.strerror or os_error}" if os_error is not None else ""
        super().__init__(f"journal unavailable: {text}{detail}")
        self.os_error = os_error


def unavailable(text: str, exc: BaseException) -> JournalUnavailable:
    """A JournalUnavailable for ``text`` caused by ``exc`` (kept as ``os_error`` if an OSError)."""
    err = JournalUnavailable(text, exc if isinstance(exc, OSError) else None)
    err.__cause__ = exc
    return err


class RecordType(IntEnum):
    """Record type byte. Values are on disk: never renumber."""

    BATCH = 0
    ENQUEUE = 1
    SETTLE = 2
    DELIVERY_STATE = 3
    QUEUE_DECLARED = 10
    QUEUE_DELETED = 11
    EXCHANGE_DECLARED = 20
    EXCHANGE_DELETED = 21
    BINDING_ADDED = 22
    BINDING_REMOVED = 23
    TOPOLOGY_SNAPSHOT = 30


@dataclass(slots=True)
class Record:
    """Base of journal records; payload = msgpack list of the fields in order."""

    TYPE: ClassVar[RecordType]

    def to_list(self) -> list:
        return [getattr(self, f.name) for f in fields(self)]

    @classmethod
    def from_list(cls, items: list) -> "Record":
        return cls(*items)


@dataclass(slots=True)
class Batch(Record):
    """Start of one commit's write: ``nbytes`` of records follow (recovery only)."""

    TYPE = RecordType.BATCH
    nbytes: int


@dataclass(slots=True)
class Enqueue(Record):
    """A persistent message on a durable queue. ``entry_id``: node-unique, increasing in enqueue
    order (queue order on recovery is entry id order). Times are epoch ms, 0 = none:
    ``expiry_ms`` (absolute TTL deadline), ``not_before_ms`` (scheduled delivery)."""

    TYPE = RecordType.ENQUEUE
    vhost: str
    queue: str
    entry_id: int
    exchange: str
    routing_key: str
    header: bytes
    body: bytes
    redelivered: bool = False
    delivery_count: int = 0
    enqueue_ms: int = 0
    expiry_ms: int = 0
    not_before_ms: int = 0

    def to_list(self) -> list:
        return [self.vhost, self.queue, self.entry_id, self.exchange, self.routing_key,
                self.header, self.body, self.redelivered, self.delivery_count, self.enqueue_ms,
                self.expiry_ms, self.not_before_ms]


@dataclass(slots=True)
class Settle(Record):
    """Entries gone from their queue (ack, reject, expiry, purge, LVQ replacement)."""

    TYPE = RecordType.SETTLE
    entry_ids: list[int]


@dataclass(slots=True)
class DeliveryState(Record):
    """``updates``: ``[[entry_id, redelivered, delivery_count], ...]`` (deliver, release)."""

    TYPE = RecordType.DELIVERY_STATE
    updates: list[list]


@dataclass(slots=True)
class QueueDeclared(Record):
    TYPE = RecordType.QUEUE_DECLARED
    vhost: str
    name: str
    auto_delete: bool = False
    arguments: dict = field(default_factory=dict)


@dataclass(slots=True)
class QueueDeleted(Record):
    """The queue and every entry of it are gone."""

    TYPE = RecordType.QUEUE_DELETED
    vhost: str
    name: str


@dataclass(slots=True)
class ExchangeDeclared(Record):
    TYPE = RecordType.EXCHANGE_DECLARED
    vhost: str
    name: str
    type: str
    auto_delete: bool = False
    internal: bool = False
    arguments: dict = field(default_factory=dict)


@dataclass(slots=True)
class ExchangeDeleted(Record):
    """The exchange and the bindings whose source it is are gone."""

    TYPE = RecordType.EXCHANGE_DELETED
    vhost: str
    name: str


@dataclass(slots=True)
class BindingAdded(Record):
    """``dest_kind``: ``"q"`` or ``"e"`` (shared.wire DEST_QUEUE / DEST_EXCHANGE)."""

    TYPE = RecordType.BINDING_ADDED
    vhost: str
    exchange: str
    dest_kind: str
    destination: str
    routing_key: str
    arguments: dict = field(default_factory=dict)


@dataclass(slots=True)
class BindingRemoved(Record):
    TYPE = RecordType.BINDING_REMOVED
    vhost: str
    exchange: str
    dest_kind: str
    destination: str
    routing_key: str
    arguments: dict = field(default_factory=dict)


@dataclass(slots=True)
class TopologySnapshot(Record):
    """The whole durable topology at this point of the log; replaces all earlier topology.
    Lists hold the field lists of QueueDeclared / ExchangeDeclared / BindingAdded."""

    TYPE = RecordType.TOPOLOGY_SNAPSHOT
    queues: list[list]
    exchanges: list[list]
    bindings: list[list]


RECORD_CLASSES: dict[int, type[Record]] = {
    int(c.TYPE): c for c in (Batch, Enqueue, Settle, DeliveryState, QueueDeclared, QueueDeleted,
                             ExchangeDeclared, ExchangeDeleted, BindingAdded, BindingRemoved,
                             TopologySnapshot)}
TOPOLOGY_TYPES = frozenset({RecordType.QUEUE_DECLARED, RecordType.QUEUE_DELETED,
                            RecordType.EXCHANGE_DECLARED, RecordType.EXCHANGE_DELETED,
                            RecordType.BINDING_ADDED, RecordType.BINDING_REMOVED,
                            RecordType.TOPOLOGY_SNAPSHOT})
_TYPE_BYTE = {t: bytes((t,)) for t in RECORD_CLASSES}

#: msgpack bytes of a record's field list (drops its buffer after a large message,
#: shared/wire.py); the journal's per-message records call it on their fields directly
packb = Packer().pack


def encode_payload(record: Record) -> bytes:
    """msgpack bytes of ``record``'s fields."""
    return packb(record.to_list())


def decode_record(rtype: int, payload: bytes | memoryview) -> Record:
    """The record of type ``rtype`` from its payload. Raises ValueError if it does not decode."""
    cls = RECORD_CLASSES.get(rtype)
    if cls is None:
        raise ValueError(f"unknown record type {rtype}")
    try:
        items = msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=True)
        return cls.from_list(items)
    except (TypeError, ValueError, msgpack.UnpackException) as exc:
        raise ValueError(f"undecodable {cls.__name__} payload: {exc}") from None


def frame(rtype: int, payload: bytes, salt: int) -> tuple[bytes, bytes, bytes]:
    """The three parts of one framed record (header, type byte, payload): join them to write."""
    tb = _TYPE_BYTE[rtype]
    crc = zlib.crc32(payload, zlib.crc32(tb, salt))
    h8 = _LEN_CRC.pack(len(payload) + 1, crc)
    return h8 + zlib.crc32(h8, salt).to_bytes(4, "little"), tb, payload


class _Record(Protocol):
    rtype: int
    payload: bytes


Framable = TypeVar("Framable", bound=_Record)


def frame_all(records: Iterable[Framable], salt: int, pos: int,
              parts: list[bytes]) -> list[tuple[Framable, int, int]]:
    """Frame ``records`` (each with ``rtype`` and ``payload``) as :func:`frame` does, one
    after the other from file offset ``pos``, onto ``parts``; returns (record, offset, framed
    size) of each. A commit frames every record of its write so (journal.py)."""
    crc32 = zlib.crc32
    pack = _LEN_CRC.pack
    tbs = _TYPE_BYTE
    seeds = {t: crc32(tb, salt) for t, tb in tbs.items()}
    append = parts.append
    placed = []
    for r in records:
        payload = r.payload
        rtype = r.rtype
        h8 = pack(len(payload) + 1, crc32(payload, seeds[rtype]))
        append(h8 + crc32(h8, salt).to_bytes(4, "little"))
        append(tbs[rtype])
        append(payload)
        size = RECORD_OVERHEAD + len(payload)
        placed.append((r, pos, size))
        pos += size
    return placed


def segment_header(salt: int) -> bytes:
    return SEGMENT_HEADER.pack(SEGMENT_MAGIC, salt)


def read_salt(data: bytes, path: str) -> int:
    """The salt of a segment image (>= 12 bytes). Raises JournalCorrupt on a bad magic."""
    magic, salt = SEGMENT_HEADER.unpack_from(data, 0)
    if magic != SEGMENT_MAGIC:
        raise JournalCorrupt(path, 0, "not a Shoal journal segment (bad magic)")
    return salt


def _check_at(data: bytes | memoryview, pos: int, salt: int) -> tuple[int, str]:
    """(record size, "") if a whole valid record starts at ``pos``, else (0, reason)."""
    end = len(data)
    if end - pos < RECORD_HEADER.size:
        return 0, "partial record header"
    length, crc, hcrc = RECORD_HEADER.unpack_from(data, pos)
    if zlib.crc32(data[pos:pos + 8], salt) != hcrc:
        return 0, "bad record header checksum"
    if not 1 <= length <= MAX_RECORD_BYTES:
        return 0, f"bad record length {length}"
    start = pos + RECORD_HEADER.size
    if start + length > end:
        return 0, "partial record payload"
    if zlib.crc32(data[start:start + length], salt) != crc:
        return 0, "bad record checksum"
    return RECORD_HEADER.size + length, ""


def _valid_record_from(data: bytes | memoryview, pos: int, salt: int) -> int:
    """The first offset >= ``pos`` where a whole valid record starts, or -1."""
    end = len(data) - RECORD_OVERHEAD
    raw = bytes(data[pos:]) if isinstance(data, memoryview) else data[pos:]
    zeros = len(raw) - len(raw.rstrip(b"\0"))      # a zero-filled tail holds no record
    end = min(end, len(data) - zeros)
    while pos <= end:
        if _check_at(data, pos, salt)[0]:
            return pos
        pos += 1
    return -1


@dataclass(slots=True)
class Scan:
    """Result of :func:`scan`: ``records`` as (offset, size, type, payload view) in file order;
    ``good_end``: end of the last good record; ``bad_reason``: why the record at ``good_end``
    is bad ("" when the image ends cleanly)."""

    records: list[tuple[int, int, int, memoryview]]
    good_end: int
    bad_reason: str = ""


def scan(data: bytes, path: str, last: bool) -> Scan:
    """Walk a segment image (header included). Damage is a *torn tail* only in the last
    segment (``last``) and when no valid record starts at or after the end of the write (the
    BATCH) it belongs to; the tail is then cut at the start of that write, so a commit is
    recovered whole or not at all. Otherwise raises JournalCorrupt(path, offset). Unknown
    record types with a good checksum (a newer Shoal) raise JournalCorrupt too."""
    salt = read_salt(data, path)
    view = memoryview(data)
    records: list[tuple[int, int, int, memoryview]] = []
    pos = HEADER_BYTES
    batch_start = batch_end = pos
    n = len(data)
    reason = ""
    while pos < n:
        size, reason = _check_at(view, pos, salt)
        if not size:
            if not last:
                raise JournalCorrupt(path, pos, reason + " (not the last segment)")
            follow = _valid_record_from(view, max(pos + 1, batch_end), salt)
            if follow >= 0:
                raise JournalCorrupt(path, pos, f"{reason}; valid records follow at byte "
                                                f"{follow}")
            break
        rtype = view[pos + RECORD_HEADER.size]
        if rtype not in RECORD_CLASSES:
            raise JournalCorrupt(path, pos, f"unknown record type {rtype}")
        payload = view[pos + RECORD_OVERHEAD:pos + size]
        if rtype == RecordType.BATCH:
            try:
                batch_end = pos + size + decode_record(rtype, payload).nbytes  # type: ignore
            except (ValueError, TypeError) as exc:
                raise JournalCorrupt(path, pos, str(exc)) from None
            batch_start = pos
        records.append((pos, size, rtype, payload))
        pos += size
    if pos >= n and batch_end <= n:
        return Scan(records, pos)
    if not last:
        raise JournalCorrupt(path, batch_start, "last write of the segment is incomplete "
                                                "(not the last segment)")
    cut = batch_start if pos < batch_end else pos
    return Scan([r for r in records if r[0] < cut], cut, reason or "incomplete last commit")


