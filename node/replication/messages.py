"""What Raft members send each other, and what the core hands its host (etcd's raftpb):
the message types, :class:`Message` with its msgpack-ready wire form, :class:`HardState` and
:class:`Ready` (node/replication/raft.py's module docstring gives the host's protocol).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from shoal.node.replication.log import Entry, Snapshot

# Message types.
APP, APP_RESP, VOTE, VOTE_RESP, PRE_VOTE, PRE_VOTE_RESP, HEARTBEAT, HEARTBEAT_RESP, SNAP, \
    TIMEOUT_NOW = range(1, 11)
#: What only a leader sends: a member that gets none of these for a while has no leader that
#: counts it (reconcile.py's silence).
FROM_LEADER = frozenset((APP, SNAP, HEARTBEAT))
_NAMES = {APP: "app", APP_RESP: "app_resp", VOTE: "vote", VOTE_RESP: "vote_resp",
          PRE_VOTE: "pre_vote", PRE_VOTE_RESP: "pre_vote_resp", HEARTBEAT: "heartbeat",
          HEARTBEAT_RESP: "heartbeat_resp", SNAP: "snap", TIMEOUT_NOW: "timeout_now"}

@dataclass(slots=True)
class Message:
    """A message between members of one group. ``index``/``log_term``: for APP the entry
    before ``entries``; for APP_RESP the last index matched (or the rejected index, with
    ``reject_hint`` the follower's last index); for votes the candidate's last index and term.
    ``commit``: the sender's commit index (APP, HEARTBEAT)."""

    type: int
    frm: str
    to: str
    term: int
    log_term: int = 0
    index: int = 0
    entries: list = field(default_factory=list)
    commit: int = 0
    reject: bool = False
    reject_hint: int = 0
    snapshot: Snapshot | None = None
    #: a VOTE of a leadership transfer: granted past the old leader's lease (etcd's
    #: campaignTransfer context)
    transfer: bool = False

    def to_wire(self) -> list:
        return [self.type, self.frm, self.to, self.term, self.log_term, self.index,
                [e.to_wire() for e in self.entries], self.commit, self.reject,
                self.reject_hint, self.snapshot.to_wire() if self.snapshot else None,
                self.transfer]

    @classmethod
    def from_wire(cls, w: list) -> "Message":
        """Raises ValueError/TypeError/IndexError on a malformed list (the host drops it)."""
        t, frm, to, term, log_term, index, ents, commit, reject, hint, snap, transfer = w
        if t not in _NAMES or not isinstance(term, int):
            raise ValueError(f"bad raft message type {t!r}")
        return cls(t, frm, to, term, log_term, index, [Entry.from_wire(e) for e in ents],
                   commit, bool(reject), hint, Snapshot.from_wire(snap) if snap else None,
                   bool(transfer))

    def __repr__(self) -> str:
        return (f"{_NAMES.get(self.type, self.type)}({self.frm}->{self.to} t{self.term} "
                f"i{self.index}/{self.log_term} n{len(self.entries)} c{self.commit}"
                f"{' reject' if self.reject else ''}{' snap' if self.snapshot else ''})")


@dataclass(slots=True)
class HardState:
    """What must be on disk before a message depending on it leaves: ``term``, ``vote`` (the
    member voted for in ``term``, or None) and ``commit``."""

    term: int = 0
    vote: str | None = None
    commit: int = 0


@dataclass(slots=True)
class Ready:
    """The host's work after a step or tick (see the module docstring for the order)."""

    hard_state: HardState | None
    snapshot: Snapshot | None
    entries: list[Entry]
    messages: list[Message]
    committed: list[Entry]
