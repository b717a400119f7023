"""Segments, commit jobs and compaction policy of the node journal (design.md section 5).

Compaction (called by every commit before it frames its write, see :func:`plan_compaction`):
only the OLDEST segments are ever deleted, so a SETTLE, DELIVERY_STATE or QUEUE_DELETED record
can never outlive the ENQUEUE it cancels. The oldest segment is deleted once none of its
ENQUEUEs is live; it is first copied forward (its live ENQUEUEs re-appended to the head with the
same entry ids and current delivery state) when it is mostly dead, or while the journal holds
much more garbage than live data. A segment holding topology records is deleted only after a
TOPOLOGY_SNAPSHOT has been written after it. docs/durability.md derives the disk bound.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

from shoal.node.durability.format import (HEADER_BYTES, RECORD_HEADER, RECORD_OVERHEAD, RecordType,
                             decode_record, encode_payload)
from shoal.node.durability.state import JournalState, LiveEntry

log = logging.getLogger("shoal.node.durability.journal")

ENQUEUE = int(RecordType.ENQUEUE)
SNAPSHOT = int(RecordType.TOPOLOGY_SNAPSHOT)


@dataclass(frozen=True)
class JournalConfig:
    """``segment_bytes``: roll the head segment past this size (bytes). ``mostly_dead``: copy the
    oldest segment forward when its live bytes are below this fraction of its size.
    ``garbage_factor``: also copy forward while bytes on disk exceed ``garbage_factor * live
    bytes + 2 * segment_bytes``. ``copy_bytes_per_commit``: bytes of old segment read per commit
    for copying (bounds the work of one commit). ``max_buffered_bytes``: while the disk fails,
    ENQUEUEs beyond this many buffered bytes are refused (JournalUnavailable)."""

    segment_bytes: int = 64 << 20
    mostly_dead: float = 0.5
    garbage_factor: float = 2.0
    copy_bytes_per_commit: int = 4 << 20
    max_buffered_bytes: int = 64 << 20


@dataclass(frozen=True)
class JournalStats:
    """``bytes_on_disk``: committed bytes of all segments; ``live_records``/``live_bytes``: live
    ENQUEUE records (framed bytes); ``durable_lsn``: highest committed LSN; ``fsyncs``: data
    syncs done by commits."""

    segments: int
    bytes_on_disk: int
    live_records: int
    live_bytes: int
    buffered_records: int
    durable_lsn: int
    commits: int
    fsyncs: int


class Kind(IntEnum):
    USER = 0        # appended by the node
    COPY = 1        # compaction copy of a live ENQUEUE
    SNAPSHOT = 2    # compaction topology snapshot


class Segment:
    __slots__ = ("number", "path", "salt", "size", "live_count", "live_bytes", "topo_records",
                 "fd", "copy_cursor")

    def __init__(self, number: int, path: Path, salt: int, size: int) -> None:
        self.number = number
        self.path = path
        self.salt = salt
        self.size = size                    # committed bytes (header included)
        self.live_count = 0
        self.live_bytes = 0
        self.topo_records = 0
        self.fd = -1
        self.copy_cursor = HEADER_BYTES

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Pending:
    __slots__ = ("kind", "rtype", "payload", "entry_id", "lsn", "source")

    def __init__(self, kind: Kind, rtype: int, payload: bytes, entry_id: int, lsn: int,
                 source: int = 0) -> None:
        self.kind = kind
        self.rtype = rtype
        self.payload = payload
        self.entry_id = entry_id
        self.lsn = lsn
        self.source = source                # COPY: segment copied from


class Job:
    """One commit's disk work, prepared on the loop thread, run by
    :meth:`CommitWriter.run <shoal.node.durability.writer.CommitWriter.run>`."""

    __slots__ = ("segment", "new", "offset", "data", "placed", "delete", "truncate", "upto",
                 "fd", "dir_fd", "fsync_s")

    def __init__(self, segment: Segment, new: bool, offset: int, data: bytes,
                 placed: list[tuple[Pending, int, int]], delete: list[Segment],
                 truncate: bool, upto: int) -> None:
        self.segment = segment
        self.new = new
        self.offset = offset
        self.data = data
        self.placed = placed
        self.delete = delete
        self.truncate = truncate
        self.upto = upto
        self.fd = -1
        self.fsync_s = 0.0


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def plan_compaction(segments: dict[int, Segment], head: Segment | None, cfg: JournalConfig,
                    state: JournalState, snapshot_seg: int) -> tuple[list[Segment], list[Pending]]:
    """Plan the compaction work of the coming commit over the journal's ``segments`` (oldest
    first; ``head`` is written to), with ``state`` the live records and ``snapshot_seg`` the
    segment of the last TOPOLOGY_SNAPSHOT. Returns (the segments the commit deletes after its
    fsync, the records it must write first: a topology snapshot, then copies of live
    ENQUEUEs). Reads old segments (at most ``copy_bytes_per_commit`` per call); a read error
    skips compaction this time."""
    total = sum(s.size for s in segments.values())
    live = sum(s.live_bytes for s in segments.values())
    delete: list[Segment] = []
    copies: list[Pending] = []
    budget = cfg.copy_bytes_per_commit
    need_snapshot = False
    for seg in segments.values():
        if seg is head:
            break
        if seg.live_count:
            garbage_heavy = total > cfg.garbage_factor * live + 2 * cfg.segment_bytes
            mostly_dead = seg.live_bytes < cfg.mostly_dead * (seg.size - HEADER_BYTES)
            if not (garbage_heavy or mostly_dead):
                break
            try:
                done, budget = _copy_live(state.entries, seg, copies, budget)
            except (OSError, ValueError) as exc:
                log.warning("journal: compaction cannot read %s: %s", seg.path, exc)
                seg.copy_cursor = HEADER_BYTES
                copies = [c for c in copies if c.source != seg.number]
                break
            if not done:
                break
            pending_from_seg = sum(1 for c in copies if c.source == seg.number)
            if pending_from_seg != seg.live_count:
                seg.copy_cursor = HEADER_BYTES  # should not happen: rescan next time
                break
        if seg.topo_records and snapshot_seg <= seg.number:
            need_snapshot = True
        delete.append(seg)
        total -= seg.size
    if need_snapshot:
        snap = Pending(Kind.SNAPSHOT, SNAPSHOT, encode_payload(state.snapshot()), 0, 0)
        copies.insert(0, snap)
    return delete, copies

def _copy_live(entries: dict[int, LiveEntry], seg: Segment, out: list[Pending],
               budget: int) -> tuple[bool, int]:
    """Append copies of ``seg``'s live ENQUEUEs (those ``entries`` still places in it) from
    its copy cursor on, reading about ``budget`` bytes; returns (reached the end, budget
    left)."""
    if seg.fd < 0:
        seg.fd = os.open(seg.path, os.O_RDONLY)
    while seg.copy_cursor < seg.size and budget > 0:
        want = min(max(budget, RECORD_HEADER.size), seg.size - seg.copy_cursor)
        chunk = os.pread(seg.fd, want, seg.copy_cursor)
        pos = 0
        while pos + RECORD_HEADER.size <= len(chunk):
            length = int.from_bytes(chunk[pos:pos + 4], "little")
            end = pos + RECORD_HEADER.size + length
            if end > len(chunk):
                if pos == 0:        # one record bigger than the budget: read it whole
                    chunk = os.pread(seg.fd, RECORD_HEADER.size + length, seg.copy_cursor)
                    if len(chunk) < RECORD_HEADER.size + length:
                        raise ValueError(f"short read at byte {seg.copy_cursor}")
                    continue
                break
            offset = seg.copy_cursor + pos
            if chunk[pos + RECORD_HEADER.size] == ENQUEUE:
                e_id_rec = decode_record(ENQUEUE, chunk[pos + RECORD_OVERHEAD:end])
                e = entries.get(e_id_rec.entry_id)     # type: ignore[attr-defined]
                if e is not None and e.segment == seg.number and e.offset == offset:
                    e_id_rec.redelivered = e.redelivered  # type: ignore[attr-defined]
                    e_id_rec.delivery_count = e.delivery_count  # type: ignore
                    out.append(Pending(Kind.COPY, ENQUEUE, encode_payload(e_id_rec),
                                        e_id_rec.entry_id, 0, seg.number))  # type: ignore
            pos = end
        if pos == 0:
            raise ValueError(f"unreadable record at byte {seg.copy_cursor}")
        seg.copy_cursor += pos
        budget -= pos
    return seg.copy_cursor >= seg.size, budget
