"""A stream's log on disk: segment files of chunks, each with its index (docs/streams.md).

The format of a segment and its index is segment.py's.

Durability: :meth:`SegmentLog.append` writes the chunk then its index record; :meth:`sync`
fdatasyncs the segment, and its index only until one record of it is on disk (the
segment's first sync). The index is derived from the chunks: at open, every chunk the last
segment's index names is checked (whole, and its CRC), and the chunks after the last one
named are read back from the segment, each taking the next log index, until one is torn or
fails its CRC; the segment is cut there (a torn write; what it cuts was never synced, so
never confirmed). One fdatasync a write instead of two: the index's cost as much as the
segment's on this project's VM, and a stream's replicated publish rate rose by about a
tenth (docs/performance.md, issue 47). A restart thus reads the segment being written once,
at most ``max_segment_bytes``, as before. Earlier segments, index too, were synced when the
next one began.

Retention (RabbitMQ's ``x-max-length-bytes`` and ``x-max-age``, rabbit_stream_queue.erl and
osiris_retention.erl) removes whole segments from the front, never the one being written.
"""
from __future__ import annotations

import bisect
import os
import shutil
from pathlib import Path

from shoal.node.durability.compact import fsync_dir
from shoal.node.streams.chunk import HEADER_SIZE, USER, ChunkError, ChunkHeader, check
from shoal.node.streams.segment import (INDEX, INDEX_HEADER, INDEX_SIZE, SEGMENT_HEADER, Segment,
                                        pwrite_all, segment_name)

#: Osiris's defaults for x-stream-max-segment-size-bytes and chunks per segment
DEFAULT_MAX_SEGMENT_BYTES = 500_000_000
DEFAULT_MAX_SEGMENT_CHUNKS = 256_000
#: RabbitMQ's ceiling for x-stream-max-segment-size-bytes (rabbit.hrl)
MAX_SEGMENT_BYTES = 3_000_000_000


class SegmentLog:
    """The chunks of one stream member, in segment files under ``directory``.

    ``next_offset`` is the offset the next chunk must start at; ``first_offset`` the first
    offset still held (``next_offset`` when none is). Sizes in bytes, times epoch ms.
    Raises ValueError for a chunk that does not start at ``next_offset`` and
    :class:`~shoal.node.streams.chunk.ChunkError` for bytes that are not a chunk.
    """

    def __init__(self, directory: str | os.PathLike,
                 max_segment_bytes: int = DEFAULT_MAX_SEGMENT_BYTES,
                 max_segment_chunks: int = DEFAULT_MAX_SEGMENT_CHUNKS) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_segment_bytes = min(max_segment_bytes, MAX_SEGMENT_BYTES)
        self.max_segment_chunks = max_segment_chunks
        self.segments: list[Segment] = []
        self.next_offset = 0
        self.bytes = 0              # every segment file's size
        self._firsts: list[int] = []
        self._recover()
        if not self.segments:           # a new log has its first segment, as Osiris's
            self._sync(self._new_segment(self.next_offset))

    # -- reading --------------------------------------------------------------------------

    @property
    def first_offset(self) -> int:
        for s in self.segments:
            if s.chunks:
                return s.chunk_id(0)
        return self.next_offset

    @property
    def last_chunk_id(self) -> int | None:
        """The id of the last chunk written (RabbitMQ's ``last`` offset spec starts there),
        or None for an empty log."""
        for s in reversed(self.segments):
            for i in range(s.chunks - 1, -1, -1):
                if s.record(i)[4] == USER:
                    return s.chunk_id(i)
        return None

    @property
    def first_timestamp(self) -> int | None:
        for s in self.segments:
            if s.chunks:
                return s.timestamp(0)
        return None

    def locate(self, offset: int) -> tuple[Segment, int] | None:
        """The segment and index position of the chunk that holds ``offset``, or None when
        it is not held (before ``first_offset`` or at ``next_offset`` and after)."""
        if offset >= self.next_offset or offset < self.first_offset:
            return None
        k = bisect.bisect_right(self._firsts, offset) - 1
        while k >= 0:
            s = self.segments[k]
            i = s.find(offset)
            if i >= 0:
                return s, i
            k -= 1
        return None

    def chunk_at(self, offset: int) -> bytes | None:
        """The whole chunk that holds ``offset`` (one read from the file), or None."""
        at = self.locate(offset)
        if at is None:
            return None
        s, i = at
        return s.read(s.record(i)[3], s.end_of(i))

    def record_of(self, offset: int) -> tuple[int, int, int, int, int, int] | None:
        """The index record of the chunk holding ``offset``: ``(chunk_id, timestamp, epoch,
        position, type, log_index)``, or None."""
        at = self.locate(offset)
        return None if at is None else at[0].record(at[1])

    def locate_index(self, log_index: int) -> tuple[Segment, int] | None:
        """The segment and position of the chunk whose replication log index is
        ``log_index`` (node/streams/replica.py), or None when it is not held."""
        k = len(self.segments) - 1
        while k >= 0:
            s = self.segments[k]
            if s.chunks and s.log_index(0) <= log_index:
                i = s.find_index(log_index)
                return None if i < 0 else (s, i)
            k -= 1
        return None

    def read_at(self, s: Segment, i: int) -> bytes:
        """The whole chunk at position ``i`` of segment ``s`` (one read)."""
        return s.read(s.record(i)[3], s.end_of(i))

    def seek_time(self, ts: int) -> int:
        """The id of the first chunk written at ``ts`` (epoch ms) or later, ``next_offset``
        when none was: RabbitMQ's timestamp offset spec (osiris_log.erl's
        ``timestamp_idx_scan``: the chunk is the unit)."""
        for s in self.segments:
            if s.chunks and s.timestamp(s.chunks - 1) >= ts:
                return s.chunk_id(s.find_time(ts))
        return self.next_offset

    # -- writing --------------------------------------------------------------------------

    def append(self, chunk: bytes, log_index: int = 0, verify: bool = False) -> ChunkHeader:
        """Write ``chunk`` (not yet synced: :meth:`sync`); ``verify`` checks its CRC first
        (a chunk from another member). Returns its header."""
        h = check(chunk) if verify else ChunkHeader(chunk)
        if len(chunk) != h.size:
            raise ChunkError(f"chunk {h.chunk_id}: {len(chunk)} bytes, its header says "
                             f"{h.size}")
        if h.chunk_id != self.next_offset:
            raise ValueError(f"chunk {h.chunk_id} does not start at the log's next offset "
                             f"{self.next_offset}")
        s = self.segments[-1] if self.segments else None
        # a new segment once this one is full, unless the chunk would start it under the
        # same name (a CONTROL chunk takes no offset: the next chunk has its id)
        if s is None or (s.chunks and h.chunk_id != s.first
                         and (s.size + len(chunk) > self.max_segment_bytes
                              or s.chunks >= self.max_segment_chunks)):
            if s is not None:
                self._sync(s)
            s = self._new_segment(h.chunk_id)
        s.open()
        rec = INDEX.pack(h.chunk_id, h.timestamp, h.epoch, s.size, h.type, log_index)
        pwrite_all(s.fd, chunk, s.size)
        pwrite_all(s.ifd, rec, len(INDEX_HEADER) + len(s.index))
        s.index += rec
        s.size += len(chunk)
        self.bytes += len(chunk)
        self.next_offset = h.next_offset
        return h

    def sync(self) -> None:
        """Everything appended is on disk once this returns: an fdatasync of the segment
        being written, and of its index while none of its records is on disk yet (the
        others are rebuilt from the chunks at open: module docstring). Raises OSError."""
        if not self.segments:
            return
        s = self.segments[-1]
        if s.fd is None:
            return
        os.fdatasync(s.fd)
        if not s.anchored and s.chunks:
            os.fdatasync(s.ifd)
            s.anchored = True

    def reset(self, next_offset: int) -> None:
        """Forget every chunk and start again at ``next_offset``: a member that is behind a
        leader's retention starts from the leader's first offset (docs/streams.md)."""
        for s in self.segments:
            s.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.segments = []
        self._firsts = []
        self.bytes = 0
        self.next_offset = next_offset
        self._sync(self._new_segment(next_offset))

    def truncate_from(self, offset: int) -> None:
        """Remove the chunk holding ``offset`` and every later one (a replica's chunks that
        the leader's log does not have); ``next_offset`` becomes that chunk's id. Does
        nothing when ``offset`` is not held."""
        at = self.locate(offset)
        if at is not None:
            self.cut(*at)

    def cut(self, s: Segment, i: int) -> None:
        """Remove chunk ``i`` of segment ``s`` and every later one (by position: a replica
        cuts at a log index, node/streams/replica.py, and a CONTROL chunk shares its chunk
        id with the chunk after it)."""
        k = self.segments.index(s)
        for later in self.segments[k + 1:]:
            self._remove(later)
        if k + 1 < len(self.segments):
            fsync_dir(self.directory)   # an unlinked later segment must not come back
        del self.segments[k + 1:]
        del self._firsts[k + 1:]
        cid, _, _, pos, _, _ = s.record(i)
        s.open()
        os.ftruncate(s.fd, pos)
        os.ftruncate(s.ifd, len(INDEX_HEADER) + i * INDEX_SIZE)
        self.bytes -= s.size - pos
        s.size = pos
        del s.index[i * INDEX_SIZE:]
        self.next_offset = cid
        self._sync(s)

    def retain(self, max_bytes: int | None, max_age_ms: int | None, now_ms: int) -> int:
        """Apply retention: remove the oldest segments while the log is over ``max_bytes``
        or their newest chunk is older than ``max_age_ms`` before ``now_ms``; never the
        segment being written. Returns how many were removed."""
        return self.drop_front(self.retention_plan(max_bytes, max_age_ms, now_ms))

    def retention_plan(self, max_bytes: int | None, max_age_ms: int | None, now_ms: int,
                       keep_index: int | None = None) -> int:
        """How many segments from the front :meth:`retain` would remove; with
        ``keep_index``, none holding a chunk whose log index is past it (a replicated
        stream keeps what it has not applied)."""
        n, size = 0, self.bytes
        while n < len(self.segments) - 1:
            s = self.segments[n]
            over = max_bytes is not None and size > max_bytes
            old = (max_age_ms is not None and s.chunks
                   and s.timestamp(s.chunks - 1) < now_ms - max_age_ms)
            if not (over or old or not s.chunks):
                break
            if keep_index is not None and s.chunks and s.log_index(s.chunks - 1) > keep_index:
                break
            size -= s.size
            n += 1
        return n

    def drop_front(self, n: int) -> int:
        """Remove the first ``n`` segments (files and index); returns ``n``. The directory
        is synced: a segment a crash brought back would break the log's continuity."""
        for s in self.segments[:n]:
            self._remove(s)
        if n:
            fsync_dir(self.directory)
        del self.segments[:n]
        del self._firsts[:n]
        return n

    def close(self) -> None:
        for s in self.segments:
            s.close()

    def destroy(self) -> None:
        """Close and delete every file (the stream was deleted)."""
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        self.segments = []
        self._firsts = []
        self.bytes = 0

    # -- inside ---------------------------------------------------------------------------

    def _new_segment(self, first: int) -> Segment:
        s = Segment(first, self.directory / f"{segment_name(first)}.segment")
        s.open()
        os.ftruncate(s.fd, 0)
        os.ftruncate(s.ifd, 0)
        pwrite_all(s.fd, SEGMENT_HEADER, 0)
        pwrite_all(s.ifd, INDEX_HEADER, 0)
        self.segments.append(s)
        self._firsts.append(first)
        self.bytes += s.size
        fsync_dir(self.directory)
        return s

    def _sync(self, s: Segment) -> None:
        """fdatasync the segment and its whole index."""
        if s.fd is not None:
            os.fdatasync(s.fd)
            os.fdatasync(s.ifd)
            s.anchored = s.chunks > 0

    def _remove(self, s: Segment) -> None:
        s.close()
        self.bytes -= s.size
        for p in (s.path, s.path.with_suffix(".index")):
            try:
                p.unlink()
            except FileNotFoundError:
                pass

    def _recover(self) -> None:
        names = sorted(p for p in self.directory.glob("*.segment"))
        for n, path in enumerate(names):
            try:
                first = int(path.stem)
            except ValueError:
                continue
            s = Segment(first, path)
            s.size = path.stat().st_size
            last = n == len(names) - 1
            if s.size < len(SEGMENT_HEADER) or path.read_bytes()[:8] != SEGMENT_HEADER:
                if not last:
                    raise ChunkError(f"{path}: not a stream segment")
                s.open()
                os.ftruncate(s.fd, 0)
                pwrite_all(s.fd, SEGMENT_HEADER, 0)
                s.size = len(SEGMENT_HEADER)
            self._load_index(s, check_tail=last)
            self.segments.append(s)
            self._firsts.append(first)
            self.bytes += s.size
        self._drop_discontinuous()
        self.next_offset = 0
        for s in reversed(self.segments):
            if s.chunks:
                cid, _, _, pos, _, _ = s.record(s.chunks - 1)
                self.next_offset = ChunkHeader(s.read(pos, pos + HEADER_SIZE)).next_offset
                break
        else:
            if self.segments:
                self.next_offset = self.segments[-1].first

    def _drop_discontinuous(self) -> None:
        """Segments must continue one another (each one's first chunk id is the offset after
        the previous one's last chunk): from the first that does not (a file a crash brought
        back after it was unlinked), the rest goes."""
        prev_next = None
        for k, s in enumerate(self.segments):
            if not s.chunks:
                continue
            if prev_next is not None and s.chunk_id(0) != prev_next:
                for later in self.segments[k:]:
                    self._remove(later)
                del self.segments[k:]
                del self._firsts[k:]
                fsync_dir(self.directory)
                return
            pos = s.record(s.chunks - 1)[3]
            prev_next = ChunkHeader(s.read(pos, pos + HEADER_SIZE)).next_offset

    def _load_index(self, s: Segment, check_tail: bool) -> None:
        """Read ``s``'s index. For the segment being written (``check_tail``) keep the
        records up to the first that does not name a whole chunk passing its CRC, then
        rebuild the records of the whole chunks after the last one kept (their index
        records may not have reached the disk: :meth:`sync`), each with the log index after
        the one before (0 stays 0: a stream without replication); cut the segment file
        after the last whole chunk (a torn write). A chunk with no record before it kept
        was never synced (the first sync writes the index too), so it goes."""
        ipath = s.path.with_suffix(".index")
        raw = ipath.read_bytes() if ipath.exists() else b""
        recs = bytearray(raw[len(INDEX_HEADER):]) if raw[:8] == INDEX_HEADER else bytearray()
        del recs[len(recs) - len(recs) % INDEX_SIZE:]
        if not check_tail:
            s.index = recs
            s.anchored = s.chunks > 0
            return
        s.open()
        pos = len(SEGMENT_HEADER)
        n = 0
        last: ChunkHeader | None = None
        for i in range(len(recs) // INDEX_SIZE):
            cid, _, _, at, _, _ = INDEX.unpack_from(recs, i * INDEX_SIZE)
            h = self._whole_at(s, at) if at == pos else None
            if h is None or h.chunk_id != cid:
                break
            pos = at + h.size
            n = i + 1
            last = h
        good = recs[:n * INDEX_SIZE]
        log_index = INDEX.unpack_from(recs, (n - 1) * INDEX_SIZE)[5] if n else 0
        while last is not None:
            h = self._whole_at(s, pos)
            if h is None or h.chunk_id != last.next_offset:
                break
            log_index = log_index + 1 if log_index else 0
            good += INDEX.pack(h.chunk_id, h.timestamp, h.epoch, pos, h.type, log_index)
            pos += h.size
            last = h
        if pos != s.size:
            os.ftruncate(s.fd, pos)
            s.size = pos
        s.index = good
        if good != recs or raw[:8] != INDEX_HEADER:
            os.ftruncate(s.ifd, 0)
            pwrite_all(s.ifd, INDEX_HEADER + bytes(good), 0)
        self._sync(s)

    @staticmethod
    def _whole_at(s: Segment, at: int) -> ChunkHeader | None:
        """The header of the whole chunk at ``at`` in ``s`` passing its CRC, else None."""
        if at + HEADER_SIZE > s.size:
            return None
        try:
            h = ChunkHeader(s.read(at, at + HEADER_SIZE))
            if at + h.size > s.size:
                return None
            check(s.read(at, at + h.size))
        except ChunkError:
            return None
        return h
