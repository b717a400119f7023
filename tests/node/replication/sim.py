"""A seeded, deterministic simulator for the sans-IO Raft core (node/replication/raft.py), with a
checker: etcd's raft is tested with scripted interactions and a randomized network, TigerBeetle
with the VOPR (one seed drives a whole cluster, its network, its disks and its faults); this is
the same idea at the size of this core.

One ``random.Random(seed)`` drives everything (and every :class:`Raft` gets its own ``Random``
seeded from it), so a seed replays exactly: ``Sim(seed, trace=True).run()`` and ``.trace`` (or
``python3 tests/node/replication/raft_sim.py --replay SEED``).

The cluster: 3 or 5 nodes (chosen by the seed). Each :class:`Host` follows the host protocol of
raft.py's docstring exactly: after every step/tick/propose, while ``has_ready()``: take a Ready,
*write* it to the :class:`Disk` (hard state, snapshot, entries), *fsync* (the unsynced part
becomes the synced part), *send* its messages, *apply* its committed entries (a snapshot's data
first), ``advance``. The fsync can be left pending (the host is then busy: it takes no message
and no tick until the fsync completes), so that a crash can fall between the write and the fsync
and lose the unsynced writes (all of them, or all but a prefix, as a journal would). The state
machine is the list of applied entries ``(index, term, kind, data)``; a snapshot's data is a
copy of it; the host compacts (``Raft.compact`` at the applied index) whenever more than ``K``
entries sit past its snapshot. Messages travel msgpack-encoded (``Message.to_wire``).

Each seed chooses its own cluster and fault mix (swarm testing: some faults are off for a seed):
3 or 5 nodes, the election timeout (3, 5 or 10 ticks, lasting 30 to 120 steps), the entries per
append (``raft.MAX_APPEND`` 1, 2, 4 or 256), the compaction threshold ``K``, pre-vote and
check-quorum (each on for 80% of the seeds), and the probabilities below. A step is one of:

* a tick of every node (the clock) or of one node (clocks drift);
* a fault, with its probability per step: a partition (two-sided, often cutting the leader off
  a majority) or a one-way cut, and heal; a crash (losing the unsynced writes, a prefix of them,
  or none; often the leader, or a node between a write and its fsync), after which the survivors
  may see the link close (``peer_lost``, staggered delays); a restart from the synced disk; a
  wiped disk (the node restarts empty under a new member id and is brought back by
  :func:`membership.repair`, which whichever node leads calls on its ticks, as the real node
  will; only when every configuration is settled, so that a majority of intact voters remains);
  a spurious ``peer_lost`` (a link that flapped); a client's proposal to a leader, which is
  now and then an operator's ``delete_member`` or ``add_member`` (logged as the nodes
  wanted; every leader steps toward them with ``membership.step_toward``, as the node does;
  a removed member lingers with its old configuration, as on the node until its
  reconciliation; only with pre-vote and check-quorum, which the node always runs);
* a leadership transfer (the leader steps down and asks a caught-up voter to campaign, as
  manager.py does) or a member made to campaign by its host (as a group's creator is);
* otherwise the delivery of a message (the oldest deliverable one, or any: reordering), which
  may instead be lost, delayed, or delivered and kept in flight to arrive again (duplicated),
  or the completion of a pending fsync; when there is nothing to deliver, time passes.

After every step the checker (sim_checker.py) verifies, over the whole history of the run:

* election safety: at most one leader per term;
* vote safety: a member grants at most one vote per term (paper 5.2; a vote that left a member
  must be on its disk);
* log matching: an entry ``(index, term)`` is the same entry (kind and data) in every log that
  ever held it, and the entry before it has the same term in all of them; by induction two logs
  holding the same ``(index, term)`` are identical up to that index over the ranges both hold
  (this is the pairwise property of paper 5.3 for every pair of nodes at every step, checked
  incrementally: only a node that took a step can have changed its log);
* leader completeness: an entry committed in term T (a leader of term T counted it) is in the
  log, or under the snapshot, of every leader of a term after T (paper 5.4.3);
* state machine safety: no two nodes ever apply different entries (term, kind and payload) at
  one index, snapshots included; and no node's commit index runs ahead of what a leader counted
  (commit safety);
* monotonic commit and apply per incarnation (apply strictly in index order, no gaps), the
  synced term never going back, and every Ready's entries fitting the log on disk;
* the core's own assertions (any exception out of the core is a violation);
* a router's confirmed publishes (sim_queue.py ``Publisher``): an answer is given only for the
  entry that enqueues that publish; a publish whose answer was lost with its leader is sent
  again, and a leader finds it in its log (group.py ``find_publish``) exactly when the log it
  keeps in memory holds it; at the end every confirmed publish is in the committed log, and
  none twice unless a leader logged it again from under its snapshot.

At the end of a schedule the faults stop, partitions heal, crashed nodes restart, messages are
delivered in order and nothing is lost, and the cluster must (liveness, within
:data:`QUIET_STEPS` steps) have a leader that has committed a final proposal on a majority of
the nodes wanted and whose configuration is every wanted node's current member id as a voter (a
wiped node has rejoined, a deleted one is out).

A violation raises :class:`Violation` naming the seed, the step, the invariant and the details.
"""
from __future__ import annotations

import random
import traceback

import msgpack

from shoal.node.replication import membership, raft as raft_module, reconcile
from shoal.node.replication.group import ELECTION_TICKS
from shoal.node.replication.messages import FROM_LEADER
from shoal.node.replication.log import ADD_VOTER, CONF, NORMAL, REMOVE, Entry, Snapshot
from shoal.node.replication.raft import (APP, LEADER, SNAP, VOTE, VOTE_RESP, HardState,
                                         Message, Raft, bootstrap)

try:
    from .sim_checker import SAFETY, Checker, Violation
    from .sim_queue import CONFIGS, Client, HostQueue, Publisher
except ImportError:         # imported by path (raft_sim.py, test_raft_sim.py's subprocess)
    from sim_checker import SAFETY, Checker, Violation  # type: ignore
    from sim_queue import CONFIGS, Client, HostQueue, Publisher  # type: ignore

# SAFETY and Violation are the checker's, named here for the simulator's callers
__all__ = ["FINAL", "NO_DEDUP", "QUIET_STEPS", "SAFETY", "SEND_BEFORE_FSYNC", "VARIANTS",
           "WIPE_KEEPS_ID", "Sim", "Violation", "run_seed", "trace_of"]

#: The unsafe hosts of the checker's own tests (test_raft_sim.py): each must be caught.
WIPE_KEEPS_ID = "wipe_keeps_id"          # a wiped node comes back under its old member id
SEND_BEFORE_FSYNC = "send_before_fsync"  # a Ready's messages leave before its fsync
NO_DEDUP = "no_dedup"                    # a leader logs every publish sent again
LEADER_RULE = "leader_rule"              # reconciliation waits while a leader is known
VARIANTS = (WIPE_KEEPS_ID, SEND_BEFORE_FSYNC, NO_DEDUP, LEADER_RULE)

FINAL = "final"
#: The quiet phase's bound (steps) for a leader, the final commit and a repaired membership.
QUIET_STEPS = 4000


def _unpack(raw: bytes, frm: str, to: str):
    return Message.from_wire(msgpack.unpackb(raw))


def _conf_after(voters: set, learners: set, entries) -> tuple[set, set]:
    """The configuration after the CONF entries of ``entries`` ((kind, data) pairs), applied as
    raft.py applies them."""
    voters, learners = set(voters), set(learners)
    for kind, data in entries:
        if kind == CONF:
            op, member = data
            if op == REMOVE:
                voters.discard(member)
                learners.discard(member)
            elif op == ADD_VOTER:
                learners.discard(member)
                voters.add(member)
            elif member not in voters:
                learners.add(member)
    return voters, learners


class Disk:
    """A member's disk: the synced part (``hs``, ``snap``, ``entries``: what survives any crash)
    and the writes not yet synced (``unsynced``, in order). Entries are kept as wire lists and
    the snapshot as a tuple, copies of what the host wrote (nothing shared with memory)."""

    __slots__ = ("hs", "snap", "entries", "unsynced")

    def __init__(self) -> None:
        self.hs: tuple | None = None            # (term, vote, commit)
        self.snap: tuple | None = None          # (index, term, voters, learners, data)
        self.entries: list[list] = []           # [term, index, kind, data], contiguous
        self.unsynced: list[tuple] = []

    @property
    def snap_index(self) -> int:
        return self.snap[0] if self.snap else 0

    @property
    def last_index(self) -> int:
        return self.entries[-1][1] if self.entries else self.snap_index

    def write(self, op: tuple) -> None:
        self.unsynced.append(op)

    def sync(self, keep: int | None = None) -> str | None:
        """Make the first ``keep`` unsynced writes (all when None) durable and forget the rest;
        returns an error when a write does not fit the log on disk (a gap)."""
        ops, self.unsynced = self.unsynced, []
        for op in ops if keep is None else ops[:keep]:
            err = self._apply(op)
            if err:
                return err
        return None

    def _apply(self, op: tuple) -> str | None:
        kind, val = op
        if kind == "hs":
            self.hs = val
        elif kind == "snap":            # a snapshot received: it replaces the whole log
            self.snap, self.entries = val, []
        elif kind == "compact":         # the host's own snapshot: the log up to it goes
            if val[0] > self.snap_index:
                if val[0] > self.last_index:
                    return f"compaction at {val[0]} beyond the log on disk ({self.last_index})"
                del self.entries[:val[0] - self.snap_index]
                self.snap = val
        elif kind == "ents":
            first = val[0][1]
            if first <= self.snap_index or first > self.last_index + 1:
                return (f"entries from {first} do not follow the log on disk "
                        f"(snapshot {self.snap_index}, last {self.last_index})")
            del self.entries[first - self.snap_index - 1:]
            self.entries.extend(val)
        return None


class Host:
    """One node: its current member id, disk, Raft (None while crashed), a Ready written and
    not yet fsynced (``pending``), and its state machine."""

    __slots__ = ("node", "gen", "id", "disk", "raft", "pending", "sm", "sm_index",
                 "last_commit", "final", "lead_term", "lead_commit", "hq", "silent", "absent",
                 "tomb")

    def __init__(self, node: str, hq: HostQueue) -> None:
        self.hq = hq                    # the quorum queue's state machine (sim_queue.py)
        self.node = node
        self.gen = 0
        self.id = membership.member_id(node, "d0")
        self.disk = Disk()
        self.raft: Raft | None = None
        self.pending = None
        self.sm: list[tuple] = []
        self.sm_index = 0
        self.last_commit = 0
        self.final = False
        self.lead_term = 0              # the term this incarnation was last seen leading
        self.lead_commit = 0            # its commit index when last checked as that leader
        self.silent = 0                 # ticks since a leader's APP, SNAP or HEARTBEAT
        #: the node is up and holds no member (dropped by the reconciliation) until a
        #: leader's APP or SNAP makes it again; ``tomb``: the dropped member's (term, vote)
        self.absent = False
        self.tomb: tuple | None = None


class Sim:
    """One schedule: ``Sim(seed).run()`` returns its statistics or raises :class:`Violation`.
    ``steps``: the length of the faulty phase (default: chosen by the seed). ``variant``: one of
    :data:`VARIANTS` (a deliberately unsafe host) or None. ``paranoid``: also compare every
    pair of logs literally after every step (``Checker.pairs``; otherwise only at the end)."""

    def __init__(self, seed: int, *, trace: bool = False, variant: str | None = None,
                 steps: int | None = None, paranoid: bool = False) -> None:
        self.seed = seed
        self.variant = variant
        self.paranoid = paranoid
        rng = self.rng = random.Random(seed)
        self.trace: list[str] | None = [] if trace else None
        # --- the seed's configuration (swarm testing: some faults may be off) ---
        self.n = rng.choice((3, 5))
        self.election_ticks = rng.choice((3, 5, 10))
        # the clock: a step ticks every node with p_tick_all (an election timeout lasts about
        # 30 to 120 steps) or one node with p_tick_one (clocks drift)
        self.p_tick_all = self.election_ticks / rng.choice((30, 60, 120))
        self.p_tick_one = rng.choice((0.0, 0.05, 0.15))
        self.K = rng.randint(3, 20)
        #: entries per MsgApp (raft.MAX_APPEND, set for the run): small, so that a follower
        #: that is behind catches up over several appends
        self.max_append = rng.choice((1, 2, 4, 256))
        self.steps = steps if steps is not None else rng.randint(150, 450)
        self.p_defer = rng.choice((0.0, 0.05, 0.2, 0.5))
        self.p_reorder = rng.choice((0.0, 0.1, 0.5, 1.0))
        # each message picked for delivery may instead be lost, delayed, or delivered and kept
        # in flight to arrive again
        self.p_drop = rng.choice((0.0, 0.02, 0.1))
        self.p_delay = rng.choice((0.0, 0.02, 0.1))
        self.p_dup = rng.choice((0.0, 0.02, 0.1))
        self.p_peer_lost = rng.choice((0.0, 0.5, 1.0))
        self.pre_vote = rng.random() < 0.8
        self.check_quorum = rng.random() < 0.8
        #: per step, the probability of each fault (when it can act: heal needs a partition,
        #: restart a crashed node...) and of a client's proposal (when a leader can take it),
        #: some 0 (swarm testing)
        self.p = {
            "propose": rng.choice((0.02, 0.05, 0.15)),
            "partition": rng.choice((0.0, 0.005, 0.02)),
            "one_way": rng.choice((0.0, 0.005, 0.02)),
            "heal": rng.choice((0.01, 0.03)),
            "crash": rng.choice((0.0, 0.005, 0.02)),
            "restart": rng.choice((0.01, 0.03)),
            "wipe": rng.choice((0.0, 0.003, 0.01)),
            "flap": rng.choice((0.0, 0.01)),
            "transfer": rng.choice((0.0, 0.005, 0.02)),
            "campaign": rng.choice((0.0, 0.003, 0.01)),
        }
        #: otherwise a step delivers a message or completes an fsync, with these weights per
        #: message that can be delivered and per host waiting for its fsync, or (nothing to
        #: do) ticks every node
        self.w_deliver = 10.0
        self.w_fsync = rng.choice((2.0, 10.0))
        if variant == WIPE_KEEPS_ID:
            self.p["wipe"] = 0.02
        elif variant == SEND_BEFORE_FSYNC:
            self.p_defer = 0.5
            self.p["crash"] = self.p["restart"] = 0.05
        # --- the world ---
        self.step = 0
        self.faults = True
        self.nodes = [f"n{i}" for i in range(1, self.n + 1)]
        # the quorum queue (sim_queue.py), from a Random of its own: the schedule above is
        # the same with or without it
        qrng = random.Random(f"queue/{seed}")
        self.qargs = qrng.choice(CONFIGS)
        self.client = Client(qrng, self.qargs)
        #: an operator's delete_member / add_member (its own Random: with p_op 0 the schedule
        #: is the one it was before operators were simulated). Only with pre-vote and
        #: check-quorum, as the node always runs: a removed member lingers until the node's
        #: reconciliation drops it (10 s), and without them its elections would disrupt the
        #: group all along (the dissertation's 4.2.3)
        self.op_rng = random.Random(f"ops/{seed}")
        self.p_op = self.op_rng.choice((0.0, 0.1, 0.3)) \
            if self.pre_vote and self.check_quorum else 0.0
        self.publisher = Publisher(qrng, no_dedup=variant == NO_DEDUP)
        # every other host's machine is lazy, as a member's that never led: their digests
        # agree with the others' only if its records become the same entries
        self.hosts = {node: Host(node, HostQueue(self.qargs, qrng.uniform(-5000, 5000),
                                                 lazy=k % 2 == 1))
                      for k, node in enumerate(self.nodes)}
        self.by_id = {h.id: h for h in self.hosts.values()}
        self.net: list[list] = []       # [deliver_at, from node, to member, packed message]
        self.blocked: set[tuple[str, str]] = set()
        self.proposals = 0
        self.stats = {"steps": 0, "leaders": 0, "commits": 0, "snapshots_sent": 0,
                      "snapshots_installed": 0, "compactions": 0, "crashes": 0, "wipes": 0,
                      "conf_changes": 0, "lost_writes": 0, "quiet_steps": 0,
                      "queue_commands": 0, "operator_ops": 0, "dropped": 0, "rejoined": 0}
        #: the checker's history and invariants (sim_checker.py)
        self.checker = Checker(self.fail, self.hosts, self.stats,
                               self._note if trace else None)
        snap = bootstrap([h.id for h in self.hosts.values()], ())
        for h in self.hosts.values():
            h.disk.snap = (snap.index, snap.term, snap.voters, snap.learners, ())
            self._start(h)

    # ---- tracing ---------------------------------------------------------------------------
    def _note(self, text: str) -> None:
        if self.trace is not None:
            self.trace.append(f"{self.step:5d} {text}")

    def _state(self, h: Host) -> str:
        r = h.raft
        if r is None:
            return f"{h.id}:down"
        return (f"{h.id}:{r.state[0].upper()}t{r.term}c{r.commit}l{r.last_index}"
                f"s{r.log.snap_index}{' busy' if h.pending is not None else ''}")

    def fail(self, invariant: str, details: str):
        raise Violation(self.seed, self.step, invariant, details)

    # ---- the host ----------------------------------------------------------------------------
    def _start(self, h: Host) -> None:
        """Start (or restart) ``h`` from its synced disk, as the real host does."""
        d = h.disk
        snap = Snapshot(d.snap[0], d.snap[1], d.snap[2], d.snap[3], d.snap[4]) if d.snap else None
        entries = [Entry(t, i, k, list(x) if isinstance(x, list) else x)
                   for t, i, k, x in d.entries]
        hs = HardState(*d.hs) if d.hs else None
        h.raft = Raft(h.id, (), rng=random.Random(self.rng.getrandbits(64)),
                      election_ticks=self.election_ticks, heartbeat_ticks=1, hard_state=hs,
                      snapshot=snap, entries=entries, pre_vote=self.pre_vote,
                      check_quorum=self.check_quorum, snapshot_source=lambda: tuple(h.sm))
        h.pending = None
        h.sm = list(snap.data) if snap else []
        h.sm_index = snap.index if snap else 0
        self._rebuild(h)
        h.final = any(x[3] == FINAL for x in h.sm)
        h.last_commit = h.raft.commit
        h.lead_term = h.lead_commit = 0
        h.silent = 0
        self._pump(h)

    def _pump(self, h: Host) -> None:
        r = h.raft
        rounds = 0
        while h.pending is None and r.has_ready():
            rounds += 1
            if rounds > 1000:
                self.fail("core exception", f"{h.id}: has_ready() stays true after advance()")
            rd = r.ready()
            d = h.disk
            # The protocol's order (raft.py; etcd's WAL, node/replication/store.py): snapshot,
            # entries, then the hard state, so that a torn write never keeps a commit index
            # past the entries it covers (seed 56258 applied a stale entry when hs came first)
            if rd.snapshot is not None:
                s = rd.snapshot
                d.write(("snap", (s.index, s.term, tuple(s.voters), tuple(s.learners),
                                  self.checker.snapshot_data(h, s))))
            if rd.entries:
                d.write(("ents", [[e.term, e.index, e.kind,
                                   list(e.data) if isinstance(e.data, list) else e.data]
                                  for e in rd.entries]))
            if rd.hard_state is not None:
                hs = rd.hard_state
                d.write(("hs", (hs.term, hs.vote, hs.commit)))
            if self.variant == SEND_BEFORE_FSYNC:
                self._send(h, rd.messages)
            if self.faults and self.p_defer and self.rng.random() < self.p_defer:
                h.pending = rd
                return
            self._finish(h, rd)

    def _finish(self, h: Host, rd) -> None:
        """The fsync of a written Ready, then its messages, its applies and advance()."""
        self._sync(h)
        if self.variant != SEND_BEFORE_FSYNC:
            self._send(h, rd.messages)
        if rd.snapshot is not None:
            self._install(h, rd.snapshot)
        for e in rd.committed:
            self._apply(h, e)
        r = h.raft
        if r.state == LEADER:
            # what it counted committed, before advance() applies a removal of itself and it
            # steps down (a member removed while it did not know: it led its old
            # configuration, whose majorities meet the new one's)
            self.checker.leader(h)
        r.advance(rd)
        if r.log.applied - r.log.snap_index > self.K:
            if h.hq.snapshot_digest() != h.hq.digest():
                self.fail("queue state", f"{h.id}: its queue's snapshot restores another "
                          f"queue at {r.log.applied}")
            s = r.compact(r.log.applied, tuple(h.sm))
            h.disk.write(("compact", (s.index, s.term, tuple(s.voters), tuple(s.learners),
                                      s.data)))
            self.stats["compactions"] += 1

    def _sync(self, h: Host, keep: int | None = None) -> None:
        err = h.disk.sync(keep)
        if err:
            self.fail("disk", f"{h.id}: {err}")
        self.checker.synced(h.id, h.disk.hs)

    def _send(self, h: Host, msgs: list[Message]) -> None:
        for m in msgs:
            if m.type == VOTE_RESP and not m.reject:
                self.checker.vote(m.frm, m.term, m.to)
            elif m.type == VOTE:
                self.checker.vote(m.frm, m.term, m.frm)
            elif m.snapshot is not None:
                self.stats["snapshots_sent"] += 1
            self.net.append([self.step, h.node, m.to, msgpack.packb(m.to_wire())])

    def _install(self, h: Host, s: Snapshot) -> None:
        data = self.checker.installing(h, s)
        h.sm = list(data)
        h.sm_index = s.index
        h.final = any(x[3] == FINAL for x in data)
        self._rebuild(h)
        self.stats["snapshots_installed"] += 1
        if self.trace is not None:
            self._note(f"   {h.id} installs snapshot {s.index}/{s.term} {s.voters} {s.learners}")

    def _apply(self, h: Host, e: Entry) -> None:
        rec = self.checker.applying(h, e)
        h.sm.append((e.index,) + rec)
        h.sm_index = e.index
        if h.hq.apply(e.index, e.kind, e.data):
            self.stats["queue_commands"] += 1
            self.checker.queue_at(h, e.index)
        if e.data == FINAL:
            h.final = True
        if e.kind == CONF:
            self.stats["conf_changes"] += 1
            if self.trace is not None:
                self._note(f"   {h.id} applies conf {e.data} at {e.index}")

    def _rebuild(self, h: Host) -> None:
        """``h``'s queue from its state machine's entries (a snapshot, a restart)."""
        h.hq.rebuild(h.sm)
        if h.sm:
            self.checker.queue_at(h, h.sm_index)

    def _crash(self, h: Host, mode: str) -> None:
        unsynced = len(h.disk.unsynced)
        if mode == "keep":
            keep = None
        elif mode == "lose":
            keep = 0
        else:
            keep = self.rng.randint(0, unsynced)
        if keep is not None and keep < unsynced:
            self.stats["lost_writes"] += 1
        self._sync(h, keep)
        h.raft = None
        h.pending = None
        if self.trace is not None:
            self._note(f"crash {h.id} ({mode}, {unsynced} unsynced writes, kept "
                       f"{unsynced if keep is None else keep})")

    # ---- the schedule --------------------------------------------------------------------------
    def live(self) -> list[Host]:
        return [h for h in self.hosts.values() if h.raft is not None]

    def idle(self) -> list[Host]:
        return [h for h in self.hosts.values() if h.raft is not None and h.pending is None]

    def leader(self) -> Host | None:
        """The live leader of the highest term, if any."""
        best = None
        for h in self.idle():
            if h.raft.state == LEADER and (best is None or h.raft.term > best.raft.term):
                best = h
        return best

    @staticmethod
    def _wanted_of(h: Host) -> list[str] | None:
        """The nodes an operator wants members on, as ``h`` applied it (its last
        ``["wanted", nodes]`` entry, machine.py); None: those of the members."""
        for x in reversed(h.sm):
            d = x[3]
            if x[2] == NORMAL and isinstance(d, (list, tuple)) and len(d) == 2 and \
                    d[0] == "wanted":
                return list(d[1])
        return None

    def wanted_nodes(self) -> set[str]:
        """The nodes wanted as the host that applied the most says (all at first)."""
        h = max(self.hosts.values(), key=lambda x: x.sm_index)
        w = self._wanted_of(h)
        return set(w) if w is not None else set(self.nodes)

    def _settled(self) -> bool:
        """Every node's current id is a voter and nothing else is, in every member's committed
        configuration (applied, for a live member; up to the commit index on its disk, for a
        crashed one) and in the last configuration of its log: a wipe now leaves a majority of
        intact voters in any configuration that can follow. (A wipe while a replacement is
        still a learner, or while its promotion is not committed, could leave a majority of
        the committed configuration gone for good: no Raft recovers from that.)"""
        nodes = self.wanted_nodes()
        want = ({h.id for h in self.hosts.values() if h.node in nodes}, set())
        for h in self.hosts.values():
            if h.node not in nodes:
                continue                # removed: it lingers until reconciled
            w = self._wanted_of(h)
            if (set(w) if w is not None else set(self.nodes)) != nodes:
                return False            # an operator's change not applied here yet
            r = h.raft
            if r is not None:       # applied (= committed, between steps) and the rest
                committed = (set(r.voters), set(r.learners))
                rest = [(e.kind, e.data) for e in r.log.entries if e.index > r.log.applied]
            else:
                if h.disk.snap is None:
                    return False
                commit = h.disk.hs[2] if h.disk.hs else 0
                committed = _conf_after(set(h.disk.snap[2]), set(h.disk.snap[3]),
                                        [(e[2], e[3]) for e in h.disk.entries if e[1] <= commit])
                rest = [(e[2], e[3]) for e in h.disk.entries if e[1] > commit]
            if committed != want or _conf_after(*committed, rest) != want or \
                    any(k == NORMAL and isinstance(d, (list, tuple)) and len(d) == 2 and
                        d[0] == "wanted" for k, d in rest):
                return False            # a change, or an operator's, logged and not applied
        return True

    def _deliver(self, k: int) -> Host | None:
        _, frm, to, raw = self.net.pop(k)
        h = self.by_id.get(to)
        m = _unpack(raw, frm, to)
        if h is not None and h.absent and (frm, h.node) not in self.blocked and \
                m.type in (APP, SNAP):
            self._rejoin(h)
        if h is None or h.raft is None or (frm, h.node) in self.blocked:
            if self.trace is not None:
                self._note(f"lost {m!r}")
            return None
        if m.type in FROM_LEADER:
            h.silent = 0
        h.raft.step(m)
        self._pump(h)
        if self.trace is not None:
            self._note(f"deliver {m!r} -> {self._state(h)}")
        return h

    def _tick(self, h: Host) -> None:
        r = h.raft
        r.tick()
        h.silent += 1
        if self.variant == LEADER_RULE and r.leader is not None:
            h.silent = 0                # the old rule: wait while it knows a leader
        if r.state == LEADER and h.pending is None:
            current = {x.node: x.id for x in self.hosts.values()
                       if x.raft is not None or x.absent}       # the node is up
            change = membership.step_toward(r, h.node, current, self._wanted_of(h))
            if change is not None and self.trace is not None:
                self._note(f"   {h.id} proposes {change} at {r.log.last_index}")
        elif self._reconcile(h):
            return
        self._pump(h)

    def _reconcile(self, h: Host) -> bool:
        """node/replication/reconcile.py on ``h``'s tick, with its own ``action`` and answer
        rule: a member no leader replicated to for the grace period (10 election timeouts,
        as the node's 10 s) goes if it knows no configuration, else asks the other voters'
        nodes, each answering from its own configuration at once (a crashed node or a cut
        link: no answer; a node that dropped its member: none). A majority saying it is
        gone or goes on without it drops it. True when dropped."""
        r = h.raft
        act = reconcile.action(r, h.silent * ELECTION_TICKS // self.election_ticks, False)
        if act is None:
            return False
        if act == reconcile.ASK:
            answers = {}
            for v in r.voters:
                x = self.hosts.get(membership.node_of(v))
                if x is None or x is h or (h.node, x.node) in self.blocked or \
                        (x.node, h.node) in self.blocked:
                    continue
                if x.absent:
                    answers[x.id] = reconcile.NONE
                elif x.raft is not None:
                    answers[x.id] = reconcile.answer_for(x.raft, h.id)
            if not reconcile.gone_here(answers, r.voters, r.id, reconcile.removed_in_log(
                    reconcile.conf_changes(r), r.id)):
                return False
        hs = r.hard_state()
        h.tomb = (hs.term, hs.vote)     # the node keeps them (store.py's tombstones)
        h.raft = None
        h.absent = True
        h.disk = Disk()
        h.sm, h.sm_index, h.final = [], 0, False
        h.hq.rebuild([])
        self.stats["dropped"] += 1
        if self.trace is not None:
            self._note(f"{h.id} reconciled ({act}): dropped, term {hs.term} vote {hs.vote}")
        return True

    def _rejoin(self, h: Host) -> None:
        """A leader's APP or SNAP reaches a node that dropped its member: the member is made
        again, empty (manager.py ``_join``), from the dropped one's term and vote."""
        h.absent = False
        h.disk = Disk()
        if h.tomb is not None:
            h.disk.hs = (h.tomb[0], h.tomb[1], 0)
        self.stats["rejoined"] += 1
        self._start(h)
        if self.trace is not None:
            self._note(f"{h.id} joins again, empty: {self._state(h)}")

    def _operate(self, h: Host) -> list | None:
        """Maybe an operator's delete_member or add_member at leader ``h`` while the
        membership is settled (node/replication/operations.py: ``membership.wanted_after``,
        logged as ``["wanted", nodes]``)."""
        if not self.p_op or self.op_rng.random() >= self.p_op or not self._settled():
            return None
        now = self._wanted_of(h) or sorted(membership.node_of(m) for m in h.raft.voters)
        out = [n for n in self.nodes if n not in now]
        if out and self.op_rng.random() < 0.6:
            op, node = "add_member", self.op_rng.choice(out)
        else:
            op, node = "delete_member", self.op_rng.choice(sorted(now))
        try:
            wanted = membership.wanted_after(now, op, node)
        except ValueError:
            return None
        self.stats["operator_ops"] += 1
        if self.trace is not None:
            self._note(f"operator: {op} {node} at {h.id}")
        return ["wanted", wanted]

    def _propose(self, h: Host, data) -> int | None:
        index = h.raft.propose(data)
        self._pump(h)
        if self.trace is not None:
            self._note(f"propose {data} to {h.id} at {index} -> {self._state(h)}")
        return index

    def _fault_step(self) -> list[Host]:
        """One step of the faulty phase; returns the hosts whose Raft took input."""
        rng = self.rng
        net = self.net
        x = rng.random()
        if x < self.p_tick_all:
            return self._tick_all()
        if x < self.p_tick_all + self.p_tick_one:
            idle = self.idle()
            if not idle:
                return self._tick_all()
            h = rng.choice(idle)
            self._tick(h)
            if self.trace is not None:
                self._note(f"tick {self._state(h)}")
            return [h]
        live = self.live()
        idle = self.idle()
        can = {"partition": True, "one_way": True, "heal": bool(self.blocked),
               "crash": bool(live), "flap": len(live) >= 2,
               "restart": any(h.raft is None and not h.absent for h in self.hosts.values()),
               "transfer": self.leader() is not None, "campaign": bool(idle)}
        x = rng.random()
        action = None
        for fault, p in self.p.items():
            if x < p:
                if fault == "propose":
                    leaders = [h for h in self.idle() if h.raft.state == LEADER]
                    if leaders:
                        action = fault
                elif fault == "wipe":
                    if self.variant == WIPE_KEEPS_ID or (len(self.wanted_nodes()) >= 3 and
                                                         self._settled()):
                        action = fault
                elif can[fault]:
                    action = fault
                break
            x -= p
        if action is None:
            busy = [h for h in self.hosts.values() if h.pending is not None]
            by_id = self.by_id
            ready = [k for k, msg in enumerate(net) if msg[0] <= self.step and
                     (msg[2] not in by_id or by_id[msg[2]].pending is None)]
            w_deliver = self.w_deliver * len(ready)
            total = w_deliver + self.w_fsync * len(busy)
            if total == 0:
                return self._tick_all()       # nothing to do: time passes
            action = "deliver" if rng.random() * total < w_deliver else "fsync"
        if action == "fsync":
            h = rng.choice(busy)
            rd, h.pending = h.pending, None
            if self.trace is not None:
                self._note(f"fsync {h.id}")
            self._finish(h, rd)
            self._pump(h)
            return [h]
        if action == "deliver":
            k = rng.choice(ready) if rng.random() < self.p_reorder else ready[0]
            x = rng.random()
            if x < self.p_drop:
                msg = net.pop(k)
                if self.trace is not None:
                    self._note(f"drop {_unpack(msg[3], msg[1], msg[2])!r}")
                return []
            x -= self.p_drop
            if x < self.p_delay:
                net[k][0] = self.step + rng.randint(5, 60)
                if self.trace is not None:
                    self._note(f"delay {_unpack(net[k][3], net[k][1], net[k][2])!r} to "
                               f"{net[k][0]}")
                return []
            x -= self.p_delay
            if x < self.p_dup:
                net.append(list(net[k]))
                self._note("duplicate:")
            h = self._deliver(k)
            return [h] if h else []
        if action == "propose":
            self.proposals += 1
            h = rng.choice(leaders)
            r = h.raft
            op = self._operate(h)
            again, err = (None, None) if op is not None else self.publisher.resend(h)
            if err:
                self.fail("a publish sent again is stored once", err)
            cmd = op if op is not None else again if again is not None else \
                self.client.command(h.id, r.term, r.log, h.hq, self.step)
            index = self._propose(h, cmd if cmd is not None else f"p{self.proposals}")
            if cmd is not None and index is not None and op is None:
                if again is None:
                    self.client.last[(h.id, r.term)] = index
                self.publisher.logged(cmd, h, index)
            return [h]
        if action == "partition":
            k = rng.randint(1, self.n - 1)
            side = set(rng.sample(self.nodes, k))
            lead = self.leader()
            if lead is not None and rng.random() < 0.5:     # cut the leader off a majority
                side = {lead.node} | set(rng.sample(self.nodes, (self.n - 1) // 2))
            for a in self.nodes:
                for b in self.nodes:
                    if (a in side) != (b in side):
                        self.blocked.add((a, b))
            if self.trace is not None:
                self._note(f"partition {sorted(side)} | {sorted(set(self.nodes) - side)}")
            return []
        if action == "one_way":
            a, b = rng.sample(self.nodes, 2)
            self.blocked.add((a, b))
            if self.trace is not None:
                self._note(f"cut {a} -> {b}")
            return []
        if action == "heal":
            self.blocked.clear()
            self._note("heal")
            return []
        if action == "crash":
            h = rng.choice(live)
            lead = self.leader()
            busy = [x for x in live if x.pending is not None]
            x = rng.random()
            if busy and x < 0.5:        # between a write and its fsync
                h = rng.choice(busy)
            elif lead is not None and x < 0.8:
                h = lead
            self._crash(h, rng.choice(("lose", "keep", "prefix")))
            self.stats["crashes"] += 1
            touched = []
            if rng.random() < self.p_peer_lost:       # the survivors see its socket close
                for rank, s in enumerate(self.idle()):
                    s.raft.peer_lost(h.id, 1 + rank)
                    self._pump(s)
                    touched.append(s)
                if self.trace is not None:
                    self._note(f"   peer_lost({h.id}) on {[s.id for s in touched]}")
            return touched
        if action == "restart":
            h = rng.choice([h for h in self.hosts.values() if h.raft is None and not h.absent])
            self._start(h)
            if self.trace is not None:
                self._note(f"restart {self._state(h)}")
            return [h]
        if action == "wipe":
            nodes = self.wanted_nodes()
            h = rng.choice([x for x in self.hosts.values() if x.node in nodes])
            if h.raft is not None:
                self._crash(h, "lose")
            old = h.id
            del self.by_id[h.id]
            h.gen += 1
            if self.variant != WIPE_KEEPS_ID:
                h.id = membership.member_id(h.node, f"d{h.gen}")
            self.by_id[h.id] = h
            h.disk = Disk()
            h.absent, h.tomb = False, None
            self._start(h)
            self.stats["wipes"] += 1
            if self.trace is not None:
                self._note(f"wipe {old} -> restart as {self._state(h)}")
            return [h]
        if action == "transfer":    # the host's leadership transfer (manager.py: transfer)
            lead = self.leader()
            r = lead.raft
            targets = [m for m in sorted(r.voters) if m != r.id and m in r.progress
                       and r.progress[m].match >= r.log.last_index]
            if not targets:
                return []
            target = rng.choice(targets)
            r.transfer_leadership(target)
            self._pump(lead)
            if self.trace is not None:
                self._note(f"transfer: {lead.id} hands over to {target} -> "
                           f"{self._state(lead)}")
            return [lead]
        if action == "campaign":    # the host makes a member campaign (e.g. a group's creator)
            h = rng.choice(idle)
            h.raft.campaign()
            self._pump(h)
            if self.trace is not None:
                self._note(f"campaign {self._state(h)}")
            return [h]
        assert action == "flap"
        a, b = rng.sample(live, 2)
        if a.pending is not None:
            return []
        a.raft.peer_lost(b.id, rng.randint(0, 3))
        self._pump(a)
        if self.trace is not None:
            self._note(f"peer_lost({b.id}) on {a.id} (link flap)")
        return [a]

    def _tick_all(self) -> list[Host]:
        idle = self.idle()
        for h in idle:
            self._tick(h)
        if self.trace is not None:
            self._note("tick all -> " + " ".join(self._state(h) for h in idle))
        return idle

    def _quiet(self) -> None:
        """The end of a schedule: no more faults; the cluster must recover (liveness)."""
        self.faults = False
        self.blocked.clear()
        self._note("--- quiet: heal, restart, no more faults")
        for h in self.hosts.values():
            if h.pending is not None:
                rd, h.pending = h.pending, None
                self._finish(h, rd)
                self._pump(h)
                self.checker.check(h)
        for h in self.hosts.values():
            if h.raft is None and not h.absent:
                self._start(h)
                if self.trace is not None:
                    self._note(f"restart {self._state(h)}")
                self.checker.check(h)
        proposed = set()
        for _ in range(QUIET_STEPS):
            self.step += 1
            self.stats["quiet_steps"] += 1
            if self.net:
                h = self._deliver(0)
                touched = [h] if h else []
            else:
                touched = self.idle()
                for h in touched:
                    self._tick(h)
                if self.trace is not None:
                    self._note("tick all -> " + " ".join(self._state(h) for h in touched))
            for h in touched:
                self.checker.check(h)
            if self.paranoid:
                self.checker.pairs()
            lead = self.leader()
            if lead is None:
                continue
            r = lead.raft
            if (lead.id, r.term) not in proposed:
                # a client asks again while the leader refuses (a leadership transfer under
                # way), as the router does when a publish is answered PUBLISH_MOVED
                if self._propose(lead, FINAL) is not None:
                    proposed.add((lead.id, r.term))
                self.checker.check(lead)
            nodes = self.wanted_nodes()
            want = {h.id for h in self.hosts.values() if h.node in nodes}
            if sum(h.final for h in self.hosts.values() if h.id in want) >= \
                    len(want) // 2 + 1 and r.voters == want and not r.learners and \
                    all(h.absent for h in self.hosts.values() if h.node not in nodes):
                if self.trace is not None:
                    self._note(f"--- live: {self._state(lead)} voters {sorted(r.voters)}")
                return
        lead = self.leader()
        self.fail("liveness", f"no leader with the final proposal committed on a majority, "
                  f"every node wanted a voter and every other's member dropped after "
                  f"{QUIET_STEPS} quiet steps: "
                  + " ".join(self._state(h) for h in self.hosts.values())
                  + (f"; leader voters {sorted(lead.raft.voters)} learners "
                     f"{sorted(lead.raft.learners)}" if lead else "; no leader"))

    def run(self) -> dict:
        """The whole schedule; returns the statistics or raises :class:`Violation`."""
        if self.trace is not None:
            self._note(f"seed {self.seed}: {self.n} nodes, election {self.election_ticks} "
                       f"ticks, tick all {self.p_tick_all:.3f} one {self.p_tick_one}, compact "
                       f"past {self.K}, max append {self.max_append}, {self.steps} steps, "
                       f"defer fsync {self.p_defer}, reorder {self.p_reorder}, drop "
                       f"{self.p_drop}, delay {self.p_delay}, dup {self.p_dup}, faults {self.p}, "
                       f"pre_vote {self.pre_vote}, check_quorum {self.check_quorum}, variant "
                       f"{self.variant}")
        saved, raft_module.MAX_APPEND = raft_module.MAX_APPEND, self.max_append
        try:
            for h in self.hosts.values():
                self.checker.check(h)
            for self.step in range(1, self.steps + 1):
                for h in self._fault_step():
                    self.checker.check(h)
                err = self.publisher.answers(LEADER)
                if err:
                    self.fail("publish answer", err)
                if self.paranoid:
                    self.checker.pairs()
            self.checker.pairs()
            self._quiet()
            self.checker.pairs()
            self.checker.queue_replay()
            err = self.publisher.answers(LEADER)
            if err:
                self.fail("publish answer", err)
            end = self.publisher.check_end(max(self.hosts.values(),
                                               key=lambda x: x.sm_index).sm)
            if end:
                self.fail(*end)
        except Violation:
            raise
        except Exception as exc:    # the core's assertions, or a crash in it
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            raise Violation(self.seed, self.step, "core exception",
                            f"{exc!r} at {tb.filename}:{tb.lineno}") from exc
        finally:
            raft_module.MAX_APPEND = saved
        self.stats["steps"] = self.step
        self.stats.update(self.publisher.stats)
        self.stats["confirmed_publishes"] = len(self.publisher.confirmed)
        return self.stats


def run_seed(seed: int, **kw) -> dict:
    return Sim(seed, **kw).run()


def trace_of(seed: int, **kw) -> tuple[list[str], BaseException | None]:
    """The trace of ``seed`` and the violation it ended with (None when it passed)."""
    sim = Sim(seed, trace=True, **kw)
    try:
        sim.run()
    except Violation as v:
        sim.trace.append(f"VIOLATION {v}")
        return sim.trace, v
    return sim.trace, None
