"""Quorum queues over three sans-IO nodes in one process (node/replication/manager.py): each a
Shard with its Replication, linked by an in-memory network, driven by a fake router per node.

What a router sees: declare-ok once a leader is elected; PUBLISH_RESULT only after the message
is applied (on a majority's log); PUBLISH_MOVED and EV_QUEUE_LEADER from a member that does not
lead; settlements replicated to every member; a new leader after the leader's link is lost,
which flags redelivered exactly what the old one delivered; a member restarted from its disk keeps the
queue; 406 for what a quorum queue cannot be.
"""
from __future__ import annotations

import pytest

from shoal.node.replication.manager import Replication
from shoal.node.replication.store import RaftStore
from shoal.node.shard import Shard
from shoal.shared.settings import Settings
from shoal.shared.wire import (EV_QUEUE_LEADER, EV_QUEUE_REMOVED, MOVED, OUTCOME_ACK,
                               OUTCOME_REQUEUE, WIRE_VERSION, T)

QQ = {"x-queue-type": "quorum"}
HEADER = bytes([0, 60, 0, 0, 0, 0, 0, 0, 0, 1, 0x10, 0, 2])   # basic, body 1, delivery_mode 2


class Links:
    """An in-memory PeerLinks: messages wait in ``net`` until the cluster delivers them."""

    def __init__(self, cluster: "Cluster", node_id: str) -> None:
        self.cluster, self.node_id = cluster, node_id
        self.out: dict[str, list[list]] = {}

    @property
    def nodes(self) -> list[str]:
        return [n for n in self.cluster.ids if n != self.node_id]

    def queue(self, peer: str, msg: list) -> None:
        self.out.setdefault(peer, []).append(msg)

    def broadcast(self, msg: list) -> None:
        for n in self.nodes:
            self.queue(n, msg)

    def flush(self) -> None:
        for peer, msgs in self.out.items():
            if self.node_id not in self.cluster.down and peer not in self.cluster.down:
                self.cluster.net.extend((self.node_id, peer, m) for m in msgs)
        self.out = {}

    def close(self) -> None:
        pass


class Cluster:
    def __init__(self, tmp_path, n: int = 3) -> None:
        self.tmp = tmp_path
        self.ids = [f"node-{i}" for i in range(n)]
        self.net: list[tuple[str, str, list]] = []
        self.down: set[str] = set()
        self.now = 1000.0
        self.shards: dict[str, Shard] = {}
        self.inbox: dict[str, list[list]] = {}
        for node in self.ids:
            self.start(node)

    def start(self, node: str) -> None:
        settings = Settings(node_id=node, delivery_leases=False, link_heartbeat_ms=100,
                            link_heartbeat_timeout=100.0)
        shard = Shard(node, f"inc-{node}", settings)
        shard.timers.now = self.now
        rep = Replication(shard, RaftStore(self.tmp / node), Links(self, node))
        rep.restore()
        shard.attach_replication(rep)
        shard.open_streams(self.tmp / node / "streams")
        self.shards[node] = shard
        self.inbox[node] = []
        shard.handle(b"router", [T.HELLO, WIRE_VERSION, "r1", node], self.now)
        self.down.discard(node)
        self.pump()
        self.inbox[node].clear()

    def crash(self, node: str) -> None:
        self.down.add(node)
        self.shards[node].replication.close()
        self.shards[node].streams.close()
        self.net = [m for m in self.net if node not in (m[0], m[1])]
        for other in self.ids:
            if other != node and other not in self.down:
                self.shards[other].replication.peer_lost(node)

    def pump(self, rounds: int = 50) -> None:
        """Process, deliver and collect until quiet (no clock)."""
        for _ in range(rounds):
            for node, shard in self.shards.items():
                if node in self.down:
                    continue
                shard.replication.process()
                shard.streams.process()
                for msgs in shard.take_outbox().values():
                    self.inbox[node].extend(msgs)
            if not self.net:
                return
            net, self.net = self.net, []
            for src, dst, msg in net:
                if dst not in self.down:
                    self.shards[dst].handle(f"peer:{src}".encode(), msg, self.now)

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            self.now += 100
            for node, shard in self.shards.items():
                if node not in self.down:
                    shard.tick(self.now)
            self.pump()

    def request(self, node: str, tag: T, *fields) -> list:
        self.shards[node].handle(b"router", [tag, 99, *fields], self.now)
        for _ in range(60):
            self.pump()
            replies = [m for m in self.inbox[node] if m[0] == T.REPLY and m[1] == 99]
            if replies:
                self.inbox[node] = [m for m in self.inbox[node] if m is not replies[0]]
                return replies[0]
            self.tick()
        raise AssertionError(f"no reply from {node}: {self.inbox[node]}")

    def send(self, node: str, *msg) -> None:
        self.shards[node].handle(b"router", list(msg), self.now)
        self.pump()

    def take(self, node: str, tag: T) -> list[list]:
        got = [m for m in self.inbox[node] if m[0] == tag]
        self.inbox[node] = [m for m in self.inbox[node] if m[0] != tag]
        return got

    def leader(self, name: str = "q") -> str:
        for _ in range(100):
            led = [n for n, s in self.shards.items() if n not in self.down and
                   ("/", name) in s.replication.groups and
                   s.replication.groups[("/", name)].leading]
            if led:
                return led[0]
            self.tick()
        raise AssertionError("no leader")

    def count(self, node: str, name: str = "q") -> int:
        return self.shards[node].queues[("/", name)].message_count


def declare(c: Cluster, node: str = "node-0", name: str = "q", args: dict | None = None,
            durable: int = 1) -> list:
    c.tick(6)       # the nodes have said PEER_HELLO
    return c.request(node, T.QUEUE_DECLARE, "/", name, 0, durable, 0, 0, args or QQ, None)


def publish(c: Cluster, node: str, seq: int, body: bytes = b"x", name: str = "q") -> None:
    c.send(node, T.PUBLISH, seq, "/", [name], "", name, HEADER, body, None)


def test_a_declare_is_answered_once_a_leader_is_elected_on_every_member(tmp_path):
    c = Cluster(tmp_path)
    reply = declare(c)
    assert reply[2:] == [0, "", ["q", 0, 0]]
    leader = c.leader()
    assert leader == "node-0"
    events = [m for m in c.inbox["node-0"] if m[0] == T.TOPOLOGY_EVENT]
    assert [e[2][:3] for e in events if e[1] == EV_QUEUE_LEADER] == [["/", "q", "node-0"]]
    for node in c.ids:
        assert ("/", "q") in c.shards[node].queues


def test_a_publish_is_confirmed_once_applied_and_every_member_has_it(tmp_path):
    c = Cluster(tmp_path)
    declare(c)
    publish(c, "node-0", 7, b"hello")
    assert c.take("node-0", T.PUBLISH_RESULT) == [[T.PUBLISH_RESULT, 7, 0, 1]]
    c.tick(2)
    assert [c.count(n) for n in c.ids] == [1, 1, 1]


def test_without_a_majority_nothing_is_confirmed(tmp_path):
    c = Cluster(tmp_path)
    declare(c)
    c.down |= {"node-1", "node-2"}
    publish(c, "node-0", 8)
    c.tick(5)
    assert c.take("node-0", T.PUBLISH_RESULT) == []
    c.down.clear()
    c.tick(20)
    got = c.take("node-0", T.PUBLISH_RESULT) + c.take("node-0", T.PUBLISH_MOVED)
    assert got and got[0][1] == 8


def test_a_member_that_does_not_lead_says_who_does_and_moves_the_publish(tmp_path):
    c = Cluster(tmp_path)
    declare(c)
    publish(c, "node-1", 9)
    moved = c.take("node-1", T.PUBLISH_MOVED)
    assert moved == [[T.PUBLISH_MOVED, 9, 0, 0, ["q"]]]
    events = [m[2] for m in c.inbox["node-1"] if m[0] == T.TOPOLOGY_EVENT and
              m[1] == EV_QUEUE_LEADER]
    assert events and events[-1][2] == "node-0"
    reply = c.request("node-1", T.GET, "/", "q", 1, None)
    assert reply[2] == MOVED


def test_settlements_are_replicated_to_every_member(tmp_path):
    c = Cluster(tmp_path)
    declare(c)
    for i in range(3):
        publish(c, "node-0", 10 + i, str(i).encode())
    reply = c.request("node-0", T.CONSUME, 5, "/", "q", "tag", 0, 0, {}, None)
    assert reply[2] == 0
    c.send("node-0", T.CREDIT, 5, 10, False)
    delivered = c.take("node-0", T.DELIVER)
    assert [d[7] for d in delivered] == [b"0", b"1", b"2"]
    c.send("node-0", T.SETTLE, OUTCOME_ACK, [delivered[0][2]])
    c.send("node-0", T.SETTLE, OUTCOME_REQUEUE, [delivered[1][2]])
    c.tick(2)
    again = c.take("node-0", T.DELIVER)
    assert [(d[7], d[3]) for d in again] == [(b"1", True)]        # redelivered
    assert [c.count(n) for n in ("node-1", "node-2")] == [2, 2]


def test_losing_the_leaders_link_elects_another_that_flags_what_was_delivered(tmp_path):
    """The new leader redelivers exactly what the old one delivered and was not settled,
    flagged; a message never delivered comes unflagged (the checkouts are in the log)."""
    c = Cluster(tmp_path)
    declare(c)
    publish(c, "node-0", 20, b"a")
    publish(c, "node-0", 21, b"b")
    got = c.request("node-0", T.GET, "/", "q", 0, None)        # a, not acknowledged
    assert got[4][5] == b"a" and got[4][1] is False
    c.tick(2)
    c.crash("node-0")
    leader = c.leader()
    assert leader != "node-0"
    events = [m[2] for m in c.inbox[leader] if m[0] == T.TOPOLOGY_EVENT and
              m[1] == EV_QUEUE_LEADER]
    assert events and events[-1][2] == leader
    replies = [c.request(leader, T.GET, "/", "q", 1, None) for _ in range(2)]
    assert [(r[2], r[4][5], r[4][1]) for r in replies] == [(0, b"a", True), (0, b"b", False)]


def test_a_member_restarted_from_its_disk_keeps_the_queue(tmp_path):
    c = Cluster(tmp_path)
    declare(c)
    for i in range(5):
        publish(c, "node-0", 30 + i)
    c.tick(3)
    c.crash("node-2")
    c.start("node-2")
    c.tick(3)
    assert c.count("node-2") == 5


def test_a_wiped_member_rejoins_under_a_new_id_and_catches_up(tmp_path):
    c = Cluster(tmp_path)
    declare(c)
    for i in range(5):
        publish(c, "node-0", 40 + i)
    c.tick(3)
    old = c.shards["node-2"].replication.member_id
    c.crash("node-2")
    import shutil
    shutil.rmtree(tmp_path / "node-2")
    c.start("node-2")
    new = c.shards["node-2"].replication.member_id
    assert new != old
    c.tick(60)
    voters = c.shards["node-0"].replication.groups[("/", "q")].raft.voters
    assert new in voters and old not in voters
    assert c.count("node-2") == 5


def test_delete_removes_the_queue_on_every_member(tmp_path):
    c = Cluster(tmp_path)
    declare(c)
    publish(c, "node-0", 50)
    reply = c.request("node-0", T.QUEUE_DELETE, "/", "q", 0, 0, None)
    assert reply[2:] == [0, "", [1]]
    c.tick(2)
    for node in c.ids:
        assert ("/", "q") not in c.shards[node].queues
    removed = [m for m in c.inbox["node-1"] if m[0] == T.TOPOLOGY_EVENT and
               m[1] == EV_QUEUE_REMOVED]
    assert removed


@pytest.mark.parametrize("args,durable,text", [
    ({**QQ, "x-dead-letter-strategy": "bogus"}, 1, "invalid arg 'x-dead-letter-strategy' for queue 'q' in vhost '/': invalid_dlx_strategy"),
    ({**QQ, "x-overflow": "bogus"}, 1, "invalid arg 'x-overflow' for queue 'q' in vhost '/'"),
    (QQ, 0, "invalid property 'non-durable' for queue 'q' in vhost '/'"),
])
def test_what_a_quorum_queue_cannot_be_is_refused_naming_it(tmp_path, args, durable, text):
    c = Cluster(tmp_path)
    reply = declare(c, args=args, durable=durable)
    assert reply[2] == 406 and text in reply[3]


def test_a_stopped_leader_delivers_nothing_when_it_wakes(tmp_path):
    """SIGSTOP of the leader's node: the others elect a leader; when the old one wakes, its
    lease has run out, so a GET or a consumer's credit gets nothing from it (it answers MOVED)
    until it has learned the new term and stepped down."""
    c = Cluster(tmp_path)
    declare(c)
    publish(c, "node-0", 60, b"m")
    c.tick(2)
    c.down.add("node-0")                     # stopped: no turns, no ticks, no messages
    leader = c.leader()
    assert leader != "node-0"
    g = c.shards["node-0"].replication.groups[("/", "q")]
    c.shards["node-0"].timers.now = c.now   # it wakes: its clock has moved on
    assert g.leading and not g.may_deliver()
    c.shards["node-0"].handle(b"router", [T.GET, 98, "/", "q", 1, None], c.now)
    replies = [m for m in c.shards["node-0"].take_outbox().get(b"router", [])
               if m[0] == T.REPLY]
    assert replies and replies[0][2] == MOVED
    c.down.discard("node-0")
    c.tick(3)
    assert not g.leading


def resend(c: Cluster, node: str, seq: int, first: int, body: bytes = b"x",
           name: str = "q") -> None:
    """A PUBLISH sent again after a leader change (router/quorum.py ``_resend``): a new,
    negative publish id, and its first send's id."""
    c.send(node, T.PUBLISH, seq, "/", [name], "", name, HEADER, body, None, first)


def test_a_publish_sent_again_that_the_log_holds_is_not_enqueued_twice(tmp_path):
    """As RabbitMQ's quorum queues drop an enqueuer's sequence number they have seen: the
    router's resend of a publish whose answer it lost is confirmed, and the queue holds the
    message once; a resend of one the log does not hold is enqueued, redelivered."""
    c = Cluster(tmp_path)
    declare(c)
    publish(c, "node-0", 30, b"a")
    assert c.take("node-0", T.PUBLISH_RESULT) == [[T.PUBLISH_RESULT, 30, 0, 1]]
    resend(c, "node-0", -31, 30, b"a")                    # its answer was lost: sent again
    assert c.take("node-0", T.PUBLISH_RESULT) == [[T.PUBLISH_RESULT, -31, 0, 1]]
    resend(c, "node-0", -33, 32, b"b")                    # never stored: stored now
    assert c.take("node-0", T.PUBLISH_RESULT) == [[T.PUBLISH_RESULT, -33, 0, 1]]
    c.tick(2)
    assert [c.count(n) for n in c.ids] == [2, 2, 2]
    replies = [c.request("node-0", T.GET, "/", "q", 1, None) for _ in range(2)]
    assert [(r[4][5], r[4][1]) for r in replies] == [(b"a", False), (b"b", True)]


def test_a_publish_sent_again_before_its_first_copy_is_committed_waits_for_it(tmp_path):
    """The first send is in the leader's log but not on a majority yet when the resend comes:
    the resend is answered when that entry is applied, and nothing is logged twice."""
    c = Cluster(tmp_path)
    declare(c)
    c.down |= {"node-1", "node-2"}
    publish(c, "node-0", 40, b"c")
    resend(c, "node-0", -41, 40, b"c")
    c.tick(3)
    assert c.take("node-0", T.PUBLISH_RESULT) == []       # no majority: nothing confirmed
    c.down.clear()
    c.tick(20)
    got = sorted(m[1] for m in c.take("node-0", T.PUBLISH_RESULT) if m[3] == 1)
    assert got == [-41, 40]
    assert [c.count(n) for n in c.ids] == [1, 1, 1]



@pytest.mark.parametrize("args", [QQ, {"x-queue-type": "stream"}], ids=["quorum", "stream"])
def test_a_declare_whose_group_is_dropped_before_it_has_a_leader_is_answered_moved(
        tmp_path, args):
    """A node whose disk was wiped can make a queue anew for a router that last saw it led
    there, while the queue's other members go on; reconciling drops the new group (fault
    campaign seed 17: its declare then waited for ever). The declare is answered MOVED, so
    the router asks the leader again."""
    c = Cluster(tmp_path)
    c.tick(31)                  # past requests.STARTUP_TICKS: a declare makes its group
    c.shards["node-0"].handle(b"router", [T.QUEUE_DECLARE, 77, "/", "q", 0, 1, 0, 0, args,
                                          None], c.now)
    c.crash("node-1")
    c.crash("node-2")           # before they hear of it: the group made has no leader
    c.tick(3)
    assert not [m for m in c.inbox["node-0"] if m[0] == T.REPLY and m[1] == 77]
    shard = c.shards["node-0"]
    if args is QQ:
        shard.replication.forget(shard.replication.groups[("/", "q")])
    else:
        mem = shard.streams.members
        mem._drop(mem.members[("/", "q")])
    c.pump()
    [reply] = [m for m in c.inbox["node-0"] if m[0] == T.REPLY and m[1] == 77]
    assert reply[2] == MOVED
