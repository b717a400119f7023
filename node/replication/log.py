"""A Raft member's log in memory (etcd raft ``log.go`` and ``log_unstable.go`` in one).

Indexes start at 1. Entries up to ``snap_index`` are compacted into a snapshot; the ones after
it are kept in ``entries`` (``entries[0].index == mem_base + 1``). ``stable`` is the last index
the host has persisted: entries after it go out in the next Ready (raft.py) to be written before
any message that depends on them is sent.

A quorum queue's log keeps every entry after its snapshot in memory (``mem_base ==
snap_index``). A stream's log is its segments (docs/streams.md, "Replication"): entries from
``snap_index + 1`` to ``mem_base`` are persisted, no longer in memory, and read back by the
log's ``reader`` (:class:`LogReader`) when a follower behind needs them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

#: The result a proposer's waiter gets when its entry will not be applied by this member as
#: leader (it stopped leading first): group.py's ``propose``, checkouts.py.
LOST = object()

#: Entry kinds.
NORMAL = 0
CONF = 1            # data = [op, member_id], op in conf ops below

#: Configuration changes, one member at a time (Raft dissertation 4.1).
ADD_VOTER = "add"           # a new voter, or a learner promoted
ADD_LEARNER = "learner"     # receives the log, never votes or counts toward a majority
REMOVE = "remove"


@dataclass(slots=True)
class Entry:
    """One log entry: its ``term``, ``index``, ``kind`` (NORMAL or CONF) and ``data`` (any
    msgpack value; None for the empty entry a new leader appends)."""

    term: int
    index: int
    kind: int = NORMAL
    data: Any = None

    def to_wire(self) -> list:
        return [self.term, self.index, self.kind, self.data]

    @classmethod
    def from_wire(cls, w: list) -> "Entry":
        return cls(w[0], w[1], w[2], w[3])


@dataclass(slots=True)
class Snapshot:
    """The state machine as of ``index`` (whose entry had ``term``), and the configuration
    then: ``voters`` and ``learners`` (sorted tuples of member ids). ``data``: the host's."""

    index: int
    term: int
    voters: tuple = ()
    learners: tuple = ()
    data: Any = None

    def to_wire(self) -> list:
        return [self.index, self.term, list(self.voters), list(self.learners), self.data]

    @classmethod
    def from_wire(cls, w: list) -> "Snapshot":
        return cls(w[0], w[1], tuple(w[2]), tuple(w[3]), w[4])


class LogReader(Protocol):
    """Persisted entries that are no longer in memory (a stream's segments)."""

    def term(self, index: int) -> int | None:
        """The term of the persisted entry ``index``; None when not held."""

    def entries(self, lo: int, hi: int) -> list[Entry]:
        """Persisted entries from ``lo`` to at most ``hi`` in order: at least one, fewer
        when a byte budget ends the read early."""


@dataclass(slots=True)
class RaftLog:
    """The log: the snapshot's index and term, the entries after it, the commit index, the
    applied index (handed to the host in a Ready) and the last persisted index; with a
    ``reader``, ``mem_base``: the last index read back from it rather than held in memory."""

    snap_index: int = 0
    snap_term: int = 0
    entries: list[Entry] = field(default_factory=list)
    committed: int = 0
    applied: int = 0
    stable: int = 0
    mem_base: int = 0
    reader: LogReader | None = None

    @property
    def last_index(self) -> int:
        return self.entries[-1].index if self.entries else self.mem_base

    @property
    def last_term(self) -> int:
        if self.entries:
            return self.entries[-1].term
        return self.term(self.mem_base) or 0

    def term(self, index: int) -> int | None:
        """The term of the entry at ``index``; None when compacted away or beyond the end."""
        if index == self.snap_index:
            return self.snap_term
        if index < self.snap_index or index > self.last_index:
            return None
        if index > self.mem_base:
            return self.entries[index - self.mem_base - 1].term
        return self.reader.term(index)      # type: ignore[union-attr]

    def match_term(self, index: int, term: int) -> bool:
        return self.term(index) == term

    def entry(self, index: int) -> Entry:
        if index > self.mem_base:
            return self.entries[index - self.mem_base - 1]
        return self.reader.entries(index, index)[0]     # type: ignore[union-attr]

    def slice(self, lo: int, hi: int) -> list[Entry]:
        """Entries ``lo`` to ``hi`` inclusive (``lo > snap_index``); from a ``reader``, fewer
        when its byte budget ends the read early."""
        off = self.mem_base + 1
        if lo >= off:
            return self.entries[lo - off:hi - off + 1]
        top = min(hi, self.mem_base)
        disk = self.reader.entries(lo, top)     # type: ignore[union-attr]
        if hi <= self.mem_base or len(disk) < top - lo + 1:
            return disk
        return disk + self.entries[:hi - off + 1]

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Raft 5.4.1: a candidate's log is at least as up to date as this one."""
        return last_term > self.last_term or \
            (last_term == self.last_term and last_index >= self.last_index)

    def append(self, entries: list[Entry]) -> int:
        """Append ``entries``, first cutting off this log from ``entries[0].index`` on.
        Raises AssertionError if that would cut a committed entry (a bug)."""
        if not entries:
            return self.last_index
        first = entries[0].index
        assert first > self.committed, f"truncating committed entry {first} <= {self.committed}"
        if first <= self.mem_base:      # cuts into what the reader holds (the host cuts it)
            self.entries = []
            self.mem_base = first - 1
        else:
            del self.entries[first - self.mem_base - 1:]
        self.entries.extend(entries)
        if self.stable >= first:
            self.stable = first - 1
        return self.last_index

    def find_conflict(self, entries: list[Entry]) -> int:
        """The index of the first of ``entries`` whose term differs from this log's at that
        index (or that this log lacks); 0 when all are present."""
        for e in entries:
            if not self.match_term(e.index, e.term):
                return e.index
        return 0

    def maybe_append(self, index: int, log_term: int, commit: int,
                     entries: list[Entry]) -> int | None:
        """A follower's MsgApp: when this log has ``(index, log_term)``, append what of
        ``entries`` is new, advance the commit index and return the last index now known to
        match the leader's log; None (reject) otherwise."""
        if not self.match_term(index, log_term):
            return None
        last_new = index + len(entries)
        conflict = self.find_conflict(entries)
        if conflict:
            if conflict <= self.snap_index:     # already compacted into our snapshot: skip it
                entries = [e for e in entries if e.index > self.snap_index]
                conflict = self.find_conflict(entries)
            if conflict:
                self.append(entries[conflict - entries[0].index:])
        self.commit_to(min(commit, last_new))
        return last_new

    def commit_to(self, index: int) -> None:
        if index > self.committed:
            assert index <= self.last_index, f"commit {index} beyond last {self.last_index}"
            self.committed = index

    def unstable(self) -> list[Entry]:
        """Entries not yet handed to the host to persist."""
        if self.stable >= self.last_index:
            return []
        return self.slice(max(self.stable, self.snap_index) + 1, self.last_index)

    def to_apply(self) -> list[Entry]:
        """Committed entries not yet handed to the host to apply."""
        if self.applied >= self.committed:
            return []
        return self.slice(max(self.applied, self.snap_index) + 1, self.committed)

    def restore(self, snap: Snapshot) -> None:
        """Replace the whole log by ``snap`` (a follower's MsgSnap)."""
        self.entries = []
        self.snap_index = self.mem_base = snap.index
        self.snap_term = snap.term
        self.committed = snap.index
        self.applied = snap.index
        self.stable = snap.index

    def compact(self, index: int, term: int | None = None) -> None:
        """Drop the entries up to ``index`` (``<= applied``): a snapshot now covers them.
        ``term``: that entry's term when the log can no longer tell it (a stream's
        retention removed it first)."""
        assert index <= self.applied, f"compacting unapplied {index} > {self.applied}"
        if index <= self.snap_index:
            return
        if term is None:
            term = self.term(index)
        if index > self.mem_base:
            del self.entries[:index - self.mem_base]
            self.mem_base = index
        self.snap_index = index
        self.snap_term = term or 0
        if self.stable < index:
            self.stable = index

    def release(self, index: int) -> None:
        """Drop the in-memory entries up to ``index`` (applied and persisted); they stay
        readable from the ``reader`` (a stream's host calls this after each Ready)."""
        if index <= self.mem_base:
            return
        assert index <= self.applied and index <= self.stable, \
            f"releasing {index}: applied {self.applied}, stable {self.stable}"
        del self.entries[:index - self.mem_base]
        self.mem_base = index
