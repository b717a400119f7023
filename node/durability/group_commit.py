"""The node server's group commit: :class:`GroupCommit` (design.md section 5, docs/durability.md
"What the node does").

One object per :class:`~shoal.node.server.NodeServer`, holding the node's
:class:`~shoal.node.durability.journal.Journal` from open to close:

- **open** (:meth:`GroupCommit.open`, :meth:`GroupCommit.take_clean_marker`): the journal in
  ``<data_dir>/journal``; the file :data:`CLEAN_MARKER` there says the last run stopped cleanly
  (without it every recovered message is marked redelivered), and is removed at start;
- **one commit per turn** (:meth:`GroupCommit.commit`, the server's ``_commit``): the shard
  appends the turn's settlements, then ONE commit (one write + one fdatasync) if records are
  pending and none of this server's is in flight. While the disk's fdatasyncs are short
  (``Journal.can_commit_now``) it runs on the loop's thread, after the turn's outbox is sent
  (deliveries do not wait for the disk), and the answers it releases leave with the turn's
  own flush. Otherwise, and always when a router shares the loop (``inline`` False:
  ``--embed-node``, whose node turns come with each of the router's batches, so that a
  commit on its thread would hold up every client of that router, tripling its p50),
  ``Journal.commit_async`` runs it on the journal's thread, and records appended meanwhile
  form the next group. When it is on disk the answers that promised
  durability (PUBLISH_RESULT of persistent messages, REPLYs of durable declares) are released
  (``Shard.release_durable``) and the outbox is flushed;
- **a failing disk** (``JournalUnavailable``: ENOSPC, EIO): the answers stay withheld (never a
  false confirm), the error is logged once, the routers are told (NODE_BLOCKED, which blocks
  publishers with ``connection.blocked``) and the commit is retried every
  :data:`COMMIT_RETRY_S` seconds until one succeeds;
- **why publishers must wait**: the journal's reason and the resource alarms' (node/alarms.py,
  :meth:`GroupCommit.set_alarm`), joined into one NODE_BLOCKED reason (None when neither holds);
- **stop** (:meth:`GroupCommit.finish`, :meth:`GroupCommit.close`): the last commit (10 s at
  most), its answers released, then the clean marker if everything is on disk.

It calls the shard through :class:`CommitTarget` and the server through callbacks (flush the
outbox, wake the loop, schedule a retry); it never raises from a commit's callback.
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Callable, Protocol

from shoal.node.durability.journal import Journal, JournalUnavailable, fsync_dir

log = logging.getLogger("shoal.node")

#: File in the journal directory written by a clean stop (after the last commit) and removed
#: at start: without it, the last turn's delivery states may be lost, so every recovered
#: message is marked redelivered.
CLEAN_MARKER = "CLEAN"
#: Seconds between commit retries while the journal cannot write.
COMMIT_RETRY_S = 1.0


class CommitTarget(Protocol):
    """What the group commit uses of the shard (node/shard.py's ``Shard``)."""

    node_id: str

    def journal_flush(self) -> bool: ...

    def release_durable(self) -> int: ...

    def set_blocked(self, reason: str | None) -> None: ...


class GroupCommit:
    """The journal of a node server and its one commit per turn.

    ``GroupCommit(target, flush, poke, call_later)``: ``flush()`` sends the shard's outbox,
    ``poke()`` wakes the server's loop, ``call_later(seconds, fn)`` schedules ``fn`` and returns
    its handle, or None when the server is not running or stopping (no retry then).
    ``journal``: None until :meth:`open`, and again after :meth:`close`.
    """

    def __init__(self, target: CommitTarget, flush: Callable[[], object],
                 poke: Callable[[], None],
                 call_later: Callable[[float, Callable[[], None]],
                                      asyncio.TimerHandle | None]) -> None:
        self.target = target
        self._flush = flush
        self._poke = poke
        self._call_later = call_later
        self.journal: Journal | None = None
        self.alarm: str | None = None               #: resource alarms' reason (alarms.py)
        self.journal_blocked: str | None = None     #: why the journal cannot write
        self._committing = False        # a commit_async of this server is in flight
        self._retry: asyncio.TimerHandle | None = None
        self._last_commit: asyncio.Future | None = None
        self.clean = False              # the last commit at stop succeeded
        #: commit on the loop's thread while the disk is fast (False: always the journal's
        #: thread; the server sets it when a router runs in its loop, --embed-node)
        self.inline = True

    def open(self, path: Path) -> Journal:
        """Open the journal in ``path`` (``Journal.open``: raises JournalCorrupt,
        JournalUnavailable)."""
        self.journal = Journal.open(path)
        return self.journal

    def take_clean_marker(self) -> bool:
        """Whether the last run stopped cleanly; the marker is removed (and the directory
        fsynced), so a crash from now on counts as unclean. Raises OSError."""
        assert self.journal is not None
        path = self.journal.directory
        marker = path / CLEAN_MARKER
        clean = marker.exists()
        if clean:
            marker.unlink()
            fsync_dir(path)
        return clean

    def commit(self) -> None:
        """End of a turn: append the turn's settlements and start one group commit if records
        are pending (none in flight from this server: the journal groups what comes
        meanwhile into the next one)."""
        if self.journal is None or not self.target.journal_flush():
            return
        if self._committing or self._retry is not None:
            return
        journal = self.journal
        if self.inline and journal.can_commit_now():
            self._flush()              # the turn's deliveries leave before the disk's wait
            try:
                done = journal.commit_now()
            except JournalUnavailable as exc:
                self._failed(exc)
                return
            if done:                   # the caller's turn flushes the released answers
                self.target.release_durable()
                return
        self._commit_async()

    def _commit_async(self) -> None:
        """Start a commit on the journal's thread; :meth:`_committed` takes its outcome."""
        assert self.journal is not None
        self._committing = True
        fut = self._last_commit = self.journal.commit_async()
        fut.add_done_callback(self._committed)

    def _committed(self, fut: asyncio.Future) -> None:
        self._committing = False
        exc = None if fut.cancelled() else fut.exception()
        if isinstance(exc, JournalUnavailable):
            self._failed(exc)
            return
        if exc is not None:
            log.error("journal commit failed: %r", exc)
        if self.journal_blocked is not None and self.journal is not None \
                and self.journal.available:
            log.warning("journal writes again: resuming confirms")
            self.journal_blocked = None
            self._update_blocked()
        self.target.release_durable()
        self._flush()
        self._poke()                   # the send may have eaten the FD's edge: look again

    def _failed(self, exc: JournalUnavailable) -> None:
        """A commit failed: withhold its answers, tell the routers, retry later."""
        if self.journal_blocked is None:
            log.error("journal cannot write: %s; persistent publishes are not confirmed "
                      "until it can (retrying every %.0f s)", exc, COMMIT_RETRY_S)
        self.journal_blocked = f"shoal node {self.target.node_id}: journal cannot write " \
                               f"({_reason(exc)})"
        self._update_blocked()
        self._flush()
        self._retry = self._call_later(COMMIT_RETRY_S, self._retry_commit)

    def _retry_commit(self) -> None:
        self._retry = None
        self.commit()
        if not self._committing and self._retry is None and self.journal is not None \
                and not self.journal.available:
            self._commit_async()       # nothing new buffered: retry the old records

    def set_alarm(self, reason: str | None) -> None:
        """A resource alarm (node/alarms.py) went on (``reason``) or off (None)."""
        self.alarm = reason
        self._update_blocked()
        self._flush()

    def _update_blocked(self) -> None:
        """Tell the routers (NODE_BLOCKED) why publishers must wait: a resource alarm
        and/or a journal that cannot write; None when neither holds."""
        reasons = [r for r in (self.alarm, self.journal_blocked) if r]
        self.target.set_blocked("; ".join(reasons) if reasons else None)

    async def finish(self) -> None:
        """Stopping: commit what is pending and send the answers it releases."""
        if self.journal is None:
            return
        self.target.journal_flush()
        try:
            if self._last_commit is not None and not self._last_commit.done():
                await asyncio.wait([self._last_commit], timeout=10)
            self._committing = False
            if self.journal.available or self._retry is None:
                await asyncio.wait_for(self.journal.commit_async(), 10)
        except (JournalUnavailable, asyncio.TimeoutError) as exc:
            log.error("journal: last commit failed at stop: %s", exc)
            return
        self.target.release_durable()
        self.clean = True

    def cancel_retry(self) -> None:
        """The server stopped serving: no more retries."""
        if self._retry is not None:
            self._retry.cancel()

    def close(self) -> None:
        """Close the journal; mark a clean stop when :meth:`finish` committed everything."""
        journal = self.journal
        if journal is None:
            return
        if self.clean and journal.available and journal.stats().buffered_records == 0:
            try:
                (journal.directory / CLEAN_MARKER).touch()
                fsync_dir(journal.directory)
            except OSError as exc:
                log.warning("journal: cannot mark a clean stop: %s", exc)
        journal.close()
        self.journal = None


def _reason(exc: JournalUnavailable) -> str:
    err = getattr(exc, "os_error", None)
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(exc)
