"""The journal's writes: :class:`CommitWriter` (design.md section 5, docs/durability.md "Commit
rule", "Disk errors").

The :class:`~shoal.node.durability.journal.Journal` prepares a commit on the event loop's thread
(its buffered records and compaction copies framed into one :class:`~.compact.Job`) and applies
the outcome there (``finish_commit`` / ``commit_failed``); this module does what lies between:

- :meth:`CommitWriter.run`, the disk work of one job (any thread): one ``pwrite`` loop at the
  job's offset (first truncating what a failed write left past it), ONE ``os.fdatasync``, an fsync of the
  directory when the job starts a new segment, then the unlink of compacted segments (a failed
  unlink is logged; compaction retries it). Raises OSError;
- :meth:`CommitWriter.commit_async`, the worker thread (one, named ``shoal-journal``, made on
  the first use) that runs the jobs: one in flight at a time, in order; records appended
  meanwhile form the next job (group commit). Each future resolves to the durable LSN once every
  record appended before its call is on disk, or raises JournalUnavailable (the OSError kept as
  ``os_error``: ENOSPC, EIO) when its job failed; a record is confirmed only once its LSN is
  durable, never before.

- :meth:`CommitWriter.commit_now`, the same commit on the calling (event loop's) thread, taken
  while :meth:`CommitWriter.can_commit_now`: no job in flight, the journal writing, and the
  disk's recent fdatasyncs short (their median at most :data:`INLINE_FSYNC_MAX_S`). On this
  project's test VM a hand-off to the thread and back cost more CPU than the fdatasync's wait
  (docs/performance.md, "Issue 46: the journal's commit on the loop's thread"); a slow disk
  (network block storage), or a job larger than :data:`INLINE_MAX_BYTES` (a compaction's
  copy), goes to the thread, where the loop keeps serving while it waits; so does every
  commit of a node whose loop a router shares (``--embed-node``: group_commit.py). Quorum
  queues and streams already sync their logs on the loop's thread (node/replication,
  node/streams).

Only :meth:`run` leaves the loop's thread; the futures, the waiters and the in-flight job are
the loop's. What the writer uses of the journal is :class:`CommitSteps`.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from shoal.node.durability.compact import Job, fsync_dir
from shoal.node.durability.format import unavailable

log = logging.getLogger("shoal.node.durability.journal")

#: :meth:`CommitWriter.commit_now` commits on the loop's thread while the median wall time
#: of the last :data:`FSYNC_SAMPLES` fdatasyncs it made is at most this many seconds (a
#: median, so that a busy CPU's late wake-ups after a sync do not count as a slow disk).
#: Above it the worker thread commits, and one commit every :data:`PROBE_EVERY_S` seconds is
#: still made on the loop's thread to measure the disk again (the worker's own timings
#: include its waits for the GIL).
INLINE_FSYNC_MAX_S = 0.002
FSYNC_SAMPLES = 15
PROBE_EVERY_S = 1.0
#: ... and while the commit's write is at most this many bytes (a larger one, a compaction's
#: copy of live records, goes to the worker thread).
INLINE_MAX_BYTES = 1 << 20


class CommitSteps(Protocol):
    """What the writer uses of the journal (node/durability/journal.py's ``Journal``)."""

    @property
    def appended_lsn(self) -> int: ...

    @property
    def durable_lsn(self) -> int: ...

    @property
    def available(self) -> bool: ...

    def prepare_commit(self) -> Job | None: ...

    def finish_commit(self, job: Job) -> None: ...

    def commit_failed(self, job: Job) -> None: ...


class CommitWriter:
    """The writes of one journal in ``directory``. ``inflight``: the running job's future
    (None when no :meth:`commit_async` job runs)."""

    def __init__(self, journal: CommitSteps, directory: Path) -> None:
        self.journal = journal
        self.directory = directory
        self.inflight: asyncio.Future | None = None
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self._executor: ThreadPoolExecutor | None = None
        #: median wall time of the recent fdatasyncs on the loop's thread (s)
        self.fsync_recent_s = 0.0
        self._fsyncs: deque[float] = deque(maxlen=FSYNC_SAMPLES)
        self._probed = 0.0          # time.monotonic() of the last probe

    def run(self, job: Job) -> None:
        """The disk work of one commit (any thread): one pwrite, one fdatasync, then unlink
        compacted segments. Raises OSError."""
        if job.new:
            job.fd = fd = os.open(job.segment.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        else:
            fd = job.segment.fd
            if job.truncate:
                os.ftruncate(fd, job.offset)
        view = memoryview(job.data)
        pos = job.offset
        while view:
            n = os.pwrite(fd, view, pos)
            view = view[n:]
            pos += n
        t0 = time.perf_counter()
        os.fdatasync(fd)
        job.fsync_s = time.perf_counter() - t0
        if job.new:
            fsync_dir(self.directory)
        for seg in job.delete:
            try:
                seg.path.unlink()
            except OSError as exc:      # dead data stays; retried by a later compaction
                log.warning("journal: cannot delete compacted %s: %s", seg.path, exc)

    def can_commit_now(self) -> bool:
        """Whether :meth:`commit_now` may run the next commit on this thread: no job in
        flight, the journal writing (a failing disk is retried on the worker thread), and the
        recent fdatasyncs short (:data:`INLINE_FSYNC_MAX_S`), or a probe due."""
        if self.inflight is not None or not self.journal.available:
            return False
        if self.fsync_recent_s <= INLINE_FSYNC_MAX_S:
            return True
        now = time.monotonic()
        if now - self._probed >= PROBE_EVERY_S:
            self._probed = now
            return True
        return False

    def commit_now(self) -> bool:
        """Commit on the calling thread (the event loop's; call only when
        :meth:`can_commit_now`): one pwrite, one fdatasync. True: every record appended
        before the call is on disk (or nothing was buffered). False: the job is larger than
        :data:`INLINE_MAX_BYTES` and went to the worker thread; the caller waits for it with
        :meth:`commit_async`. Raises JournalUnavailable (ENOSPC, EIO: the records stay
        buffered, as for a failed :meth:`commit_async`)."""
        job = self.journal.prepare_commit()
        if job is None:
            return True
        if len(job.data) > INLINE_MAX_BYTES:
            self._start(job, asyncio.get_running_loop())
            return False
        try:
            self.run(job)
        except OSError as exc:
            self.journal.commit_failed(job)
            err = unavailable(f"cannot write {job.segment.path}", exc)
            self._resolve_waiters(err)
            raise err from exc
        self._observe(job)
        self.journal.finish_commit(job)
        self._resolve_waiters(None)
        return True

    def _observe(self, job: Job) -> None:
        samples = self._fsyncs
        samples.append(job.fsync_s)
        self.fsync_recent_s = sorted(samples)[len(samples) // 2]

    def commit_async(self) -> asyncio.Future:
        """Commit on the worker thread; the future resolves to the durable LSN once every
        record appended before this call is on disk (or raises JournalUnavailable). Records
        appended meanwhile go into the next commit (group commit); commits stay in order.
        Call from the running event loop."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        j = self.journal
        target = j.appended_lsn
        if target <= j.durable_lsn and self.inflight is None:
            fut.set_result(j.durable_lsn)
            return fut
        self._waiters.append((target, fut))
        self._kick(loop)
        return fut

    def _kick(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.inflight is not None:
            return
        job = self.journal.prepare_commit()
        if job is None:
            self._resolve_waiters(None)
            return
        self._start(job, loop)

    def _start(self, job: Job, loop: asyncio.AbstractEventLoop) -> None:
        """Hand ``job`` to the worker thread (made on the first use)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="shoal-journal")
        self.inflight = inflight = loop.run_in_executor(self._executor, self.run, job)
        inflight.add_done_callback(lambda f: self._job_done(job, f, loop))

    def _job_done(self, job: Job, f: asyncio.Future, loop: asyncio.AbstractEventLoop) -> None:
        self.inflight = None
        exc = f.exception() if not f.cancelled() else asyncio.CancelledError()
        if exc is not None:
            self.journal.commit_failed(job)
            self._resolve_waiters(unavailable(f"cannot write {job.segment.path}", exc))
            return
        self.journal.finish_commit(job)
        self._resolve_waiters(None)
        if self._waiters:
            self._kick(loop)

    def _resolve_waiters(self, error: BaseException | None) -> None:
        durable = self.journal.durable_lsn
        keep = []
        for target, fut in self._waiters:
            if fut.done():
                continue
            if target <= durable:
                fut.set_result(durable)
            elif error is not None:
                fut.set_exception(error)
            else:
                keep.append((target, fut))
        self._waiters = keep

    def close(self) -> None:
        """Stop the worker thread (after its job, if one runs)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
