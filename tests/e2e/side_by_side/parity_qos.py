"""Parity scenarios (see :mod:`.parity`): ``basic.qos`` set or changed while consumers run
(spec 1.8.3.13; RabbitMQ's channel limiter for ``global``, the consumer's own prefetch
otherwise). pika only."""
from __future__ import annotations

import time

from .parity import Rec, scenario


def _pump(c, done, limit: float = 3.0) -> None:
    """Process ``c``'s events until ``done()`` or ``limit`` s (a wait for what must not
    come ends at the limit)."""
    deadline = time.monotonic() + limit
    while not done() and time.monotonic() < deadline:
        c.process_data_events(0.05)


def _acking(counts: dict, key: str):
    """A pika delivery callback that counts under ``key`` and acks at once."""
    def deliver(chan, m, _p, _b):
        counts[key] += 1
        chan.basic_ack(m.delivery_tag)
    return deliver


@scenario
def global_qos_after_consume(rec: Rec) -> None:
    """A channel's ``global`` prefetch set after ``basic.consume`` holds its consumers from
    then on: 1 of 3 messages, the next after an ack (the RabbitMQ Java client's
    ``QosTests.setLimitAfterConsume``); set with a delivery unacked, it counts that one
    (``limitInheritsUnackedCount``); on two channels, each its own
    (``limitingMultipleChannels``). Shoal's consumers kept the credit granted before the
    limit and got all 3."""
    c = rec.conn()
    pub = c.channel()
    ch = c.channel()
    q = rec.q("gqos")
    ch.queue_declare(q)
    got: list[int] = []
    ch.basic_consume(q, lambda _c, m, _p, _b: got.append(m.delivery_tag))
    ch.basic_qos(prefetch_count=1, global_qos=True)
    for i in range(3):
        pub.basic_publish("", q, b"m%d" % i)
    _pump(c, lambda: len(got) > 1, 1.0)
    rec.add("limit 1, 3 published: delivered", len(got))
    ch.basic_ack(got[-1], multiple=True)
    _pump(c, lambda: len(got) > 2, 1.0)
    rec.add("after an ack: delivered", len(got))

    ch2 = c.channel()
    q2 = rec.q("gqos-unacked")
    ch2.queue_declare(q2)
    got2: list[int] = []
    ch2.basic_consume(q2, lambda _c, m, _p, _b: got2.append(m.delivery_tag))
    pub.basic_publish("", q2, b"first")
    _pump(c, lambda: len(got2) >= 1)
    ch2.basic_qos(prefetch_count=2, global_qos=True)
    for _ in range(2):
        pub.basic_publish("", q2, b"more")
    _pump(c, lambda: len(got2) > 2, 1.0)
    rec.add("limit 2 with 1 unacked, 2 more published: delivered", len(got2))

    chans = [c.channel(), c.channel()]
    qs = [rec.q("gqos-a"), rec.q("gqos-b")]
    counts = [[], []]
    for i, (x, qn) in enumerate(zip(chans, qs)):
        x.queue_declare(qn)
    for i, x in enumerate(chans):       # each channel consumes from both queues
        for qn in qs:
            x.basic_consume(qn, lambda _c, m, _p, _b, i=i: counts[i].append(m.delivery_tag))
        x.basic_qos(prefetch_count=1, global_qos=True)
    for qn in qs:
        for _ in range(5):
            pub.basic_publish("", qn, b"x")
    _pump(c, lambda: len(counts[0]) + len(counts[1]) > 2, 1.0)
    rec.add("two channels, limit 1 each: delivered", sorted(len(n) for n in counts))
    c.close()


@scenario
def global_qos_fairness(rec: Rec) -> None:
    """Under a channel's ``global`` prefetch of 1 the channel's consumer tags are served in
    turn: two tags on one queue, and one tag on each of three queues, every delivery acked
    as it comes (the RabbitMQ Java client's QosTests.singleChannelAndQueueFairness and
    fairness). Shoal gave every delivery to the first tag."""
    c = rec.conn()
    pub = c.channel()
    ch = c.channel()
    ch.basic_qos(prefetch_count=1, global_qos=True)
    q = rec.q("fair")
    ch.queue_declare(q)
    counts = {"c1": 0, "c2": 0}
    for tag in counts:
        ch.basic_consume(q, _acking(counts, tag), consumer_tag=tag)
    for _ in range(10):
        pub.basic_publish("", q, b"x")
    _pump(c, lambda: sum(counts.values()) >= 10)
    rec.add("two tags on one queue: all delivered", sum(counts.values()),
            "each served", all(counts.values()))

    ch3 = c.channel()
    ch3.basic_qos(prefetch_count=1, global_qos=True)
    qs = [rec.q(f"fair-{i}") for i in range(3)]
    got = {qn: 0 for qn in qs}
    for qn in qs:
        ch3.queue_declare(qn)
        for _ in range(30):
            pub.basic_publish("", qn, b"y")
    for qn in qs:
        ch3.basic_consume(qn, _acking(got, qn))
    _pump(c, lambda: sum(got.values()) >= 30)
    ch3.close()
    rec.add("three queues, 30 deliveries: every queue served", all(got.values()))
    c.close()


@scenario
def global_qos_with_a_no_ack_consumer(rec: Rec) -> None:
    """A ``no_ack`` consumer on a channel with a ``global`` limit: RabbitMQ's limiter lets it
    have a delivery only while the limit is not reached, and its deliveries do not count
    toward it (the Java client's ``QosTests.noAckObeysLimit``); the channel's consumer that
    acks is served within the limit beside it. Shoal gave the no_ack consumer standing
    credit that counted against the limit, and the other consumer had nothing after it."""
    c = rec.conn()
    pub = c.channel()
    ch = c.channel()
    ch.basic_qos(prefetch_count=1, global_qos=True)
    q1, q2 = rec.q("gna-ack"), rec.q("gna-noack")
    for q in (q1, q2):
        ch.queue_declare(q)
    acking: list = []
    free: list = []
    ch.basic_consume(q1, lambda _c, m, _p, b: acking.append((m.delivery_tag, b)))
    pub.basic_publish("", q1, b"a1")
    _pump(c, lambda: len(acking) >= 1)
    ch.basic_consume(q2, lambda _c, m, _p, b: free.append(b), auto_ack=True)
    pub.basic_publish("", q2, b"n1")
    _pump(c, lambda: len(free) >= 1, 1.0)
    rec.add("a1 unacked, n1 published: no_ack got", free[:])
    ch.basic_ack(acking[0][0])
    pub.basic_publish("", q2, b"n2")
    pub.basic_publish("", q2, b"n3")
    _pump(c, lambda: len(free) >= 3)
    rec.add("a1 acked, n2 n3 published: no_ack got", free[:])
    pub.basic_publish("", q1, b"a2")
    _pump(c, lambda: len(acking) >= 2)
    rec.add("a2 published: acking got", [b for _, b in acking])
    pub.basic_publish("", q2, b"n4")
    _pump(c, lambda: len(free) >= 4, 1.0)
    rec.add("a2 unacked, n4 published: no_ack got", free[:])
    if len(acking) >= 2:
        ch.basic_ack(acking[1][0])
    _pump(c, lambda: len(free) >= 4)
    rec.add("a2 acked: no_ack got", free[:])
    c.close()
