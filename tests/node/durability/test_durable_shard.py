"""Issue 5, sans-IO: a Shard with a real Journal in a tmp dir, "restarted" by opening the
journal again in a new Shard (node/durability/durable.py, docs/durability.md).

Checks what a router (and so a client) sees: replay order, redelivered and delivery counts,
TTL and scheduled times kept across a restart, durable topology back, transient state gone,
and durable answers (PUBLISH_RESULT, declare REPLY) held until the group commit.
"""
from __future__ import annotations

import errno

import pytest
from pamqp.commands import Basic
from shoal.node.durability.journal import Journal, JournalUnavailable
from shoal.node.queues.message import encode_header
from shoal.node.shard import Shard
from shoal.shared.settings import Settings
from shoal.shared.wire import DEST_QUEUE, OUTCOME_ACK, OUTCOME_REQUEUE, WIRE_VERSION, T

WALL = 1_700_000_000_000.0      # epoch ms at monotonic 0 (fixed: the tests move time by hand)


def header(**props) -> bytes:
    return encode_header(Basic.Properties(**props), 1)


PERSISTENT = header(delivery_mode=2)
TRANSIENT = header(delivery_mode=1)


class Node:
    """One node "process": a Shard on a journal directory; ``restart()`` makes a new one."""

    def __init__(self, path, now: float = 0.0, commit: bool = True) -> None:
        self.path = path
        self.now = now
        self.auto_commit = commit
        self.journal = Journal.open(path)
        self.shard = Shard("node-0", "inc", Settings(node_id="node-0",
                                                     link_heartbeat_timeout=60.0),
                           wall_offset_ms=WALL)
        self.shard.timers.now = now
        self.restored = self.shard.attach_journal(self.journal, clean=True)
        self.box: list[list] = []
        self.req = 0
        self.send(T.HELLO, WIRE_VERSION, "r1", "node-0")
        assert self.take()[0][0] == T.HELLO_OK

    def restart(self, at: float | None = None, clean: bool = True) -> Node:
        self.end_turn()
        self.journal.close()
        n = Node.__new__(Node)
        n.path, n.now, n.auto_commit = self.path, self.now if at is None else at, True
        n.journal = Journal.open(self.path)
        n.shard = Shard("node-0", "inc2", Settings(node_id="node-0",
                                                   link_heartbeat_timeout=60.0),
                        wall_offset_ms=WALL)
        n.shard.timers.now = n.now
        n.restored = n.shard.attach_journal(n.journal, clean)
        n.box, n.req = [], 0
        n.send(T.HELLO, WIRE_VERSION, "r1", "node-0")
        assert n.take()[0][0] == T.HELLO_OK
        return n

    def end_turn(self) -> None:
        """What NodeServer does after a turn: flush settlements, commit, release answers."""
        if self.shard.journal_flush() and self.auto_commit:
            self.journal.commit()
        self.shard.release_durable()
        self._pump()

    def _pump(self) -> None:
        for _peer, msgs in self.shard.take_outbox().items():
            self.box.extend(msgs)

    def send(self, *msg, turn: bool = True) -> None:
        self.shard.handle(b"r1", list(msg), self.now)
        self._pump()
        if turn:
            self.end_turn()

    def take(self) -> list[list]:
        out, self.box = self.box, []
        return out

    def request(self, tag, *fields) -> list:
        self.req += 1
        self.send(tag, self.req, *fields)
        replies = [m for m in self.take() if m[0] == T.REPLY]
        assert len(replies) == 1 and replies[0][2] == 0, replies
        return replies[0][4]

    def declare(self, name, durable=True, args=None, exclusive=False, auto_delete=False):
        return self.request(T.QUEUE_DECLARE, "/", name, False, durable, exclusive, auto_delete,
                            args or {}, "r1/c1")

    def publish(self, queue, body: bytes, hdr: bytes = PERSISTENT, seq: int = 0) -> None:
        self.send(T.PUBLISH, seq, "/", [queue], "", queue, hdr, body, "r1/c1")

    def consume(self, queue, cid=1, credit=100) -> None:
        self.request(T.CONSUME, cid, "/", queue, f"t{cid}", False, False, {}, "r1/c1")
        self.send(T.CREDIT, cid, credit, False)

    def deliveries(self) -> list[list]:
        return [m for m in self.take() if m[0] == T.DELIVER]

    def get_all(self, queue) -> list[tuple[bytes, bool]]:
        """basic.get with ack until empty: [(body, redelivered)]."""
        out = []
        while True:
            self.req += 1
            self.send(T.GET, self.req, "/", queue, False, "r1/c1")
            payload = [m for m in self.take() if m[0] == T.REPLY][0][4]
            if payload is None:
                return out
            out.append((payload[5], payload[1]))
            self.send(T.SETTLE, OUTCOME_ACK, [payload[0]])


def test_durable_queue_replays_persistent_messages_in_order(tmp_path):
    n = Node(tmp_path)
    n.declare("dq")
    n.declare("tq", durable=False)
    for i in range(5):
        n.publish("dq", f"p{i}".encode())
        n.publish("dq", f"t{i}".encode(), TRANSIENT)
        n.publish("tq", f"x{i}".encode())
    n = n.restart()
    assert n.restored == 5
    assert ("/", "tq") not in n.shard.queues                  # non-durable queue gone
    assert n.get_all("dq") == [(f"p{i}".encode(), False) for i in range(5)]


def test_settled_messages_stay_settled_with_interleaved_acks(tmp_path):
    n = Node(tmp_path)
    n.declare("q")
    for i in range(10):
        n.publish("q", f"m{i}".encode())
    n.consume("q")
    ids = [m[2] for m in n.deliveries()]
    n.send(T.SETTLE, OUTCOME_ACK, ids[::2])                    # ack m0, m2, m4, ...
    n.send(T.SETTLE, OUTCOME_REQUEUE, ids[1::2][:2])           # m1, m3 back, redelivered
    n = n.restart()
    got = n.get_all("q")
    assert [b for b, _ in got] == [b"m1", b"m3", b"m5", b"m7", b"m9"]
    # every one of them had been delivered before the restart
    assert all(r for _, r in got)


def test_delivery_counts_survive_restart(tmp_path):
    n = Node(tmp_path)
    n.declare("q", args={"x-delivery-limit": 5})
    n.publish("q", b"m")
    for _ in range(2):                                          # delivered and requeued twice
        n.consume("q", cid=7)
        [d] = n.deliveries()
        n.send(T.CANCEL, 99, 7)
        n.send(T.SETTLE, OUTCOME_REQUEUE, [d[2]])
        n.take()
    n = n.restart()
    q = n.shard.queues[("/", "q")]
    [e] = list(q.entries)
    assert (e.redelivered, e.delivery_count) == (True, 2)


def test_unclean_restart_marks_every_message_redelivered(tmp_path):
    n = Node(tmp_path)
    n.declare("q")
    n.publish("q", b"a")
    n.publish("q", b"b")
    n = n.restart(clean=False)
    assert n.get_all("q") == [(b"a", True), (b"b", True)]


def test_ttl_and_schedule_kept_across_restart(tmp_path):
    n = Node(tmp_path, now=1000.0)
    n.declare("q")
    n.publish("q", b"ttl", header(delivery_mode=2, expiration="10000"))  # expires at 11_000
    n.publish("q", b"late", header(delivery_mode=2, headers={"x-delay": 5000}))  # at 6000
    # restart 4 s later on a new monotonic clock (same wall clock): deadlines stay absolute
    n = n.restart(at=5000.0)
    q = n.shard.queues[("/", "q")]
    assert q.message_count == 1 and q.held == 1
    n.now = 6001.0
    n.shard.tick(n.now)
    assert q.message_count == 2 and q.held == 0                 # not re-delayed by 5 s
    n.now = 11_002.0
    n.shard.tick(n.now)
    n.end_turn()
    assert [b for b, _ in n.get_all("q")] == [b"late"]          # ttl one expired on time
    n = n.restart(at=20_000.0)
    assert n.get_all("q") == []                                 # the expiry was settled


def test_durable_topology_survives_and_transient_does_not(tmp_path):
    n = Node(tmp_path)
    n.declare("q")
    n.request(T.EXCHANGE_DECLARE, "/", "dx", "direct", False, True, False, False, {})
    n.request(T.EXCHANGE_DECLARE, "/", "tx", "fanout", False, False, False, False, {})
    n.request(T.BIND, "/", "dx", DEST_QUEUE, "q", "k", {})
    n.request(T.BIND, "/", "amq.topic", DEST_QUEUE, "q", "a.#", {})
    n.request(T.BIND, "/", "tx", DEST_QUEUE, "q", "", {})
    n.declare("excl", exclusive=True)                           # exclusive: never durable
    n = n.restart()
    exchanges, bindings, queues, _ = n.request(T.TOPOLOGY_SNAPSHOT)
    assert queues == [["/", "q", 1]]            # durable: the other nodes' catalogues keep it
    assert [x[1] for x in exchanges] == ["dx"]
    assert sorted((b[1], b[4]) for b in bindings) == [("amq.topic", "a.#"), ("dx", "k")]
    assert set(n.shard.queues) == {("/", "q")}
    # deletions are durable too
    n.request(T.UNBIND, "/", "dx", DEST_QUEUE, "q", "k", {})
    n.request(T.EXCHANGE_DELETE, "/", "dx", False)
    n.request(T.QUEUE_DELETE, "/", "q", False, False, "r1/c1")
    n = n.restart()
    assert n.request(T.TOPOLOGY_SNAPSHOT) == [[], [], [], []] and not n.shard.queues


def test_topology_events_on_replay_reach_routers_as_snapshot(tmp_path):
    n = Node(tmp_path)
    n.request(T.EXCHANGE_DECLARE, "/", "dx", "topic", False, True, False, False, {"a": 1})
    n.take()
    n = n.restart()
    exchanges = n.request(T.TOPOLOGY_SNAPSHOT)[0]
    assert exchanges == [["/", "dx", "topic", True, False, False, {"a": 1}]]


def test_answers_wait_for_the_group_commit(tmp_path):
    n = Node(tmp_path, commit=False)
    n.send(T.QUEUE_DECLARE, 99, "/", "q", False, True, False, False, {}, "r1/c1")
    assert not [m for m in n.take() if m[0] == T.REPLY]   # answered only after commit
    n.journal.commit()
    n.end_turn()
    n.take()
    n.publish("q", b"p", seq=1)                                 # persistent: withheld
    n.publish("q", b"t", TRANSIENT, seq=2)                      # transient: at once
    results = [m for m in n.take() if m[0] == T.PUBLISH_RESULT]
    assert results == [[T.PUBLISH_RESULT, 2, 0, 1]]
    n.req += 1
    n.send(T.QUEUE_DECLARE, n.req, "/", "q2", False, True, False, False, {}, "r1/c1")
    assert not [m for m in n.take() if m[0] == T.REPLY]         # durable declare: withheld
    n.journal.commit()
    n.end_turn()
    out = n.take()
    assert [T.PUBLISH_RESULT, 1, 0, 1] in out
    assert [m[1] for m in out if m[0] == T.REPLY] == [n.req]


class FailingJournal:
    """Wraps a Journal whose disk is "full" while ``full`` is set."""

    def __init__(self, journal: Journal) -> None:
        self.j = journal
        self.full = True

    def commit(self) -> int:
        if self.full:
            raise JournalUnavailable("disk full", OSError(errno.ENOSPC, "No space left"))
        return self.j.commit()


def test_disk_full_withholds_confirms_and_blocks_until_space_returns(tmp_path):
    n = Node(tmp_path, commit=False)
    n.send(T.QUEUE_DECLARE, 99, "/", "q", False, True, False, False, {}, "r1/c1")
    n.journal.commit()
    n.end_turn()
    n.take()
    disk = FailingJournal(n.journal)
    n.publish("q", b"p", seq=1)
    with pytest.raises(JournalUnavailable):
        disk.commit()
    n.shard.set_blocked("disk full")
    n.end_turn()
    out = n.take()
    assert [T.NODE_BLOCKED, True, "disk full"] in out
    assert not [m for m in out if m[0] == T.PUBLISH_RESULT]     # never a false confirm
    # a router connecting meanwhile is told too
    n.shard.handle(b"r2", [T.HELLO, WIRE_VERSION, "r2", "node-0"], n.now)
    assert [T.NODE_BLOCKED, True, "disk full"] in n.shard.take_outbox()[b"r2"]
    disk.full = False
    disk.commit()
    n.shard.set_blocked(None)
    n.end_turn()
    out = n.take()
    assert [T.NODE_BLOCKED, False, ""] in out and [T.PUBLISH_RESULT, 1, 0, 1] in out


def test_entry_ids_keep_rising_across_restarts(tmp_path):
    n = Node(tmp_path)
    n.declare("q")
    n.publish("q", b"a")
    first = list(n.shard.queues[("/", "q")].entries)[0].entry_id
    n = n.restart()
    n.publish("q", b"b")
    ids = [e.entry_id for e in n.shard.queues[("/", "q")].entries]
    assert ids[0] == first and ids[1] > first
    n = n.restart()
    assert n.get_all("q") == [(b"a", False), (b"b", False)]


def test_lvq_replacement_is_settled(tmp_path):
    n = Node(tmp_path)
    n.declare("lvq", args={"qpid.last_value_queue_key": "k"})
    for v in (b"1", b"2", b"3"):
        n.publish("lvq", v, header(delivery_mode=2, headers={"k": "same"}))
    n = n.restart()
    assert n.get_all("lvq") == [(b"3", False)]


def test_node_server_blocks_on_enospc_and_resumes(tmp_path):
    """The real NodeServer loop: the journal's disk work fails with ENOSPC -> the durable
    declare and the persistent publish are not answered, routers get NODE_BLOCKED; when
    space returns (the periodic retry succeeds) both answers leave and NODE_BLOCKED False."""
    import threading
    import time

    import zmq
    from shoal.node.process import run_node
    from shoal.node.server import NodeServer
    from shoal.shared.wire import decode_batch, encode_batch

    endpoint = f"ipc://{tmp_path}/node.sock"
    settings = Settings(node_id="node-0", node_bind=endpoint, data_dir=str(tmp_path))
    server = NodeServer(settings)
    server.open_journal()
    full = threading.Event()
    full.set()
    real_run = server.journal.writer.run

    def disk(job):
        if full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_run(job)
    server.journal.writer.run = disk
    t = threading.Thread(target=run_node, args=(settings, server))
    t.start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)

    def collect(seconds: float) -> list[list]:
        out = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if sock.poll(50):
                out.extend(decode_batch(sock.recv()))
        return out
    try:
        sock.send(encode_batch([[T.HELLO, WIRE_VERSION, "r1", "node-0"],
                                [T.QUEUE_DECLARE, 1, "/", "q", False, True, False, False, {},
                                 None]]))
        first = collect(1.5)
        blocked = [m for m in first if m[0] == T.NODE_BLOCKED]
        assert len(blocked) == 1
        assert blocked[0][1] is True and "No space left" in blocked[0][2]
        assert not [m for m in first if m[0] == T.REPLY]          # not on disk: no declare-ok
        full.clear()
        later = collect(3.0)
        assert [T.REPLY, 1, 0, "", ["q", 0, 0]] in later
        assert [T.NODE_BLOCKED, False, ""] in later
        sock.send(encode_batch([[T.PUBLISH, 5, "/", ["q"], "", "q", PERSISTENT, b"x", None]]))
        assert [T.PUBLISH_RESULT, 5, 0, 1] in collect(1.0)
    finally:
        server.stop()
        t.join(10)
        sock.close()
        ctx.term()
    j = Journal.open(tmp_path / "journal")                        # the message is on disk
    assert [m.body for m in j.recovered.messages[("/", "q")]] == [b"x"]
    j.close()


def test_a_leased_persistent_message_is_confirmed_only_once_on_disk_and_survives(tmp_path):
    """A router holding a delivery lease records a confirmed publish it delivered (LEASED
    with a publish id, node/lease.py): its PUBLISH_RESULT waits for the group commit, as a
    PUBLISH's does, and the unacked message comes back after a restart."""
    n = Node(tmp_path, commit=False)
    n.send(T.QUEUE_DECLARE, 99, "/", "q", False, True, False, False, {}, "r1/c1")
    n.journal.commit()
    n.end_turn()
    n.take()
    n.consume("q", cid=1, credit=10)
    (grant,) = [m for m in n.take() if m[0] == T.LEASE_GRANT]
    assert grant[:2] == [T.LEASE_GRANT, [1]]
    n.send(T.LEASE_TAKE, [1], grant[2])
    assert n.take() == [[T.LEASE_TAKEN, 1, grant[2]]]
    n.send(T.LEASED, 1, -1, "", "q", PERSISTENT, b"leased", "r1/c1", 7)
    assert not [m for m in n.take() if m[0] == T.PUBLISH_RESULT]    # not on disk yet
    n.journal.commit()
    n.end_turn()
    assert [m for m in n.take() if m[0] == T.PUBLISH_RESULT] == [[T.PUBLISH_RESULT, 7, 0, 1]]
    n = n.restart()
    assert n.get_all("q") == [(b"leased", True)]
