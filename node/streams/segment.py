"""One segment file of a stream's log and its index: the on-disk format (docs/streams.md,
"On disk"; the log of segments is segments.py).

One directory per stream member. A segment holds whole chunks (node/streams/chunk.py) in
write order after Osiris's 8-byte log header (``OSIL``, version 1), and is named by its first
chunk id, 20 digits, as Osiris names them: ``00000000000000004096.segment``. Beside it,
``.index`` holds one fixed-size record per chunk after an 8-byte header (``SHSI``, version 1):

=====  ====================================================================================
bytes  field
=====  ====================================================================================
8      chunk id (the chunk's first offset)
8      timestamp (signed, epoch ms)
8      epoch
4      the chunk's position in the segment file
1      chunk type
8      log index: the replication layer's index of the chunk (0 when none)
=====  ====================================================================================

Osiris's index record is the first 29 bytes of this one; the log index is Shoal's. Chunk ids
and (as the writer keeps them, :class:`~shoal.node.streams.stream.StreamWriter`) timestamps
never decrease, so seeking to an offset or to a time is a binary search over the records, a
lookup, not a scan. A reader's page of the index is the segment's ``index`` bytes in memory
(37 bytes a chunk, no object per chunk).
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

SEGMENT_HEADER = b"OSIL\x00\x00\x00\x01"
INDEX_HEADER = b"SHSI\x00\x00\x00\x01"
INDEX = struct.Struct(">QqQIBQ")
INDEX_SIZE = INDEX.size         # 37


class Segment:
    """One segment file and its index records (``index``: the records without the header)."""

    __slots__ = ("first", "path", "index", "size", "fd", "ifd", "anchored")

    def __init__(self, first: int, path: Path) -> None:
        self.first = first          # the chunk id in its name
        self.path = path
        self.index = bytearray()
        self.size = len(SEGMENT_HEADER)
        self.fd: int | None = None
        self.ifd: int | None = None
        #: some index record is on disk (SegmentLog.sync: the rest can be rebuilt from it)
        self.anchored = False

    @property
    def chunks(self) -> int:
        return len(self.index) // INDEX_SIZE

    def record(self, i: int) -> tuple[int, int, int, int, int, int]:
        """``(chunk_id, timestamp, epoch, position, type, log_index)`` of chunk ``i``."""
        return INDEX.unpack_from(self.index, i * INDEX_SIZE)

    def chunk_id(self, i: int) -> int:
        return int.from_bytes(self.index[i * INDEX_SIZE:i * INDEX_SIZE + 8], "big")

    def timestamp(self, i: int) -> int:
        return INDEX.unpack_from(self.index, i * INDEX_SIZE)[1]

    def end_of(self, i: int) -> int:
        """Where chunk ``i`` ends in the segment file."""
        if i + 1 < self.chunks:
            return self.record(i + 1)[3]
        return self.size

    def find(self, offset: int) -> int:
        """The position in the index of the last chunk whose id is at most ``offset``
        (-1 when the first is already past it)."""
        lo, hi = 0, self.chunks
        while lo < hi:
            mid = (lo + hi) // 2
            if self.chunk_id(mid) <= offset:
                lo = mid + 1
            else:
                hi = mid
        return lo - 1

    def log_index(self, i: int) -> int:
        return int.from_bytes(self.index[i * INDEX_SIZE + 29:(i + 1) * INDEX_SIZE], "big")

    def find_index(self, log_index: int) -> int:
        """The position of the chunk whose log index is ``log_index``, -1 when none is
        (log indexes grow by one a chunk in a replicated stream)."""
        if not self.chunks:
            return -1
        i = log_index - self.log_index(0)
        return i if 0 <= i < self.chunks and self.log_index(i) == log_index else -1

    def find_time(self, ts: int) -> int:
        """The position of the first chunk whose timestamp is at least ``ts`` (``chunks``
        when none is)."""
        lo, hi = 0, self.chunks
        while lo < hi:
            mid = (lo + hi) // 2
            if self.timestamp(mid) < ts:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def open(self) -> None:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            self.ifd = os.open(self.path.with_suffix(".index"), os.O_RDWR | os.O_CREAT, 0o644)

    def close(self) -> None:
        for fd in (self.fd, self.ifd):
            if fd is not None:
                os.close(fd)
        self.fd = self.ifd = None

    def read(self, lo: int, hi: int) -> bytes:
        self.open()
        return os.pread(self.fd, hi - lo, lo)


def segment_name(first: int) -> str:
    return f"{first:020d}"


def pwrite_all(fd: int, data: bytes | memoryview, pos: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, pos)
        view = view[n:]
        pos += n
