"""Replicated streams over three sans-IO nodes in one process (node/streams/members.py), on
the quorum queues' in-memory cluster (tests/node/replication/test_quorum_nodes.py): what a
router sees of a stream with several members.

Declare-ok once a leader is elected; PUBLISH_RESULT only once the chunk is committed;
PUBLISH_MOVED and EV_QUEUE_LEADER from a member that does not lead, MOVED for its consumers;
every member holds the same chunks; after the leader's node is lost a new leader serves
every confirmed message; a restarted member keeps its log; a delete reaches every member.
"""
from __future__ import annotations

from shoal.shared.wire import EV_QUEUE_LEADER, MOVED, T

from tests.node.replication.test_quorum_nodes import Cluster

STREAM = {"x-queue-type": "stream", "x-initial-cluster-size": 3}
#: basic's content header: body size 1, delivery-mode 2
HEADER = bytes([0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0x10, 0, 2])


def stream_leader(c: Cluster, name: str = "s") -> str:
    for _ in range(100):
        led = [n for n, s in c.shards.items() if n not in c.down and
               ("/", name) in s.streams.streams and
               s.streams.streams[("/", name)].replica.leading]
        if led:
            return led[0]
        c.tick()
    raise AssertionError("no leader")


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


def test_a_stream_of_three_members_confirms_at_commit_and_moves_to_its_leader(tmp_path):
    c = Cluster(tmp_path)
    try:
        r = c.request("node-0", T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, STREAM, None)
        assert r[2] == 0 and r[4] == ["s", 0, 0]
        leader = stream_leader(c)
        rows = {n: c.shards[n].streams.streams[("/", "s")] for n in c.ids}
        assert all(sorted(s.replica.members()) == c.ids for s in rows.values())
        c.send(leader, T.PUBLISH, 5, "/", ["s"], "", "s", HEADER, b"a", None)
        c.shards[leader].streams.commit(None)
        c.pump()
        assert c.take(leader, T.PUBLISH_RESULT) == [[T.PUBLISH_RESULT, 5, 0, 1]]
        follower = next(n for n in c.ids if n != leader)
        c.inbox[follower].clear()
        c.send(follower, T.PUBLISH, 6, "/", ["s"], "", "s", HEADER, b"b", None)
        assert c.take(follower, T.PUBLISH_MOVED) == [[T.PUBLISH_MOVED, 6, 0, 0, ["s"]]]
        events = [m for m in c.inbox[follower] if m[0] == T.TOPOLOGY_EVENT]
        assert events and events[0][1] == EV_QUEUE_LEADER and events[0][2][2] == leader
        r = c.request(follower, T.CONSUME, 1, "/", "s", "t", 0, 0, {}, None, [10, 0])
        assert r[2] == MOVED
        c.tick(3)                       # heartbeats carry the commit to the followers
        chunk = rows[leader].log.chunk_at(0)
        assert all(s.log.chunk_at(0) == chunk for s in rows.values())
        assert consume_all(c, leader, 2) == [(0, b"a")]
    finally:
        for shard in c.shards.values():
            shard.streams.close()


def test_after_the_leaders_node_is_lost_a_new_leader_serves_every_confirmed_message(tmp_path):
    c = Cluster(tmp_path)
    try:
        c.request("node-0", T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, STREAM, None)
        leader = stream_leader(c)
        for k in range(5):
            c.send(leader, T.PUBLISH, 10 + k, "/", ["s"], "", "s", HEADER, b"m%d" % k, None)
            c.shards[leader].streams.commit(None)
            c.pump()
        assert len(c.take(leader, T.PUBLISH_RESULT)) == 5
        c.crash(leader)
        c.shards[leader].streams.close()
        new = stream_leader(c)
        assert new != leader
        c.send(new, T.PUBLISH, 20, "/", ["s"], "", "s", HEADER, b"after", None)
        c.shards[new].streams.commit(None)
        c.pump()
        assert c.take(new, T.PUBLISH_RESULT) == [[T.PUBLISH_RESULT, 20, 0, 1]]
        assert [b for _, b in consume_all(c, new, 3)] == \
            [b"m0", b"m1", b"m2", b"m3", b"m4", b"after"]
        # the old leader's node comes back from its disk and catches up
        c.start(leader)
        c.tick(5)
        back = c.shards[leader].streams.streams[("/", "s")]
        assert back.committed == c.shards[new].streams.streams[("/", "s")].committed
    finally:
        for shard in c.shards.values():
            shard.streams.close()


def test_a_delete_reaches_every_member(tmp_path):
    c = Cluster(tmp_path)
    try:
        c.request("node-0", T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, STREAM, None)
        leader = stream_leader(c)
        assert c.request(leader, T.QUEUE_DELETE, "/", "s", 0, 0, None)[2] == 0
        c.pump()
        assert all(("/", "s") not in s.streams.streams for s in c.shards.values())
    finally:
        for shard in c.shards.values():
            shard.streams.close()
