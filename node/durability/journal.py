"""The node's append-only journal: :class:`Journal` (design.md section 5, issue 5).

One journal per node, in ``<data_dir>/journal/``: segment files ``00000001.seg``, ... (format in
:mod:`shoal.node.durability.format`, rules of replay in :mod:`shoal.node.durability.state`, reading
the segments back at start in :mod:`shoal.node.durability.recover`, segments and compaction in
:mod:`shoal.node.durability.compact`; the whole picture and where the node calls it in
docs/durability.md).

Commit rule: :meth:`Journal.append` only buffers and returns the record's sequence number
(LSN); :meth:`Journal.commit` writes everything buffered with one ``pwrite`` and one
``os.fdatasync`` and returns the highest durable LSN. A publisher confirm for a record may be
sent once ``commit() >= its LSN``. :meth:`Journal.commit_async` does the same on a worker
thread (one commit in flight at a time, in order) and returns a future; :meth:`Journal.commit_now`
on the event loop's thread while the disk's fdatasyncs are short. The journal prepares
each commit and applies its outcome; the disk work and the worker thread are
:mod:`shoal.node.durability.writer`'s (:class:`~shoal.node.durability.writer.CommitWriter`,
an object the journal holds).

Compaction runs inside commits: the oldest segments whose entries are all settled are deleted;
the oldest segment is copied forward (its live ENQUEUEs rewritten into the head, same entry
ids) when it is mostly dead or when the journal holds much more garbage than live data. Only
the oldest segment is ever deleted, so a later SETTLE can never lose the ENQUEUE it cancels.

Errors: :class:`JournalUnavailable` (disk full, unwritable or locked directory; retry later),
:class:`JournalCorrupt` (damage a crash cannot explain; file and byte offset given).
"""
from __future__ import annotations

import fcntl
import logging
import os
import random
from pathlib import Path
from typing import Iterable, Iterator

from shoal.node.durability.format import (HEADER_BYTES, RECORD_OVERHEAD, TOPOLOGY_TYPES, Batch, BindingAdded,
                             BindingRemoved, DeliveryState, Enqueue, ExchangeDeclared,
                             ExchangeDeleted, JournalCorrupt, JournalError, JournalUnavailable,
                             QueueDeclared, QueueDeleted, Record, RecordType, Settle,
                             decode_record, encode_payload, frame, frame_all, packb, scan, segment_header,
                             unavailable)
from shoal.node.durability.compact import (Job, JournalConfig, JournalStats, Kind, Pending, Segment, fsync_dir,
                              plan_compaction)
from shoal.node.durability.recover import recover_segments
from shoal.node.durability.state import JournalState, LiveEntry, Recovered
from shoal.node.durability.writer import CommitWriter
from shoal.node.stats import COMMIT_BUCKETS, FSYNC_BUCKETS, Histogram

__all__ = ["Journal", "JournalConfig", "JournalStats", "JournalError", "JournalCorrupt",
           "JournalUnavailable", "Recovered"]

log = logging.getLogger("shoal.node.durability.journal")

_ENQUEUE = int(RecordType.ENQUEUE)
_SETTLE = int(RecordType.SETTLE)
_DELIVERY_STATE = int(RecordType.DELIVERY_STATE)
_SNAPSHOT = int(RecordType.TOPOLOGY_SNAPSHOT)


class Journal:
    """The journal of one node's shard. Create with :meth:`open`; not thread-safe (call it
    from the node's event loop thread only)."""

    def __init__(self, directory: Path, config: JournalConfig) -> None:
        self.directory = directory
        self.config = config
        self.state = JournalState(self._on_dead, keep_messages=True)
        self.segments: dict[int, Segment] = {}     # ascending segment number
        self.head: Segment | None = None
        self.recovered = Recovered()
        self._buffer: list[Pending] = []
        self._buffered_bytes = 0
        self._appended_lsn = 0
        self._durable_lsn = 0
        self._snapshot_seg = 0
        self._tail_dirty = False
        self._force_roll = False
        self._available = True
        #: the disk work of commits and the worker thread of :meth:`commit_async`
        self.writer = CommitWriter(self, directory)
        #: ``commit_async() -> Future``: :meth:`CommitWriter.commit_async
        #: <shoal.node.durability.writer.CommitWriter.commit_async>` (bound once: a commit per
        #: turn); the future resolves to the durable LSN once every record appended before the
        #: call is on disk, or raises JournalUnavailable. Call from the running event loop.
        self.commit_async = self.writer.commit_async
        #: ``can_commit_now() -> bool``, ``commit_now() -> bool``: the same commit on the
        #: calling thread while the disk's fdatasyncs are short (CommitWriter's, bound once)
        self.can_commit_now = self.writer.can_commit_now
        self.commit_now = self.writer.commit_now
        self._lock_fd = -1
        self.commits = 0
        self.fsyncs = 0
        #: seconds per commit's fdatasync and records per commit (NODE_STATS, metrics)
        self.fsync_seconds = Histogram(FSYNC_BUCKETS)
        self.commit_records = Histogram(COMMIT_BUCKETS)

    # ------------------------------------------------------------------ open / recover
    @classmethod
    def open(cls, directory: str | os.PathLike, config: JournalConfig | None = None) -> "Journal":
        """Open (creating if missing) the journal in ``directory`` and recover it.

        Torn tails of the last segment are cut (logged; listed in ``recovered.cuts``). Raises
        JournalCorrupt(path, offset) for other damage, JournalUnavailable if the directory
        cannot be created, written or locked (another process has it open)."""
        j = cls(Path(directory), config or JournalConfig())
        try:
            j.directory.mkdir(parents=True, exist_ok=True)
            j._lock_fd = os.open(j.directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise unavailable(f"cannot open journal directory {j.directory}", exc) from exc
        try:
            fcntl.flock(j._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(j._lock_fd)
            raise JournalUnavailable(f"{j.directory} is locked by another process") from exc
        try:
            j._recover()
        except BaseException:
            j._close_files()
            raise
        return j

    def _recover(self) -> None:
        state = self.state
        self._snapshot_seg, cuts = recover_segments(self.directory, state, self.segments)
        state.drop_orphans()
        self.recovered = state.recovered()
        self.recovered.cuts = cuts
        state.messages = None                       # the index keeps no message bodies
        if self.segments:
            self.head = self.segments[next(reversed(self.segments))]
            try:
                self.head.fd = os.open(self.head.path, os.O_RDWR)
            except OSError as exc:
                raise unavailable(f"cannot open {self.head.path}", exc) from exc
        else:
            self._create_first_segment()
        n = sum(len(v) for v in self.recovered.messages.values())
        r = self.recovered
        log.log(logging.INFO if (n or r.queues or r.exchanges or r.bindings or cuts)
                else logging.DEBUG, "journal %s: recovered %d queues, %d exchanges, %d bindings, %d messages "
                 "from %d segments", self.directory, len(self.recovered.queues),
                 len(self.recovered.exchanges), len(self.recovered.bindings), n,
                 len(self.segments))

    def _create_first_segment(self) -> None:
        salt = random.getrandbits(32)
        seg = Segment(1, self.directory / "00000001.seg", salt, HEADER_BYTES)
        try:
            seg.fd = os.open(seg.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            os.pwrite(seg.fd, segment_header(salt), 0)
            os.fdatasync(seg.fd)
            fsync_dir(self.directory)
        except OSError as exc:
            seg.close()
            raise unavailable(f"cannot create {seg.path}", exc) from exc
        self.segments[1] = seg
        self.head = seg

    def _on_dead(self, e: LiveEntry) -> None:
        seg = self.segments.get(e.segment) if e.segment else None
        if seg is not None:
            seg.live_count -= 1
            seg.live_bytes -= e.size

    # ------------------------------------------------------------------ append
    @property
    def available(self) -> bool:
        """False after a failed commit, until a commit succeeds (publishers should be blocked)."""
        return self._available

    @property
    def durable_lsn(self) -> int:
        return self._durable_lsn

    @property
    def appended_lsn(self) -> int:
        """The LSN of the last record appended (durable or not)."""
        return self._appended_lsn

    def is_live(self, entry_id: int) -> bool:
        """Whether ``entry_id`` is a journaled, unsettled entry."""
        return entry_id in self.state.entries

    def append(self, record: Record) -> int:
        """Buffer ``record`` and return its LSN (durable once ``commit()`` returns >= it).

        SETTLE / DELIVERY_STATE keep only ids of journaled live entries (others are not
        durable: nothing to record; the LSN of the last record is returned when none is left).
        Raises ValueError for an ENQUEUE on a queue not declared in the journal or an entry id
        already live (caller bugs), JournalUnavailable for an ENQUEUE while the disk is failing
        and ``max_buffered_bytes`` are already buffered."""
        t = type(record)
        if t is Enqueue:
            if (record.vhost, record.queue) not in self.state.queues:
                raise ValueError(f"queue {record.queue!r} in vhost {record.vhost!r} is not a "
                                 f"durable queue of this journal")
            if record.entry_id in self.state.entries:
                raise ValueError(f"entry {record.entry_id} is already journaled")
            if not self._available and self._buffered_bytes >= self.config.max_buffered_bytes:
                raise JournalUnavailable(f"{self.directory}: disk failing and "
                                         f"{self._buffered_bytes} bytes already buffered")
        elif t is Settle:
            live = self.state.entries
            ids = [i for i in record.entry_ids if i in live]
            if not ids:
                return self._appended_lsn
            record = Settle(ids)
        elif t is DeliveryState:
            live = self.state.entries
            updates = [u for u in record.updates if u[0] in live]
            if not updates:
                return self._appended_lsn
            record = DeliveryState(updates)
        elif t is Batch or t is Record:
            raise ValueError(f"cannot append a {t.__name__} record")
        payload = encode_payload(record)
        self.state.apply(record)
        return self._buffer_user(int(record.TYPE), payload,
                                 record.entry_id if t is Enqueue else 0)

    # conveniences, one per record type (arguments as the record fields). The three a message
    # makes (ENQUEUE, DELIVERY_STATE, SETTLE) encode their payload and change the index
    # directly: :meth:`append` with the record object gives the same bytes and state
    # (tests/node/durability/test_journal_fast_path.py), at about twice the cost per message.
    def enqueue(self, vhost: str, queue: str, entry_id: int, exchange: str, routing_key: str,
                header: bytes, body: bytes, redelivered: bool = False, delivery_count: int = 0,
                enqueue_ms: int = 0, expiry_ms: int = 0, not_before_ms: int = 0) -> int:
        """ENQUEUE; ``enqueue_ms``, ``expiry_ms``, ``not_before_ms``: epoch ms, 0 = none.
        Raises as :meth:`append`."""
        state = self.state
        qkey = (vhost, queue)
        if state.messages is not None or qkey not in state.queues \
                or entry_id in state.entries or not self._available:
            return self.append(Enqueue(vhost, queue, entry_id, exchange, routing_key, header,
                                       body, redelivered, delivery_count, enqueue_ms,
                                       expiry_ms, not_before_ms))
        payload = packb([vhost, queue, entry_id, exchange, routing_key, header, body,
                          redelivered, delivery_count, enqueue_ms, expiry_ms, not_before_ms])
        state.add_entry(qkey, entry_id, redelivered, delivery_count)
        return self._buffer_user(_ENQUEUE, payload, entry_id)

    def settle(self, entry_ids: Iterable[int]) -> int:
        """SETTLE of the ids that are journaled and live (none: no record, the LSN of the
        last record is returned)."""
        state = self.state
        live = state.entries
        ids = [i for i in entry_ids if i in live]
        if not ids:
            return self._appended_lsn
        payload = packb([ids])
        kill = state.kill
        for i in ids:
            kill(i)
        return self._buffer_user(_SETTLE, payload)

    def delivery_state(self, updates: Iterable[tuple[int, bool, int]]) -> int:
        """[(entry_id, redelivered, delivery_count), ...] for deliveries and releases, of the
        ids that are journaled and live (none: no record, as :meth:`settle`)."""
        live = self.state.entries
        kept = [u for u in updates if u[0] in live]
        if not kept:
            return self._appended_lsn
        payload = packb([kept])           # tuples pack as arrays: DeliveryState's bytes
        for entry_id, redelivered, count in kept:
            e = live[entry_id]
            e.redelivered = bool(redelivered)
            e.delivery_count = int(count)
        return self._buffer_user(_DELIVERY_STATE, payload)

    def _buffer_user(self, rtype: int, payload: bytes, entry_id: int = 0) -> int:
        """Buffer one encoded user record (``entry_id``: an ENQUEUE's); returns its LSN."""
        self._appended_lsn = lsn = self._appended_lsn + 1
        self._buffer.append(Pending(Kind.USER, rtype, payload, entry_id, lsn))
        self._buffered_bytes += RECORD_OVERHEAD + len(payload)
        return lsn

    def declare_queue(self, vhost: str, name: str, auto_delete: bool = False,
                      arguments: dict | None = None) -> int:
        return self.append(QueueDeclared(vhost, name, auto_delete, arguments or {}))

    def delete_queue(self, vhost: str, name: str) -> int:
        return self.append(QueueDeleted(vhost, name))

    def declare_exchange(self, vhost: str, name: str, type: str, auto_delete: bool = False,
                         internal: bool = False, arguments: dict | None = None) -> int:
        return self.append(ExchangeDeclared(vhost, name, type, auto_delete, internal,
                                            arguments or {}))

    def delete_exchange(self, vhost: str, name: str) -> int:
        return self.append(ExchangeDeleted(vhost, name))

    def bind(self, vhost: str, exchange: str, dest_kind: str, destination: str,
             routing_key: str, arguments: dict | None = None) -> int:
        return self.append(BindingAdded(vhost, exchange, dest_kind, destination, routing_key,
                                        arguments or {}))

    def unbind(self, vhost: str, exchange: str, dest_kind: str, destination: str,
               routing_key: str, arguments: dict | None = None) -> int:
        return self.append(BindingRemoved(vhost, exchange, dest_kind, destination, routing_key,
                                          arguments or {}))

    # ------------------------------------------------------------------ commit
    def commit(self) -> int:
        """Write all buffered records (plus compaction work) with one write and one fdatasync;
        return the durable LSN. No buffered records and no compaction due: no I/O.

        Raises JournalUnavailable (disk full, I/O error): nothing committed before is lost, the
        records stay buffered and the next commit retries them. RuntimeError if a
        :meth:`commit_async` is in flight."""
        if self.writer.inflight is not None:
            raise RuntimeError("Journal.commit() while a commit_async() is in flight")
        job = self.prepare_commit()
        if job is None:
            return self._durable_lsn
        try:
            self.writer.run(job)
        except OSError as exc:
            self.commit_failed(job)
            raise unavailable(f"cannot write {job.segment.path}", exc) from exc
        self.finish_commit(job)
        return self._durable_lsn

    def prepare_commit(self) -> Job | None:
        """A commit's first step (the writer's hook): take the buffer (plus compaction work)
        and frame it into one write; None when there is nothing to do."""
        delete, compaction = plan_compaction(self.segments, self.head, self.config, self.state,
                                             self._snapshot_seg)
        self._buffer.extend(compaction)
        if not self._buffer and not delete:
            return None
        records, self._buffer = self._buffer, []
        self._buffered_bytes = 0
        body = sum(RECORD_OVERHEAD + len(p.payload) for p in records)
        batch = encode_payload(Batch(body))
        head = self.head
        assert head is not None
        parts: list[bytes] = []
        if self._force_roll or (head.size > HEADER_BYTES and head.size + RECORD_OVERHEAD
                                + len(batch) + body > self.config.segment_bytes):
            number = head.number + 1
            seg = Segment(number, self.directory / f"{number:08d}.seg",
                           random.getrandbits(32), 0)
            new, offset = True, 0
            parts.append(segment_header(seg.salt))
            pos = HEADER_BYTES
        else:
            seg, new, offset, pos = head, False, head.size, head.size
        salt = seg.salt
        parts.extend(frame(int(RecordType.BATCH), batch, salt))
        pos += RECORD_OVERHEAD + len(batch)
        placed = frame_all(records, salt, pos, parts)
        return Job(seg, new, offset, b"".join(parts), placed, delete, self._tail_dirty,
                    self._appended_lsn)

    def finish_commit(self, job: Job) -> None:
        """A commit's last step once its disk work succeeded (the writer's hook): place its
        records in the index and the segments, move the durable LSN."""
        seg = job.segment
        if job.new:
            seg.fd = job.fd
            self.segments[seg.number] = seg
            self.head = seg
        seg.size = job.offset + len(job.data)
        entries = self.state.entries
        segments = self.segments
        for p, offset, size in job.placed:
            if p.rtype == _ENQUEUE:
                e = entries.get(p.entry_id)
                if e is None or (p.kind is Kind.COPY and e.segment != p.source):
                    continue
                old = segments.get(e.segment) if e.segment else None
                if old is not None:
                    old.live_count -= 1
                    old.live_bytes -= e.size
                e.segment, e.offset, e.size = seg.number, offset, size
                seg.live_count += 1
                seg.live_bytes += size
            elif p.rtype in TOPOLOGY_TYPES:
                seg.topo_records += 1
                if p.rtype == _SNAPSHOT:
                    self._snapshot_seg = seg.number
        for old in job.delete:
            if old.live_count:
                log.error("journal: compacted %s still had %d live records", old.path,
                          old.live_count)
            old.close()
            if old.path.exists():
                old.copy_cursor = HEADER_BYTES      # unlink failed: keep it, retry later
            else:
                segments.pop(old.number, None)
        self._durable_lsn = max(self._durable_lsn, job.upto)
        self._available = True
        self._tail_dirty = False
        self._force_roll = False
        self.commits += 1
        self.fsyncs += 1
        self.fsync_seconds.observe(job.fsync_s)
        self.commit_records.observe(len(job.placed))

    def commit_failed(self, job: Job) -> None:
        """A commit's disk work failed (the writer's hook): keep its node records buffered
        (same LSNs, in front)."""
        self._available = False
        kept = [p for p, _, _ in job.placed if p.kind is Kind.USER]
        self._buffer = kept + self._buffer
        self._buffered_bytes = sum(RECORD_OVERHEAD + len(p.payload) for p in self._buffer)
        for seg in self.segments.values():
            seg.copy_cursor = HEADER_BYTES
        if job.new:
            if job.fd >= 0:
                os.close(job.fd)
                job.fd = -1
            try:
                job.segment.path.unlink()
            except OSError:
                pass
            self._force_roll = True             # never leave a half-made newer segment behind
        else:
            self._tail_dirty = True

    # ------------------------------------------------------------------ reading / info
    def replay(self) -> Iterator[Record]:
        """Every committed record (BATCH markers excluded), in log order. Raises JournalCorrupt
        if a file changed under the journal."""
        for seg in list(self.segments.values()):
            with open(seg.path, "rb") as f:
                data = f.read(seg.size)
            for offset, _size, rtype, payload in scan(data, str(seg.path), False).records:
                if rtype != RecordType.BATCH:
                    try:
                        yield decode_record(rtype, payload)
                    except ValueError as exc:
                        raise JournalCorrupt(str(seg.path), offset, str(exc)) from None

    def stats(self) -> JournalStats:
        segs = self.segments.values()
        return JournalStats(len(self.segments), sum(s.size for s in segs),
                            len(self.state.entries), sum(s.live_bytes for s in segs),
                            len(self._buffer), self._durable_lsn, self.commits, self.fsyncs)

    def close(self) -> None:
        """Commit what is buffered (best effort: a failure is logged), close files, release
        the directory lock. Await the last :meth:`commit_async` first."""
        if self.writer.inflight is None and self._buffer:
            try:
                self.commit()
            except JournalUnavailable as exc:
                log.error("journal: %d records not committed at close: %s",
                          len(self._buffer), exc)
        self.writer.close()
        self._close_files()

    def _close_files(self) -> None:
        for seg in self.segments.values():
            seg.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
