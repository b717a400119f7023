"""A quorum queue's messages as a follower holds them: the records of its log, not queue
entries (docs/replication.md "On a node"; the state machine is machine.py's ``QueueMachine``).

A follower neither delivers nor routes, so until it leads it keeps each message as the
``enq`` command that logged it plus what later commands did to it. The machine turns the
records into entries (``QueueMachine.materialize``) when the member becomes leader, or
earlier when it holds more than :data:`LAZY_MAX` of them.
"""
from __future__ import annotations

from shoal.node.queues.entry import AVAILABLE, QueueEntry


#: the most records a lazy follower holds: past them it makes its entries (a backlog), so
#: that becoming leader builds at most this many (about 3 µs each here: 25 ms); it holds
#: records again once its queue is empty
LAZY_MAX = 8192


class Logged:
    """A message a lazy follower holds: its ``enq`` command as logged (``cmd``), and what the
    log did to it since (``header``: a modified outcome's annotations merged in,
    ``redelivered``, ``delivery_count``). Read as a queue entry that is available and alive."""

    __slots__ = ("cmd", "header", "redelivered", "delivery_count")
    state = AVAILABLE
    is_dead = False
    entry_id = None

    def __init__(self, cmd: list) -> None:
        self.cmd = cmd
        self.header = cmd[3]
        self.redelivered = False
        self.delivery_count = 0

    @property
    def exchange(self) -> str:
        return self.cmd[1]

    @property
    def routing_key(self) -> str:
        return self.cmd[2]

    @property
    def body(self) -> bytes:
        return self.cmd[4]

    @property
    def publisher(self) -> str | None:
        return self.cmd[5]

    @property
    def ts(self) -> float | None:
        """The leader's clock at the enqueue (epoch ms), None if the command has none."""
        return self.cmd[7] if len(self.cmd) > 7 else None


class Following:
    """The replica a queue sees while a lazy follower's records become its entries: not
    leading, so it arms no timer, refuses nothing and drops no head (features.py)."""

    leading = False

    def removed(self, entry: QueueEntry) -> None:
        pass

    def used(self) -> None:
        pass
