"""Issue 19: exact AMQP semantics across routers. Two routers share one port and every node
(`shoal serve --routers 2`); each test talks to both through their direct ports (``a`` is
router 0, ``b`` router 1), with pika, and checks what a client sees: the nodes are the single
owners of queues, exchanges and bindings (design.md section 1), so what one router's client
did holds for the other router's clients as soon as the client has the -ok.
"""
from __future__ import annotations

import json
import time
import uuid

import pika
import pika.exceptions
import pytest

pytestmark = pytest.mark.e2e


def connect(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url))


def _connection_to(cluster, index: int):
    conn = connect(cluster.router_url(index))
    yield conn
    if conn.is_open:
        conn.close()


@pytest.fixture
def a(routers2):
    """A connection to router 0 alone."""
    yield from _connection_to(routers2, 0)


@pytest.fixture
def b(routers2):
    """A connection to router 1 alone."""
    yield from _connection_to(routers2, 1)


def name(prefix: str) -> str:
    return f"r2-{prefix}-{uuid.uuid4().hex[:10]}"


def pump(*conns, until, timeout: float = 10.0) -> None:
    """Run the connections' callbacks until ``until()`` is true (bounded by ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        for conn in conns:
            conn.process_data_events(time_limit=0.02)


def get_one(ch, queue: str, timeout: float = 10.0):
    """basic.get until a message comes (a delivery may be in flight), else None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is not None:
            return method, props, body
        time.sleep(0.02)
    return None


def consume(conn, ch, queue: str, count: int, timeout: float = 10.0) -> list:
    """Consume ``count`` deliveries (no ack) from ``queue``; returns (method, body) pairs."""
    got = []
    tag = ch.basic_consume(queue, lambda c, m, p, body: got.append((m, body)))
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    ch.basic_cancel(tag)
    return got


def test_both_direct_ports_reach_different_routers(routers2):
    assert len({r.pid for r in routers2.routers}) == 2
    assert len({r.direct_port for r in routers2.routers}) == 2


def test_queue_declared_through_a_is_routed_through_b_at_once(a, b):
    cha, chb = a.channel(), b.channel()
    chb.confirm_delivery()
    for _ in range(20):             # the declare-ok and the publish race each other
        q = name("q")
        cha.queue_declare(q)
        chb.basic_publish("", q, b"x", mandatory=True)   # returned (312) if B did not know q
        assert cha.queue_declare(q, passive=True).method.message_count == 1
        cha.queue_delete(q)


def test_binding_made_through_a_routes_through_b_at_once(a, b):
    cha, chb = a.channel(), b.channel()
    chb.confirm_delivery()
    x = name("x")
    cha.exchange_declare(x, "direct")
    for i in range(20):
        q = name("q")
        cha.queue_declare(q)
        cha.queue_bind(q, x, f"k{i}")
        chb.basic_publish(x, f"k{i}", b"x", mandatory=True)
        assert cha.queue_declare(q, passive=True).method.message_count == 1
        cha.queue_delete(q)
    cha.exchange_delete(x)


def test_exchange_declared_through_a_is_known_to_b_at_once(a, b):
    cha, chb = a.channel(), b.channel()
    chb.confirm_delivery()
    for _ in range(20):
        x = name("x")
        cha.exchange_declare(x, "fanout")
        chb.basic_publish(x, "", b"x")   # 404 (channel closed) if B did not know x
        cha.exchange_delete(x)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            chb.basic_publish(x, "", b"x")   # and gone for B as soon as delete-ok came
        assert err.value.reply_code == 404
        chb = b.channel()
        chb.confirm_delivery()


def test_unroutable_mandatory_publish_through_b_is_returned(a, b):
    cha, chb = a.channel(), b.channel()
    chb.confirm_delivery()
    x = name("x")
    cha.exchange_declare(x, "direct")
    with pytest.raises(pika.exceptions.UnroutableError):
        chb.basic_publish(x, "nobody", b"x", mandatory=True)
    cha.exchange_delete(x)


def test_exclusive_queue_of_a_is_locked_for_b(a, b):
    cha = a.channel()
    q = name("excl")
    cha.queue_declare(q, exclusive=True)
    chb = b.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        chb.basic_consume(q, lambda *args: None)
    assert err.value.reply_code == 405


def test_single_active_consumer_spans_routers(a, b):
    cha, chb = a.channel(), b.channel()
    q = name("sac")
    cha.queue_declare(q, arguments={"x-single-active-consumer": True})
    got_a, got_b = [], []
    tag_a = cha.basic_consume(q, lambda c, m, p, body: got_a.append(body), auto_ack=True)
    chb.basic_consume(q, lambda c, m, p, body: got_b.append(body), auto_ack=True)
    for i in range(5):
        chb.basic_publish("", q, str(i).encode())
    pump(a, b, until=lambda: len(got_a) == 5)
    assert (len(got_a), got_b) == (5, [])
    cha.basic_cancel(tag_a)              # B's consumer becomes the active one
    chb.basic_publish("", q, b"after")
    pump(b, until=lambda: got_b)
    assert got_b == [b"after"]
    chb.queue_delete(q)


def test_consumer_priorities_span_routers(a, b):
    cha, chb = a.channel(), b.channel()
    q = name("prio")
    cha.queue_declare(q)
    low, high = [], []
    chb.basic_consume(q, lambda c, m, p, body: high.append(body), auto_ack=True,
                      arguments={"x-priority": 10})
    cha.basic_consume(q, lambda c, m, p, body: low.append(body), auto_ack=True,
                      arguments={"x-priority": 1})
    for i in range(10):
        chb.basic_publish("", q, str(i).encode())
    pump(a, b, until=lambda: len(high) == 10)
    a.process_data_events(time_limit=0.1)
    assert (len(high), low) == (10, [])
    cha.queue_delete(q)


def test_queue_deleted_through_b_cancels_the_consumer_on_a(a, b):
    cha, chb = a.channel(), b.channel()
    q = name("del")
    cha.queue_declare(q)
    cancelled = []
    cha.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = cha.basic_consume(q, lambda *args: None)
    assert chb.queue_delete(q).method.message_count == 0
    pump(a, until=lambda: cancelled)
    assert cancelled == [tag]


def test_exchange_deleted_through_b_is_gone_for_a_and_its_queue_consumer_stays(a, b):
    """RabbitMQ's exchange.delete removes the exchange and its bindings, not the bound queues'
    consumers: A's consumer keeps its queue, and A's next publish to the exchange is 404."""
    cha, chb = a.channel(), b.channel()
    x, q = name("xdel"), name("q")
    cha.exchange_declare(x, "fanout")
    cha.queue_declare(q)
    cha.queue_bind(q, x)
    got, cancelled = [], []
    cha.add_on_cancel_callback(lambda frame: cancelled.append(frame))
    cha.basic_consume(q, lambda c, m, p, body: got.append(body), auto_ack=True)
    cha.basic_publish(x, "", b"before")
    pump(a, until=lambda: got)
    chb.exchange_delete(x)
    pub = a.channel()
    pub.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        pub.basic_publish(x, "", b"after")
    assert err.value.reply_code == 404
    chb.basic_publish("", q, b"direct")
    pump(a, until=lambda: len(got) == 2)
    assert (got, cancelled) == ([b"before", b"direct"], [])
    chb.queue_delete(q)


def test_confirms_and_tx_through_either_router(a, b):
    cha, chb = a.channel(), b.channel()
    q = name("conf")
    cha.queue_declare(q, durable=True)
    cha.confirm_delivery()
    chb.confirm_delivery()
    cha.basic_publish("", q, b"via-a", pika.BasicProperties(delivery_mode=2))
    chb.basic_publish("", q, b"via-b", pika.BasicProperties(delivery_mode=2))
    tb = b.channel()
    tb.tx_select()
    tb.basic_publish("", q, b"tx-b")
    assert cha.queue_declare(q, passive=True).method.message_count == 2   # not committed
    tb.tx_commit()
    bodies = sorted(get_one(cha, q)[2] for _ in range(3))
    assert bodies == [b"tx-b", b"via-a", b"via-b"]
    cha.queue_delete(q)


def test_multiqueue_consumer_pool_holds_with_consumers_on_the_other_router(a, b, routers2):
    """An x-multiqueue consumer on A with prefetch 3 over two queues on two nodes never holds
    more than 3 unacked while B's consumers (prefetch 2 each) on the same queues take theirs;
    acking frees exactly what was acked."""
    q1, q2 = routers2.queue_on("node-0", "mq"), routers2.queue_on("node-1", "mq")
    cha, chb = a.channel(), b.channel()
    for q in (q1, q2):
        cha.queue_declare(q)
    cha.basic_qos(prefetch_count=3)
    chb.basic_qos(prefetch_count=2)
    got_a: list = []
    got_b: list = []
    cha.basic_consume(q1, lambda c, m, p, body: got_a.append(m),
                      arguments={"x-multiqueue": [q1, q2]})
    for q in (q1, q2):
        chb.basic_consume(q, lambda c, m, p, body: got_b.append(m))
    for i in range(40):
        chb.basic_publish("", (q1, q2)[i % 2], str(i).encode())

    def pump_until(done) -> None:
        deadline = time.monotonic() + 10
        while not done() and time.monotonic() < deadline:
            a.process_data_events(time_limit=0.02)
            b.process_data_events(time_limit=0.02)
            assert len(got_a) - acked_a[0] <= 3, "the multi-queue consumer exceeded its prefetch"
            assert len(got_b) <= 4, "B's consumers exceeded their prefetch"

    acked_a = [0]
    pump_until(lambda: len(got_a) == 3 and len(got_b) == 4)
    assert (len(got_a), len(got_b)) == (3, 4)
    left = sum(chb.queue_declare(q, passive=True).method.message_count for q in (q1, q2))
    assert left == 33
    cha.basic_ack(got_a[-1].delivery_tag, multiple=True)
    acked_a[0] = 3
    pump_until(lambda: len(got_a) == 6)
    assert len(got_a) == 6 and len({m.delivery_tag for m in got_a}) == 6
    for q in (q1, q2):
        chb.queue_delete(q)


def test_exclusive_queue_goes_when_its_router_is_killed(own_routers2):
    c = own_routers2
    a = connect(c.router_url(0))
    q = c.queue_on("node-1", "excl")     # node-0 may live in router-0 (--embed-node)
    a.channel().queue_declare(q, exclusive=True)
    c.kill_router(0)
    b = connect(c.router_url(1))
    deadline = time.monotonic() + 20
    while True:
        try:
            b.channel().queue_declare(q, passive=True)
            code = 200
        except pika.exceptions.ChannelClosedByBroker as err:
            code = err.reply_code
        if code == 404:
            break
        assert code == 405, f"passive declare of another connection's exclusive queue: {code}"
        assert time.monotonic() < deadline, "the dead router's exclusive queue is still there"
        time.sleep(0.2)
    b.close()


def test_unacked_deliveries_of_a_killed_router_come_back_redelivered(own_routers2):
    c = own_routers2
    a, b = connect(c.router_url(0)), connect(c.router_url(1))
    cha, chb = a.channel(), b.channel()
    q = c.queue_on("node-1", "redeliver")    # node-0 may live in router-0 (--embed-node)
    chb.queue_declare(q, durable=True)
    chb.confirm_delivery()
    for i in range(5):
        chb.basic_publish("", q, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    got = consume(a, cha, q, 5)          # unacked on router A
    assert len(got) == 5 and not any(m.redelivered for m, _ in got)
    c.kill_router(0)
    again = consume(b, chb, q, 5, timeout=20)
    assert sorted(body for _, body in again) == [str(i).encode() for i in range(5)]
    assert all(m.redelivered for m, _ in again)
    chb.queue_delete(q)
    b.close()


def test_a_killed_router_is_restarted_on_the_same_ports(own_routers2):
    c = own_routers2
    old = c.routers[0].pid
    c.kill_router(0)
    deadline = time.monotonic() + 30
    while True:
        info = json.loads((c.data_dir / "cluster.json").read_text())
        if info["routers"][0]["pid"] != old:
            break
        assert time.monotonic() < deadline, "router-0 was not restarted"
        time.sleep(0.2)
    assert info["routers"][0]["direct_port"] == c.routers[0].direct_port
    for url in (c.router_url(0), c.url):
        _declare_when_served(url, time.monotonic() + 30)     # the same ports serve again
    c.routers[0].pid = info["routers"][0]["pid"]
    c.stop()                                # Ctrl-C still stops every process, exit 0



def _declare_when_served(url: str, deadline: float) -> None:
    """Declare an exclusive queue through ``url``. With ``--embed-node``, node-0 died with
    router-0 and comes back with it: the other router answers 404 "node 'node-0' is down or
    unreachable" until its link has said HELLO to the new node-0, so that answer is retried
    (bounded); any other refusal fails the test."""
    while True:
        conn = connect(url)
        try:
            conn.channel().queue_declare(name("after"), exclusive=True)
            return
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != 404 or "is down or unreachable" not in exc.reply_text \
                    or time.monotonic() > deadline:
                raise
        finally:
            if conn.is_open:
                conn.close()
        time.sleep(0.2)


def _await_queue_gone(conn, q: str, why: str, timeout: float = 20.0) -> None:
    """Passive-declare ``q`` through ``conn`` until it answers 404 (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn.channel().queue_declare(q, passive=True)
        except pika.exceptions.ChannelClosedByBroker as err:
            if err.reply_code == 404:
                return
            assert err.reply_code == 405, f"passive declare of {q}: {err.reply_code}"
        assert time.monotonic() < deadline, why
        time.sleep(0.2)


def test_auto_delete_queue_goes_when_its_only_consumers_router_is_killed(own_routers2):
    c = own_routers2              # the queues on node-1: node-0 may live in router-0
    a, b = connect(c.router_url(0)), connect(c.router_url(1))
    gone, kept = c.queue_on("node-1", "ad"), c.queue_on("node-1", "ad")
    cha, chb = a.channel(), b.channel()
    for q in (gone, kept):
        chb.queue_declare(q, auto_delete=True)
        cha.basic_consume(q, lambda *args: None)
    chb.basic_consume(kept, lambda *args: None)      # kept has a consumer on B as well
    c.kill_router(0)
    _await_queue_gone(b, gone, "the dead router's consumer still holds the auto-delete queue")
    assert b.channel().queue_declare(kept, passive=True).method.consumer_count == 1
    b.close()


def test_a_killed_router_loses_no_confirmed_message(own_routers2):
    """A publisher with confirms on A is cut off by kill -9 mid-stream: every message it had
    a confirm for is in the queue, read through B (at most the one in flight is extra)."""
    c = own_routers2
    q = c.queue_on("node-1", "noloss")
    b = connect(c.router_url(1))
    b.channel().queue_declare(q, durable=True)
    a = connect(c.router_url(0))
    cha = a.channel()
    cha.confirm_delivery()
    confirmed: list[int] = []
    with pytest.raises(pika.exceptions.AMQPError):
        for i in range(100_000):
            cha.basic_publish("", q, str(i).encode(), pika.BasicProperties(delivery_mode=2))
            confirmed.append(i)
            if i == 300:
                c.kill_router(0)
    assert 300 <= len(confirmed) < 100_000
    chb = b.channel()
    held = chb.queue_declare(q, passive=True).method.message_count
    assert len(confirmed) <= held <= len(confirmed) + 1
    bodies = {int(body) for _, body in consume(b, chb, q, held)}
    assert set(confirmed) <= bodies
    b.close()
