"""The Raft simulator's checker (sim.py): the history of one schedule and the invariants it
must keep, apart from the world that makes the schedule (hosts, network, disks, faults).

sim.py's docstring lists the invariants. The world reports what happens (a vote leaves a
member, a hard state is synced, a snapshot is installed, an entry applied, a host took a step)
and the :class:`Checker` records it and raises :class:`Violation` on the first broken rule. It
draws no random numbers, so it cannot change a schedule.
"""
from __future__ import annotations

from typing import Callable

from shoal.node.replication.log import Entry, Snapshot
from shoal.node.replication.raft import CANDIDATE, LEADER, Raft

try:
    from .sim_queue import replay_into_classic
except ImportError:         # imported by path (raft_sim.py, test_raft_sim.py's subprocess)
    from sim_queue import replay_into_classic  # type: ignore

#: Invariants about safety (``liveness`` is the other kind).
SAFETY = ("election safety", "vote safety", "log matching", "leader completeness",
          "state machine safety", "commit safety", "monotonic commit", "monotonic apply",
          "durable state", "disk", "core exception", "queue state", "queue replay",
          "publish answer", "a publish sent again is stored once",
          "no confirmed publish lost")


class Violation(AssertionError):
    """An invariant broke: ``seed``, ``step``, ``invariant`` (one of :data:`SAFETY` or
    ``"liveness"``) and ``details``."""

    def __init__(self, seed: int, step: int, invariant: str, details: str) -> None:
        self.seed, self.step, self.invariant, self.details = seed, step, invariant, details
        super().__init__(f"seed {seed} step {step}: {invariant}: {details} (replay: python3 "
                         f"tests/node/replication/raft_sim.py --replay {seed})")


def freeze(data):
    """Entry data as a comparable value (a CONF entry's [op, member] comes back as a list)."""
    return tuple(data) if isinstance(data, list) else data


def entry_key(e: Entry) -> tuple:
    return (e.term, e.kind, freeze(e.data))


class Checker:
    """The history of one schedule, checked as it grows.

    ``fail(invariant, details)`` raises the :class:`Violation`; ``hosts``: node -> the sim's
    Host (``id``, ``raft``, ``sm``, ``sm_index``, ``hq`` and the checker's own marks
    ``last_commit``, ``lead_term``, ``lead_commit``); ``stats``: the run's counters, of which
    the checker counts ``leaders`` and ``commits``; ``note(text)``: the trace.
    """

    def __init__(self, fail: Callable[[str, str], None], hosts: dict, stats: dict,
                 note: Callable[[str], None] | None) -> None:
        self.fail, self.hosts, self.stats, self.note = fail, hosts, stats, note
        self.leaders: dict[int, str] = {}                       # term -> member
        self.votes: dict[tuple[str, int], str] = {}             # (member, term) -> candidate
        self.entries: dict[tuple[int, int], tuple] = {}         # (index, term) -> entry, prev
        self.applied: dict[int, tuple] = {}                     # index -> (term, kind, data)
        self.commit_term: dict[int, int] = {1: 0}               # index -> lowest commit term
        self.durable_term: dict[str, int] = {}                  # member -> synced term
        self.qdigests: dict[int, tuple] = {}        # index -> the queue's digest there

    # ---- what the world reports ------------------------------------------------------------
    def vote(self, voter: str, term: int, cand: str) -> None:
        """A vote for ``cand`` left ``voter`` in ``term`` (vote safety)."""
        prev = self.votes.setdefault((voter, term), cand)
        if prev != cand:
            self.fail("vote safety", f"{voter} voted for {prev} and for {cand} in term {term}")

    def synced(self, member: str, hard_state: tuple | None) -> None:
        """``member``'s disk was synced holding ``hard_state`` (its term never goes back)."""
        if hard_state is not None:
            term = hard_state[0]
            if term < self.durable_term.get(member, 0):
                self.fail("durable state", f"{member}: synced term went back from "
                          f"{self.durable_term[member]} to {term}")
            self.durable_term[member] = term

    def snapshot_data(self, h, s: Snapshot) -> tuple:
        """A snapshot's data as the state machine it is (checked: indexes 2..s.index)."""
        data = tuple((x[0], x[1], x[2], freeze(x[3])) for x in s.data or ())
        if len(data) != s.index - 1 or any(x[0] != i + 2 for i, x in enumerate(data)):
            self.fail("state machine safety", f"{h.id}: snapshot at {s.index} holds indexes "
                      f"{[x[0] for x in data][:5]}...{[x[0] for x in data][-5:]}")
        return data

    def installing(self, h, s: Snapshot) -> tuple:
        """``h`` installs ``s``: its data, checked against what any node applied."""
        if s.index <= h.sm_index:
            self.fail("monotonic apply", f"{h.id} installed a snapshot at {s.index} after "
                      f"applying up to {h.sm_index}")
        data = self.snapshot_data(h, s)
        applied = self.applied
        for x in data:
            rec = x[1:]
            old = applied.setdefault(x[0], rec)
            if old != rec:
                self.fail("state machine safety", f"{h.id}: snapshot has {rec} at {x[0]}, "
                          f"another node applied {old}")
        return data

    def applying(self, h, e: Entry) -> tuple:
        """``h`` applies ``e`` next: its key, checked (in order, the same at every node)."""
        if e.index != h.sm_index + 1:
            self.fail("monotonic apply", f"{h.id} applies {e.index} after {h.sm_index}")
        rec = entry_key(e)
        old = self.applied.setdefault(e.index, rec)
        if old != rec:
            self.fail("state machine safety", f"{h.id} applies {rec} at {e.index}, another "
                      f"node applied {old}")
        return rec

    def queue_at(self, h, index: int) -> None:
        """The same queue at the same applied index on every host (sim_queue.py)."""
        d = h.hq.digest()
        old = self.qdigests.setdefault(index, d)
        if old != d:
            self.fail("queue state", f"{h.id}'s queue at {index} is {d}, another host's was "
                      f"{old}")

    # ---- the invariants over the whole cluster ----------------------------------------------
    def queue_replay(self) -> None:
        """The committed log replayed on one plain classic queue ends as the quorum queue
        (sim_queue.py)."""
        h = max(self.hosts.values(), key=lambda x: x.sm_index)
        ref = replay_into_classic(h.sm)
        if isinstance(ref, str):
            self.fail("queue replay", f"a classic queue refuses the log: {ref}")
        msgs, out, discards, _ = h.hq.digest()
        mine = (tuple(x[:4] for x in msgs), out, discards)
        if mine != ref:
            self.fail("queue replay", f"{h.id}'s quorum queue {mine} != a classic queue's {ref}")

    def check(self, h) -> None:
        """The invariants that a step of ``h`` could break (see sim.py's docstring)."""
        r = h.raft
        if r is None:
            return
        log = r.log
        if r.commit < h.last_commit:
            self.fail("monotonic commit", f"{h.id} commit went back from {h.last_commit} to "
                      f"{r.commit}")
        h.last_commit = r.commit
        if r.commit > log.last_index or log.applied > r.commit:
            self.fail("monotonic commit", f"{h.id}: applied {log.applied} commit {r.commit} "
                      f"last {log.last_index}")
        if r.commit > len(self.commit_term) and r.state != LEADER:
            self.fail("commit safety", f"{h.id} commits up to {r.commit} but leaders counted "
                      f"only up to {len(self.commit_term)}")
        # log matching, incrementally: (index, term) -> (kind, data, term before it)
        known = self.entries
        prev = log.snap_term
        for e in log.entries:
            rec = (e.kind, freeze(e.data), prev)
            old = known.setdefault((e.index, e.term), rec)
            if old != rec:
                self.fail("log matching", f"{h.id} holds entry {e.index}/{e.term} as {rec} "
                          f"(data, previous term), another log held it as {old}")
            prev = e.term
        if r.state == LEADER:
            self.leader(h)
        elif r.state == CANDIDATE and r.vote != r.id:
            self.fail("vote safety", f"candidate {h.id} voted for {r.vote} in term {r.term}")

    def pairs(self) -> None:
        """Log matching as paper 5.3 states it, literally, for every pair of live nodes: if
        both logs hold an entry with the same index and term, they are identical up to it
        (over the indexes both still hold, that is after both snapshots)."""
        logs = [(h.id, h.raft.log) for h in self.hosts.values() if h.raft is not None]
        for k, (a, la) in enumerate(logs):
            for b, lb in logs[k + 1:]:
                lo = max(la.snap_index, lb.snap_index)
                hi = min(la.last_index, lb.last_index)
                top = next((i for i in range(hi, lo - 1, -1)
                            if la.term(i) is not None and la.term(i) == lb.term(i)), None)
                if top is None:
                    continue
                for i in range(lo + 1, top + 1):
                    ea, eb = la.entry(i), lb.entry(i)
                    if entry_key(ea) != entry_key(eb):
                        self.fail("log matching", f"{a} and {b} both hold {top}/{la.term(top)} "
                                  f"but differ at {i}: {entry_key(ea)} != {entry_key(eb)}")

    def holds(self, r: Raft, index: int) -> bool:
        """Whether ``r``'s log holds the entry applied at ``index`` (or its snapshot covers
        it)."""
        log = r.log
        if index <= log.snap_index:
            return True             # covered by its snapshot (whose data was checked)
        if index > log.last_index:
            return False
        e = log.entry(index)
        return e.index == index and entry_key(e) == self.applied.get(index, entry_key(e))

    def leader(self, h) -> None:
        """``h`` leads: election safety, leader completeness, and the entries it counts
        committed recorded with the lowest term that committed them."""
        r = h.raft
        term = r.term
        other = self.leaders.setdefault(term, h.id)
        if other != h.id:
            self.fail("election safety", f"{h.id} and {other} both lead term {term}")
        if h.lead_term != term:     # newly elected: it must hold what earlier terms committed
            h.lead_term, h.lead_commit = term, 0
            self.stats["leaders"] += 1
            if self.note is not None:
                self.note(f"   {h.id} leads term {term}")
            for i in range(r.log.snap_index + 1, len(self.commit_term) + 1):
                if self.commit_term[i] < term and not self.holds(r, i):
                    self.fail("leader completeness", f"{h.id} leads term {term} without entry "
                              f"{i} {self.applied.get(i)} committed in term "
                              f"{self.commit_term[i]}")
        if r.commit <= h.lead_commit:
            return
        # entries this leader knows committed: committed in a term <= its own
        fresh = []
        log = r.log
        for i in range(h.lead_commit + 1, r.commit + 1):
            if i > log.snap_index:
                e = log.entry(i)
                rec = entry_key(e)
                old = self.applied.setdefault(i, rec)
                if old != rec:
                    self.fail("state machine safety", f"leader {h.id} commits {rec} at {i}, "
                              f"another node applied {old}")
            old_term = self.commit_term.get(i)
            if old_term is None:
                if i != len(self.commit_term) + 1:
                    self.fail("leader completeness", f"{h.id} commits {i} but the known "
                              f"commits end at {len(self.commit_term)}")
                self.commit_term[i] = term
                fresh.append(i)
                self.stats["commits"] += 1
            elif term < old_term:
                self.commit_term[i] = term
                fresh.append(i)
        h.lead_commit = r.commit
        if fresh:
            for x in self.hosts.values():
                xr = x.raft
                if xr is not None and xr.state == LEADER and xr.term > term:
                    for i in fresh:
                        if not self.holds(xr, i):
                            self.fail("leader completeness", f"{x.id} leads term {xr.term} "
                                      f"without entry {i} that {h.id} committed in term {term}")
