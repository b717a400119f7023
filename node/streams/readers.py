"""Who reads a replicated stream, and from which member (docs/streams.md, "Reading from any
member").

A stream's consumers may read from any of its members, as RabbitMQ's do (a 0-9-1 consumer
reads the member on its channel's node, rabbit_stream_queue.erl ``consume``; a stream
protocol client picks a replica). Each member serves its own consumers from the chunks it
holds up to its commit index, which its leader tells it, so a consumer never reads a chunk
that a new leader could cut. Routers choose the member (router/quorum.py ``read_node``).

Management and metrics list every consumer of a stream at the member it reads from. They ask
the leader, so a member that does not lead reports its readers to the leader every
:data:`REPORT_TICKS` ticks (STREAM_READERS ``[T, vhost, name, uid, node id, [[tag, offset],
...]]``, shared/wire.py), and once more when it has none left. The leader keeps each report
for :data:`STALE_TICKS` ticks: a member that stops reporting (its node is down) drops out.
"""
from __future__ import annotations

from typing import Any

from shoal.shared.wire import T

from shoal.node.streams.offsets import OFFSET, start_offset

STREAM_READERS = int(T.STREAM_READERS)

#: A member that does not lead reports its readers every this many ticks (100 ms each:
#: node/replication/group.py TICK_MS).
REPORT_TICKS = 10
#: The leader forgets a member's report this many ticks after it came.
STALE_TICKS = 35


class BehindLeader(Exception):
    """A numeric offset past the end of a member that does not lead (:func:`reader_start`)."""


def reader_start(spec: tuple[str, int], log: Any, leading: bool) -> int:
    """Where a consumer with ``x-stream-offset`` ``spec`` (offsets.py ``parse_offset_spec``)
    starts on a member whose log is ``log`` (segments.py's SegmentLog): offsets.py
    ``start_offset``. Raises BehindLeader for a numeric offset past the log's end on a member
    that does not lead (``leading`` False): that member may be behind, and started at its
    own end the consumer would read again offsets it had (one that comes back at the offset
    after its last delivery); the leader holds every committed offset."""
    if not leading and spec[0] == OFFSET and spec[1] > log.next_offset:
        raise BehindLeader(f"offset {spec[1]} is past this member's end {log.next_offset}")
    return start_offset(spec, log.first_offset, log.next_offset, log.last_chunk_id,
                        log.seek_time)


class Readers:
    """The readers of one member's stream as its leader knows them (``Member.readers``):
    its own consumers, and the other members' reports while this member leads."""

    __slots__ = ("reports", "reported")

    def __init__(self) -> None:
        #: node id -> (its readers as [[tag, offset], ...], the tick the report came in)
        self.reports: dict[str, tuple[list, int]] = {}
        #: whether this member's last report (as a member that does not lead) named readers
        self.reported = False

    def on_report(self, node: str, readers: list, tick: int) -> None:
        """STREAM_READERS from the member on ``node``, at the host's tick ``tick``."""
        if readers:
            self.reports[node] = (readers, tick)
        else:
            self.reports.pop(node, None)

    def report(self, s: Any) -> list | None:
        """What this member, not leading, tells its leader now: its readers as
        ``[[tag, offset], ...]``, or None when there is nothing to say (none now, and none
        in the last report)."""
        rows = [[c.tag, c.reader.offset] for c in s.consumers]
        if not rows and not self.reported:
            return None
        self.reported = bool(rows)
        return rows

    def rows(self, s: Any, here: str, members: list[str], committed: int, tick: int
             ) -> list[list]:
        """Every consumer of stream ``s`` (its member ``here`` leads) as ``[tag, offset,
        offset_lag, node]``: ``offset`` the next it reads, ``offset_lag`` the committed
        messages it has not read (from the leader's commit), ``node`` the member's it
        reads from. Reports from members that left, or older than STALE_TICKS, go."""
        out = [[c.tag, c.reader.offset, max(0, committed - c.reader.offset), here]
               for c in s.consumers]
        for node, (readers, at) in list(self.reports.items()):
            if node not in members or node == here or tick - at > STALE_TICKS:
                del self.reports[node]
                continue
            out.extend([tag, off, max(0, committed - off), node] for tag, off in readers)
        return out


def send_reports(host: Any) -> None:
    """Every REPORT_TICKS ticks: each member here that does not lead, and knows its leader,
    reports its readers to it (``host``: members.py's StreamMembers)."""
    if host.rep.ticks % REPORT_TICKS:
        return
    for m in host.members.values():
        if m.leading or m.known_leader is None or m.known_leader == host.node_id:
            continue
        rows = m.readers.report(m.stream)
        if rows is not None:
            host.rep.to_peer(m.known_leader, [STREAM_READERS, m.stream.vhost, m.stream.name,
                                              m.uid, host.node_id, rows])
