"""A seeded, deterministic simulator for replicated streams (node/streams/replica.py) with a
checker over the whole history: the Raft simulator's idea (tests/node/replication/sim.py)
with each member's log in real segment files.

    python3 tests/node/streams/stream_sim.py --schedules 500 [--start SEED]
    python3 tests/node/streams/stream_sim.py --replay SEED

One ``random.Random(seed)`` drives the cluster (3 or 5 members, chosen by the seed), its
network, its disks and its faults; every member's files live under a temporary directory.
A step is one of: a tick of every member or of one; a publish of 1 to 3 messages to a
member that believes it leads; the delivery of a message (the oldest or any: reordering),
which may instead be lost, or delivered and kept to arrive again (duplicated); a partition
or its healing; a crash (the writes since the last fdatasync are lost, or a prefix of them
survives: a torn write; files unlinked since then may come back); a restart; the end of a
pending fdatasync (a member may sit between a write and its sync, taking nothing else; a
leader's appends have left before it, as the node sends them: replica.py
``early_messages``);
retention on one member (segments of a few chunks, so it bites); a publish sent again (the
writer ``w``, as a router, sends a publish whose leader lost the lead before confirming it to
a leader it sees now: node/streams/hosting.py's rule, found in the log with
``find_publish`` or stored with its sequence in the chunk's trailer); a wiped disk (a member's
process killed and its directory deleted: it comes back empty under a new member id,
``node@d<n>``, and the leader replaces the old id with it one change at a time, as
node/streams/members.py ``repair`` does with membership.py's ``repair``: the new id a learner
that catches up from the leader's segments, the old id removed, the new one promoted; only
while every member is up and every configuration settled, with 3 members at least, so that a
majority of intact voters remains, as the quorum queues' simulator); an operator's
``delete_member`` or ``add_member`` at the leader while the membership is settled
(membership.py ``wanted_after``; each leader then steps toward the nodes wanted with
``step_toward``, as the node does: a leader whose node goes hands the lead over first). A
member removed is dropped by its host, with what was sent to it: on its leader's
STREAM_DELETE, or (a node down then) by the reconciliation, modelled with reconcile.py's
rule; a node added again gets a member anew, empty, from the leader's first APP or SNAP
(node/streams/members.py ``on_peer``).

The checker, after every step:

* **election safety**: at most one leader per term;
* **vote safety**: a member id grants at most one vote per term, across its deletion and
  its making again under that id (paper 5.2);
* **same chunk at the same offset**: whenever a member's commit moves, each chunk it now
  holds as committed is byte for byte the chunk every other member committed at that offset;
* **no offset with two messages**: every message a member's reader delivers (a
  :class:`~shoal.node.streams.stream.StreamReader` that reads only what is committed) is the
  message every other reader got at that offset, and the one confirmed there;
* **a consumer never reads an offset twice**: a roaming consumer subscribes again now and
  then at a random live member, from the offset after its last delivery, as a router moves
  one or a client comes back (node/streams/readers.py ``reader_start``: a member behind its
  leader sends it to the newest leader); its offsets only increase;
* **no confirmed message lost**: at the end every member's log holds every confirmed message
  at its offset (unless retention removed it there);
* **a publish sent again is stored once**: when the leader it is sent to does not find it
  (``find_publish``), that leader's log does not hold it (unless retention removed it
  there); when it finds it, the chunk found holds that message;
* **liveness**: once the faults stop and every member is back, a leader confirms a final
  publish and every member commits it, within QUIET_STEPS steps.

Members are named by node (``m0``...); messages travel to member ids, and one addressed to
an id its node no longer has (wiped) is dropped, as the node's peer link drops it.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import msgpack

from shoal.node.replication import membership, reconcile
from shoal.node.replication.raft import APP, LEADER, SNAP, VOTE, VOTE_RESP, HardState, Message
from shoal.node.streams import chunk as chunks
from shoal.node.streams.offsets import OFFSET
from shoal.node.streams.readers import BehindLeader, reader_start
from shoal.node.streams.raftstate import start_at
from shoal.node.streams.replica import StreamReplica
from shoal.node.streams.stream import StreamReader

try:
    from .disk_model import DiskModel
except ImportError:         # imported by path (test_stream_sim.py, the script itself)
    from disk_model import DiskModel  # type: ignore

QUIET_STEPS = 6000
FINAL = b"final"
#: A deliberately unsafe host for the checker's own test: its fdatasync does nothing, so a
#: crash loses what it acknowledged.
NO_SYNC = "no_sync"
#: Another: the leader never looks for a publish sent again (every resend is stored).
NO_DEDUP = "no_dedup"
#: Another: a wiped member comes back under its old id, a voter that forgot its votes and log.
WIPE_KEEPS_ID = "wipe_keeps_id"
#: Another: every message of a Ready leaves before its sync, not only a leader's appends
#: (replica.py ``early_messages``): a follower acknowledges what is not on its disk yet.
EARLY_ANSWERS = "early_answers"
VARIANTS = (NO_SYNC, NO_DEDUP, WIPE_KEEPS_ID, EARLY_ANSWERS)


class Violation(AssertionError):
    def __init__(self, seed: int, step: int, invariant: str, details: str) -> None:
        self.seed, self.step, self.invariant, self.details = seed, step, invariant, details
        super().__init__(f"seed {seed} step {step}: {invariant}: {details} (replay: python3 "
                         f"tests/node/streams/stream_sim.py --replay {seed})")


class Member:
    """A member's directory, its replica (None while crashed), the Ready written and not
    synced yet, and its reader's position."""

    def __init__(self, sim: "Sim", node: str, voters: list[str]) -> None:
        self.sim = sim
        self.node = node
        self.gen = 0
        self.id = membership.member_id(node, "d0")
        self.dir = sim.root / self.id
        self.pending = None
        self.read_offset = 0
        self.rep: StreamReplica | None = None
        #: the node is up but holds no member of the stream (deleted by an operator's
        #: delete_member, until a leader replicates to it again)
        self.absent = False
        #: the deleted member's last (term, vote), which the node keeps for the member a
        #: leader makes again under this id (node/replication/store.py's tombstones)
        self.tomb: tuple | None = None
        self.open(voters)

    def open(self, voters: list[str] | None = None) -> None:
        s = self.sim
        self.rep = StreamReplica(self.id, self.dir, voters=voters, header=["/", "s", {}],
                                 rng=random.Random(s.rng.random()),
                                 election_ticks=s.election_ticks,
                                 max_segment_chunks=s.segment_chunks)
        self.reader = StreamReader(self.rep.segments, self.read_offset)
        self.pending = None

    def crash(self) -> None:
        """Lose what was not made durable (DiskModel.crash); the roaming consumer reading
        here subscribes again elsewhere later."""
        if self.sim.roamer is not None and self.sim.roamer[0] == self.id:
            self.sim.roamer = None
        self.rep.close()
        self.rep = None
        self.pending = None
        self.sim.disk.crash(self.dir)

    def delete(self) -> None:
        """The member and its files go (the host's STREAM_DELETE, or its own removal
        applied); the node stays up, and a leader that replicates to it again makes it
        anew, empty (node/streams/members.py ``on_peer``). What was sent to it before goes
        too: on the node's ordered link it arrived before the STREAM_DELETE, or before the
        leader's message that told it of its removal."""
        if self.rep is not None:
            hs = self.rep.raft.hard_state()
            self.tomb = (hs.term, hs.vote)
        self._drop()
        self.read_offset = 0
        self.absent = True
        self.sim.net = [x for x in self.sim.net if x[1] != self.id]

    def _drop(self) -> None:
        if self.sim.roamer is not None and self.sim.roamer[0] == self.id:
            self.sim.roamer = None
        if self.rep is not None:
            self.rep.close()
        self.rep = None
        self.pending = None
        self.sim.disk.forget(self.dir)
        shutil.rmtree(self.dir, ignore_errors=True)

    def wipe(self) -> None:
        """Killed, its directory deleted; it comes back empty under a new member id."""
        self._drop()
        self.read_offset = 0
        if self.sim.variant == WIPE_KEEPS_ID:   # bootstrapped again, as a new stream's
            self.open(sorted(m.id for m in self.sim.members.values()))
            return
        self.gen += 1
        self.id = membership.member_id(self.node, f"d{self.gen}")
        self.dir = self.sim.root / self.id
        self.open()


class Sim:
    def __init__(self, seed: int, trace: bool = False, variant: str | None = None) -> None:
        self.seed = seed
        self.variant = variant
        #: what the schedule exercised: crashes, snapshots installed (a member reset to a
        #: leader's start), logs cut (a divergent tail), segments removed by retention
        self.stats = {"crashes": 0, "resets": 0, "cuts": 0, "retained": 0, "roams": 0,
                      "roams_to_leader": 0, "resent": 0, "resent_found": 0, "wipes": 0,
                      "conf_changes": 0, "operator_ops": 0, "transfers": 0, "deleted": 0,
                      "rejoined": 0}
        self.rng = rng = random.Random(seed)
        self.trace_on = trace
        self.trace: list[str] = []
        self.tmp = tempfile.mkdtemp(prefix="shoal-stream-sim-")
        self.root = Path(self.tmp)
        n = rng.choice((3, 3, 5))
        self.election_ticks = rng.choice((3, 5, 10))
        self.segment_chunks = rng.choice((2, 4, 16, 1000))
        self.retain_bytes = rng.choice((None, 600, 3000))
        self.p_drop = rng.choice((0.0, 0.05, 0.2))
        self.p_dup = rng.choice((0.0, 0.05))
        self.p_crash = rng.choice((0.0, 0.005, 0.02))
        self.p_part = rng.choice((0.0, 0.01, 0.03))
        self.p_delay_sync = rng.choice((0.0, 0.3))
        self.p_wipe = 0.01 if variant == WIPE_KEEPS_ID else rng.choice((0.0, 0.002, 0.006))
        # from a Random of its own: with p_op 0 a seed's schedule is the one it had before
        # operators' changes were simulated (a regression seed keeps replaying)
        self.p_op = random.Random(f"ops/{seed}").choice((0.0, 0.003, 0.01))
        nodes = [f"m{i}" for i in range(n)]
        ids = [membership.member_id(node, "d0") for node in nodes]
        self.disk = DiskModel(rng, no_sync=variant == NO_SYNC)
        self.disk.install()
        try:
            #: node -> its member (whose id changes when its disk is wiped)
            self.members = {node: Member(self, node, ids) for node in nodes}
        except BaseException:
            self.disk.uninstall()
            raise
        self.net: list[tuple[str, str, bytes]] = []
        self.cut: set[tuple[str, str]] = set()
        self.step_no = 0
        self.now = 1_000
        self.leaders: dict[int, str] = {}
        self.votes: dict[tuple[str, int], str] = {}     # (member id, term) -> candidate
        self.chunk_at: dict[int, bytes] = {}       # committed chunk bytes by chunk id
        self.seen: dict[int, bytes] = {}           # offset -> message delivered or confirmed
        self.confirmed: dict[int, bytes] = {}      # offset -> body, confirmed to a publisher
        self.proposals: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
        self.published = 0
        #: the writer's publishes not yet confirmed: seq -> (body, the member that took it
        #: last, its term); publishes sent again and found stored in a chunk not yet
        #: committed: [member id, term, log index, offset, body]
        self.unanswered: dict[int, tuple[bytes, str, int]] = {}
        self.after: list[list] = []
        self.final_offset: int | None = None
        self.final_by: tuple[str, int] = ("", 0)
        #: a consumer that subscribes again at another member now and then, at the offset
        #: after its last delivery, as a router moves one or a client comes back
        #: (node/streams/readers.py): (member id, its reader), or None between two
        self.roamer: tuple[str, StreamReader] | None = None
        self.roamer_last = -1

    # ---- faults and plumbing ---------------------------------------------------------------
    def fail(self, invariant: str, details: str) -> None:
        raise Violation(self.seed, self.step_no, invariant, details)

    def log(self, text: str) -> None:
        if self.trace_on:
            self.trace.append(f"{self.step_no}: {text}")

    def alive(self) -> list[Member]:
        return [m for m in self.members.values() if m.rep is not None]

    def by_id(self, mid: str) -> Member | None:
        """The member whose id is ``mid`` now (None: its node's disk was wiped since)."""
        m = self.members.get(membership.node_of(mid))
        return m if m is not None and m.id == mid else None

    def settled(self) -> bool:
        """Every member up, idle, and in its applied configuration every member's current
        id a voter and nothing else, no change in its log past that: a wipe now leaves a
        majority of intact voters in any configuration that can follow (sim.py's rule)."""
        present = [m for m in self.members.values() if not m.absent]
        want = {m.id for m in present}
        nodes = {m.node for m in present}
        for m in present:
            if m.rep is None or m.pending is not None:
                return False
            r, rep = m.rep.raft, m.rep
            if set(r.voters) != want or r.learners or \
                    any(c[0] > r.log.applied for c in rep.confs) or \
                    any(w[0] > r.log.applied for w in rep.wanted_ops) or \
                    (rep.wanted is not None and set(rep.wanted) != nodes):
                return False
        return True

    def repair(self, m: Member) -> None:
        """As leader: the next step toward the nodes wanted and every node's current member
        id (membership.py ``step_toward``, as node/streams/members.py ``repair``): the
        nodes up are those with a live member and those without one (absent)."""
        if m.pending is not None or not m.rep.is_leader:
            return
        current = {x.node: x.id for x in self.members.values()
                   if x.rep is not None or x.absent}
        step = membership.step_toward(m.rep.raft, m.node, current, m.rep.wanted)
        if step is not None:
            self.stats["transfers" if step[0] == "transfer" else "conf_changes"] += 1
            self.log(f"{m.id} begins {step[0]} {step[1]}")

    def operate(self) -> None:
        """An operator's add_member or delete_member (rabbitmq-streams add_replica,
        delete_replica; node/streams/members.py ``operate``) at the leader, while the
        membership is settled: the nodes wanted are logged, and the leader's repair does the
        rest. Deleting the leader's own node hands the lead over first."""
        leaders = [m for m in self.alive() if m.rep.is_leader and m.pending is None]
        if not leaders or not self.settled():
            return
        m = leaders[0]
        voters = sorted(membership.node_of(v) for v in m.rep.raft.voters)
        absent = [x.node for x in self.members.values() if x.absent]
        if absent and self.rng.random() < 0.6:
            op, node = "add_member", self.rng.choice(absent)
        else:
            op, node = "delete_member", self.rng.choice(voters)
        try:
            wanted = membership.wanted_after(m.rep.wanted or voters, op, node)
        except ValueError:
            return                          # the last member: refused (406)
        index = m.rep.propose_wanted(wanted)
        if index is not None:
            # its answer comes from finish() too: no older publish of this member at that
            # index (lost with an older term) may be taken for it
            self.proposals.pop((m.id, index), None)
            self.stats["operator_ops"] += 1
            self.log(f"operator: {op} {node} at {m.id}: wanted {wanted}")
            self.drive(m)

    def send(self, msgs: list[Message]) -> None:
        for m in msgs:
            if m.type == VOTE_RESP and not m.reject:
                self.vote(m.frm, m.term, m.to)
            elif m.type == VOTE:
                self.vote(m.frm, m.term, m.frm)
            self.net.append((m.frm, m.to, msgpack.packb(m.to_wire())))

    def vote(self, voter: str, term: int, cand: str) -> None:
        """Vote safety: a member id grants at most one vote per term, over all its lives."""
        prev = self.votes.setdefault((voter, term), cand)
        if prev != cand:
            self.fail("vote safety", f"{voter} voted for {prev} and for {cand} in term {term}")

    def drive(self, m: Member) -> None:
        """The host protocol: while there is a Ready and no sync pending, write it, sync it
        (now or later), send, finish."""
        while m.rep is not None and m.pending is None and m.rep.has_ready():
            first = m.rep.segments.next_offset
            rd = m.rep.write()
            if rd.snapshot is not None:
                self.stats["resets"] += 1
            elif rd.entries and m.rep.segments.next_offset < first:
                self.stats["cuts"] += 1
            m.pending = rd
            if self.variant == EARLY_ANSWERS:
                early, rd.messages = rd.messages, []
            else:
                early = m.rep.early_messages(rd)    # a leader's appends, before its sync
            self.send(early)
            if self.rng.random() < self.p_delay_sync:
                return
            self.complete(m)
        self.check_leader(m)

    def complete(self, m: Member) -> None:
        rd, m.pending = m.pending, None
        rep = m.rep
        rep.sync()
        self.send(rd.messages)
        before = rep.committed_offset
        for index in rep.finish(rd):
            for off, body in self.proposals.pop((m.id, index), []):
                self.confirm(off, body)
        if rep.dropped:                     # as leader: tell the removed (members.py)
            dropped, rep.dropped = rep.dropped, []
            for v in dropped:
                x = self.by_id(v)
                if x is not None and x.rep is not None:     # a node down misses it
                    self.stats["deleted"] += 1
                    self.log(f"{m.id} drops {v}")
                    x.delete()
        if getattr(rep, "removed", False):  # a replica that drops itself (the node's old
            self.stats["deleted"] += 1      # rule, kept for test_stream_sim.py's teeth)
            self.log(f"{m.id} was removed")
            m.delete()
            return
        if self.after:
            keep = []
            for a in self.after:
                if a[0] == m.id and rep.raft.log.applied >= a[2] and rep.is_leader \
                        and rep.raft.term == a[1]:
                    self.confirm(a[3], a[4])
                elif a[0] != m.id or (rep.is_leader and rep.raft.term == a[1]):
                    keep.append(a)          # else the lead was lost: it may be sent again
            self.after = keep
        if rep.committed_offset > before:
            self.check_chunks(m, before, rep.committed_offset)
        self.read(m)
        if self.retain_bytes is not None and self.rng.random() < 0.5:
            self.retain(m)                  # as the host does after a turn that wrote

    def retain(self, m: Member) -> None:
        n = m.rep.retain(self.retain_bytes, None, self.now)
        self.stats["retained"] += n
        if n:
            self.log(f"{m.id} retention: {n} segments, start {m.rep.base['index']}")

    def confirm(self, off: int, body: bytes) -> None:
        if self.seen.get(off, body) != body:
            self.fail("no offset with two messages",
                      f"confirmed {body!r} at {off}, {self.seen[off]!r} delivered there")
        self.seen[off] = body
        self.confirmed[off] = body
        if body != FINAL:
            self.unanswered.pop(int(body.split(b"-")[1]), None)
        self.log(f"confirmed {body!r} at {off}")

    def check_chunks(self, m: Member, lo: int, hi: int) -> None:
        seg = m.rep.segments
        off = max(lo, seg.first_offset)
        while off < hi:
            raw = seg.chunk_at(off)
            if raw is None:
                self.fail("same chunk at the same offset",
                          f"{m.id} committed up to {hi} but holds no chunk at {off}")
            h = chunks.ChunkHeader(raw)
            if h.next_offset > hi:
                self.fail("same chunk at the same offset",
                          f"{m.id}: chunk {h.chunk_id} ends at {h.next_offset}, past its "
                          f"commit {hi}")
            known = self.chunk_at.setdefault(h.chunk_id, raw)
            if known != raw:
                self.fail("same chunk at the same offset",
                          f"{m.id}: chunk {h.chunk_id} differs from the one committed before")
            off = h.next_offset

    def read(self, m: Member) -> None:
        for msg in m.reader.read(50, m.rep.committed_offset):
            body = bytes(msg.body)
            if self.seen.setdefault(msg.offset, body) != body:
                self.fail("no offset with two messages",
                          f"{m.id} read {body!r} at {msg.offset}, {self.seen[msg.offset]!r} "
                          f"there before")
        m.read_offset = m.reader.offset
        if self.roamer is not None and self.roamer[0] == m.id:
            self.read_roamer(m)

    def roam(self) -> None:
        """The roaming consumer subscribes at a live member, from the offset after its last
        delivery (readers.py ``reader_start``); a member that does not lead and is behind
        sends it to the newest leader, as the router does after MOVED (none live: it tries
        again later)."""
        live = self.alive()
        if not live:
            return
        m = self.rng.choice(live)
        spec = (OFFSET, self.roamer_last + 1)
        try:
            start = reader_start(spec, m.rep.segments, m.rep.is_leader)
        except BehindLeader:
            self.stats["roams_to_leader"] += 1
            newest = max(self.leaders, default=None)
            m = self.by_id(self.leaders[newest]) if newest is not None else None
            if m is None or m.rep is None or not m.rep.is_leader or \
                    m.rep.raft.term != newest:
                self.roamer = None
                return
            start = reader_start(spec, m.rep.segments, True)
        self.stats["roams"] += 1
        self.roamer = (m.id, StreamReader(m.rep.segments, start))
        self.log(f"roamer at {m.id} from {start}")
        self.read_roamer(m)

    def read_roamer(self, m: Member) -> None:
        for msg in self.roamer[1].read(50, m.rep.committed_offset):
            body = bytes(msg.body)
            if msg.offset <= self.roamer_last:
                self.fail("a consumer never reads an offset twice",
                          f"the roaming consumer read {msg.offset} at {m.id} after "
                          f"{self.roamer_last}")
            if self.seen.setdefault(msg.offset, body) != body:
                self.fail("no offset with two messages",
                          f"{m.id} read {body!r} at {msg.offset}, {self.seen[msg.offset]!r} "
                          f"there before")
            self.roamer_last = msg.offset

    def check_leader(self, m: Member) -> None:
        r = m.rep.raft if m.rep is not None else None
        if r is not None and r.state == LEADER:
            who = self.leaders.setdefault(r.term, m.id)
            if who != m.id:
                self.fail("election safety", f"{who} and {m.id} both lead term {r.term}")

    # ---- steps -----------------------------------------------------------------------------
    def publish(self, final: bool = False) -> None:
        leaders = [m for m in self.alive() if m.rep.is_leader and m.pending is None]
        if not leaders:
            return
        m = self.rng.choice(leaders)
        seqs = [] if final else list(range(self.published,
                                           self.published + self.rng.randint(1, 3)))
        bodies = [FINAL] if final else [f"{self.seed}-{q}".encode() for q in seqs]
        self.published += len(bodies)
        self._propose(m, bodies, {"w": (seqs, [])} if seqs else {}, final)

    def _propose(self, m: Member, bodies: list[bytes], sent: dict, final: bool = False
                 ) -> None:
        recs = [chunks.encode_record("", "s", b"", b) for b in bodies]
        got = m.rep.publish(recs, self.now, trailer=chunks.encode_trailer(sent))
        if got is None:
            return
        index, first = got
        self.proposals[(m.id, index)] = [(first + k, b) for k, b in enumerate(bodies)]
        for q, b in zip(sent.get("w", ([], []))[0] + sent.get("w", ([], []))[1], bodies):
            self.unanswered[q] = (b, m.id, m.rep.raft.term)
        if final:
            self.final_offset = first
            self.final_by = (m.id, m.rep.raft.term)
        self.log(f"{m.id} publishes {len(bodies)} at index {index}, offset {first}"
                 f"{' (sent again)' if sent.get('w', ([], []))[1] else ''}")
        self.drive(m)

    def _held(self, m: Member) -> dict[bytes, tuple[int, int]]:
        """What ``m``'s log holds from its start, committed or not: body -> (log index,
        offset)."""
        rep, out = m.rep, {}
        log = rep.raft.log
        for i in range(rep.base["index"] + 1, log.last_index + 1):
            if i > log.mem_base:
                raw = log.entries[i - log.mem_base - 1].data
                if not isinstance(raw, bytes):
                    continue
            else:
                at = rep.segments.locate_index(i)
                if at is None or at[0].record(at[1])[4] == chunks.CONTROL:
                    continue
                raw = rep.segments.read_at(*at)
            for off, rec in chunks.records(raw):
                out.setdefault(bytes(chunks.decode_record(rec)[4]), (i, off))
        return out

    def resend(self) -> None:
        """The writer sends again its publishes whose member lost the lead (or its process)
        before confirming them, to a member that leads now, as a router does
        (router/quorum.py); the leader stores only those its log does not hold."""
        leaders = [m for m in self.alive() if m.rep.is_leader and m.pending is None]
        lost = [q for q, (_, mid, term) in self.unanswered.items()
                if (x := self.by_id(mid)) is None or x.rep is None or not x.rep.is_leader
                or x.rep.raft.term != term]
        if not leaders or not lost:
            return
        m = self.rng.choice(leaders)
        held = self._held(m)
        store = []
        for q in sorted(lost)[:3]:
            body = self.unanswered[q][0]
            at = None if self.variant == NO_DEDUP else m.rep.find_publish("w", q)
            self.stats["resent"] += 1
            if at is None:
                if body in held:
                    self.fail("a publish sent again is stored once",
                              f"{m.id} did not find seq {q} ({body!r}); its log holds it "
                              f"at index {held[body][0]}")
                store.append(q)
                continue
            self.stats["resent_found"] += 1
            if held.get(body, (None,))[0] != at:
                self.fail("a publish sent again is stored once",
                          f"{m.id} found seq {q} ({body!r}) at index {at}; its log holds it "
                          f"at {held.get(body)}")
            self.unanswered[q] = (body, m.id, m.rep.raft.term)
            self.after.append([m.id, m.rep.raft.term, at, held[body][1], body])
            self.log(f"{m.id} finds seq {q} at index {at}")
        if store:
            self._propose(m, [self.unanswered[q][0] for q in store], {"w": ([], store)})
        else:
            self.drive(m)

    def deliver(self, any_order: bool) -> None:
        if not self.net:
            return
        k = self.rng.randrange(len(self.net)) if any_order else 0
        frm, to, raw = self.net[k]
        r = self.rng.random()
        if r < self.p_dup:
            pass                                    # kept: it arrives again later
        else:
            del self.net[k]
        if r >= self.p_dup and r < self.p_dup + self.p_drop:
            return
        m = self.by_id(to)
        cut = (membership.node_of(frm), membership.node_of(to)) in self.cut
        if m is not None and m.absent and not cut:
            msg = Message.from_wire(msgpack.unpackb(raw))
            if msg.type not in (APP, SNAP):
                return
            m.absent = False                # a leader replicates to it: a member anew
            if m.tomb is not None:
                m.dir.mkdir(parents=True, exist_ok=True)
                start_at(m.dir / "raft.state", HardState(m.tomb[0], m.tomb[1], 0))
            m.open()
            self.stats["rejoined"] += 1
            self.log(f"{m.id} joins again, empty")
        if m is None or m.rep is None or m.pending is not None or cut:
            if m is not None and m.pending is not None and not cut and m.rep is not None:
                self.net.append((frm, to, raw))     # busy: later
            return
        m.rep.step(Message.from_wire(msgpack.unpackb(raw)))
        self.drive(m)

    def tick(self, m: Member) -> None:
        if m.rep is not None and m.pending is None:
            m.rep.tick()
            if self.reconcile(m):
                return
            self.repair(m)
            self.drive(m)

    def reconcile(self, m: Member) -> bool:
        """node/streams/members.py ``reconcile`` with reconcile.py's ``action``: a member that no
        leader has replicated to for SILENT_TICKS goes if it holds nothing (no configuration
        yet), else asks the other voters it knows; each answers from its own configuration
        (a node without the stream: none; one down: no answer), and a majority saying it
        goes on without it drops it. True when dropped."""
        action = reconcile.action(m.rep.raft, m.rep.silent_ticks, m.rep.is_leader)
        if action is None:
            return False
        r = m.rep.raft
        if action == reconcile.DROP:              # made for a message, holding nothing
            self.stats["deleted"] += 1
            self.log(f"{m.id} reconciled: new, and no leader replicates to it")
            m.delete()
            return True
        answers = {}
        for v in r.voters:
            x = self.members.get(membership.node_of(v))
            if x is None or x is m:
                continue
            if x.absent or x.rep is not None:       # a node down does not answer
                answers[x.id] = reconcile.answer_for(None if x.absent else x.rep.raft, m.id)
        if not reconcile.gone_here(answers, r.voters, r.id,
                                   reconcile.removed_in_log(m.rep.conf_changes(), r.id)):
            return False
        self.stats["deleted"] += 1
        self.log(f"{m.id} reconciled: no longer a member")
        m.delete()
        return True

    def step(self, quiet: bool) -> None:
        rng = self.rng
        self.step_no += 1
        self.now += 1
        x = rng.random()
        ms = list(self.members.values())
        if not quiet and x < self.p_crash:
            m = rng.choice(ms)
            if m.rep is not None:
                self.log(f"crash {m.id}")
                self.stats["crashes"] += 1
                m.crash()
            return
        if not quiet and x < self.p_crash + self.p_part:
            if self.cut and rng.random() < 0.5:
                self.cut = set()
                self.log("heal")
            else:
                side = set(rng.sample([m.node for m in ms], rng.randint(1, len(ms) // 2)))
                self.cut = {(a.node, b.node) for a in ms for b in ms
                            if (a.node in side) != (b.node in side)}
                self.log(f"partition {sorted(side)}")
            return
        if not quiet and x < self.p_crash + self.p_part + self.p_wipe:
            present = [x for x in ms if not x.absent]
            # a majority of intact voters must remain: 3 members at least
            if self.variant == WIPE_KEEPS_ID or (len(present) >= 3 and self.settled()):
                m = rng.choice(present)
                old = m.id
                self.stats["wipes"] += 1
                m.wipe()
                self.log(f"wipe {old}: back empty as {m.id}")
            return
        if not quiet and x < self.p_crash + self.p_part + self.p_wipe + self.p_op:
            self.operate()
            return
        x = rng.random()
        if quiet:       # a calm network: messages arrive well within an election timeout
            x = x * 0.4 if rng.random() < 0.15 else 0.4 + x * 0.6
        if x < 0.03:
            for m in ms:
                if m.rep is None and not m.absent and (quiet or rng.random() < 0.3):
                    self.log(f"restart {m.id}")
                    m.open()
                    self.drive(m)
        elif x < 0.13:
            for m in ms:
                self.tick(m)
        elif x < 0.18:
            self.tick(rng.choice(ms))
        elif x < 0.26:
            pend = [m for m in ms if m.pending is not None]
            if pend:
                m = rng.choice(pend)
                self.complete(m)
                self.drive(m)
        elif x < 0.33:
            if not quiet or self.final_lost():
                self.publish(final=quiet)
        elif x < 0.345:
            self.roam()
        elif x < 0.36:
            if not quiet:       # quiet: nothing is stored after the final publish
                self.resend()
        elif x < 0.365 and self.retain_bytes is not None:
            m = rng.choice(ms)
            if m.rep is not None and m.pending is None:
                self.retain(m)
        else:
            self.deliver(any_order=not quiet and rng.random() < 0.3)

    def run(self, steps: int | None = None) -> dict:
        try:
            n = steps if steps is not None else self.rng.randint(500, 3000)
            for _ in range(n):
                self.step(quiet=False)
            self.cut = set()
            self.p_drop = self.p_dup = self.p_delay_sync = 0.0
            for m in self.members.values():
                if m.pending is not None:
                    self.complete(m)
                    self.drive(m)
            for _ in range(QUIET_STEPS):
                self.step(quiet=True)
                if self.done():
                    break
            else:
                self.fail("liveness", f"no final commit on every member after {QUIET_STEPS} "
                          f"quiet steps (final offset {self.final_offset})")
            self.check_end()
            return {"steps": self.step_no, "confirmed": len(self.confirmed),
                    "leaders": len(self.leaders), **self.stats}
        except Violation:
            raise
        except Exception as e:  # noqa: BLE001 - any exception is a finding
            import traceback
            self.fail("exception", "".join(traceback.format_exception(e))[-3000:])
        finally:
            self.disk.uninstall()
            for m in self.members.values():
                if m.rep is not None:
                    m.rep.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def final_lost(self) -> bool:
        """No final publish yet, or its leader lost the lead before it was confirmed (the
        publisher sends it again, as a client whose channel's confirms were lost does)."""
        if self.final_offset is None:
            return True
        if FINAL in self.confirmed.values():
            return False
        m = self.by_id(self.final_by[0])
        return m is None or m.rep is None or not m.rep.is_leader or m.rep.raft.term != self.final_by[1]

    def done(self) -> bool:
        if FINAL not in self.confirmed.values():
            return False
        # every confirmed offset (the final publish may be confirmed twice: sent again
        # after its leader lost the lead, and found stored at another offset or stored
        # again), as check_end reads them all (seed 5981: a learner caught up to the
        # first final and not yet the second was taken as done)
        last = max(self.confirmed)
        return all(m.rep is not None and m.rep.committed_offset > last
                   for m in self.members.values() if not m.absent)

    def check_end(self) -> None:
        for m in self.members.values():
            if m.absent:
                continue
            seg = m.rep.segments
            for off, body in self.confirmed.items():
                if off < seg.first_offset:
                    continue
                raw = seg.chunk_at(off)
                got = None
                if raw is not None:
                    for o, rec in chunks.records(raw):
                        if o == off:
                            got = bytes(chunks.decode_record(rec)[4])
                if got != body:
                    self.fail("no confirmed message lost",
                              f"{m.id} holds {got!r} at {off}, {body!r} was confirmed")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="the replicated stream simulator")
    p.add_argument("--schedules", type=int, default=200)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--replay", type=int, metavar="SEED")
    p.add_argument("--variant", choices=VARIANTS,
                   help="a deliberately unsafe host (the checker must catch it)")
    a = p.parse_args(argv)
    if a.replay is not None:
        sim = Sim(a.replay, trace=True, variant=a.variant)
        try:
            sim.run()
            ok = True
        except Violation as v:
            print("\n".join(sim.trace))
            print(v)
            ok = False
        else:
            print("\n".join(sim.trace))
        return 0 if ok else 1
    t0 = time.monotonic()
    bad = 0
    total: dict[str, int] = {}
    for seed in range(a.start, a.start + a.schedules):
        try:
            st = Sim(seed, variant=a.variant).run()
            for k, v in st.items():
                total[k] = total.get(k, 0) + v
        except Violation as v:
            bad += 1
            print(f"VIOLATION {v}", flush=True)
    print(f"{a.schedules} schedules, {bad} violations, "
          + ", ".join(f"{v} {k}" for k, v in total.items())
          + f", {time.monotonic() - t0:.1f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
