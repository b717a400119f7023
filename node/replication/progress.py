"""The leader's view of each follower (etcd's ``tracker/progress.go``)."""
from __future__ import annotations

from dataclasses import dataclass

# Follower progress states (etcd tracker/progress.go).
PROBE, REPLICATE, SNAPSHOT = 0, 1, 2


@dataclass(slots=True)
class Progress:
    """The leader's view of one follower (etcd ``tracker.Progress``): ``match`` the highest
    index known replicated, ``next`` the next to send, ``state`` PROBE (one APP in flight until
    answered or a heartbeat), REPLICATE (pipelined) or SNAPSHOT (waiting for one to land)."""

    match: int = 0
    next: int = 1
    state: int = PROBE
    paused: bool = False
    pending_snapshot: int = 0
    recent_active: bool = False
    learner: bool = False
    stalled_at: int = -1        #: match at a heartbeat answer with appends unacknowledged
