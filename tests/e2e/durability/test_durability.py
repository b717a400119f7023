"""Issue 5, end to end: what a client sees of durability through kill -9 of a node or the
router (the launcher restarts the killed process within about a second).

Durable queues and their persistent messages come back in order, delivered-but-unacked ones
with ``redelivered`` set; transient messages and non-durable queues are gone (as in RabbitMQ);
durable exchanges and bindings survive a node and a router restart. Real pika clients, real
processes (``own_cluster``).
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import pika
import pika.exceptions
import pytest

pytestmark = pytest.mark.e2e

RESTART = 30.0      # bound (s) for a killed process to be restarted and serving again
PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)

R = TypeVar("R")


def pids(cluster) -> dict[str, int]:
    """Process ids from cluster.json (rewritten by the launcher when it restarts one)."""
    info = json.loads((cluster.data_dir / "cluster.json").read_text())
    out = {n["id"]: int(n["pid"]) for n in info["nodes"]}
    out["router"] = int(info["router"]["pid"])
    out.update((r["id"], int(r["pid"])) for r in info.get("routers", []) if "pid" in r)
    return out


def kill9(cluster, which: str, sig: int = signal.SIGKILL) -> None:
    """kill -9 ``which`` ("router" or a node id) and wait until the launcher restarted it."""
    cluster.killed = True
    old = pids(cluster)[which]
    os.kill(old, sig)
    deadline = time.monotonic() + RESTART
    while time.monotonic() < deadline:
        try:
            new = pids(cluster)[which]
        except (OSError, ValueError, KeyError):
            new = old
        if new != old:
            return
        time.sleep(0.05)
    raise AssertionError(f"{which} was not restarted within {RESTART:.0f} s")


def params(cluster) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(cluster.host, cluster.port, cluster.vhost,
                                     pika.PlainCredentials(cluster.user, cluster.password),
                                     heartbeat=0, connection_attempts=1, socket_timeout=5)


def retry(fn: Callable[[], R], timeout: float = RESTART) -> R:
    """Call ``fn`` until it stops raising AMQP/connection errors (a process is restarting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except (pika.exceptions.AMQPError, OSError) as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"still failing after {timeout:.0f} s: {exc!r}") from exc
            time.sleep(0.2)


class Session:
    """One blocking pika connection with a confirm channel."""

    def __init__(self, cluster) -> None:
        self.conn = pika.BlockingConnection(params(cluster))
        self.ch = self.conn.channel()
        self.ch.confirm_delivery()

    def close(self) -> None:
        try:
            self.conn.close()
        except pika.exceptions.AMQPError:
            pass


def session(cluster) -> Session:
    return retry(lambda: Session(cluster))


def passive_count(cluster, queue: str) -> int:
    """message_count of ``queue`` (raises ChannelClosedByBroker 404 when it does not exist)."""
    s = Session(cluster)
    try:
        return s.ch.queue_declare(queue, passive=True).method.message_count
    finally:
        s.close()


def queue_exists(cluster, queue: str) -> bool:
    try:
        passive_count(cluster, queue)
        return True
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False


def wait_serving(cluster, queue: str) -> int:
    """After a restart: retry until ``queue``'s node answers; returns its message count."""
    return retry(lambda: passive_count(cluster, queue))


def drain(cluster, queue: str, expect: int, timeout: float = 20.0) -> list[tuple[bytes, bool]]:
    """Consume (acking) until ``expect`` messages came or ``timeout``; [(body, redelivered)]."""
    s = session(cluster)
    deadline = time.monotonic() + timeout
    got: list[tuple[bytes, bool]] = []
    try:
        for method, _props, body in s.ch.consume(queue, inactivity_timeout=1.0):
            if method is None:
                if len(got) >= expect or time.monotonic() > deadline:
                    break
                continue
            got.append((body, method.redelivered))
            s.ch.basic_ack(method.delivery_tag)
            if len(got) >= expect:
                break
        s.ch.cancel()
    finally:
        s.close()
    return got


def test_durable_queue_keeps_persistent_messages_through_node_kill(own_cluster, uid):
    cl = own_cluster
    durable = cl.queue_on("node-1", "dur")
    transient_q = cl.queue_on("node-1", "tmp")
    s = session(cl)
    s.ch.queue_declare(durable, durable=True)
    s.ch.queue_declare(transient_q, durable=False)
    for i in range(30):
        s.ch.basic_publish("", durable, f"p{i}".encode(), PERSISTENT)      # confirmed
        s.ch.basic_publish("", durable, f"t{i}".encode(), TRANSIENT)
    for i in range(5):
        s.ch.basic_publish("", transient_q, f"x{i}".encode(), PERSISTENT)
    # three deliveries left unacked at the crash: they come back with redelivered set
    unacked = []
    for _ in range(3):
        method, _p, body = s.ch.basic_get(durable, auto_ack=False)
        unacked.append(body)
    assert unacked == [b"p0", b"t0", b"p1"]
    kill9(cl, "node-1")
    s.close()

    assert wait_serving(cl, durable) == 30            # the transient copies are gone
    assert not queue_exists(cl, transient_q)          # a non-durable queue is gone
    got = drain(cl, durable, 30)
    assert [b for b, _ in got] == [f"p{i}".encode() for i in range(30)]   # original order
    # p0 and p1 had been delivered; after kill -9 the node cannot know what its last turn
    # delivered, so every recovered message says redelivered ("may have been delivered")
    assert all(r for _, r in got)
    assert passive_count(cl, durable) == 0


def test_clean_node_restart_marks_exactly_the_delivered_messages_redelivered(own_cluster,
                                                                              uid):
    cl = own_cluster
    q = cl.queue_on("node-1", "clean")
    s = session(cl)
    s.ch.queue_declare(q, durable=True)
    for i in range(6):
        s.ch.basic_publish("", q, f"c{i}".encode(), PERSISTENT)
    for _ in range(2):
        s.ch.basic_get(q, auto_ack=False)                 # c0, c1 delivered, not acked
    kill9(cl, "node-1", signal.SIGTERM)                   # clean stop, then restarted
    s.close()
    assert wait_serving(cl, q) == 6
    got = drain(cl, q, 6)
    assert got == [(f"c{i}".encode(), i < 2) for i in range(6)]


def test_acked_messages_stay_acked_and_arguments_survive(own_cluster, uid):
    """Settlements are journaled (acked messages do not come back) and a queue comes back
    with its arguments (a redeclare with other arguments is refused, 406)."""
    cl = own_cluster
    q = cl.queue_on("node-0", "args")
    s = session(cl)
    s.ch.queue_declare(q, durable=True, arguments={"x-max-priority": 5})
    for i in range(10):
        s.ch.basic_publish("", q, f"m{i}".encode(),
                           pika.BasicProperties(delivery_mode=2, priority=i % 3))
    for _ in range(4):                                  # acks m2, m5, m8 (priority 2), m1
        method, _p, _b = s.ch.basic_get(q, auto_ack=False)
        s.ch.basic_ack(method.delivery_tag)
    s.conn.process_data_events(0.2)
    kill9(cl, "node-0")
    s.close()
    assert wait_serving(cl, q) == 6
    s = session(cl)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        s.ch.queue_declare(q, durable=True, arguments={"x-max-priority": 9})
    assert err.value.reply_code == 406
    s.close()
    got = [b for b, _ in drain(cl, q, 6)]
    # priority order still holds after the restart (1s before 0s), FIFO within a priority
    assert got == [b"m4", b"m7", b"m0", b"m3", b"m6", b"m9"]


def test_durable_exchange_and_binding_survive_node_and_router_kill(own_cluster, uid):
    cl = own_cluster
    s = session(cl)
    ex = f"dx-{uid}"
    tx = f"tx-{uid}"
    q = cl.queue_on("node-1", "bound")
    s.ch.exchange_declare(ex, "direct", durable=True)
    s.ch.exchange_declare(tx, "fanout", durable=False)
    s.ch.queue_declare(q, durable=True)
    s.ch.queue_bind(q, ex, routing_key="k")
    s.ch.queue_bind(q, "amq.topic", routing_key="t.#")
    s.ch.basic_publish(ex, "k", b"before", PERSISTENT, mandatory=True)
    s.close()
    for victim in ("node-0", "node-1", "router"):
        kill9(cl, victim)
        wait_serving(cl, q)

        def publish() -> None:
            s = Session(cl)
            try:
                s.ch.basic_publish(ex, "k", f"after-{victim}".encode(), PERSISTENT,
                                   mandatory=True)          # UnroutableError if unbound
                s.ch.basic_publish("amq.topic", "t.x", f"topic-{victim}".encode(),
                                   PERSISTENT, mandatory=True)
            finally:
                s.close()
        retry(publish)
    s = session(cl)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        s.ch.exchange_declare(tx, "fanout", passive=True)    # non-durable exchange: gone
    assert err.value.reply_code == 404
    s.close()
    got = sorted(b for b, _ in drain(cl, q, 7))
    assert got == sorted([b"before"] + [f"{k}-{v}".encode() for v in ("node-0", "node-1",
                                                                        "router")
                                        for k in ("after", "topic")])


def test_router_kill_clients_reconnect_and_find_everything(own_cluster, uid):
    cl = own_cluster
    qs = cl.queues_on_distinct_nodes(2, "rk")
    s = session(cl)
    for q in qs:
        s.ch.queue_declare(q, durable=True)
        for i in range(20):
            s.ch.basic_publish("", q, f"{q}-{i}".encode(), PERSISTENT)
    s.close()
    kill9(cl, "router")
    for q in qs:
        assert wait_serving(cl, q) == 20
    for q in qs:
            assert [b for b, _ in drain(cl, q, 20)] == [f"{q}-{i}".encode() for i in range(20)]


def test_consumer_is_cancelled_and_finds_its_messages_after_node_restart(own_cluster, uid):
    """The router cancels consumers of a restarting node's queues (basic.cancel); the client
    consumes again once the node is back and gets the unacked message with redelivered."""
    cl = own_cluster
    q = cl.queue_on("node-1", "cc")
    s = session(cl)
    s.ch.queue_declare(q, durable=True)
    for i in range(5):
        s.ch.basic_publish("", q, f"c{i}".encode(), PERSISTENT)
    cancelled = []
    s.ch.basic_qos(prefetch_count=1)
    s.ch.add_on_cancel_callback(lambda frame: cancelled.append(frame))
    first = []
    s.ch.basic_consume(q, lambda ch, m, p, b: first.append((b, m.redelivered)))
    t0 = time.monotonic()
    while not first and time.monotonic() - t0 < 10:
        s.conn.process_data_events(0.1)
    assert first == [(b"c0", False)]
    kill9(cl, "node-1")
    t0 = time.monotonic()
    while not cancelled and time.monotonic() - t0 < RESTART:
        s.conn.process_data_events(0.1)
    assert cancelled, "no basic.cancel after the node died"
    s.close()
    wait_serving(cl, q)
    got = drain(cl, q, 5)
    assert got[0] == (b"c0", True)
    assert [b for b, _ in got] == [f"c{i}".encode() for i in range(5)]


def read_stream(cl, stream: str) -> list[tuple[int, bytes]]:
    """A new reader of ``stream`` from ``first`` until nothing comes for 2 s: (offset, body)
    of each message."""
    r = session(cl)
    r.ch.basic_qos(prefetch_count=500)
    got: list[tuple[int, bytes]] = []
    for method, props, body in r.ch.consume(stream, inactivity_timeout=2.0,
                                            arguments={"x-stream-offset": "first"}):
        if method is None:
            break
        got.append((props.headers["x-stream-offset"], body))
        r.ch.basic_ack(method.delivery_tag)
    r.close()
    return got


#: Publishes a publisher under a fault goes on with once the faulted process is back (or the
#: fault is over): enough to cross the restart, where its 5,000 took 15-45 s.
AFTER_FAULT = 200


def kill_under_a_publisher(cl, queue: str, args: dict, node: str) -> tuple[list[bytes], int]:
    """Declare durable ``queue`` with ``args``, publish m0, m1, ... to it with confirms,
    kill -9 ``node`` half a second in, go on until the channel fails or AFTER_FAULT more
    went once the launcher restarted the node (5,000 at most); once the queue is served
    again returns the confirmed bodies, in order, and its message count."""
    s = session(cl)
    s.ch.queue_declare(queue, durable=True, arguments=args)
    confirmed: list[bytes] = []
    for i in range(100):
        s.ch.basic_publish("", queue, b"m%d" % i, PERSISTENT)
        confirmed.append(b"m%d" % i)
    victim = pids(cl)[node]
    killer = threading.Timer(0.5, os.kill, (victim, signal.SIGKILL))
    killer.start()                                      # while the publisher goes on
    more = None                                         # to go once the node is back
    try:
        for i in range(100, 5000):
            s.ch.basic_publish("", queue, b"m%d" % i, PERSISTENT)
            confirmed.append(b"m%d" % i)
            if more is None and i % 20 == 0 and killer.finished.is_set() \
                    and pids(cl)[node] != victim:
                more = AFTER_FAULT
            elif more is not None:
                more -= 1
                if more == 0:
                    break
    except (pika.exceptions.AMQPError, OSError):
        pass
    killer.join()
    s.close()
    return confirmed, wait_serving(cl, queue)


def test_a_stream_keeps_every_confirmed_message_through_node_kill(own_cluster, uid):
    """kill -9 of a stream's node while a publisher with confirms runs: after the restart a
    reader from ``first`` gets every confirmed message once, at offsets 0, 1, 2, ... with no
    gap and no offset given twice (docs/streams.md, "On disk": a torn tail is cut). A stream
    of one member (x-initial-cluster-size 1): test_streams_replicated.py kills a leader."""
    cl = own_cluster
    stream = cl.queue_on("node-1", f"stream-{uid}")
    confirmed, count = kill_under_a_publisher(
        cl, stream, {"x-queue-type": "stream", "x-initial-cluster-size": 1}, "node-1")
    assert count >= len(confirmed)
    got = read_stream(cl, stream)
    assert [o for o, _ in got] == list(range(len(got)))
    bodies = [b for _, b in got]
    assert len(set(bodies)) == len(bodies)
    assert bodies[:len(confirmed)] == confirmed


def test_a_quorum_queue_of_one_member_keeps_every_confirmed_message_once_through_a_kill(
        own_cluster, uid):
    """kill -9 of a quorum queue's only member while a publisher with confirms runs: after the
    restart every confirmed message is there, and once. The publish whose answer died with
    the node is sent again by the router; if the node's log holds it already it is not
    enqueued twice (group.py ``find_publish``, as RabbitMQ's quorum queues drop an enqueuer's
    sequence number they have seen)."""
    cl = own_cluster
    q = cl.queue_on("node-1", f"qq-{uid}")
    confirmed, count = kill_under_a_publisher(
        cl, q, {"x-queue-type": "quorum", "x-quorum-initial-group-size": 1}, "node-1")
    assert count >= len(confirmed)
    bodies = [b for b, _ in drain(cl, q, count)]
    assert len(bodies) == count
    assert len(set(bodies)) == len(bodies)              # none enqueued twice
    assert bodies[:len(confirmed)] == confirmed
