"""One stream on one member: its declare arguments, its writer and its readers
(docs/streams.md).

A stream is an append-only log (segments.py); consumers never remove a message, each reads
from an offset of its own (offsets.py), and retention (``x-max-length-bytes``, ``x-max-age``)
removes whole segments. What a publishing turn brings is one chunk (chunk.py): the writer
takes every message of the turn, gives them consecutive offsets and writes them with one
write and, at :meth:`StreamWriter.sync`, one fdatasync.

``committed`` is the offset below which every message is confirmed; readers never read past
it, so a consumer never sees a message that a failover could lose (RabbitMQ's readers read
up to Osiris's committed chunk id the same way).
"""
from __future__ import annotations

from typing import Any, Iterator

from shoal.node.streams import chunk as chunks
from shoal.node.streams.offsets import parse_max_age
from shoal.node.streams.segments import DEFAULT_MAX_SEGMENT_BYTES, MAX_SEGMENT_BYTES, SegmentLog

#: The declare arguments a stream takes (rabbit_stream_queue.erl ``capabilities``)
STREAM_ARGUMENTS = frozenset({
    "x-queue-type", "x-max-length-bytes", "x-max-age", "x-stream-max-segment-size-bytes",
    "x-stream-filter-size-bytes", "x-initial-cluster-size", "x-queue-leader-locator"})
#: Queue arguments of the other queue types, refused on a stream as RabbitMQ refuses them
#: (rabbit_amqqueue.erl ``check_arguments_key``); Qpid's ``qpid.*`` are refused the same way
OTHER_ARGUMENTS = frozenset({
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
    "x-max-length", "x-max-in-memory-length", "x-max-in-memory-bytes", "x-max-priority",
    "x-overflow", "x-queue-mode", "x-single-active-consumer", "x-quorum-initial-group-size",
    "x-delivery-limit", "x-dead-letter-strategy", "x-queue-version", "x-queue-master-locator",
    "x-qpid-priorities"})
LEADER_LOCATORS = ("client-local", "balanced", "least-leaders", "random")


class StreamError(ValueError):
    """A declare argument a stream refuses: ``text`` is RabbitMQ's (406)."""


class StreamConfig:
    """A stream's checked declare arguments. Sizes in bytes, times in ms; None: not set."""

    __slots__ = ("max_bytes", "max_age", "max_segment_bytes", "filter_size",
                 "initial_cluster_size", "leader_locator")

    def __init__(self) -> None:
        self.max_bytes: int | None = None
        self.max_age: int | None = None
        self.max_segment_bytes = DEFAULT_MAX_SEGMENT_BYTES
        self.filter_size = chunks.DEFAULT_FILTER_SIZE
        self.initial_cluster_size: int | None = None
        self.leader_locator: str | None = None


def _rs(vhost: str, name: str) -> str:
    return f"queue '{name}' in vhost '{vhost}'"


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def parse_stream_arguments(vhost: str, name: str, args: dict | None, durable: bool,
                           exclusive: bool, auto_delete: bool) -> StreamConfig:
    """Check a stream's ``queue.declare``; returns its :class:`StreamConfig`. Raises
    :class:`StreamError` with RabbitMQ's 406 text (rabbit_queue_type_util.erl's property
    checks, rabbit_stream_queue.erl ``declare``, rabbit_amqqueue.erl's argument checks)."""
    rs = _rs(vhost, name)
    if auto_delete:
        raise StreamError(f"invalid property 'auto-delete' for {rs}")
    if exclusive:
        raise StreamError(f"invalid property 'exclusive-owner' for {rs}")
    if not durable:
        raise StreamError(f"invalid property 'non-durable' for {rs}")
    cfg = StreamConfig()
    args = args or {}
    for key in args:
        if key in OTHER_ARGUMENTS or key.startswith("qpid."):
            raise StreamError(f"invalid arg '{key}' for {rs} of queue type "
                              f"rabbit_stream_queue")
    if "x-max-length-bytes" in args:
        v = _int(args["x-max-length-bytes"])
        if v is None or v < 0:
            raise StreamError(f"invalid arg 'x-max-length-bytes' for {rs}: "
                              f"{{value_negative,{args['x-max-length-bytes']!r}}}")
        cfg.max_bytes = v
    if "x-max-age" in args:
        try:
            cfg.max_age = parse_max_age(args["x-max-age"])
        except ValueError:
            raise StreamError(f"invalid arg 'x-max-age' for {rs}: {{error,invalid_max_age}}") \
                from None
    if "x-stream-max-segment-size-bytes" in args:
        v = _int(args["x-stream-max-segment-size-bytes"])
        if v is None or v <= 0:
            raise StreamError(f"invalid arg 'x-stream-max-segment-size-bytes' for {rs}: "
                              f"{{value_zero_or_negative,"
                              f"{args['x-stream-max-segment-size-bytes']!r}}}")
        if v > MAX_SEGMENT_BYTES:
            raise StreamError("Exceeded max value for x-stream-max-segment-size-bytes")
        cfg.max_segment_bytes = v
    if "x-stream-filter-size-bytes" in args:
        v = _int(args["x-stream-filter-size-bytes"])
        if v is None:
            raise StreamError("Invalid type for x-stream-filter-size-bytes")
        if not chunks.MIN_FILTER_SIZE <= v <= chunks.MAX_FILTER_SIZE:
            raise StreamError("Invalid value for x-stream-filter-size-bytes")
        cfg.filter_size = v
    if "x-initial-cluster-size" in args:
        v = _int(args["x-initial-cluster-size"])
        if v is None or v <= 0:
            raise StreamError(f"invalid arg 'x-initial-cluster-size' for {rs}: "
                              f"{{value_zero_or_negative,{args['x-initial-cluster-size']!r}}}")
        cfg.initial_cluster_size = v
    if "x-queue-leader-locator" in args:
        v = args["x-queue-leader-locator"]
        v = bytes(v).decode() if isinstance(v, (bytes, bytearray)) else v
        if v not in LEADER_LOCATORS:
            raise StreamError(f"invalid arg 'x-queue-leader-locator' for {rs}: "
                              f"{{invalid_queue_locator,{v!r}}}")
        cfg.leader_locator = v
    return cfg


class Message:
    """A message read from a stream: its offset and what was published (header and body are
    views of the chunk read from disk: no copy)."""

    __slots__ = ("offset", "exchange", "routing_key", "header", "body", "timestamp")

    def __init__(self, offset: int, exchange: str, routing_key: str, header: memoryview,
                 body: memoryview, timestamp: int) -> None:
        self.offset = offset
        self.exchange = exchange
        self.routing_key = routing_key
        self.header = header
        self.body = body
        self.timestamp = timestamp      # the chunk's, epoch ms


class StreamWriter:
    """The writing side of one member's log: one chunk per publishing turn.

    ``epoch`` is the writer's term (a new leader's is higher). Chunk timestamps never go
    back, even if the clock does, so that seeking to a time stays a binary search."""

    def __init__(self, log: SegmentLog, cfg: StreamConfig, epoch: int = 1) -> None:
        self.log = log
        self.cfg = cfg
        self.epoch = epoch
        self.committed = log.next_offset       # a single member's: what is synced
        self._batch: list[bytes] = []
        self._filters: list[bytes | None] = []
        self._any_filter = False
        self._last_ts = 0

    def add(self, exchange: str, routing_key: str, header: bytes, body: bytes,
            filter_value: bytes | None = None) -> int:
        """Take one message for the turn's chunk; returns the offset it will have."""
        self._batch.append(chunks.encode_record(exchange, routing_key, header, body,
                                                filter_value))
        self._filters.append(filter_value)
        if filter_value is not None:
            self._any_filter = True
        return self.log.next_offset + len(self._batch) - 1

    def flush(self, now_ms: int, log_index: int = 0) -> bytes | None:
        """Write the turn's messages as one chunk (not yet synced); returns the chunk, for
        replicas, or None when the turn had none."""
        if not self._batch:
            return None
        ts = max(now_ms, self._last_ts)
        self._last_ts = ts
        c = chunks.build(self._batch, self.log.next_offset, self.epoch, ts,
                         self._filters if self._any_filter else None, self.cfg.filter_size)
        self._batch = []
        self._filters = []
        self._any_filter = False
        self.log.append(c, log_index)
        return c

    def sync(self) -> int:
        """Make the written chunks durable; returns the new committed offset (what a lone
        member may confirm and readers may read)."""
        self.log.sync()
        self.committed = self.log.next_offset
        return self.committed

    def retain(self, now_ms: int) -> int:
        """Apply the stream's retention (segments removed)."""
        return self.log.retain(self.cfg.max_bytes, self.cfg.max_age, now_ms)


class StreamReader:
    """One consumer's position in a stream. ``values``: its ``x-stream-filter`` values
    (UTF-8), None for no filter; ``unfiltered``: ``x-stream-match-unfiltered``."""

    def __init__(self, log: SegmentLog, offset: int, values: list[bytes] | None = None,
                 unfiltered: bool = False) -> None:
        self.log = log
        self.offset = offset
        self.values = values
        self.unfiltered = unfiltered
        #: the chunk being read: its bytes, its header and (once needed) its records, each
        #: parsed once however many reads its credit takes
        self._chunk: bytes | None = None
        self._head: chunks.ChunkHeader | None = None
        self._records: list[tuple[int, memoryview]] | None = None
        self.skipped_chunks = 0

    def read(self, limit: int, committed: int) -> list[Message]:
        """Up to ``limit`` messages from the reader's offset, none at ``committed`` or past
        it; advances the offset past what it returns and what its filter skipped."""
        out: list[Message] = []
        while len(out) < limit and self.offset < committed:
            if self.offset < self.log.first_offset:     # retention went past it
                self.offset = self.log.first_offset
                continue
            h = self._chunk_for(self.offset)
            if h is None:
                break
            if h.next_offset > committed:
                break                   # a chunk is confirmed whole or not at all
            if h.type != chunks.USER:   # a replication entry (replica.py): never found by
                break                   # offset (it takes none), so nothing to read here
            if self.values is not None and not chunks.may_match(
                    self._chunk[chunks.HEADER_SIZE:h.data_at], self.values, self.unfiltered):
                self.offset = h.next_offset
                self.skipped_chunks += 1
                continue
            if self._records is None:
                self._records = list(chunks.records(self._chunk))
            for off, rec in self._records[self.offset - h.chunk_id:]:
                if len(out) >= limit:
                    break
                self.offset = off + 1
                ex, rk, fv, header, body = chunks.decode_record(rec)
                if self.values is not None and not (
                        fv in self.values if fv is not None else self.unfiltered):
                    continue
                out.append(Message(off, ex, rk, header, body, h.timestamp))
        return out

    def _chunk_for(self, offset: int) -> chunks.ChunkHeader | None:
        """The header of the chunk holding ``offset``, read from the log unless it is the
        one held already; None when the log does not hold it."""
        h = self._head
        if h is not None and h.chunk_id <= offset < h.next_offset:
            return h
        self._chunk = self.log.chunk_at(offset)
        self._head = None if self._chunk is None else chunks.ChunkHeader(self._chunk)
        self._records = None
        return self._head

    def __iter__(self) -> Iterator[Message]:   # for tests and tools: everything committed
        while True:
            batch = self.read(256, self.log.next_offset)
            if not batch:
                return
            yield from batch

