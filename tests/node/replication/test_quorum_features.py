"""A quorum queue's limits, last values and clocks over three sans-IO nodes (issue 44):
x-max-length with drop-head and reject-publish, last-value queues, TTL and x-expires by the
leader's clock, the default delivery limit. What every test checks in the end is what a
router would see after a leader change: every member holds the same messages, because only
the leader decides and its decisions are in the log (node/replication/machine.py).
"""
from __future__ import annotations

from pamqp import commands, header

from shoal.node.replication import checkouts
from shoal.node.replication.raft import APP, VOTE, VOTE_RESP, Message
from shoal.shared.errors import RESOURCE_ERROR
from shoal.shared.wire import OUTCOME_REJECT, OUTCOME_REQUEUE, T

from tests.node.replication.sim_queue import with_entries
from tests.node.replication.test_quorum_nodes import HEADER, QQ, Cluster, declare, publish


def props(**kw) -> bytes:
    """A content header (the wire's bytes) with these basic properties, persistent."""
    return header.ContentHeader(0, 1, commands.Basic.Properties(delivery_mode=2, **kw)).marshal()


def send(c: Cluster, node: str, seq: int, body: bytes, hdr: bytes, name: str = "q") -> None:
    c.send(node, T.PUBLISH, seq, "/", [name], "", name, hdr, body, None)


def held(c: Cluster, node: str, name: str = "q") -> list[bytes]:
    """The live messages of ``node``'s member, in queue order (acquired ones too; a lazy
    follower's records as they become entries when it leads)."""
    q = with_entries(c.shards[node].queues[("/", name)].replica.machine).queue
    return [bytes(e.body) for e in q.entries if not e.is_dead]


def consume(c: Cluster, node: str, credit: int, cid: int = 5, name: str = "q") -> list[list]:
    reply = c.request(node, T.CONSUME, cid, "/", name, "tag", 0, 0, {}, None)
    assert reply[2] == 0
    c.send(node, T.CREDIT, cid, credit, False)
    return c.take(node, T.DELIVER)


def test_drop_head_drops_the_same_messages_on_every_member(tmp_path):
    c = Cluster(tmp_path)
    declare(c, args={**QQ, "x-max-length": 3})
    for i in range(5):
        publish(c, "node-0", 1 + i, str(i).encode())
    c.tick(2)
    assert [held(c, n) for n in c.ids] == [[b"2", b"3", b"4"]] * 3


def test_acquired_messages_do_not_count_and_followers_do_not_drop_them(tmp_path):
    """RabbitMQ counts ready messages only. The leader has 2 acquired and 2 ready: under
    x-max-length 2, nothing is dropped; a follower, which does not know what is acquired,
    must not drop by its own count (it would lose what the consumer holds)."""
    c = Cluster(tmp_path)
    declare(c, args={**QQ, "x-max-length": 2})
    publish(c, "node-0", 1, b"a")
    publish(c, "node-0", 2, b"b")
    assert [d[7] for d in consume(c, "node-0", 2)] == [b"a", b"b"]
    publish(c, "node-0", 3, b"c")
    publish(c, "node-0", 4, b"d")
    c.tick(2)
    assert [held(c, n) for n in c.ids] == [[b"a", b"b", b"c", b"d"]] * 3
    c.crash("node-0")
    leader = c.leader()
    reply = c.request(leader, T.GET, "/", "q", 1, None)
    assert reply[4][5] == b"a" and reply[4][1] is True          # kept, and redelivered


def test_reject_publish_refuses_over_the_limit_and_no_member_holds_it(tmp_path):
    c = Cluster(tmp_path)
    declare(c, args={**QQ, "x-max-length": 2, "x-overflow": "reject-publish"})
    for i in range(3):
        publish(c, "node-0", 10 + i, str(i).encode())
    results = sorted(c.take("node-0", T.PUBLISH_RESULT))
    assert [r[1:3] for r in results] == [[10, 0], [11, 0], [12, RESOURCE_ERROR]]
    c.tick(2)
    assert [held(c, n) for n in c.ids] == [[b"0", b"1"]] * 3


def test_qpid_reject_policy_counts_bytes(tmp_path):
    c = Cluster(tmp_path)
    declare(c, args={**QQ, "qpid.max_size": 10, "qpid.policy_type": "reject"})
    publish(c, "node-0", 1, b"123456")
    publish(c, "node-0", 2, b"123456")
    assert [r[2] for r in sorted(c.take("node-0", T.PUBLISH_RESULT))] == [0, RESOURCE_ERROR]


def test_reject_publish_dlx_is_drop_head_as_in_rabbitmq(tmp_path):
    """RabbitMQ accepts it on a quorum queue, logs "Invalid overflow strategy" and applies
    drop-head (rabbit_quorum_queue:overflow/3)."""
    c = Cluster(tmp_path)
    reply = declare(c, args={**QQ, "x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    assert reply[2] == 0
    publish(c, "node-0", 1, b"old")
    publish(c, "node-0", 2, b"new")
    assert [r[2] for r in sorted(c.take("node-0", T.PUBLISH_RESULT))] == [0, 0]
    c.tick(2)
    assert [held(c, n) for n in c.ids] == [[b"new"]] * 3


def test_a_last_value_replaces_the_older_on_every_member(tmp_path):
    c = Cluster(tmp_path)
    declare(c, args={**QQ, "qpid.last_value_queue_key": "sym"})
    send(c, "node-0", 1, b"A1", props(headers={"sym": "A"}))
    send(c, "node-0", 2, b"B1", props(headers={"sym": "B"}))
    send(c, "node-0", 3, b"A2", props(headers={"sym": "A"}))
    c.tick(2)
    assert [held(c, n) for n in c.ids] == [[b"B1", b"A2"]] * 3


def test_an_acquired_last_value_is_not_replaced_anywhere(tmp_path):
    """Qpid: an acquired older value stays (its consumer holds it). A follower keeps it
    too, so that a new leader redelivers it when the consumer's leader is lost."""
    c = Cluster(tmp_path)
    declare(c, args={**QQ, "qpid.last_value_queue_key": "sym"})
    send(c, "node-0", 1, b"A1", props(headers={"sym": "A"}))
    assert [d[7] for d in consume(c, "node-0", 1)] == [b"A1"]
    send(c, "node-0", 2, b"A2", props(headers={"sym": "A"}))
    send(c, "node-0", 3, b"A3", props(headers={"sym": "A"}))
    c.tick(2)
    assert [held(c, n) for n in c.ids] == [[b"A1", b"A3"]] * 3
    c.crash("node-0")
    leader = c.leader()
    got = [c.request(leader, T.GET, "/", "q", 1, None)[4] for _ in range(3)]
    assert [g[5] for g in got if g] == [b"A1", b"A3"]


def test_a_follower_never_expires_by_its_own_clock(tmp_path):
    c = Cluster(tmp_path)
    declare(c, args={**QQ, "x-message-ttl": 1000})
    publish(c, "node-0", 1, b"m")
    c.tick(1)
    follower = c.shards["node-1"]
    follower.tick(c.now + 60_000)          # its clock jumps a minute ahead: nothing happens
    assert held(c, "node-1") == [b"m"]
    follower.timers.now = c.now
    c.tick(12)                             # the leader's TTL passes: it logs the expiry
    assert [held(c, n) for n in c.ids] == [[]] * 3


def test_a_new_leader_expires_by_the_time_of_the_enqueue_in_the_log(tmp_path):
    """The TTL counts from when the old leader enqueued the message, not from the new
    leader's election."""
    c = Cluster(tmp_path)
    declare(c, args={**QQ, "x-message-ttl": 4000})
    t0 = c.now
    publish(c, "node-0", 1, b"m")
    c.tick(5)
    c.crash("node-0")
    leader = c.leader()
    assert held(c, leader) == [b"m"] and c.now < t0 + 4000
    while c.now < t0 + 4200:
        c.tick()
    assert [held(c, n) for n in c.ids if n != "node-0"] == [[]] * 2


def test_x_expires_deletes_an_unused_queue_on_every_member(tmp_path):
    c = Cluster(tmp_path)
    declare(c, args={**QQ, "x-expires": 2000})
    c.tick(10)
    assert all(("/", "q") in c.shards[n].queues for n in c.ids)
    c.tick(15)
    assert not any(("/", "q") in c.shards[n].queues for n in c.ids)


def test_x_expires_waits_for_consumers_and_counts_from_the_last_use(tmp_path):
    c = Cluster(tmp_path)
    declare(c, args={**QQ, "x-expires": 2000})
    consume(c, "node-0", 1)
    c.tick(30)
    assert ("/", "q") in c.shards["node-0"].queues
    c.request("node-0", T.CANCEL, 5)
    c.tick(10)
    c.request("node-0", T.GET, "/", "q", 1, None)      # a use: counts again from here
    c.tick(15)
    assert ("/", "q") in c.shards["node-1"].queues
    c.tick(10)
    assert not any(("/", "q") in c.shards[n].queues for n in c.ids)


def test_x_expires_does_not_restart_with_a_new_leader(tmp_path):
    """rabbit_fifo keeps last_active in the log: a new leader counts from the last use,
    by its own clock, not from its election."""
    c = Cluster(tmp_path)
    declare(c, args={**QQ, "x-expires": 3000})
    t0 = c.now
    c.tick(10)
    c.crash("node-0")
    c.leader()
    while c.now < t0 + 3300:
        c.tick()
    assert not any(("/", "q") in c.shards[n].queues for n in ("node-1", "node-2"))


def test_the_default_delivery_limit_is_rabbitmq_4s_20_on_every_member(tmp_path):
    c = Cluster(tmp_path)
    declare(c)
    assert {c.shards[n].queues[("/", "q")].cfg.max_returns for n in c.ids} == {20}
    declare(c, name="own", args={**QQ, "x-delivery-limit": 3})
    assert {c.shards[n].queues[("/", "own")].cfg.max_returns for n in c.ids} == {3}
    declare(c, name="none", args={**QQ, "x-delivery-limit": -1})
    assert {c.shards[n].queues[("/", "none")].cfg.max_returns for n in c.ids} == {None}
    for n in c.ids:
        c.shards[n].settings.quorum_delivery_limit = -1     # RabbitMQ 3.10's behaviour
    declare(c, name="old")
    assert {c.shards[n].queues[("/", "old")].cfg.max_returns for n in c.ids} == {None}


def test_a_message_returned_more_often_than_the_limit_goes_from_every_member(tmp_path):
    c = Cluster(tmp_path)
    declare(c, args={**QQ, "x-delivery-limit": 1})
    publish(c, "node-0", 1, b"m")
    for _ in range(2):
        d = consume(c, "node-0", 1) or c.take("node-0", T.DELIVER)
        assert [x[7] for x in d] == [b"m"]
        c.send("node-0", T.SETTLE, OUTCOME_REQUEUE, [d[0][2]])
        c.request("node-0", T.CANCEL, 5)
    c.tick(2)
    assert [held(c, n) for n in c.ids] == [[]] * 3


def test_a_member_down_while_its_queue_was_deleted_drops_it_when_back(tmp_path):
    """Reconciliation (node/replication/reconcile.py): the others no longer have the group;
    after the grace period without a leader the returning member asks them and drops it."""
    c = Cluster(tmp_path)
    declare(c)
    publish(c, "node-0", 1, b"m")
    c.tick(2)
    c.crash("node-2")
    assert c.request("node-0", T.QUEUE_DELETE, "/", "q", 0, 0, None)[2] == 0
    c.tick(3)
    c.start("node-2")
    assert ("/", "q") in c.shards["node-2"].replication.groups
    c.tick(160)                                     # the grace period (10 s), then the asks
    assert ("/", "q") not in c.shards["node-2"].replication.groups
    assert ("/", "q") not in c.shards["node-2"].queues
    c.crash("node-2")
    c.start("node-2")                               # and it stays gone after a restart
    assert ("/", "q") not in c.shards["node-2"].replication.groups


def remove_the_slower_follower(c: Cluster) -> tuple[str, str, object]:
    """``delete_member`` of the follower whose answers come second, publishing as a loaded
    queue is: the leader commits the removal on the other's answer and sends this member
    the commit index, so it applies its own removal and still names the leader. Returns
    the leader's node, the removed member's node and its group."""
    lead = c.leader()
    other = [n for n in c.ids if n != lead][-1]
    g = c.shards[other].replication.groups[("/", "q")]
    c.shards[lead].handle(b"router", [T.QUORUM_OP, 98, "delete_member", "/", "q", other],
                          c.now)
    seq = 1
    while g.raft.id in g.raft.voters and seq < 40:
        send(c, lead, seq, b"m", props())
        seq += 1
        c.tick()
    assert g.raft.id not in g.raft.voters and g.raft.leader is not None     # the case
    return lead, other, g


def test_a_member_removed_while_up_drops_its_group_even_when_it_applied_its_removal(tmp_path):
    """``delete_member`` of a live follower, the slower of the two: the leader commits the
    removal on the other's answer and sends this member the commit index, so it applies its
    own removal and still names the leader, which no longer replicates to it. It used to keep
    the group (its queue, its log) for good: the reconciliation waited for it to know no
    leader. Now 10 s without a leader's message make it ask, and the others say it is out."""
    c = Cluster(tmp_path)
    declare(c)
    lead, other, _ = remove_the_slower_follower(c)
    c.tick(130)                                       # 10 s of silence, then the asks
    assert ("/", "q") not in c.shards[other].replication.groups
    assert ("/", "q") not in c.shards[other].queues
    assert ("/", "q") in c.shards[lead].replication.groups      # the queue goes on
    assert len(c.shards[lead].replication.groups[("/", "q")].raft.voters) == 2


def test_the_member_removed_from_a_group_of_two_drops_its_group(tmp_path):
    """A queue shrunk from two members to one: the other voter's answer alone is not a
    majority of the removed member's configuration of two. Its own log holds its removal,
    and that counts, so it drops the group (it used to keep it for good)."""
    c = Cluster(tmp_path)
    declare(c)
    lead = c.leader()
    first, second = [n for n in c.ids if n != lead]
    for node in (first, second):
        g = c.shards[node].replication.groups[("/", "q")]
        c.shards[lead].handle(b"router", [T.QUORUM_OP, 98, "delete_member", "/", "q", node],
                              c.now)
        for _ in range(40):
            if g.raft.id not in c.shards[lead].replication.groups[("/", "q")].raft.voters:
                break
            c.tick()
    assert len(c.shards[lead].replication.groups[("/", "q")].raft.voters) == 1
    c.tick(150)
    assert ("/", "q") not in c.shards[first].replication.groups
    assert ("/", "q") not in c.shards[second].replication.groups
    assert ("/", "q") not in c.shards[second].queues


def test_a_member_dropped_and_added_back_never_votes_twice_in_a_term(tmp_path):
    """Raft's persistent state outlives the drop: the member's last term and vote stay on its
    node's disk (a tombstone, store.py), and the member made again when the leader adds the
    node back goes on from them. Without them it came back at term 0 with no vote, and a
    vote request of the current term, held up on a link while the member was removed,
    dropped and added back, got a second vote from it: two leaders in one term."""
    c = Cluster(tmp_path)
    declare(c)
    lead, other, g = remove_the_slower_follower(c)
    third = next(n for n in c.ids if n not in (lead, other))
    term, voted, uid = g.raft.term, g.raft.vote, g.uid
    assert voted is not None
    c.tick(130)
    assert ("/", "q") not in c.shards[other].replication.groups          # dropped
    c.crash(other)
    c.start(other)                                  # the tombstone is read back from disk
    assert c.request(lead, T.QUORUM_OP, "add_member", "/", "q", other)[2] == 0
    c.tick(20)
    back = c.shards[other].replication.groups[("/", "q")]
    assert back.raft.id in back.raft.voters and back.raft.term == term      # the same term
    # the leader is heard no more (its link is cut), and a vote request of that term from
    # the third member, held up until now, arrives
    for _ in range(3 * back.raft.election_ticks):
        back.raft.tick()
    assert back.raft.term == term and back.raft.leader is None
    rival = c.shards[third].replication.groups[("/", "q")].raft.id
    ask = Message(VOTE, rival, back.raft.id, term, back.raft.log.last_term,
                  back.raft.log.last_index + 100)
    c.net.clear()
    c.shards[other].handle(f"peer:{third}".encode(), [T.RAFT, "/", "q", uid, ask.to_wire()],
                           c.now)
    c.shards[other].replication.process()
    sent = [Message.from_wire(m[4]) for src, dst, m in c.net if src == other and m[0] == T.RAFT]
    answers = [a for a in sent if a.type == VOTE_RESP and a.to == rival]
    assert answers and all(a.reject for a in answers)


def test_a_member_made_for_a_late_message_that_nothing_follows_is_dropped(tmp_path):
    """A leader's APP for a group this node does not have makes an empty member, to which
    the leader's snapshot would follow (manager.py ``_join``). When none does (the leader
    removed it meanwhile), the member knows no configuration, so nobody can tell it it is
    out: after 10 s without a leader's message it goes by itself (reconcile.py ``action``)."""
    c = Cluster(tmp_path)
    rep = c.shards["node-2"].replication
    late = Message(APP, "node-0@old", rep.member_id, 3, 0, 5, [], 5)
    c.shards["node-2"].handle(b"peer:node-0", [T.RAFT, "/", "gone", "u1", late.to_wire()],
                              c.now)
    assert ("/", "gone") in rep.groups
    c.tick(130)
    assert ("/", "gone") not in rep.groups


def test_a_member_on_a_node_that_left_the_cluster_is_removed(tmp_path):
    c = Cluster(tmp_path)
    declare(c)
    g = c.shards["node-0"].replication.groups[("/", "q")]
    assert len(g.raft.voters) == 3
    c.crash("node-2")
    c.ids.remove("node-2")                          # restarted without it in the config
    c.tick(130)
    assert sorted(m.split("@")[0] for m in g.raft.voters) == ["node-0", "node-1"]
    assert g.wanted == ["node-0", "node-1"]
    publish(c, "node-0", 2, b"still")
    assert c.take("node-0", T.PUBLISH_RESULT) == [[T.PUBLISH_RESULT, 2, 0, 1]]


def test_a_member_that_has_a_leader_asks_nothing(tmp_path):
    c = Cluster(tmp_path)
    declare(c)
    c.tick(130)
    assert all(("/", "q") in c.shards[n].replication.groups for n in c.ids)


def test_a_wiped_node_does_not_speak_for_the_disk_it_lost(tmp_path):
    """Two of three members wiped while the third was down: they answer "none" under new
    member ids, which says nothing of the group (the third may hold its last copy); it is
    kept."""
    import shutil
    c = Cluster(tmp_path)
    declare(c)
    c.crash("node-0")
    for node in ("node-1", "node-2"):
        c.crash(node)
        shutil.rmtree(tmp_path / node)
    for node in c.ids:
        c.start(node)
    c.tick(130)
    assert ("/", "q") in c.shards["node-0"].replication.groups


ALO = {**QQ, "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
       "x-dead-letter-exchange": "dlx", "x-max-length": 2}


def discards(c: Cluster, node: str) -> list[int]:
    return sorted(c.shards[node].replication.groups[("/", "q")].machine.discards)


def reject_first(c: Cluster, node: str) -> None:
    got = c.request(node, T.GET, "/", "q", 0, None)
    c.send(node, T.SETTLE, OUTCOME_REJECT, [got[4][0]])


def poison_rejected(tmp_path, args: dict = ALO) -> Cluster:
    """A cluster whose queue (``args``) had one message, rejected by a basic.get."""
    c = Cluster(tmp_path)
    declare(c, args=args)
    publish(c, "node-0", 1, b"poison")
    reject_first(c, "node-0")
    c.tick(2)
    return c


def test_an_at_least_once_dead_letter_stays_until_its_targets_confirm(tmp_path):
    c = poison_rejected(tmp_path)
    sent = c.take("node-0", T.REPUBLISH)
    assert len(sent) == 1 and sent[0][2] == "dlx" and sent[0][6]        # a confirm id
    assert [c.count(n) for n in c.ids] == [0, 0, 0]
    assert all(discards(c, n) for n in c.ids)                           # on every member
    # it still counts towards x-max-length (as RabbitMQ's): room for one more
    c.take("node-0", T.PUBLISH_RESULT)
    publish(c, "node-0", 2, b"a")
    publish(c, "node-0", 3, b"b")
    assert [r[2] for r in sorted(c.take("node-0", T.PUBLISH_RESULT))] == [0, RESOURCE_ERROR]
    c.send("node-0", T.REPUBLISH_RESULT, sent[0][6], True)
    c.tick(2)
    assert [discards(c, n) for n in c.ids] == [[], [], []]
    publish(c, "node-0", 4, b"c")
    assert [r[2] for r in c.take("node-0", T.PUBLISH_RESULT)] == [0]


def test_a_dead_letter_not_confirmed_is_sent_again(tmp_path):
    c = poison_rejected(tmp_path)
    first = c.take("node-0", T.REPUBLISH)
    c.send("node-0", T.REPUBLISH_RESULT, first[0][6], False)           # no route yet
    c.tick(60)
    again = c.take("node-0", T.REPUBLISH)
    assert again and again[0][5] == b"poison" and again[0][6] != first[0][6]
    assert discards(c, "node-1")


def test_a_new_leader_sends_the_dead_letters_again(tmp_path):
    c = poison_rejected(tmp_path)
    assert c.take("node-0", T.REPUBLISH)
    c.crash("node-0")                                 # before the router's answer
    leader = c.leader()
    c.tick(2)
    again = c.take(leader, T.REPUBLISH)
    assert [m[5] for m in again] == [b"poison"]
    c.send(leader, T.REPUBLISH_RESULT, again[0][6], True)
    c.tick(2)
    assert discards(c, leader) == []


def test_at_least_once_needs_reject_publish_else_at_most_once(tmp_path):
    """As RabbitMQ (rabbit_quorum_queue:dlh/5): with drop-head it falls back, logged."""
    c = poison_rejected(tmp_path, {**ALO, "x-overflow": "drop-head"})
    sent = c.take("node-0", T.REPUBLISH)
    assert len(sent) == 1 and len(sent[0]) == 6                          # no confirm
    assert discards(c, "node-1") == []


def entries_of(c: Cluster, node: str, op: str) -> list:
    g = c.shards[node].replication.groups[("/", "q")]
    return [e.data for e in g.raft.log.entries if isinstance(e.data, list) and e.data[0] == op]


def test_a_publish_to_a_waiting_consumer_is_checked_out_with_its_enqueue(tmp_path):
    """The fast path: a consumer with credit and nothing ready ahead: the enqueue is logged
    checked out, the delivery goes as it is applied (one round through the log, not two),
    and every member knows it was delivered."""
    c = Cluster(tmp_path)
    declare(c)
    assert consume(c, "node-0", 5) == []
    publish(c, "node-0", 1, b"m")
    delivered = c.take("node-0", T.DELIVER)
    assert [(d[7], d[3]) for d in delivered] == [(b"m", False)]
    assert entries_of(c, "node-0", "enq")[-1][8] is True
    assert entries_of(c, "node-0", "checkout") == []
    c.tick(2)
    for n in ("node-1", "node-2"):
        assert flags(c, n)[0][1:] == (True, 1)
    c.crash("node-0")
    leader = c.leader()
    got = c.request(leader, T.GET, "/", "q", 1, None)
    assert (got[4][5], got[4][1]) == (b"m", True)


def test_an_enqueue_logged_checked_out_but_not_handed_out_is_given_back(tmp_path):
    """The consumer goes between the publish and its commit: ``unout`` makes it an
    ordinary message again on every member, unflagged and uncounted."""
    c = Cluster(tmp_path)
    declare(c)
    consume(c, "node-0", 5)
    shard = c.shards["node-0"]
    shard.handle(b"router", [T.PUBLISH, 1, "/", ["q"], "", "q", HEADER, b"m", None], c.now)
    shard.handle(b"router", [T.CANCEL, 98, 5], c.now)       # before it is committed
    c.pump()
    c.tick(2)
    assert c.take("node-0", T.DELIVER) == []
    assert entries_of(c, "node-0", "enq")[-1][8] is True
    assert entries_of(c, "node-0", "unout")
    for n in c.ids:
        assert flags(c, n)[0][1:] == (False, 0)
    got = c.request("node-0", T.GET, "/", "q", 1, None)
    assert (got[4][5], got[4][1]) == (b"m", False)


def test_a_drain_is_answered_behind_the_deliveries_held_for_their_checkout(tmp_path):
    """The router counts credit by what it was sent: CREDIT_DRAINED must come after the
    deliveries that used the credit (they wait for their checkout), as from a classic
    queue; else it grants the credit again and the consumer exceeds its prefetch (found by
    the quorum switch over test_consume's global prefetch scenarios)."""
    c = Cluster(tmp_path)
    declare(c)
    for i in range(3):
        publish(c, "node-0", 1 + i, str(i).encode())
    c.request("node-0", T.CONSUME, 5, "/", "q", "tag", 0, 0, {}, None)
    c.inbox["node-0"].clear()
    shard = c.shards["node-0"]
    shard.handle(b"router", [T.CREDIT, 5, 2, False], c.now)
    shard.handle(b"router", [T.CREDIT, 5, 0, True], c.now)     # drain what is left
    c.pump()
    c.tick(2)
    seen = [m[0] for m in c.inbox["node-0"] if m[0] in (T.DELIVER, T.CREDIT_DRAINED)]
    assert seen == [T.DELIVER, T.DELIVER, T.CREDIT_DRAINED]


def flags(c: Cluster, node: str) -> list[tuple[bytes, bool, int]]:
    """(body, redelivered, delivery count) of ``node``'s member's live messages."""
    q = with_entries(c.shards[node].queues[("/", "q")].replica.machine).queue
    return [(bytes(e.body), e.redelivered, e.delivery_count) for e in q.entries if not e.is_dead]


def test_a_consumer_behind_gets_messages_marked_ahead_without_waiting_for_the_log(tmp_path):
    """A consumer behind a backlog: the leader checks the next messages out in the log
    ahead of its credit (``mark``), so credit that comes is answered at once, with no
    checkout to wait for; marks not handed out when the consumer goes are given back
    (``unout``) on every member, unflagged and uncounted."""
    c = Cluster(tmp_path)
    declare(c)
    for i in range(5):
        publish(c, "node-0", 1 + i, str(i).encode())
    assert consume(c, "node-0", 0) == []
    c.tick(2)
    assert [len(m[1]) for m in entries_of(c, "node-0", "mark")] == [5]
    shard = c.shards["node-0"]
    shard.handle(b"router", [T.CREDIT, 5, 3, False], c.now)
    sent = [m for msgs in shard.take_outbox().values() for m in msgs]   # no Ready processed
    assert [d[7] for d in sent if d[0] == T.DELIVER] == [b"0", b"1", b"2"]
    c.pump()
    c.tick(2)
    assert entries_of(c, "node-0", "checkout") == []
    assert flags(c, "node-1") == [(b"0", True, 1), (b"1", True, 1), (b"2", True, 1),
                                  (b"3", True, 1), (b"4", True, 1)]
    c.send("node-0", T.CANCEL, 98, 5)
    c.tick(2)
    assert entries_of(c, "node-0", "unout")
    for n in c.ids:
        assert flags(c, n)[3:] == [(b"3", False, 0), (b"4", False, 0)]


def test_marked_messages_are_flagged_by_a_new_leader(tmp_path, monkeypatch):
    """The price of marking ahead (docs/replication.md): after a leader change, what was
    marked and never delivered is flagged redelivered too, as "may have been delivered"
    (AMQP 0-9-1 1.8.3.9); what was never marked (beyond ``mark_want``) is not."""
    monkeypatch.setattr(checkouts, "MARK_AHEAD_MIN", 3)
    monkeypatch.setattr(checkouts, "MARK_BATCH", 1)
    c = Cluster(tmp_path)
    declare(c)
    for i in range(3):
        publish(c, "node-0", 1 + i, str(i).encode())
    consume(c, "node-0", 0)
    c.tick(2)
    publish(c, "node-0", 9, b"late")            # beyond mark_want: not marked
    c.tick(2)
    assert [m[1] for m in entries_of(c, "node-0", "mark")][-1] != []
    c.crash("node-0")
    leader = c.leader()
    c.tick(2)
    got = [c.request(leader, T.GET, "/", "q", 1, None)[4] for _ in range(4)]
    assert [(g[5], g[1]) for g in got] == [(b"0", True), (b"1", True), (b"2", True),
                                           (b"late", False)]


def test_a_marked_message_does_not_overtake_one_waiting_for_its_checkout(tmp_path, monkeypatch):
    """m0 requeued lies behind the marks, m1 is marked: credit for both sends m0 (waiting for
    its checkout) before m1 (marked, ready at once), in the queue's order (the fault
    campaign's rule 4: a confirmed message delivered after later ones, unflagged)."""
    monkeypatch.setattr(checkouts, "MARK_AHEAD_MIN", 1)
    monkeypatch.setattr(checkouts, "MARK_BATCH", 1)
    c = Cluster(tmp_path)
    declare(c)
    for i in range(3):
        publish(c, "node-0", 1 + i, f"m{i}".encode())
    consume(c, "node-0", 0)
    c.tick(2)
    c.send("node-0", T.CREDIT, 5, 1, False)
    first = c.take("node-0", T.DELIVER)
    assert [d[7] for d in first] == [b"m0"]
    c.tick(2)                                   # m1 marked
    c.send("node-0", T.SETTLE, OUTCOME_REQUEUE, [first[0][2]])
    c.tick(2)
    c.send("node-0", T.CREDIT, 5, 2, False)
    c.tick(2)
    got = c.take("node-0", T.DELIVER)
    assert [(d[7], d[3]) for d in got] == [(b"m0", True), (b"m1", False)]


def test_a_member_that_joined_empty_logs_its_deliveries_when_it_leads(tmp_path, monkeypatch):
    """A member added to a queue whose log was compacted learns the queue from the leader's
    snapshot (its queue and state machine are made anew). Leading later, it must still log
    each delivery's checkout, so that the next leader redelivers the message flagged. (The
    fault campaign found a delivery without ``redelivered`` after a wiped node: the leader's
    checkouts kept the state machine made before the snapshot.)"""
    from shoal.node.replication import group
    monkeypatch.setattr(group, "COMPACT_ENTRIES", 2)
    c = Cluster(tmp_path, n=4)
    declare(c, args={**QQ, "x-quorum-initial-group-size": 3})
    leader = c.leader()
    outside = next(n for n in c.ids if ("/", "q") not in c.shards[n].replication.groups)
    for i in range(6):
        publish(c, leader, 1 + i, str(i).encode())
    c.tick(3)
    c.request(leader, T.QUORUM_OP, "add_member", "/", "q", outside)
    voters = c.shards[leader].replication.groups[("/", "q")].raft.voters
    for _ in range(60):                 # it joins as a learner, then votes
        c.tick()
        if any(m.startswith(outside + "@") for m in voters):
            break
    assert held(c, outside) == [str(i).encode() for i in range(6)]
    assert c.shards[outside].replication.groups[("/", "q")].snapshot is not None
    c.request(leader, T.QUORUM_OP, "transfer", "/", "q", outside)
    for _ in range(30):
        c.tick()
        if c.shards[outside].replication.groups[("/", "q")].leading:
            break
    assert c.leader() == outside
    delivered = consume(c, outside, 1)
    c.tick(2)
    delivered += c.take(outside, T.DELIVER)
    assert [(d[7], d[3]) for d in delivered] == [(b"0", False)]
    c.crash(outside)
    for _ in range(30):
        c.tick()
        if c.leader() != outside:
            break
    got = c.request(c.leader(), T.GET, "/", "q", 1, None)
    assert (got[4][5], got[4][1]) == (b"0", True)      # flagged: it was delivered


def test_a_follower_holding_records_reports_the_messages_it_holds(tmp_path):
    """A follower keeps records, not entries, until it leads (machine.py ``lazy``): a
    passive declare answered by it still counts the messages, as it did with entries; and
    the member that leads after a crash holds them as entries, in order."""
    c = Cluster(tmp_path)
    declare(c)
    for i in range(3):
        publish(c, "node-0", 1 + i, str(i).encode())
    c.tick(2)
    for n in ("node-1", "node-2"):
        assert c.shards[n].queues[("/", "q")].replica.machine.lazy
        reply = c.request(n, T.QUEUE_DECLARE, "/", "q", 1, 1, 0, 0, {}, None)
        assert reply[4] == ["q", 3, 0]
    c.crash("node-0")
    leader = c.leader()
    assert not c.shards[leader].queues[("/", "q")].replica.machine.lazy
    assert held(c, leader) == [b"0", b"1", b"2"]
    got = c.request(leader, T.GET, "/", "q", 1, None)
    assert got[4][5] == b"0"
