"""A replicated stream's member (node/streams/replica.py) driven by hand: publishes confirmed
at commit, a restart that keeps the log, its commit and its configuration, a member that
joins after retention and gets the log from the leader's segments, the hard state file's
torn-write rule, a membership change that a crash does not make a member forget, and a
member removed and added again that stays. The simulator (stream_sim.py, test_stream_sim.py) covers faults."""
from __future__ import annotations

import os
import random
import shutil
import struct
from pathlib import Path

import msgpack

from shoal.node.replication.log import ADD_LEARNER, ADD_VOTER, REMOVE
from shoal.node.replication.messages import HardState, Message
from shoal.node.streams import chunk as chunks
from shoal.node.streams.raftstate import SLOT, HardStateFile
from shoal.node.streams.replica import StreamReplica
from shoal.node.streams.stream import StreamReader


def rec(body: bytes) -> bytes:
    return chunks.encode_record("", "s", b"", body)


class Cluster:
    """Members with a perfect network: every Ready written, synced, sent and finished."""

    def __init__(self, tmp_path, ids, **kw):
        self.tmp = tmp_path
        self.kw = kw
        self.m = {i: StreamReplica(i, tmp_path / i, voters=list(ids), header=["/", "s", {}],
                                   rng=random.Random(i), election_ticks=3, **kw)
                  for i in ids}
        self.net: list[bytes] = []
        self.confirmed: dict[str, list[int]] = {i: [] for i in ids}

    def join(self, mid):
        self.m[mid] = StreamReplica(mid, self.tmp / mid, rng=random.Random(mid),
                                    election_ticks=3, **self.kw)
        self.confirmed[mid] = []

    def drive(self):
        for _ in range(10_000):
            busy = False
            for mid, r in self.m.items():
                while r.has_ready():
                    busy = True
                    rd = r.write()
                    r.sync()
                    self.net += [msgpack.packb(x.to_wire()) for x in rd.messages]
                    self.confirmed[mid] += r.finish(rd)
            while self.net:
                busy = True
                msg = Message.from_wire(msgpack.unpackb(self.net.pop(0)))
                if msg.to in self.m:
                    self.m[msg.to].step(msg)
            if not busy:
                return
        raise AssertionError("the cluster never settled")

    def elect(self, mid):
        self.m[mid].raft.campaign()
        self.drive()
        assert self.m[mid].is_leader

    def tick(self, n=1):
        for _ in range(n):
            for r in self.m.values():
                r.tick()
            self.drive()


def bodies(r: StreamReplica, offset: int = 0) -> list[bytes]:
    return [bytes(m.body) for m in StreamReader(r.segments, offset).read(10_000,
                                                                         r.committed_offset)]


def test_publishes_are_confirmed_at_commit_and_every_member_holds_the_same_log(tmp_path):
    c = Cluster(tmp_path, ["a", "b", "c"])
    c.elect("a")
    index, first = c.m["a"].publish([rec(b"one"), rec(b"two")], 1000)
    assert first == 0                   # the new leader's entry (a CONTROL chunk) takes none
    assert c.m["b"].publish([rec(b"x")], 1000) is None      # not the leader
    c.drive()
    assert c.confirmed["a"] == [index]
    c.tick(2)                           # heartbeats carry the commit to the followers
    for r in c.m.values():
        assert bodies(r) == [b"one", b"two"]
        assert r.committed_offset == 2
        assert r.segments.chunk_at(0) == c.m["a"].segments.chunk_at(0)
        assert r.segments.last_chunk_id == 0        # `last`: the last USER chunk


def test_a_restarted_member_keeps_its_log_commit_and_members(tmp_path):
    c = Cluster(tmp_path, ["a", "b", "c"])
    c.elect("a")
    for k in range(5):
        c.m["a"].publish([rec(b"m%d" % k)], 1000 + k)
        c.drive()
    c.tick(2)                           # heartbeats carry the commit to the followers
    b = c.m["b"]
    before = (b.committed_offset, b.raft.log.committed, sorted(b.raft.voters))
    b.close()
    again = StreamReplica("b", tmp_path / "b", rng=random.Random(1), election_ticks=3)
    assert (again.committed_offset, again.raft.log.committed,
            sorted(again.raft.voters)) == before
    assert bodies(again) == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert again.raft.log.entries == []     # the log is read back from the segments


def test_a_member_that_joins_after_retention_starts_at_the_leaders_first_offset(tmp_path):
    c = Cluster(tmp_path, ["a", "b", "c"], max_segment_chunks=2)
    c.elect("a")
    for k in range(10):
        c.m["a"].publish([rec(b"m%d" % k)], 1000 + k)
        c.drive()
    a = c.m["a"]
    assert a.retain(1, None, 2000) > 0      # every whole segment but the one written
    start = a.segments.first_offset
    assert start > 0 and a.base["index"] > 1
    c.join("d")
    assert a.raft.propose_conf(ADD_VOTER, "d") is not None
    c.drive()
    c.tick(3)
    d = c.m["d"]
    assert d.segments.first_offset == start
    assert d.base["index"] == a.base["index"]
    assert sorted(d.raft.voters) == ["a", "b", "c", "d"]
    assert bodies(d, start) == bodies(a, start)
    # the learner's copy is the leader's, chunk for chunk
    off = start
    while off < a.committed_offset:
        assert d.segments.chunk_at(off) == a.segments.chunk_at(off)
        off = chunks.ChunkHeader(a.segments.chunk_at(off)).next_offset


def test_the_hard_state_survives_a_torn_write_of_its_newest_slot(tmp_path):
    f = HardStateFile(tmp_path / "raft.state")
    f.write(HardState(3, "a", 10))
    f.sync()
    f.write(HardState(4, "b", 12))
    f.sync()
    f.close()
    raw = bytearray((tmp_path / "raft.state").read_bytes())
    seqs = [struct.unpack(">Q", raw[k * SLOT:k * SLOT + 8])[0] for k in range(2)]
    newest = seqs.index(max(seqs))
    raw[newest * SLOT + 20] ^= 0xFF          # torn: its CRC no longer matches
    (tmp_path / "raft.state").write_bytes(bytes(raw))
    assert HardStateFile(tmp_path / "raft.state").state == HardState(3, "a", 10)


def test_a_publish_is_found_in_the_log_by_its_writer_and_sequence(tmp_path):
    """replica.py ``find_publish``, as a new leader asks before it stores a publish sent
    again: found in memory or in the segments' files, on every member (the trailer is
    replicated with the chunk); the look back stops at a first send of the same writer
    below the one looked for (a router sends its publish ids in order)."""
    c = Cluster(tmp_path, ["a", "b", "c"], max_segment_chunks=2)
    c.elect("a")
    a = c.m["a"]
    t = chunks.encode_trailer
    a.publish([rec(b"w")], 999, trailer=t({"r1": ([1], []), "r4": ([9], [])}))
    a.publish([rec(b"x"), rec(b"y")], 1000, trailer=t({"r1": ([5, 6], []), "r2": ([3], [])}))
    a.publish([rec(b"z")], 1001, trailer=t({"r1": ([], [2])}))
    index = a.raft.log.last_index
    assert a.find_publish("r1", 2) == index             # not yet written: in memory
    c.drive()
    for k in range(4):                                  # more chunks, other writers
        a.publish([rec(b"o%d" % k)], 1002 + k, trailer=t({"r3": ([10 + k], []),
                                                         "r4": ([5], [])}))
        c.drive()
    c.tick(2)
    for r in c.m.values():                              # read back from the files
        assert not r.raft.log.entries or r.raft.log.entries[0].index > index
        assert r.find_publish("r1", 6) == index - 1
        assert r.find_publish("r1", 2) == index         # sent again, and stored then
        assert r.find_publish("r1", 1) == index - 2     # past r1's 5 and 6: they are above
        assert r.find_publish("r2", 3) == index - 1
        assert r.find_publish("r1", 7) is None          # r1's 5 and 6 came before it
        assert r.find_publish("r9", 5) is None          # another writer
        # out of order (r4's 9, then its 5): the look stops at the 5, and a 9 sent again
        # would be stored twice, never lost
        assert r.find_publish("r4", 9) is None


def test_a_membership_change_applied_survives_a_crash_that_loses_unsynced_writes(
        tmp_path, monkeypatch):
    """The commit index is written without a sync (raftstate.py), and a restart takes the
    configuration at the commit index on disk: the one that covers a membership change is
    synced before the change is applied. Otherwise a member restarted after a crash could
    name voters whose disks were wiped since, and never elect again (stream_sim.py)."""
    synced: dict[str, bytes] = {}
    real = os.fdatasync

    def fdatasync(fd):
        real(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith("raft.state"):
            synced[path] = Path(path).read_bytes()      # what a crash keeps
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    c = Cluster(tmp_path, ["a", "b", "c"])
    c.elect("a")
    c.join("d")
    assert c.m["a"].raft.propose_conf(ADD_LEARNER, "d") is not None
    c.drive()
    c.tick(2)                           # heartbeats carry the commit to the followers
    b = c.m["b"]
    assert sorted(b.raft.learners) == ["d"]
    b.close()
    state = tmp_path / "b" / "raft.state"
    state.write_bytes(synced[str(state)])       # the crash: unsynced writes lost
    again = StreamReplica("b", tmp_path / "b", rng=random.Random(1), election_ticks=3)
    assert sorted(again.raft.voters) == ["a", "b", "c"]
    assert sorted(again.raft.learners) == ["d"]


def test_a_member_removed_and_added_again_replays_its_old_removal_and_stays(tmp_path):
    """delete_member, then add_member, of the same node: the member made again (empty, the
    same id) applies the log's old removal of itself as it catches up, and stays. A second
    removal, with no add after it in the log, is the one the leader tells it of."""
    c = Cluster(tmp_path, ["a", "b", "c"])
    c.elect("a")
    a = c.m["a"]
    for k in range(3):
        a.publish([rec(b"m%d" % k)], 1000 + k)
        c.drive()
    assert a.raft.propose_conf(REMOVE, "c") is not None
    c.drive()
    c.tick(2)
    assert "c" not in a.raft.voters and a.dropped == ["c"]
    a.dropped.clear()
    gone = c.m.pop("c")                 # the host drops it (STREAM_DELETE)
    gone.close()
    shutil.rmtree(tmp_path / "c")
    a.publish([rec(b"m3")], 1003)
    c.drive()
    c.join("c")                         # add_member: the node makes it again on the APP
    assert a.raft.propose_conf(ADD_LEARNER, "c") is not None
    c.drive()
    c.tick(5)
    again = c.m["c"]
    assert "c" in again.raft.learners and again.silent_ticks == 0
    assert bodies(again) == [b"m0", b"m1", b"m2", b"m3"]
    assert a.dropped == []
    assert a.raft.propose_conf(REMOVE, "c") is not None
    c.drive()
    assert a.dropped == ["c"]
