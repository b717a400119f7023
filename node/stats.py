"""What a node tells routers about itself (issue 23: the management API and Prometheus
metrics): its queues (wire QUEUE_LIST) and its own figures (wire NODE_STATS): resident memory,
event-loop lag, the journal's fsync latency and group-commit sizes as histograms, and paging.

:class:`Histogram` keeps Prometheus-style cumulative-bucket data without a dependency (the
node does not serve HTTP; the routers render what nodes send with prometheus-client).
"""
from __future__ import annotations

import asyncio
import bisect
import collections
import json
import logging
import os
import resource
import time
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("shoal.node")

#: fsync latency buckets, seconds (Prometheus' default buckets from 0.5 ms)
FSYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: group-commit size buckets, records per commit
COMMIT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
LAG_PERIOD_S = 1.0
#: Seconds between rewrites of the node stats file (SHOAL_NODE_STATS_FILE).
STATS_EVERY_S = 1.0


class Histogram:
    """Counts of observations at or under each upper bound (the last bucket is +Inf), their
    sum and count."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def to_wire(self) -> list:
        """``[bounds, per-bucket counts (not cumulative; the last is +Inf), sum, count]``."""
        return [list(self.bounds), list(self.counts), self.sum, self.count]


class LoopLag:
    """The event loop's lag: how late a callback due every ``LAG_PERIOD_S`` ran (seconds);
    ``last`` and ``max`` since start."""

    def __init__(self) -> None:
        self.last = 0.0
        self.max = 0.0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            due = time.monotonic() + LAG_PERIOD_S
            await asyncio.sleep(LAG_PERIOD_S)
            self.last = max(0.0, time.monotonic() - due)
            self.max = max(self.max, self.last)


def rss_bytes() -> int:
    """This process's resident memory (VmRSS), bytes; the peak if /proc is not there."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def on_queue_list(shard: Any, state: Any, msg: list) -> list:
    """QUEUE_LIST (from ``state``, a RouterPeer) -> the queues of ``shard`` (of ``msg[2]``, a
    vhost, unless None)."""
    vhost, unacked = msg[2], collections.Counter()
    for peer in shard.peers.values():
        unacked.update(id(e.queue) for e in peer.unsettled.values())
    rep = getattr(shard, "replication", None)
    rows = [[q.vhost, q.name, q.durable, q.exclusive_owner is not None, q.auto_delete,
             q.arguments, q.message_count, q.consumer_count, unacked[id(q)], q.stats,
             rep.describe(q.replica) if q.replica is not None else None]
            for q in shard.queues.values() if (vhost is None or q.vhost == vhost) and
            (q.replica is None or q.replica.lists_here())]
    rows += [[s.vhost, s.name, True, False, False, s.arguments, s.message_count,
              s.consumer_count, 0, s.stats, s.describe()]
             for s in shard.streams.streams.values() if (vhost is None or s.vhost == vhost)
             and (s.replica is None or s.replica.lists_here())]
    return rows


def on_node_stats(shard: Any, state: Any, msg: list) -> dict[str, Any]:
    """NODE_STATS -> this node's figures (shared/wire.py lists the keys). ``shard``: the
    node's Shard (not imported here: the journal imports this module)."""
    out: dict[str, Any] = {
        "rss_bytes": rss_bytes(), "queues": len(shard.queues),
        "messages_ready": sum(q.message_count for q in shard.queues.values()),
        "loop_lag_seconds": shard.loop_lag.last, "loop_lag_max_seconds": shard.loop_lag.max,
        "routers": len(shard.peers), "blocked": shard.blocked_reason or "",
    }
    pages = shard.pages
    if pages is not None:
        out.update(paged_bytes=pages.paged_bytes, paged_messages=pages.paged_messages,
                   page_outs=pages.page_outs)
    rep = getattr(shard, "replication", None)
    if rep is not None and rep.groups:
        out["raft"] = rep.stats()
    journal = shard.durable.journal if shard.durable is not None else None
    if journal is not None:
        out.update(fsync_seconds=journal.fsync_seconds.to_wire(),
                   commit_records=journal.commit_records.to_wire(),
                   journal_bytes=journal.stats().bytes_on_disk)
    return out


def on_router_report(shard: Any, state: Any, msg: list) -> None:
    """ROUTER_REPORT: keep ``state``'s (a RouterPeer's) latest report of its live objects."""
    state.report = (msg[2], shard.timers.now)


def on_router_reports(shard: Any, state: Any, msg: list) -> list:
    """ROUTER_REPORTS -> [[router_id, report, age_ms], ...] of every router that sent one."""
    now = shard.timers.now
    return [[p.router_id, p.report[0], now - p.report[1]] for p in shard.peers.values()
            if p.report is not None]


def on_force_close(shard: Any, state: Any, msg: list) -> None:
    """FORCE_CLOSE: pass it on to the router it names (its connection is closed there)."""
    for peer in shard.peers.values():
        if peer.router_id == msg[1]:
            shard.send(peer.identity, list(msg))


async def write_stats_file(path: str, figures: Callable[[], dict]) -> None:
    """Rewrite ``path`` every STATS_EVERY_S with ``figures()`` as JSON (atomic rename), until
    cancelled; a file that cannot be written is logged and tried again."""
    tmp = path + ".tmp"
    while True:
        try:
            with open(tmp, "w") as f:
                json.dump(figures(), f)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("cannot write stats file %s: %s", path, exc.strerror)
        await asyncio.sleep(STATS_EVERY_S)
