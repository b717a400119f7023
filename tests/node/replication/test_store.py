"""The Raft log on disk (node/replication/store.py): what is synced comes back after a
restart; a torn tail (a crash in the middle of a write) is cut off at the last whole record;
a snapshot from the leader replaces the log, a compaction keeps what follows it; a rewrite
keeps the state; the disk id survives a restart and changes with a new directory."""
from __future__ import annotations

from shoal.node.replication.log import Entry, Snapshot
from shoal.node.replication.raft import HardState
from shoal.node.replication.store import RaftStore

K = ("/", "q")


def ents(*pairs):
    return [Entry(t, i, 0, ["enq", i]).to_wire() for t, i in pairs]


def test_what_was_synced_comes_back(tmp_path):
    s = RaftStore(tmp_path)
    s.load()
    s.append(K, "u1", "snap", Snapshot(1, 1, ("a", "b", "c"), (), {"queue": 1}).to_wire())
    s.append(K, "u1", "ents", ents((1, 2), (1, 3), (1, 4)))
    s.append(K, "u1", "hs", [2, "a", 3])
    s.sync()
    s.append(K, "u1", "ents", ents((2, 4), (2, 5)))     # cuts 4 of term 1
    s.sync()
    s.close()
    g = RaftStore(tmp_path).load()[K]
    assert g.uid == "u1" and g.hard_state == HardState(2, "a", 3)
    assert g.snapshot.voters == ("a", "b", "c")
    assert [(e.term, e.index) for e in g.entries] == [(1, 2), (1, 3), (2, 4), (2, 5)]


def test_a_torn_tail_is_cut_at_the_last_whole_record(tmp_path):
    s = RaftStore(tmp_path)
    s.load()
    s.append(K, "u1", "ents", ents((1, 2)))
    s.sync()
    s.append(K, "u1", "ents", ents((1, 3)))
    s.sync()
    s.close()
    path = tmp_path / "raft.log"
    data = path.read_bytes()
    path.write_bytes(data[:-3])
    s2 = RaftStore(tmp_path)
    assert [e.index for e in s2.load()[K].entries] == [2]
    s2.append(K, "u1", "ents", ents((1, 3)))
    s2.sync()
    s2.close()
    assert [e.index for e in RaftStore(tmp_path).load()[K].entries] == [2, 3]


def test_a_leaders_snapshot_replaces_the_log_a_compaction_keeps_the_rest(tmp_path):
    s = RaftStore(tmp_path)
    s.load()
    s.append(K, "u1", "ents", ents((1, 2), (1, 3), (1, 4)))
    s.append(K, "u1", "compact", Snapshot(3, 1, ("a",), (), {}).to_wire())
    s.sync()
    assert [e.index for e in RaftStore(tmp_path).load()[K].entries] == [4]
    s.append(K, "u1", "snap", Snapshot(9, 3, ("a",), (), {}).to_wire())
    s.sync()
    g = RaftStore(tmp_path).load()[K]
    assert g.entries == [] and g.snapshot.index == 9


def test_a_deleted_group_stays_deleted_and_a_new_uid_starts_afresh(tmp_path):
    s = RaftStore(tmp_path)
    s.load()
    s.append(K, "u1", "ents", ents((1, 2)))
    s.append(K, "u1", "del", None)
    s.sync()
    assert RaftStore(tmp_path).load() == {}
    s.append(K, "u2", "ents", ents((1, 2)))
    s.sync()
    assert RaftStore(tmp_path).load()[K].uid == "u2"


def test_a_rewrite_keeps_each_groups_state(tmp_path):
    s = RaftStore(tmp_path)
    s.load()
    snap = Snapshot(3, 1, ("a",), (), {"m": [1]})
    entries = [Entry.from_wire(w) for w in ents((1, 4), (2, 5))]
    s.rewrite([(K, "u1", HardState(2, None, 5), snap, entries)])
    s.append(K, "u1", "ents", ents((2, 6)))
    s.sync()
    s.close()
    g = RaftStore(tmp_path).load()[K]
    assert g.snapshot.data == {"m": [1]} and [e.index for e in g.entries] == [4, 5, 6]
    assert g.hard_state.commit == 5


def test_a_dropped_members_term_and_vote_outlive_restarts_and_rewrites(tmp_path):
    """The tombstone of a member dropped by the reconciliation (its last term and vote) comes
    back after a restart and a rewrite, and a rewrite leaves it out once the group is live
    again under the same uid."""
    s = RaftStore(tmp_path)
    s.load()
    s.append(K, "u1", "ents", ents((1, 2)))
    s.append(K, "u1", "del", [4, "n1@a"])
    s.sync()
    s.close()
    s = RaftStore(tmp_path)
    assert s.load() == {} and s.tombstones == {(K, "u1"): (4, "n1@a")}
    s.rewrite([])
    s.close()
    s = RaftStore(tmp_path)
    assert s.load() == {} and s.tombstones == {(K, "u1"): (4, "n1@a")}
    s.rewrite([(K, "u1", HardState(5, "n1@a", 0), None, [])])     # added back
    s.close()
    s = RaftStore(tmp_path)
    assert s.load()[K].hard_state.term == 5 and s.tombstones == {}


def test_the_disk_id_lasts_as_long_as_the_directory(tmp_path):
    a = RaftStore(tmp_path / "d").disk_id
    assert RaftStore(tmp_path / "d").disk_id == a
    assert RaftStore(tmp_path / "other").disk_id != a
