"""Deadlines of one node: message TTL, queue ``x-expires``, scheduled delivery and consumer
timeouts (seed 004 "TTL", "lock expiry"), as one heap driven by :meth:`Timers.run`.

Sans-IO: nothing here reads a clock. The shard sets :attr:`Timers.now` (monotonic ms) from
every call it gets, and the node server asks :meth:`Timers.next_due` how long it may sleep.
Wall-clock times (``x-qpid-not-valid-before``, epoch ms) are turned into monotonic ones with
``wall_offset_ms`` (epoch ms minus monotonic ms, measured once by the caller).
"""
from __future__ import annotations

import heapq
import itertools
from typing import Any, Callable

#: Deadlines handled per :meth:`Timers.run` call at most (bounded work per tick).
RUN_BUDGET = 10_000


class Timers:
    """A heap of ``(at_ms, seq, fn, args)``. Callbacks re-check their own conditions (a
    deadline may be stale: the message was acked, the queue deleted); they never raise."""

    __slots__ = ("now", "wall_offset_ms", "_heap", "_seq")

    def __init__(self, now: float = 0.0, wall_offset_ms: float = 0.0) -> None:
        self.now = now
        self.wall_offset_ms = wall_offset_ms
        self._heap: list[tuple[float, int, Callable[..., Any], tuple]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, at_ms: float, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` from the first :meth:`run` at or after ``at_ms``."""
        heapq.heappush(self._heap, (at_ms, next(self._seq), fn, args))

    def wall_to_monotonic(self, epoch_ms: float) -> float:
        return epoch_ms - self.wall_offset_ms

    def next_due(self) -> float | None:
        """The earliest deadline (ms), or None when there is none."""
        return self._heap[0][0] if self._heap else None

    def run(self, now: float, budget: int = RUN_BUDGET) -> int:
        """Run due callbacks (at most ``budget``). Returns how many ran; when it equals
        ``budget`` more may be due (call again soon)."""
        self.now = now
        heap = self._heap
        n = 0
        while heap and heap[0][0] <= now and n < budget:
            _, _, fn, args = heapq.heappop(heap)
            fn(*args)
            n += 1
        return n
