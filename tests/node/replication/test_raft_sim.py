"""The Raft simulator (sim.py) in CI: 2,000 seeded schedules with no violation, a seed replays
to the same trace (in this process and in another one with a different hash seed), and the
checker has teeth: deliberately unsafe hosts are caught within a bounded search.

``python3 tests/node/replication/raft_sim.py --schedules 100000`` runs the long version;
``--replay SEED`` prints a seed's trace.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shoal.node.replication.log import NORMAL, Entry

from . import sim_queue
from .sim import (LEADER_RULE, NO_DEDUP, SAFETY, SEND_BEFORE_FSYNC, WIPE_KEEPS_ID, Sim,
                  Violation, trace_of)

HERE = Path(__file__).resolve().parent
CI_SCHEDULES = 2000

#: The Raft properties themselves (the checker's other invariants are about the host).
RAFT_SAFETY = {"election safety", "vote safety", "log matching", "leader completeness",
               "state machine safety", "commit safety"}


def test_the_ci_schedules_keep_every_invariant():
    t0 = time.monotonic()
    steps, violations, resent = 0, [], {"resent": 0, "resent_found": 0}
    for seed in range(CI_SCHEDULES):
        try:
            st = Sim(seed).run()
            steps += st["steps"]
            for k in resent:
                resent[k] += st[k]
        except Violation as v:
            violations.append(str(v))
    elapsed = time.monotonic() - t0
    print(f"{CI_SCHEDULES} schedules, {len(violations)} violations, {steps} steps, "
          f"{resent} publishes sent again, {elapsed:.1f} s")
    assert not violations, "\n".join(violations[:20])
    # the schedules do send publishes again, and leaders find some and log others
    assert resent["resent"] > resent["resent_found"] > 0


@pytest.mark.parametrize("seed", [
    # Failed the quiet phase's liveness check (a wiped node never rejoined) while
    # membership.repair removed the stale id before adding the new one: with the default
    # wanted_nodes the node was then no longer wanted. Each wipes a node at least once.
    0, 1, 6,
])
def test_regression_a_wiped_node_rejoins_under_its_new_id(seed):
    sim = Sim(seed)
    stats = sim.run()
    assert stats["wipes"] >= 1
    lead = sim.leader()
    assert lead is not None and lead.raft.voters == {h.id for h in sim.hosts.values()}


def test_regression_a_torn_write_never_keeps_a_commit_index_past_its_entries():
    """Seed 56258: a crash kept a prefix of a Ready's unsynced writes; the host wrote the
    hard state (commit 5) before the entries, so the member came back with commit 5 over a
    stale term-1 entry at index 2 and applied it (state machine safety). The host protocol
    writes entries, then the hard state (raft.py, etcd's WAL, store.py)."""
    Sim(56258).run()


def test_logs_match_pairwise_after_every_step():
    """The literal pairwise log matching check after every step (the CI schedules check it
    incrementally, and literally at the end of each schedule)."""
    for seed in range(200):
        Sim(seed, paranoid=True).run()


def test_the_pairwise_check_catches_two_logs_that_agree_on_an_entry_but_not_before_it():
    sim = Sim(3)
    a, b = list(sim.hosts.values())[:2]
    for h, data in ((a, "x"), (b, "y")):
        h.raft.log.append([Entry(1, 2, NORMAL, data), Entry(1, 3, NORMAL, "z")])
    with pytest.raises(Violation, match="log matching: .* both hold 3/1 but differ at 2"):
        sim.checker.pairs()


def test_a_seed_replays_to_the_same_trace():
    first, v1 = trace_of(11)
    second, v2 = trace_of(11)
    assert v1 is None and v2 is None
    assert len(first) > 100 and first == second


def test_a_trace_does_not_depend_on_the_hash_seed():
    """The core and the simulator never iterate a set or a dict in hash order where it matters:
    another process with another PYTHONHASHSEED prints the same trace."""
    digest = hashlib.sha256("\n".join(trace_of(5)[0]).encode()).hexdigest()
    script = ("import hashlib, sys; sys.path.insert(0, sys.argv[1]); import sim; "
              "print(hashlib.sha256('\\n'.join(sim.trace_of(5)[0]).encode()).hexdigest())")
    for hash_seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", script, str(HERE)], capture_output=True,
                             text=True, timeout=60,
                             env=dict(os.environ, PYTHONHASHSEED=hash_seed))
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == digest


def _first_raft_violation(variant: str, seeds: range) -> Violation:
    for seed in seeds:
        try:
            Sim(seed, variant=variant).run()
        except Violation as v:
            assert v.invariant in SAFETY or v.invariant == "liveness"
            if v.invariant in RAFT_SAFETY:
                return v
    pytest.fail(f"the checker missed {variant} in seeds {seeds.start}..{seeds.stop - 1}")


def test_the_checker_catches_a_wiped_node_that_rejoins_under_its_old_id():
    """A wiped voter that keeps its member id votes again with an empty log, and its leader
    still counts the entries it lost: Raft's safety needs a voter's disk (membership.py)."""
    v = _first_raft_violation(WIPE_KEEPS_ID, range(300))
    assert str(v).startswith(f"seed {v.seed} step {v.step}: {v.invariant}: ")
    # the violation replays exactly, and its trace ends with it
    trace, again = trace_of(v.seed, variant=WIPE_KEEPS_ID)
    assert str(again) == str(v) and trace[-1] == f"VIOLATION {v}"


def test_the_checker_catches_a_host_that_sends_before_its_fsync():
    """A vote or an acknowledgement that leaves before it is durable is forgotten by a crash."""
    v = _first_raft_violation(SEND_BEFORE_FSYNC, range(300))
    assert v.invariant in RAFT_SAFETY


def test_the_runner_prints_a_summary_and_replays_a_seed():
    script = str(HERE / "raft_sim.py")
    out = subprocess.run([sys.executable, script, "--schedules", "20", "--start", "100"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1].startswith("20 schedules, 0 violations, ")
    out = subprocess.run([sys.executable, script, "--replay", "7"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("    0 seed 7: ")
    out = subprocess.run([sys.executable, script, "--replay", str(_seed_of(WIPE_KEEPS_ID)),
                          "--variant", WIPE_KEEPS_ID], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and "VIOLATION seed" in out.stdout.splitlines()[-1]


def _seed_of(variant: str) -> int:
    for seed in range(300):
        try:
            Sim(seed, variant=variant).run()
        except Violation:
            return seed
    raise AssertionError(variant)


@pytest.mark.parametrize("bug,caught", [
    # a follower reckoning a message's TTL from its own clock, not the leader's in the log
    ("own clock", "queue state"),
    # a released delivery counted as a failed attempt (as a requeue is)
    ("release counted", "queue replay"),
    # an older leader's mark taken for this leader's own: its new delivery not counted
    ("old mark as own", "queue replay"),
    # a lazy follower (records, not entries) that does not flag what a checkout delivered
    ("lazy checkout unflagged", "queue state"),
])
def test_the_queue_checks_have_teeth(monkeypatch, bug, caught):
    """The quorum queue's checks (sim_queue.py) catch a machine that breaks them, within
    the first 300 seeds."""
    from shoal.node.replication.machine import QueueMachine
    apply = QueueMachine.apply

    def broken(self, index, cmd):
        if bug == "own clock" and cmd[0] == "enq":
            cmd = cmd[:7]
        if bug == "release counted" and cmd[0] == "release":
            cmd = ["requeue", *cmd[1:]]
        if bug == "old mark as own" and cmd[0] == "checkout":
            own = [i for i in cmd[1] if i in self.marked]
            cmd = ["checkout", [i for i in cmd[1] if i not in own], cmd[2],
                   [*(cmd[3] if len(cmd) > 3 else ()), *own]]
        result = apply(self, index, cmd)
        if bug == "lazy checkout unflagged" and cmd[0] == "checkout" and self.lazy:
            for i in cmd[1]:
                if i in self.by_index:
                    self.by_index[i].redelivered = False
        return result
    monkeypatch.setattr(QueueMachine, "apply", broken)
    for seed in range(300):
        try:
            Sim(seed).run()
        except Violation as v:
            assert v.invariant == caught, str(v)
            return
    raise AssertionError(f"{bug}: no violation in 300 seeds")


def _first_violation(seeds: range, **kw) -> Violation:
    for seed in seeds:
        try:
            Sim(seed, **kw).run()
        except Violation as v:
            return v
    pytest.fail(f"no violation in seeds {seeds.start}..{seeds.stop - 1}")


def test_the_checker_catches_a_leader_that_logs_every_publish_sent_again():
    """A publish whose answer was lost with its leader is sent again (router/quorum.py); a
    leader that logs it without looking (group.py ``find_publish``) stores it twice."""
    v = _first_violation(range(300), variant=NO_DEDUP)
    assert v.invariant == "a publish sent again is stored once", str(v)
    assert "did not find publish" in v.details


def test_the_checker_catches_a_look_that_stops_at_any_other_publish(monkeypatch):
    """``find_publish`` may stop at a first send of the same router *below* the one looked
    for (publish ids rise); stopping at any other first send misses a publish that a new
    leader's log holds with a later one after it."""
    def stops_early(raft_log, writer, seq):
        base = raft_log.mem_base
        for i in range(raft_log.last_index, base, -1):
            d = raft_log.entries[i - base - 1].data
            if type(d) is list and len(d) > 10 and d[0] == "enq" and d[9] == writer:
                if d[10] == seq:
                    return i
                if not d[6]:
                    return None
        return None
    monkeypatch.setattr(sim_queue, "find_publish", stops_early)
    v = _first_violation(range(300))
    assert v.invariant == "a publish sent again is stored once", str(v)


def test_the_checker_catches_a_confirm_sent_before_the_publish_is_committed(monkeypatch):
    """A leader that answers a publish once it has appended it (not once a majority holds it
    and it is applied) loses confirmed publishes when it stops leading."""
    logged = sim_queue.Publisher.logged

    def confirmed_at_once(self, cmd, host, index):
        logged(self, cmd, host, index)
        q = sim_queue.publish_of(cmd)
        if q is not None:
            self.waiting.pop(q, None)
            self.confirmed.add(q)
    monkeypatch.setattr(sim_queue.Publisher, "logged", confirmed_at_once)
    v = _first_violation(range(300))
    assert v.invariant == "no confirmed publish lost", str(v)


def test_the_checker_catches_a_leader_that_ignores_the_nodes_wanted(monkeypatch):
    """An operator's delete_member / add_member is logged as the nodes wanted, and each
    leader steps toward them (membership.step_toward). A repair that ignores them never
    removes the member deleted: the quiet phase never sees the configuration wanted."""
    from shoal.node.replication import membership
    repair = membership.repair
    monkeypatch.setattr(membership, "repair",
                        lambda raft, current, wanted_nodes=None: repair(raft, current))
    v = _first_violation(range(300))
    assert v.invariant == "liveness", str(v)


def test_the_checker_catches_a_reconciliation_that_waits_while_a_leader_is_known():
    """The reconciliation's old rule (ask after 10 s of knowing no leader) left a member that
    applied its own removal, and still named the leader that removed it, with the group for
    good: the quiet phase requires every member of a node no longer wanted dropped."""
    v = _first_violation(range(60), variant=LEADER_RULE)
    assert v.invariant == "liveness" and "dropped" in v.details, str(v)
