"""One stream on a node (hosting.py holds the node's streams): what management lists of it,
its writer (one member) or replica (several, members.py), and its consumers.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from shoal.shared.header_table import raw_headers
from shoal.node.streams.segments import SegmentLog
from shoal.node.streams.stream import StreamConfig, StreamReader, StreamWriter

FILTER_VALUE = "x-stream-filter-value"


def rs(vhost: str, name: str) -> str:
    return f"queue '{name}' in vhost '{vhost}'"


def filter_value(header: bytes) -> bytes | None:
    """The ``x-stream-filter-value`` header of a content-header payload (a string), or
    None."""
    entries = raw_headers(header)
    if not entries:
        return None
    for key, raw in entries:
        if key == FILTER_VALUE and raw[:1] == b"S":
            return bytes(raw[5:])
    return None


class StreamConsumer:
    """One consumer of a stream: its reader (offset, filter), its credit, and whether its
    router waits for a WORK."""

    __slots__ = ("consumer_id", "peer", "tag", "stream", "reader", "credit", "wants_work",
                 "args")

    def __init__(self, consumer_id: int, peer: Any, tag: str, stream: "StreamQueue",
                 reader: StreamReader, args: dict) -> None:
        self.consumer_id = consumer_id
        self.peer = peer
        self.tag = tag
        self.stream = stream
        self.reader = reader
        self.credit = 0
        self.wants_work = False
        self.args = args


class StreamQueue:
    """One stream on this node: what management lists of it, its writer and consumers.
    ``stats``: [published, delivered, acked] as a queue's."""

    durable = True
    auto_delete = False
    exclusive_owner = None
    replica = None

    def __init__(self, vhost: str, name: str, arguments: dict, cfg: StreamConfig,
                 directory: Path, rep: Any = None) -> None:
        self.vhost = vhost
        self.name = name
        self.arguments = arguments
        self.cfg = cfg
        self.directory = directory
        #: a stream of one member writes through ``writer``; one of several has ``rep``
        #: (replica.py) and ``replica`` (members.py's Member)
        self.rep = rep
        self.writer = StreamWriter(SegmentLog(directory / "segments", cfg.max_segment_bytes),
                                   cfg) if rep is None else None
        self.consumers: list[StreamConsumer] = []
        self.stats = [0, 0, 0]
        self.pending = 0            # messages added this turn
        self.batch: list[bytes] = []                # a replicated stream's turn of records
        self.filters: list[bytes | None] = []
        #: the turn's publishes, for the chunk's trailer: writer -> (first sent, sent again)
        self.sent: dict[str, tuple[list[int], list[int]]] = {}
        #: the highest log index where a publish sent again this turn was found stored
        self.found = 0

    @property
    def log(self) -> SegmentLog:
        return self.writer.log if self.rep is None else self.rep.segments

    @property
    def committed(self) -> int:
        """The offset after the last committed message: what readers may read below."""
        return self.writer.committed if self.rep is None else self.rep.committed_offset

    @property
    def message_count(self) -> int:
        return self.committed - self.log.first_offset

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def describe(self) -> dict:
        """What management shows of the stream (RabbitMQ's queue info keys for streams, and
        ``bytes``): offsets as RabbitMQ counts them (``committed_offset``: the last
        committed message's, -1 when none; ``first_offset``: the first held), the
        segments, bytes on disk, and ``stream_consumers``: each consumer as ``[tag, offset,
        offset_lag, node]`` (``offset``: the next it reads; ``offset_lag``: committed
        messages it has not read; ``node``: the member's it reads from, None with one
        member; members.py ``reader_rows``)."""
        lg = self.log
        committed = self.committed
        rec = lg.record_of(committed - 1) if committed else None
        more = {}
        if self.replica is not None:        # several members: who leads, who holds it
            _, _, leader, _, members, online, _ = self.replica.describe()
            more = {"leader": leader, "members": members, "online": online,
                    "member_offsets": self.replica.offsets()}
        return {**more, "type": "stream",
                "epoch": self.writer.epoch if self.rep is None else self.rep.raft.term,
                "first_offset": lg.first_offset, "committed_offset": committed - 1,
                "committed_chunk_id": rec[0] if rec else -1,
                "first_timestamp": lg.first_timestamp, "segments": len(lg.segments),
                "bytes": lg.bytes,
                "stream_consumers": self.replica.reader_rows(committed)
                if self.replica is not None else
                [[c.tag, c.reader.offset, max(0, committed - c.reader.offset), None]
                 for c in self.consumers]}
