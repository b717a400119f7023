"""Multi-queue consumers across shards (issue 4): ``x-multiqueue`` on basic.consume.

One consumer tag over queues that live on different node processes, one credit pool: the
number of unacknowledged deliveries never exceeds the prefetch, every queue is served, nothing
is delivered twice or lost, and a dead node cancels the consumer while the others keep working.
"""
import time

import pika
import pytest

pytestmark = pytest.mark.e2e

WAIT_S = 20.0


def _connect(cluster):
    return pika.BlockingConnection(pika.URLParameters(cluster.url))


def _fill(ch, queues, per_queue):
    for q in queues:
        ch.queue_declare(q)
        for i in range(per_queue):
            ch.basic_publish("", q, f"{q}:{i}".encode())


def _pump(conn, until, what, limit=WAIT_S):
    deadline = time.monotonic() + limit
    while not until():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        conn.process_data_events(time_limit=0.05)


@pytest.mark.parametrize("prefetch", [1, 10, 100])
def test_prefetch_is_exact_over_three_nodes(cluster3, prefetch):
    queues = cluster3.queues_on_distinct_nodes(3, f"mq{prefetch}")
    assert len({cluster3.owner(q) for q in queues}) == 3
    per_queue = max(3 * prefetch, 20)
    conn = _connect(cluster3)
    pub = conn.channel()
    pub.confirm_delivery()
    _fill(pub, queues, per_queue)

    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    pending = []          # delivery tags not yet acked
    bodies = []
    peak = [0]

    def on_message(c, method, props, body):
        assert not method.redelivered
        bodies.append(body)
        pending.append(method.delivery_tag)
        peak[0] = max(peak[0], len(pending))

    ch.basic_consume("", on_message, arguments={"x-multiqueue": queues})
    # Without acks, exactly `prefetch` deliveries arrive and then nothing more.
    _pump(conn, lambda: len(pending) >= prefetch, f"{prefetch} deliveries")
    conn.process_data_events(time_limit=1.0)
    assert len(pending) == prefetch, "more deliveries than the prefetch allows"

    # Ack one at a time, oldest first, interleaved with deliveries from all nodes.
    total = 3 * per_queue
    deadline = time.monotonic() + 60
    while len(bodies) < total or pending:
        assert time.monotonic() < deadline, f"only {len(bodies)} of {total} delivered"
        if pending:
            ch.basic_ack(pending.pop(0))
        conn.process_data_events(time_limit=0.01)
        assert len(pending) <= prefetch
    assert peak[0] == prefetch
    assert len(bodies) == len(set(bodies)) == total, "a message was lost or duplicated"
    for q in queues:  # each queue's own order is kept
        mine = [b for b in bodies if b.startswith(q.encode() + b":")]
        assert mine == [f"{q}:{i}".encode() for i in range(per_queue)]
    conn.close()


def test_a_multiqueue_consumer_takes_from_every_queue(cluster3):
    """DG5: with work on all three queues, the first deliveries come from all of them."""
    queues = cluster3.queues_on_distinct_nodes(3, "fair")
    conn = _connect(cluster3)
    pub = conn.channel()
    pub.confirm_delivery()
    _fill(pub, queues, 50)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=5)
    order = []

    def on_message(c, method, props, body):
        order.append(method.routing_key)
        c.basic_ack(method.delivery_tag)

    ch.basic_consume("", on_message, arguments={"x-multiqueue": queues})
    _pump(conn, lambda: len(order) == 150, "150 deliveries")
    first = order[:30]
    counts = {q: first.count(q) for q in queues}
    assert all(n >= 3 for n in counts.values()), f"unfair start: {counts}"
    conn.close()


def test_missing_queue_closes_the_channel_with_404_and_leaves_no_consumer(cluster3):
    queues = cluster3.queues_on_distinct_nodes(2, "part")
    conn = _connect(cluster3)
    ch = conn.channel()
    for q in queues:
        ch.queue_declare(q)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.basic_consume("", lambda *a: None,
                         arguments={"x-multiqueue": queues + ["no-such-queue-" + queues[0]]})
    assert exc.value.reply_code == 404
    ch = conn.channel()
    for q in queues:   # the parts that were registered were withdrawn again
        _pump(conn, lambda q=q: ch.queue_declare(q, passive=True).method.consumer_count == 0,
              f"no consumer left on {q}", limit=5)
    conn.close()


def test_bad_multiqueue_argument_is_406(cluster3):
    conn = _connect(cluster3)
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.basic_consume("", lambda *a: None, arguments={"x-multiqueue": "not-a-list"})
    assert exc.value.reply_code == 406
    conn.close()


def test_global_prefetch_covers_multiqueue_and_plain_consumers(cluster3):
    """global qos 4 over an x-multiqueue consumer (2 nodes) and a plain one (third node)."""
    q0, q1, q2 = cluster3.queues_on_distinct_nodes(3, "glob")
    conn = _connect(cluster3)
    pub = conn.channel()
    pub.confirm_delivery()
    _fill(pub, [q0, q1, q2], 20)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=4, global_qos=True)
    pending = []
    seen = []

    def on_message(c, method, props, body):
        pending.append(method.delivery_tag)
        seen.append(body)

    ch.basic_consume("", on_message, arguments={"x-multiqueue": [q0, q1]})
    ch.basic_consume(q2, on_message)
    _pump(conn, lambda: len(pending) >= 4, "4 deliveries")
    conn.process_data_events(time_limit=1.0)
    assert len(pending) == 4
    deadline = time.monotonic() + 60
    while len(seen) < 60 or pending:
        assert time.monotonic() < deadline, f"only {len(seen)} of 60 delivered"
        if pending:
            ch.basic_ack(pending.pop(0))
        conn.process_data_events(time_limit=0.01)
        assert len(pending) <= 4
    assert len(set(seen)) == 60
    conn.close()


@pytest.mark.parametrize("own_cluster", [3], indirect=True)
def test_node_death_cancels_the_multiqueue_consumer_and_others_go_on(own_cluster):
    cl = own_cluster
    q0, q1, q2 = (cl.queue_on(n, "mqkill") for n in ("node-0", "node-1", "node-2"))
    conn = _connect(cl)
    pub = conn.channel()
    pub.confirm_delivery()
    _fill(pub, [q0, q1, q2], 5)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    cancelled = []
    got = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume("", lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)),
                           arguments={"x-multiqueue": [q0, q1, q2]})
    _pump(conn, lambda: len(got) == 15, "the first 15 deliveries")
    cl.killed = True
    cl.kill_node("node-2")
    _pump(conn, lambda: cancelled, "basic.cancel after the node died")
    assert cancelled == [tag]
    # The surviving nodes keep serving: a new consumer over their queues gets new messages.
    pub.basic_publish("", q0, b"after-0")
    pub.basic_publish("", q1, b"after-1")
    later = []
    ch.basic_consume("", lambda c, m, p, b: (later.append(b), c.basic_ack(m.delivery_tag)),
                     arguments={"x-multiqueue": [q0, q1]})
    _pump(conn, lambda: sorted(later) == [b"after-0", b"after-1"], "deliveries after the kill")
    conn.close()


def test_priority_and_sorted_queues_keep_their_order_within_the_credit(cluster3):
    """DG7: a multi-queue consumer with prefetch 1 over a priority queue and a sorted queue
    on different nodes gets each queue's messages in that queue's order."""
    qp = cluster3.queue_on("node-0", "prio")
    qs = cluster3.queue_on("node-1", "sorted")
    conn = _connect(cluster3)
    pub = conn.channel()
    pub.confirm_delivery()
    pub.queue_declare(qp, arguments={"x-max-priority": 9})
    pub.queue_declare(qs, arguments={"qpid.queue_sort_key": "k"})
    for i, prio in enumerate([1, 9, 5, 9, 1]):
        pub.basic_publish("", qp, f"p{prio}-{i}".encode(), pika.BasicProperties(priority=prio))
    for k in ["d", "a", "c", "b"]:
        pub.basic_publish("", qs, k.encode(), pika.BasicProperties(headers={"k": k}))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    got = {qp: [], qs: []}

    def on_message(c, method, props, body):
        got[method.routing_key].append(body)
        c.basic_ack(method.delivery_tag)

    ch.basic_consume("", on_message, arguments={"x-multiqueue": [qp, qs]})
    _pump(conn, lambda: len(got[qp]) == 5 and len(got[qs]) == 4, "all 9 deliveries")
    assert got[qp] == [b"p9-1", b"p9-3", b"p5-2", b"p1-0", b"p1-4"]
    assert got[qs] == [b"a", b"b", b"c", b"d"]
    conn.close()


def test_a_browser_sees_every_message_while_a_multiqueue_consumer_takes_them(cluster3):
    """DG8: a browser (x-filter-no-consume) on a queue gets every message, in order, without
    removing any, while an acquiring multi-queue consumer spanning that queue takes them."""
    q0, q1 = cluster3.queues_on_distinct_nodes(2, "browse")
    conn = _connect(cluster3)
    pub = conn.channel()
    pub.confirm_delivery()
    for q in (q0, q1):
        pub.queue_declare(q)
    browser = conn.channel()
    browser.basic_qos(prefetch_count=100)
    seen = []
    browser.basic_consume(q0, lambda c, m, p, b: (seen.append(b), c.basic_ack(m.delivery_tag)),
                          arguments={"x-filter-no-consume": True})
    for i in range(20):
        pub.basic_publish("", q0, f"m{i}".encode())
    _pump(conn, lambda: len(seen) == 20, "the browser to see all 20")
    assert pub.queue_declare(q0, passive=True).method.message_count == 20
    taker = conn.channel()
    taker.basic_qos(prefetch_count=3)
    taken = []
    taker.basic_consume("", lambda c, m, p, b: (taken.append(b), c.basic_ack(m.delivery_tag)),
                        arguments={"x-multiqueue": [q0, q1]})
    _pump(conn, lambda: len(taken) == 20, "the consumer to take all 20")
    assert seen == taken == [f"m{i}".encode() for i in range(20)]
    conn.close()
