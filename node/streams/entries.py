"""A replicated stream's Raft entries as the chunks of its segments (docs/streams.md,
"Replication: the design chosen, and why"; node/streams/replica.py is the member).

One entry is one chunk. A publish entry's data *is* its USER chunk (the bytes every member
writes at the same offset). Any other entry (a new leader's empty entry, a membership change)
is a CONTROL chunk that each member builds alike from it (:func:`control_chunk`: one record,
``msgpack([kind, data])``, the entry's term as epoch) and that takes no offset. The segments'
index keeps each chunk's log index, so the Raft log reads its persisted entries back from
them (:class:`SegmentReader`, :func:`entry_of`) instead of holding them in memory.
"""
from __future__ import annotations

import msgpack

from shoal.node.replication.log import NORMAL, Entry
from shoal.node.streams import chunk as chunks
from shoal.node.streams.segments import SegmentLog

#: Bytes of chunks per append message to a follower (at least one chunk).
APPEND_BYTES = 1 << 20


class SegmentReader:
    """The Raft log's persisted entries, read back from a member's segments
    (:class:`~shoal.node.replication.log.LogReader`)."""

    def __init__(self, segments: SegmentLog, max_bytes: int = APPEND_BYTES) -> None:
        self.segments = segments
        self.max_bytes = max_bytes

    def term(self, index: int) -> int | None:
        at = self.segments.locate_index(index)
        return None if at is None else at[0].record(at[1])[2]

    def entries(self, lo: int, hi: int) -> list[Entry]:
        out: list[Entry] = []
        size = 0
        seg = self.segments
        i = lo
        while i <= hi and (not out or size < self.max_bytes):
            at = seg.locate_index(i)
            if at is None:
                raise LookupError(f"log index {i} is not in the segments")
            raw = seg.read_at(*at)
            out.append(entry_of(raw, i))
            size += len(raw)
            i += 1
        return out


def entry_of(raw: bytes, index: int) -> Entry:
    """The Raft entry that chunk ``raw`` holds at log ``index``."""
    h = chunks.ChunkHeader(raw)
    if h.type != chunks.CONTROL:
        return Entry(h.epoch, index, NORMAL, raw)
    (_, rec), = chunks.records(raw)
    kind, data = msgpack.unpackb(bytes(rec))
    return Entry(h.epoch, index, kind, data)


def control_chunk(e: Entry, chunk_id: int, timestamp: int) -> bytes:
    """The CONTROL chunk of entry ``e`` (not a publish) at ``chunk_id``."""
    return chunks.build([msgpack.packb([e.kind, e.data])], chunk_id, e.term, timestamp,
                        chunk_type=chunks.CONTROL)
