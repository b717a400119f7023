"""Quorum queues that refuse nothing (issue 44), with pika and aio-pika against a real 3-node
cluster: x-max-length(-bytes) with x-overflow drop-head (dead-lettered, reason maxlen) and
reject-publish (basic.nack), Qpid's qpid.max_count/qpid.policy_type, x-expires, last-value
queues, RabbitMQ 4's default x-delivery-limit of 20, at-least-once dead-lettering (also
through kill -9 of the source's leader); and, after kill -9 of the leader's node, a new
leader that holds what the old one held (the limits and last values were decided by the
leader and logged, so every member agrees). RabbitMQ 3.10 accepts each of these declares on
a quorum queue (checked side by side on this machine); where it behaves otherwise, the test
says so.
"""
from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from .clients import BrokerError, Nacked, connect
from .faults.test_quorum import EMBED, leader_of

pytestmark = pytest.mark.e2e

QQ = {"x-queue-type": "quorum"}
DEADLINE = 30.0


@pytest.fixture(params=["pika", "aio_pika"])
def make(cluster3, request):
    """``make(confirms=False)`` -> a connected adapter of this test's client on the 3-node
    cluster, closed after."""
    made = []

    def connect_(confirms: bool = False, url: str | None = None):
        c = connect(request.param, url or cluster3.url, confirms=confirms)
        made.append(c)
        return c
    yield connect_
    for c in made:
        with contextlib.suppress(Exception):
            c.close()


def wait_for(fn, what: str):
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"not within {DEADLINE:.0f} s: {what}")


def drain(c, q: str) -> list[bytes]:
    out = []
    while (d := c.get(q, no_ack=True)) is not None:
        out.append(d.body)
    return out


def dlx_pair(c, uid: str, name: str, **args) -> tuple[str, str]:
    """A quorum queue ``name`` dead-lettering to a classic queue through the default
    exchange."""
    q, dlq = f"{name}-{uid}", f"{name}-dl-{uid}"
    c.declare_queue(dlq, durable=True)
    c.declare_queue(q, durable=True, arguments={**QQ, "x-dead-letter-exchange": "",
                                                 "x-dead-letter-routing-key": dlq, **args})
    return q, dlq


def test_drop_head_dead_letters_the_oldest_with_reason_maxlen(make, uid):
    c = make(confirms=True)
    q, dlq = dlx_pair(c, uid, "qq-maxlen", **{"x-max-length": 2})
    for i in range(5):
        c.publish("", q, str(i).encode(), {"delivery_mode": 2})
    dead: list = []
    wait_for(lambda: dead.extend(iter(lambda: c.get(dlq, no_ack=True), None)) or
             len(dead) == 3, "three dead letters")
    assert [d.body for d in dead] == [b"0", b"1", b"2"]
    assert {d.props["headers"]["x-death"][0]["reason"] for d in dead} == {"maxlen"}
    assert drain(c, q) == [b"3", b"4"]


def test_max_length_bytes_drops_by_size(make, uid):
    c = make(confirms=True)
    q = f"qq-bytes-{uid}"
    c.declare_queue(q, durable=True, arguments={**QQ, "x-max-length-bytes": 10})
    for body in (b"aaaa", b"bbbb", b"cccc"):
        c.publish("", q, body)
    assert drain(c, q) == [b"bbbb", b"cccc"]


@pytest.mark.parametrize("args", [{"x-max-length": 2, "x-overflow": "reject-publish"},
                                  {"qpid.max_count": 2, "qpid.policy_type": "reject"}])
def test_reject_publish_nacks_over_the_limit(make, uid, args):
    c = make(confirms=True)
    q = f"qq-reject-{uid}"
    c.declare_queue(q, durable=True, arguments={**QQ, **args})
    c.publish("", q, b"1")
    c.publish("", q, b"2")
    with pytest.raises(Nacked):
        c.publish("", q, b"3")
    d = c.get(q)                # acquired messages do not count: there is room again
    c.publish("", q, b"4")
    c.ack(d)
    assert drain(c, q) == [b"2", b"4"]


def test_x_expires_deletes_the_unused_queue(make, uid):
    c = make()
    q = f"qq-expires-{uid}"
    c.declare_queue(q, durable=True, arguments={**QQ, "x-expires": 500})

    def gone() -> bool:
        try:
            c.declare_queue(q, passive=True)
            return False
        except BrokerError as err:
            assert err.code == 404
            c.reopen()
            return True
    wait_for(gone, "the queue expired")


def test_a_last_value_queue_keeps_the_newest_per_key(make, uid):
    c = make(confirms=True)
    q = f"qq-lvq-{uid}"
    c.declare_queue(q, durable=True, arguments={**QQ, "qpid.last_value_queue_key": "sym"})
    for body, key in ((b"A1", "A"), (b"B1", "B"), (b"A2", "A")):
        c.publish("", q, body, {"headers": {"sym": key}})
    assert drain(c, q) == [b"B1", b"A2"]


def test_the_default_delivery_limit_is_20_as_in_rabbitmq_4(make, uid):
    """RabbitMQ 4.0: a quorum queue declared without x-delivery-limit has 20 (3.10: none;
    the setting quorum_delivery_limit: -1 keeps that)."""
    c = make(confirms=True)
    q, dlq = dlx_pair(c, uid, "qq-limit")
    c.publish("", q, b"poison")
    for _ in range(21):
        d = wait_for(lambda: c.get(q), "the message back")
        c.nack(d, requeue=True)
    d = wait_for(lambda: c.get(dlq, no_ack=True), "the dead letter")
    assert d.body == b"poison"
    assert d.props["headers"]["x-death"][0]["reason"] == "delivery_limit"
    assert c.get(q) is None


def test_at_least_once_dead_lettering_delivers_a_rejected_message(make, uid):
    c = make(confirms=True)
    q, dlq = f"qq-alo-{uid}", f"qq-alo-dl-{uid}"
    c.declare_queue(dlq, durable=True, arguments=QQ)
    c.declare_queue(q, durable=True, arguments={
        **QQ, "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    c.publish("", q, b"poison")
    c.reject(wait_for(lambda: c.get(q), "the message"), requeue=False)
    d = wait_for(lambda: c.get(dlq, no_ack=True), "the dead letter")
    assert d.body == b"poison"
    assert d.props["headers"]["x-death"][0]["reason"] == "rejected"


@pytest.mark.skipif(EMBED, reason="--embed-node: node-0 has no links to the other nodes, so "
                                  "its quorum queues have one member")
@pytest.mark.parametrize("own_cluster", [3], indirect=True)
@pytest.mark.parametrize("kind", ["pika", "aio_pika"])
def test_a_new_leader_holds_what_the_old_one_decided(own_cluster, uid, kind):
    """Limits and last values are decided by the leader and logged: after kill -9 of its
    node, the new leader holds the same messages (one consumer's unacked message included,
    flagged redelivered; the messages never delivered are not: the checkouts are in the
    log), and the limits hold on it."""
    cluster = own_cluster
    c = connect(kind, cluster.url, confirms=True)
    lvq, capped = f"qq-lvq-kill-{uid}", f"qq-capped-kill-{uid}"
    c.declare_queue(lvq, durable=True, arguments={**QQ, "qpid.last_value_queue_key": "k"})
    c.declare_queue(capped, durable=True, arguments={**QQ, "x-max-length": 2})
    c.publish("", lvq, b"A1", {"headers": {"k": "A"}})
    held = c.get(lvq)                      # acquired: a later A does not replace it
    for body, key in ((b"A2", "A"), (b"A3", "A"), (b"B1", "B")):
        c.publish("", lvq, body, {"headers": {"k": key}})
    for i in range(4):
        c.publish("", capped, str(i).encode())
    assert held.body == b"A1"
    leader, term = leader_of(cluster, lvq)
    cluster.kill_node(leader, signal.SIGKILL)
    cluster.killed = True
    leader_of(cluster, lvq, term)
    with contextlib.suppress(Exception):
        c.close()
    c = connect(kind, cluster.url, confirms=True)
    first = wait_for(lambda: c.get(lvq, no_ack=True), "the queue at its new leader")
    assert (first.body, first.redelivered) == (b"A1", True)
    rest = [c.get(lvq, no_ack=True) for _ in range(2)]
    assert [(d.body, d.redelivered) for d in rest] == [(b"A3", False), (b"B1", False)]
    got = [wait_for(lambda: c.get(capped, no_ack=True), "the capped queue") for _ in range(2)]
    assert [(d.body, d.redelivered) for d in got] == [(b"2", False), (b"3", False)]
    assert c.get(capped) is None
    c.close()


@pytest.mark.skipif(EMBED, reason="--embed-node: node-0 has no links to the other nodes, so "
                                  "its quorum queues have one member")
@pytest.mark.parametrize("own_cluster", [3], indirect=True)
def test_at_least_once_dead_letters_survive_kill9_of_the_sources_leader(own_cluster, uid):
    """Messages expire (x-message-ttl) from a quorum queue that dead-letters at least once
    into another quorum queue; the source's leader's node is killed (kill -9) in the middle.
    Every confirmed message reaches the target (a duplicate is allowed, a loss is not)."""
    import pika

    from .durability.test_durability import params
    cluster = own_cluster
    src, dst = f"qq-alo-src-{uid}", f"qq-alo-dst-{uid}"
    conn = pika.BlockingConnection(params(cluster))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(dst, durable=True, arguments=QQ)
    ch.queue_declare(src, durable=True, arguments={
        **QQ, "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dst,
        "x-message-ttl": 300})
    leader, term = leader_of(cluster, src)
    confirmed: list[int] = []
    killed = False
    deadline = time.monotonic() + 60
    i = 0
    while len(confirmed) < 400 and time.monotonic() < deadline:
        if i == 150 and not killed:
            cluster.kill_node(leader, signal.SIGKILL)
            cluster.killed = killed = True
        try:
            ch.basic_publish("", src, str(i).encode(), pika.BasicProperties(delivery_mode=2))
            confirmed.append(i)
        except pika.exceptions.NackError:
            pass
        except (pika.exceptions.AMQPError, OSError):
            conn = pika.BlockingConnection(params(cluster))      # its router lived on
            ch = conn.channel()
            ch.confirm_delivery()
        i += 1
    assert killed and leader_of(cluster, src, term)[0] != leader
    got: set[int] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not set(confirmed) <= got:
        m = ch.basic_get(dst, auto_ack=True)
        if m[0] is None:
            conn.sleep(0.1)
            continue
        got.add(int(m[2]))
    lost = set(confirmed) - got
    print(f"{len(confirmed)} confirmed, {len(got)} dead-lettered, lost {len(lost)}")
    assert not lost, f"{len(lost)} confirmed messages never dead-lettered: {sorted(lost)[:20]}"
    conn.close()


@pytest.mark.skipif(EMBED, reason="--embed-node: node-0 has no links to the other nodes, so "
                                  "its quorum queues have one member")
def test_a_member_down_while_its_queue_was_deleted_drops_it(tmp_path, uid):
    """Membership reconciliation (node/replication/reconcile.py): a follower's node is
    down (kill -9, its launcher held so that it is not restarted at once) while its queue
    is deleted; back, it has the group and no leader. After the grace period and a round of
    questions it drops it (logged), and the management API lists no such queue."""
    import pika

    from tests.conftest import EXTERNAL_URL, start_cluster, stop_cluster
    from tests.conftest import free_port
    from tests.e2e.management.test_management import call
    if EXTERNAL_URL:
        pytest.skip("starts its own cluster")
    port = free_port()
    cluster = start_cluster(tmp_path / "c", 3, env={"SHOAL_MANAGEMENT_PORT": str(port)})
    cluster.mgmt_port = port
    try:
        q = f"qq-gone-{uid}"
        conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
        ch = conn.channel()
        ch.queue_declare(q, durable=True, arguments=QQ)
        leader, _ = leader_of(cluster, q)
        follower = next(n for n in cluster.node_ids if n != leader)
        os.kill(cluster.launcher.pid, signal.SIGSTOP)       # no restart for now
        try:
            cluster.kill_node(follower, signal.SIGKILL)
            cluster.killed = True
            ch.queue_delete(q)
            time.sleep(3)               # the old leader's retirement (2 s) is over
        finally:
            os.kill(cluster.launcher.pid, signal.SIGCONT)    # it restarts the node
        conn.close()
        wait_for(lambda: "no longer have this node's member" in cluster.log_path.read_text(
            errors="replace"), "the stopped member dropping the deleted queue")
        assert q not in [row["name"] for row in call(cluster, "GET", "/queues")[1]]
    finally:
        stop_cluster(cluster, require_clean_exit=False)


def test_a_global_prefetch_holds_over_a_quorum_queue(make, uid):
    """basic.qos global: the router moves credit between consumers with drains; a quorum
    queue answers a drain behind the deliveries waiting for their checkout."""
    c = make(confirms=True)
    q = f"qq-qos-{uid}"
    c.declare_queue(q, durable=True, arguments=QQ)
    for i in range(10):
        c.publish("", q, str(i).encode())
    consumer = make()
    consumer.qos(2, global_=True)
    consumer.consume(q)
    consumer.wait_for(2)
    assert len(consumer.settle_quietly(1.0)) == 2
    consumer.qos(5, global_=True)
    consumer.wait_for(5)
    assert len(consumer.settle_quietly(1.0)) == 5
