"""Paging message bodies out to disk: a queue holds more than fits in memory (issue 22, point 4).

RabbitMQ's classic queues page message bodies to disk when memory runs short, and a queue
declared with ``x-queue-mode: lazy`` keeps (almost) nothing in memory; its quorum queues bound
what stays resident with ``x-max-in-memory-bytes``. Shoal does the same per queue: once a
queue's ready bytes (``Queue.ready_bytes``: the bodies of its AVAILABLE and HELD entries) pass
its budget, each new message's body is written to the node's page files and the entry keeps a
:class:`PagedBody` (offset and size) instead of the bytes. The header, the routing data and
the entry itself stay in memory (a few hundred bytes per message), so ordering, selectors,
groups and every queue feature work as before; the body is read back when the message is
delivered, fetched with ``basic.get`` or dead-lettered.

Budget, in bytes (0 = page every body): ``x-max-in-memory-bytes`` on the queue, 0 for
``x-queue-mode: lazy``, else the node setting ``queue_max_in_memory_bytes`` (64 MiB). Resident
ready bodies stay under budget + one message: a message stays in memory only if the queue's
ready bytes, itself included, are within the budget when it arrives.

Page files live beside the journal, in ``<data_dir>/<node_id>/pages/``: segments of
``segment_bytes`` written with plain ``write`` (no fsync: a paged body is a copy of what is in
memory or in the journal, never the only durable one), read with ``pread``. A segment is
deleted once no entry refers to it (a :class:`PagedBody` is dropped when its entry dies). The
directory is emptied when the node starts: persistent messages come back from the journal.
A body that cannot be written (disk full) stays in memory and the failure is logged once.
"""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger("shoal.node")

#: ``queue_max_in_memory_bytes``'s default: 64 MiB of ready bodies per queue stay in memory.
DEFAULT_BUDGET = 64 << 20
SEGMENT_BYTES = 64 << 20


class PagedBody:
    """A message body in a page file. ``len()`` is the body's size in bytes, so the queue's
    byte counts (``x-max-length-bytes``) work unchanged. Dropping the last reference releases
    its place in the segment."""

    __slots__ = ("store", "segment", "offset", "size")

    def __init__(self, store: "PageStore", segment: int, offset: int, size: int) -> None:
        self.store = store
        self.segment = segment
        self.offset = offset
        self.size = size

    def __len__(self) -> int:
        return self.size

    def read(self) -> bytes:
        """The body's bytes (one ``pread``). Raises OSError if the page file cannot be read."""
        return self.store.read(self)

    def __del__(self) -> None:
        try:
            self.store.release(self.segment, self.size)
        except Exception:          # never raise out of a finaliser  # pragma: no cover
            log.exception("releasing a paged body failed")


def body_bytes(body: object) -> bytes:
    """``body`` as bytes: a :class:`PagedBody` is read back, bytes are returned as they are."""
    return body.read() if body.__class__ is PagedBody else body  # type: ignore[union-attr]


class PageStore:
    """The node's page files. ``default_budget``: bytes of ready bodies a queue keeps in memory
    when it sets no budget of its own. Counters: ``paged_bytes``/``paged_messages`` (bodies on
    disk now), ``page_outs`` (bodies written since start)."""

    def __init__(self, directory: str | os.PathLike, default_budget: int = DEFAULT_BUDGET,
                 segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = Path(directory)
        shutil.rmtree(self.directory, ignore_errors=True)     # last run's pages: stale
        self.directory.mkdir(parents=True, exist_ok=True)
        self.default_budget = default_budget
        self.segment_bytes = segment_bytes
        self._fds: dict[int, int] = {}
        self._live: dict[int, int] = {}
        self._current = 0
        self._size = 0
        self._failed = False
        self.paged_bytes = 0
        self.paged_messages = 0
        self.page_outs = 0

    def over_budget(self, q: Any) -> bool:
        """Whether queue ``q``'s ready bytes pass its budget: its own (``x-max-in-memory-bytes``,
        lazy = 0) or the node's default. A new message's body then goes to the page files."""
        own = q.cfg.max_in_memory_bytes
        return q.ready_bytes > (self.default_budget if own is None else own)

    def page_out(self, body: bytes) -> "PagedBody | bytes":
        """Write ``body`` to the current segment; returns its :class:`PagedBody`, or ``body``
        itself when the write failed (logged once per failure streak)."""
        if self._fds.get(self._current) is None or (
                self._size and self._size + len(body) > self.segment_bytes):
            if not self._roll():
                return body
        fd = self._fds[self._current]
        offset = self._size
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view):]
        except OSError as exc:
            self._fail(exc)
            try:
                os.ftruncate(fd, offset)
            except OSError:
                pass
            return body
        self._failed = False
        self._size += len(body)
        self._live[self._current] += 1
        self.paged_bytes += len(body)
        self.paged_messages += 1
        self.page_outs += 1
        return PagedBody(self, self._current, offset, len(body))

    def read(self, pb: PagedBody) -> bytes:
        fd = self._fds[pb.segment]
        data = os.pread(fd, pb.size, pb.offset)
        while len(data) < pb.size:           # a short read (large bodies): read the rest
            more = os.pread(fd, pb.size - len(data), pb.offset + len(data))
            if not more:
                raise OSError(f"page segment {pb.segment} ends before offset "
                              f"{pb.offset + pb.size}")
            data += more
        return data

    def release(self, segment: int, size: int) -> None:
        """One body of ``segment`` is no longer referred to; an unused segment other than the
        one being written is deleted."""
        self.paged_bytes -= size
        self.paged_messages -= 1
        left = self._live.get(segment, 0) - 1
        self._live[segment] = left
        if left <= 0 and segment != self._current:
            self._drop(segment)

    def close(self) -> None:
        """Close and delete every page file (the node stops)."""
        for seg in list(self._fds):
            self._drop(seg)
        shutil.rmtree(self.directory, ignore_errors=True)

    def _roll(self) -> bool:
        old = self._current
        path = self.directory / f"{old + 1:08d}.page"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as exc:
            self._fail(exc)
            return False
        self._current = old + 1
        self._size = 0
        self._fds[self._current] = fd
        self._live[self._current] = 0
        if old in self._fds and self._live.get(old, 0) <= 0:
            self._drop(old)
        return True

    def _drop(self, segment: int) -> None:
        fd = self._fds.pop(segment, None)
        self._live.pop(segment, None)
        if fd is None:
            return
        os.close(fd)
        try:
            os.unlink(self.directory / f"{segment:08d}.page")
        except OSError as exc:
            log.warning("could not delete page file %08d.page: %s", segment, exc)

    def _fail(self, exc: OSError) -> None:
        if not self._failed:
            log.warning("paging message bodies to %s failed (%s): keeping them in memory",
                        self.directory, exc)
        self._failed = True
