"""Replicated streams over three sans-IO nodes in one process (node/streams/members.py), on
the quorum queues' in-memory cluster (tests/node/replication/test_quorum_nodes.py): what a
router sees of a stream with several members.

Declare-ok once a leader is elected; PUBLISH_RESULT only once the chunk is committed;
PUBLISH_MOVED and EV_QUEUE_LEADER from a member that does not lead, MOVED for its consumers;
every member holds the same chunks; after the leader's node is lost a new leader serves
every confirmed message; a restarted member keeps its log; a delete reaches every member.
"""
from __future__ import annotations

import pytest

from shoal.shared.wire import EV_QUEUE_LEADER, MOVED, T

from shoal.node.replication.messages import Message
from shoal.node.replication.raft import APP, VOTE, VOTE_RESP

from tests.node.replication.test_quorum_nodes import Cluster

STREAM = {"x-queue-type": "stream", "x-initial-cluster-size": 3}
#: basic's content header: body size 1, delivery-mode 2
HEADER = bytes([0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0x10, 0, 2])


@pytest.fixture
def c(tmp_path):
    """Three nodes in one process (tests/node/replication/test_quorum_nodes.py), their
    streams closed at the end."""
    cluster = Cluster(tmp_path)
    yield cluster
    for shard in cluster.shards.values():
        shard.streams.close()


def stream_leader(c: Cluster, name: str = "s") -> str:
    for _ in range(100):
        led = [n for n, s in c.shards.items() if n not in c.down and
               ("/", name) in s.streams.streams and
               s.streams.streams[("/", name)].replica.leading]
        if led:
            return led[0]
        c.tick()
    raise AssertionError("no leader")


def publish(c: Cluster, node: str, seq: int, body: bytes) -> None:
    """A confirmed PUBLISH to stream ``s`` at ``node``, its turn ended (the chunk proposed),
    and the cluster run until quiet."""
    c.send(node, T.PUBLISH, seq, "/", ["s"], "", "s", HEADER, body, None)
    c.shards[node].streams.commit(None)
    c.pump()


def consume_all(c: Cluster, node: str, cid: int, offset="first") -> list[tuple[int, bytes]]:
    """A consumer at ``node`` from ``offset``, with credit for everything: (offset, body)."""
    r = c.request(node, T.CONSUME, cid, "/", "s", f"tag{cid}", 0, 0,
                  {"x-stream-offset": offset}, None, [100, 0])
    assert r[2] == 0, r
    c.send(node, T.CREDIT, cid, 100, 0)
    c.pump()
    got = []
    for m in c.take(node, T.DELIVER):
        # [T, cid, delivery id, redelivered, exchange, routing key, header, body]
        off = int.from_bytes(m[6][m[6].rfind(b"x-stream-offsetl") + 16:][:8], "big")
        got.append((off, m[7]))
    return got


def test_a_stream_of_three_members_confirms_at_commit_and_moves_to_its_leader(c):
    r = c.request("node-0", T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, STREAM, None)
    assert r[2] == 0 and r[4] == ["s", 0, 0]
    leader = stream_leader(c)
    rows = {n: c.shards[n].streams.streams[("/", "s")] for n in c.ids}
    assert all(sorted(s.replica.members()) == c.ids for s in rows.values())
    publish(c, leader, 5, b"a")
    assert c.take(leader, T.PUBLISH_RESULT) == [[T.PUBLISH_RESULT, 5, 0, 1]]
    follower = next(n for n in c.ids if n != leader)
    c.inbox[follower].clear()
    c.send(follower, T.PUBLISH, 6, "/", ["s"], "", "s", HEADER, b"b", None)
    assert c.take(follower, T.PUBLISH_MOVED) == [[T.PUBLISH_MOVED, 6, 0, 0, ["s"]]]
    events = [m for m in c.inbox[follower] if m[0] == T.TOPOLOGY_EVENT]
    assert events and events[0][1] == EV_QUEUE_LEADER and events[0][2][2] == leader
    c.tick(3)                       # heartbeats carry the commit to the followers
    chunk = rows[leader].log.chunk_at(0)
    assert all(s.log.chunk_at(0) == chunk for s in rows.values())
    assert consume_all(c, leader, 2) == [(0, b"a")]
    assert consume_all(c, follower, 1) == [(0, b"a")]      # a member that does not lead


def test_a_member_that_does_not_lead_serves_its_consumers_up_to_its_commit(c):
    c.request("node-0", T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, STREAM, None)
    leader = stream_leader(c)
    follower = next(n for n in c.ids if n != leader)
    assert consume_all(c, follower, 1) == []
    # the follower delivers a chunk only once it learns that it is committed (a new leader
    # could cut what is not)
    c.send(leader, T.PUBLISH, 5, "/", ["s"], "", "s", HEADER, b"a", None)
    c.shards[leader].streams.commit(None)
    c.pump()
    assert c.take(leader, T.PUBLISH_RESULT) == [[T.PUBLISH_RESULT, 5, 0, 1]]
    c.tick(3)
    got = c.take(follower, T.DELIVER)
    assert [m[7] for m in got] == [b"a"]
    assert c.shards[follower].streams.streams[("/", "s")].committed == 1


def test_a_numeric_offset_past_a_members_end_is_for_the_leader(c):
    """A member that does not lead may be behind: a consumer coming back at the offset after
    its last delivery must not start at that member's end, before what it read. It answers
    MOVED (the router goes to the leader); the leader starts it at the log's end."""
    c.request("node-0", T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, STREAM, None)
    leader = stream_leader(c)
    follower = next(n for n in c.ids if n != leader)
    publish(c, leader, 1, b"m0")
    c.tick(3)
    ahead = {"x-stream-offset": 5}
    r = c.request(follower, T.CONSUME, 1, "/", "s", "t", 0, 0, ahead, None, [10, 0])
    assert r[2] == MOVED
    r = c.request(follower, T.CONSUME, 2, "/", "s", "t", 0, 0, {"x-stream-offset": 1}, None,
                  [10, 0])
    assert r[2] == 0                    # its end: served there
    r = c.request(leader, T.CONSUME, 3, "/", "s", "t", 0, 0, ahead, None, [10, 0])
    assert r[2] == 0
    c.send(leader, T.CREDIT, 3, 10, 0)
    publish(c, leader, 2, b"m1")
    c.tick(3)
    got = [m for m in c.take(leader, T.DELIVER) if m[1] == 3]
    assert [m[7] for m in got] == [b"m1"]


def test_consumers_stay_with_their_member_across_a_leader_change(c):
    """A consumer at the leader and one at another member both go on reading, without a gap
    or a repeat, when the lead moves (RabbitMQ's readers stay with their member)."""
    c.request("node-0", T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, STREAM, None)
    leader = stream_leader(c)
    follower = next(n for n in c.ids if n != leader)
    publish(c, leader, 1, b"m0")
    c.tick(3)
    assert consume_all(c, leader, 1) == [(0, b"m0")]
    assert consume_all(c, follower, 2) == [(0, b"m0")]
    r = c.request(leader, T.QUORUM_OP, "transfer", "/", "s", follower)
    assert r[2] == 0, r
    for _ in range(40):             # the old leader learns it no longer leads
        if not c.shards[leader].streams.streams[("/", "s")].replica.leading and \
                c.shards[follower].streams.streams[("/", "s")].replica.leading:
            break
        c.tick()
    assert stream_leader(c) == follower
    c.take(leader, T.DELIVER)
    c.take(follower, T.DELIVER)
    publish(c, follower, 2, b"m1")
    c.tick(3)
    for node, cid in ((leader, 1), (follower, 2)):
        got = [m for m in c.take(node, T.DELIVER) if m[1] == cid]
        assert [m[7] for m in got] == [b"m1"], node
    assert all(s.streams.consumer(b"router", cid) is not None
               for s, cid in ((c.shards[leader], 1), (c.shards[follower], 2)))


def test_the_leader_lists_the_consumers_of_every_member(c):
    """Management asks the leader: the other members report their readers to it
    (STREAM_READERS), each listed at the member it reads from."""
    c.request("node-0", T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, STREAM, None)
    leader = stream_leader(c)
    publish(c, leader, 1, b"m0")
    publish(c, leader, 2, b"m1")
    c.tick(3)
    others = [n for n in c.ids if n != leader]
    consume_all(c, others[0], 7)
    r = c.request(others[1], T.CONSUME, 8, "/", "s", "lagging", 0, 0,
                  {"x-stream-offset": "first"}, None, [100, 0])
    assert r[2] == 0
    c.tick(10)                      # one report each (readers.py REPORT_TICKS)
    rows = c.shards[leader].streams.streams[("/", "s")].describe()["stream_consumers"]
    assert sorted(rows) == sorted([["tag7", 2, 0, others[0]], ["lagging", 0, 2, others[1]]])
    # a reader that goes is dropped from the next report
    c.send(others[0], T.CANCEL, 0, 7)
    c.tick(10)
    rows = c.shards[leader].streams.streams[("/", "s")].describe()["stream_consumers"]
    assert rows == [["lagging", 0, 2, others[1]]]


def test_after_the_leaders_node_is_lost_a_new_leader_serves_every_confirmed_message(c):
    c.request("node-0", T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, STREAM, None)
    leader = stream_leader(c)
    for k in range(5):
        publish(c, leader, 10 + k, b"m%d" % k)
    assert len(c.take(leader, T.PUBLISH_RESULT)) == 5
    c.crash(leader)
    new = stream_leader(c)
    assert new != leader
    publish(c, new, 20, b"after")
    assert c.take(new, T.PUBLISH_RESULT) == [[T.PUBLISH_RESULT, 20, 0, 1]]
    assert [b for _, b in consume_all(c, new, 3)] == \
        [b"m0", b"m1", b"m2", b"m3", b"m4", b"after"]
    # the old leader's node comes back from its disk and catches up
    c.start(leader)
    c.tick(5)
    back = c.shards[leader].streams.streams[("/", "s")]
    assert back.committed == c.shards[new].streams.streams[("/", "s")].committed


def test_a_delete_reaches_every_member(c):
    c.request("node-0", T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, STREAM, None)
    leader = stream_leader(c)
    assert c.request(leader, T.QUEUE_DELETE, "/", "s", 0, 0, None)[2] == 0
    c.pump()
    assert all(("/", "s") not in s.streams.streams for s in c.shards.values())
    # nothing is kept of a stream deleted whole (no member of it is ever made again)
    assert all(not s.replication.store.tombstones for s in c.shards.values())


def test_add_and_delete_member_change_the_members_and_a_new_one_gets_the_log(c):
    two = {**STREAM, "x-initial-cluster-size": 2}
    c.request("node-0", T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, two, None)
    leader = stream_leader(c)
    for k in range(3):
        publish(c, leader, 30 + k, b"m%d" % k)
    s = c.shards[leader].streams.streams[("/", "s")]
    outside = next(n for n in c.ids if n not in s.replica.members())
    r = c.request(leader, T.QUORUM_OP, "add_member", "/", "s", outside)
    assert r[2] == 0 and r[4] == c.ids
    for _ in range(40):
        if len(s.replica.members()) == 3:
            break
        c.tick()
    assert s.replica.members() == c.ids
    joined = c.shards[outside].streams.streams[("/", "s")]
    assert joined.arguments == two          # learned from the leader's snapshot
    c.tick(3)
    assert joined.log.chunk_at(0) == s.log.chunk_at(0)
    assert joined.committed == s.committed == 3
    # delete a member that is not the leader: its node drops the stream
    gone = next(n for n in c.ids if n not in (leader, outside))
    r = c.request(leader, T.QUORUM_OP, "delete_member", "/", "s", gone)
    assert r[2] == 0 and gone not in r[4]
    for _ in range(40):
        if ("/", "s") not in c.shards[gone].streams.streams:
            break
        c.tick()
    assert ("/", "s") not in c.shards[gone].streams.streams
    assert gone not in s.replica.members()
    # down to one member, and the last one cannot go (406, as RabbitMQ's
    # last_stream_member)
    r = c.request(leader, T.QUORUM_OP, "delete_member", "/", "s", outside)
    assert r[2] == 0 and r[4] == [leader]
    for _ in range(40):
        if s.replica.members() == [leader]:
            break
        c.tick()
    assert s.replica.members() == [leader]
    r = c.request(leader, T.QUORUM_OP, "delete_member", "/", "s", leader)
    assert r[2] == 406 and "last member" in r[3]
    publish(c, leader, 40, b"alone")
    assert c.take(leader, T.PUBLISH_RESULT)[-1] == [T.PUBLISH_RESULT, 40, 0, 1]


def test_a_stream_of_one_member_on_a_cluster_is_replicated_and_gets_members(c):
    """``x-initial-cluster-size: 1`` on a node with others: one member, through Raft, so
    that add_member grows it (RabbitMQ's add_replica works on a stream of one replica)."""
    one = {**STREAM, "x-initial-cluster-size": 1}
    r = c.request("node-1", T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, one, None)
    assert r[2] == 0
    s = c.shards["node-1"].streams.streams[("/", "s")]
    assert s.replica is not None and s.replica.members() == ["node-1"]
    assert all(("/", "s") not in c.shards[n].streams.streams for n in ("node-0", "node-2"))
    publish(c, "node-1", 1, b"m0")
    assert c.take("node-1", T.PUBLISH_RESULT) == [[T.PUBLISH_RESULT, 1, 0, 1]]
    r = c.request("node-1", T.QUORUM_OP, "add_member", "/", "s", "node-2")
    assert r[2] == 0 and r[4] == ["node-1", "node-2"]
    for _ in range(40):
        if s.replica.members() == ["node-1", "node-2"]:
            break
        c.tick()
    assert s.replica.members() == ["node-1", "node-2"]
    c.tick(3)
    assert consume_all(c, "node-2", 4) == [(0, b"m0")]


def test_deleting_the_leaders_member_hands_the_lead_over_first(c):
    c.request("node-0", T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, STREAM, None)
    leader = stream_leader(c)
    publish(c, leader, 50, b"kept")
    r = c.request(leader, T.QUORUM_OP, "delete_member", "/", "s", leader)
    assert r[2] == 0 and leader not in r[4]
    for _ in range(60):
        if ("/", "s") not in c.shards[leader].streams.streams:
            break
        c.tick()
    assert ("/", "s") not in c.shards[leader].streams.streams
    new = stream_leader(c)
    assert new != leader
    assert c.shards[new].streams.streams[("/", "s")].replica.members() == \
        sorted(n for n in c.ids if n != leader)
    assert [b for _, b in consume_all(c, new, 9)] == [b"kept"]


def test_a_member_whose_disk_was_wiped_comes_back_under_a_new_id_with_the_log(c):
    import shutil
    c.request("node-0", T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, STREAM, None)
    leader = stream_leader(c)
    for k in range(3):
        publish(c, leader, 60 + k, b"w%d" % k)
    victim = next(n for n in c.ids if n != leader)
    old_id = c.shards[victim].replication.member_id
    c.crash(victim)
    shutil.rmtree(c.tmp / victim)
    c.start(victim)
    new_id = c.shards[victim].replication.member_id
    assert new_id != old_id
    s = c.shards[leader].streams.streams[("/", "s")]
    for _ in range(80):
        voters = s.rep.raft.voters
        if new_id in voters and old_id not in voters:
            break
        c.tick()
    assert new_id in s.rep.raft.voters and old_id not in s.rep.raft.voters
    back = c.shards[victim].streams.streams[("/", "s")]
    c.tick(3)
    assert back.committed == s.committed == 3
    assert back.log.chunk_at(0) == s.log.chunk_at(0)


def test_a_member_down_while_its_stream_was_deleted_drops_it_when_it_is_back(c):
    """As a quorum queue's (node/replication/reconcile.py): without a leader for 10 s it asks
    the other members' nodes, and a majority says the stream is gone."""
    c.request("node-0", T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, STREAM, None)
    leader = stream_leader(c)
    down = next(n for n in c.ids if n != leader)
    c.crash(down)
    assert c.request(leader, T.QUEUE_DELETE, "/", "s", 0, 0, None)[2] == 0
    c.start(down)
    assert ("/", "s") in c.shards[down].streams.streams     # its member, from its disk
    for _ in range(150):
        if ("/", "s") not in c.shards[down].streams.streams:
            break
        c.tick()
    assert ("/", "s") not in c.shards[down].streams.streams
    assert not list((c.tmp / down / "streams").iterdir())   # its files went too


def resend(c: Cluster, node: str, pid: int, first: int, body: bytes) -> None:
    """A PUBLISH sent again (router/quorum.py ``_resend``): a new negative id, and the
    publish's first id, which names it in the chunks' trailers with the router's id."""
    c.send(node, T.PUBLISH, pid, "/", ["s"], "", "s", HEADER, body, None, first)
    c.shards[node].streams.commit(None)
    c.pump()


def test_a_publish_sent_again_to_a_new_leader_is_stored_once(c):
    """The router resends a publish whose answer was lost with the leader's node; the new
    leader finds it in its log (committed before the loss) and does not store it again, as
    Osiris deduplicates a writer's sequence. One it does not find is stored."""
    c.request("node-0", T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, STREAM, None)
    leader = stream_leader(c)
    publish(c, leader, 10, b"a")
    publish(c, leader, 11, b"b")
    assert len(c.take(leader, T.PUBLISH_RESULT)) == 2
    c.crash(leader)                     # as if 11's answer were lost with it
    new = stream_leader(c)
    resend(c, new, -1, 11, b"b")
    resend(c, new, -2, 12, b"c")        # never reached a node
    assert c.take(new, T.PUBLISH_RESULT) == [[T.PUBLISH_RESULT, -1, 0, 1],
                                             [T.PUBLISH_RESULT, -2, 0, 1]]
    assert [b for _, b in consume_all(c, new, 3)] == [b"a", b"b", b"c"]


def test_a_publish_sent_again_found_in_a_chunk_not_yet_committed_waits_for_it(c):
    c.request("node-0", T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, STREAM, None)
    leader = stream_leader(c)
    shard = c.shards[leader]
    shard.handle(b"router", [T.PUBLISH, 10, "/", ["s"], "", "s", HEADER, b"a", None], c.now)
    shard.streams.commit(None)          # proposed, not committed: no pump yet
    shard.handle(b"router", [T.PUBLISH, -1, "/", ["s"], "", "s", HEADER, b"a", None, 10],
                 c.now)
    shard.streams.commit(None)
    assert c.take(leader, T.PUBLISH_RESULT) == []
    c.pump()
    assert sorted(c.take(leader, T.PUBLISH_RESULT)) == [[T.PUBLISH_RESULT, -1, 0, 1],
                                                        [T.PUBLISH_RESULT, 10, 0, 1]]
    assert [b for _, b in consume_all(c, leader, 3)] == [b"a"]


def test_a_stream_of_one_member_keeps_a_publish_sent_again_after_a_restart_once(c):
    """x-initial-cluster-size 1 on a cluster: Raft with one voter. Its node is killed after
    the chunk is on disk but before the answer left; back from its disk, it leads again and
    the router's resend is found there."""
    one = {**STREAM, "x-initial-cluster-size": 1}
    c.request("node-1", T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, one, None)
    publish(c, "node-1", 7, b"kept")
    assert c.take("node-1", T.PUBLISH_RESULT) == [[T.PUBLISH_RESULT, 7, 0, 1]]
    c.crash("node-1")
    c.start("node-1")
    assert stream_leader(c) == "node-1"
    resend(c, "node-1", -1, 7, b"kept")
    assert c.take("node-1", T.PUBLISH_RESULT) == [[T.PUBLISH_RESULT, -1, 0, 1]]
    assert consume_all(c, "node-1", 2) == [(0, b"kept")]


def test_a_member_made_for_a_late_message_holds_nothing_and_goes(c):
    """A leader's append that reaches a node after the node's member was deleted (a late
    message of a leader that had not applied the removal yet) makes the member again,
    empty. No leader replicates to it after that, so after 10 s without a leader's message
    it goes, though it knows no voters to ask (members.py ``reconcile``)."""
    c.request("node-0", T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, STREAM, None)
    leader = stream_leader(c)
    gone = next(n for n in c.ids if n != leader)
    r = c.request(leader, T.QUORUM_OP, "delete_member", "/", "s", gone)
    assert r[2] == 0
    for _ in range(40):
        if ("/", "s") not in c.shards[gone].streams.streams:
            break
        c.tick()
    assert ("/", "s") not in c.shards[gone].streams.streams
    m = c.shards[leader].streams.streams[("/", "s")].replica
    late = Message(APP, m.rep.raft.id, c.shards[gone].replication.member_id, m.rep.raft.term)
    c.shards[gone].handle(f"peer:{leader}".encode(),
                          [T.STREAM_RAFT, "/", "s", m.uid, late.to_wire()], c.now)
    assert ("/", "s") in c.shards[gone].streams.streams     # made again, empty
    for _ in range(150):
        if ("/", "s") not in c.shards[gone].streams.streams:
            break
        c.tick()
    assert ("/", "s") not in c.shards[gone].streams.streams
    assert m.members() == sorted(n for n in c.ids if n != gone)


def test_a_member_deleted_and_added_back_never_votes_twice_in_a_term(c):
    """The member's last term and vote outlive its deletion on its node (a tombstone in the
    node's Raft log, node/replication/store.py); the member made again when the leader adds
    the node back goes on from them. Without them it came back at term 0 with no vote, and a
    vote request of the current term held up on a link got a second vote from it."""
    c.request("node-0", T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, STREAM, None)
    leader = stream_leader(c)
    gone = [n for n in c.ids if n != leader][-1]
    third = next(n for n in c.ids if n not in (leader, gone))
    r = c.shards[gone].streams.streams[("/", "s")].replica.rep.raft
    term, uid = r.term, c.shards[gone].streams.streams[("/", "s")].replica.uid
    assert r.vote is not None
    assert c.request(leader, T.QUORUM_OP, "delete_member", "/", "s", gone)[2] == 0
    for _ in range(40):
        if ("/", "s") not in c.shards[gone].streams.streams:
            break
        c.tick()
    assert ("/", "s") not in c.shards[gone].streams.streams
    c.crash(gone)
    c.start(gone)                                   # the tombstone is read back from disk
    assert c.request(leader, T.QUORUM_OP, "add_member", "/", "s", gone)[2] == 0
    for _ in range(40):
        if ("/", "s") in c.shards[gone].streams.streams:
            break
        c.tick()
    back = c.shards[gone].streams.streams[("/", "s")].replica.rep.raft
    for _ in range(40):
        if back.id in back.voters:
            break
        c.tick()
    assert back.id in back.voters and back.term == term
    for _ in range(3 * back.election_ticks):         # the leader is heard no more
        back.tick()
    rival = c.shards[third].streams.streams[("/", "s")].replica.rep.raft.id
    assert back.leader is None
    ask = Message(VOTE, rival, back.id, term, back.log.last_term, back.log.last_index + 100)
    c.net.clear()
    c.shards[gone].handle(f"peer:{third}".encode(),
                          [T.STREAM_RAFT, "/", "s", uid, ask.to_wire()], c.now)
    c.shards[gone].streams.process()
    sent = [Message.from_wire(m[4]) for src, dst, m in c.net
            if src == gone and m[0] == T.STREAM_RAFT]
    answers = [a for a in sent if a.type == VOTE_RESP and a.to == rival]
    assert answers and all(a.reject for a in answers)
