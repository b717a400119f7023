"""Delivery leases (docs/consumers.md, "Delivery leases"), as clients see them: while a queue
is empty with one consumer, its router delivers publishes itself and tells the node after.
Nothing a client can see may change: every message arrives once, in each channel's publish
order, across every way a lease ends (a mandatory publish, an expiration, no credit, a
second consumer, a publisher on another router, a requeue, a lost connection), and what is
acknowledged is gone. ``shoal_deliveries_leased_total`` shows the path was taken.
"""
from __future__ import annotations

import time
import uuid

import pika
import pytest

from tests.conftest import stop_cluster
from tests.e2e.management.test_management import call, http_cluster
from tests.e2e.management.test_metrics import scrape, value

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    """The module's cluster, with its Prometheus and management ports."""
    c = http_cluster(tmp_path_factory.mktemp("shoal-leases"), prom_port="SHOAL_PROMETHEUS_PORT",
                     mgmt_port="SHOAL_MANAGEMENT_PORT")
    yield c
    stop_cluster(c)


def connect(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url))


def pump(*conns, until, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        for c in conns:
            c.process_data_events(0.01)
    assert until(), "timed out"


def leased(cl) -> float:
    return value(scrape(cl)["shoal_deliveries_leased"], "_total")


def consumer(conn, queue: str, got: list, prefetch: int, ack_every: int = 1):
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    pending = []

    def on(ch_, method, props, body):
        got.append((body, method.redelivered))
        pending.append(method.delivery_tag)
        if len(pending) >= ack_every:
            ch_.basic_ack(pending[-1], multiple=True)
            pending.clear()
    tag = ch.basic_consume(queue, on)
    return ch, tag


class LentQueue:
    """A fresh queue with one consumer (``prefetch``, acking each delivery) and a publisher,
    each on its own connection: ``publish`` sends the next body ``m<N>``; ``until_lent``
    publishes one at a time until the router delivers under a lease."""

    def __init__(self, cl, name: str, prefetch: int) -> None:
        self.cl = cl
        self.q = f"{name}-{uuid.uuid4().hex[:10]}"
        self.pub, self.sub = connect(cl.url), connect(cl.url)
        self.pch = self.pub.channel()
        self.pch.queue_declare(self.q)
        self.got: list = []
        self.sent: list = []
        consumer(self.sub, self.q, self.got, prefetch=prefetch, ack_every=1)

    def publish(self, *args, **kwargs) -> None:
        self.sent.append(f"m{len(self.sent)}".encode())
        self.pch.basic_publish("", self.q, self.sent[-1], *args, **kwargs)

    def until_lent(self) -> None:
        before = leased(self.cl)
        deadline = time.monotonic() + 20
        while leased(self.cl) == before and time.monotonic() < deadline:
            self.publish()
            pump(self.pub, self.sub, until=lambda: len(self.got) == len(self.sent))
        assert leased(self.cl) > before, "the queue was never lent"

    def all_arrived_once_in_order(self) -> None:
        """Every message sent arrives once, in publish order, none redelivered, and nothing
        is left in the queue (which is then deleted)."""
        pump(self.pub, self.sub, until=lambda: len(self.got) >= len(self.sent))
        assert [b for b, _ in self.got] == self.sent
        assert not any(r for _, r in self.got)
        self.sub.close()
        assert self.pch.queue_declare(self.q, passive=True).method.message_count == 0
        self.pch.queue_delete(self.q)
        self.pub.close()


def test_every_message_arrives_once_in_order_as_leases_end_and_come_back(prom):
    """One at a time first, until the router delivers under a lease (the queue is empty
    between messages), then bursts in which mandatory publishes and expirations end it and
    the consumer falls behind: one channel's messages arrive once, in order."""
    lq = LentQueue(prom, "lease", prefetch=20)
    lq.until_lent()
    for i in range(len(lq.sent), len(lq.sent) + 3000):
        if i % 97 == 0:        # mandatory: answered by the node, so the lease ends first
            lq.publish(mandatory=True)
        elif i % 89 == 0:      # an expiration needs the queue's timers: through the node
            lq.publish(pika.BasicProperties(expiration="60000"))
        else:
            lq.publish()
        if i % 10 == 9:        # bursts; between them the consumer falls behind or not
            lq.sub.process_data_events(0)
    lq.all_arrived_once_in_order()


def test_a_lent_queue_whose_consumer_acks_at_once_counts_every_message_once(prom):
    """A consumer that acks each delivery at once mostly acks before the router has told
    the node of it: the router then sends the node a count (LEASE_ACKED), not the message.
    The management API's message_stats for the queue still count every message published,
    delivered and acknowledged once, as RabbitMQ's do, and none is left in the queue."""
    lq = LentQueue(prom, "lease-count", prefetch=50)
    lq.until_lent()
    for i in range(2000):
        lq.publish()
        if i % 5 == 4:
            lq.sub.process_data_events(0)
    pump(lq.pub, lq.sub, until=lambda: len(lq.got) >= len(lq.sent))
    n = len(lq.sent)
    want = {"publish": n, "deliver_get": n, "ack": n}

    def counted():
        stats = call(prom, "GET", f"/queues/%2F/{lq.q}")[1].get("message_stats", {})
        return {k: stats.get(k) for k in want}
    deadline = time.monotonic() + 20
    while counted() != want and time.monotonic() < deadline:
        lq.sub.process_data_events(0.1)
    assert counted() == want
    lq.all_arrived_once_in_order()


def test_a_consumer_behind_its_prefetch_gets_every_message_once_in_order(prom):
    """Bursts of 40 to a lent queue whose consumer has a prefetch of 3 and is read only
    between bursts: publishes wait at the router for its acks' credit, or, past the wait,
    go through the node (router/lease.py, ``WAIT_S``); either way each arrives once, in
    publish order, and nothing is left in the queue."""
    lq = LentQueue(prom, "lease-wait", prefetch=3)
    lq.until_lent()
    for burst in range(25):
        for _ in range(40):
            lq.publish()
        lq.pub.process_data_events(0)
        lq.sub.process_data_events(0.002 * (burst % 5))
    lq.all_arrived_once_in_order()


@pytest.mark.parametrize("where", ["one router", "two routers"])
def test_two_publishers_and_a_second_consumer_lose_and_repeat_nothing(prom, routers2, where):
    """Two publishers (the second through the other router, which has no lease), then a
    second consumer: each publisher's messages arrive once and in its order."""
    q = f"lease2-{uuid.uuid4().hex[:10]}"
    url = (lambda i: prom.url) if where == "one router" else routers2.router_url
    a, b, sub, sub2 = connect(url(0)), connect(url(1)), connect(url(0)), connect(url(1))
    ach, bch = a.channel(), b.channel()
    ach.queue_declare(q)
    got: list = []
    consumer(sub, q, got, prefetch=50)
    sub.process_data_events(0.2)
    for i in range(1000):
        ach.basic_publish("", q, f"a{i}".encode())
        if i % 3 == 0:
            bch.basic_publish("", q, f"b{i}".encode())
        if i == 500:
            got2: list = []
            consumer(sub2, q, got2, prefetch=50)
        if i % 20 == 19:
            sub.process_data_events(0)
            if i > 500:
                sub2.process_data_events(0)
    total = 1000 + len(range(0, 1000, 3))
    pump(a, b, sub, sub2, until=lambda: len(got) + len(got2) >= total)
    everything = [x for x, _ in got + got2]
    assert sorted(everything) == sorted([f"a{i}".encode() for i in range(1000)]
                                        + [f"b{i}".encode() for i in range(0, 1000, 3)])
    for received in (got, got2):
        for p in (b"a", b"b"):
            mine = [int(x[1:]) for x, _ in received if x[:1] == p]
            assert mine == sorted(mine)
    for c in (a, b, sub, sub2):
        c.close()


def test_requeued_and_unacked_leased_deliveries_come_back(prom):
    q = f"lease3-{uuid.uuid4().hex[:10]}"
    pub, sub = connect(prom.url), connect(prom.url)
    pch = pub.channel()
    pch.queue_declare(q)
    sch = sub.channel()
    sch.basic_qos(prefetch_count=10)
    got: list = []
    sch.basic_consume(q, lambda ch, m, p, body: got.append((m.delivery_tag, body)))
    sub.process_data_events(0.2)
    for i in range(5):
        pch.basic_publish("", q, f"m{i}".encode())
    pump(pub, sub, until=lambda: len(got) >= 5)
    sch.basic_nack(got[0][0], requeue=True)
    pump(pub, sub, until=lambda: len(got) >= 6)
    assert got[5][1] == b"m0"
    sub.close()                               # m1..m4 and m0 unacked: back to the queue
    again = connect(prom.url)
    ach = again.channel()
    back: list = []
    ach.basic_consume(q, lambda ch, m, p, body: back.append((body, m.redelivered)),
                      auto_ack=True)
    pump(pub, again, until=lambda: len(back) >= 5)
    assert [b for b, _ in back] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert all(r for _, r in back)
    pch.queue_delete(q)
    for c in (pub, again):
        c.close()


def test_a_fanout_delivers_under_each_queues_lease_once_in_order(prom):
    """A publish to several queues (a fanout to three) goes under the lease of each queue
    that has one and through the node for the others: every queue's consumer gets every
    message once, in publish order, as mandatory publishes end the leases and they come
    back."""
    ex = f"lease-fan-{uuid.uuid4().hex[:8]}"
    qs = [f"{ex}-{i}" for i in range(3)]
    pub, sub = connect(prom.url), connect(prom.url)
    pch = pub.channel()
    pch.exchange_declare(ex, "fanout")
    got: dict[str, list] = {q: [] for q in qs}
    for q in qs:
        pch.queue_declare(q)
        pch.queue_bind(q, ex)
        consumer(sub, q, got[q], prefetch=20)
    before = leased(prom)
    sent: list = []

    def all_got():
        return all(len(g) == len(sent) for g in got.values())
    deadline = time.monotonic() + 20
    while leased(prom) < before + 3 and time.monotonic() < deadline:
        sent.append(f"m{len(sent)}".encode())
        pch.basic_publish(ex, "", sent[-1])
        pump(pub, sub, until=all_got)
    assert leased(prom) >= before + 3, "the fanout's queues were never lent"
    for i in range(len(sent), len(sent) + 1500):
        body = f"m{i}".encode()
        pch.basic_publish(ex, "", body, mandatory=(i % 97 == 0))   # mandatory: the node's
        sent.append(body)
        if i % 10 == 9:
            sub.process_data_events(0)
    pump(pub, sub, until=all_got)
    for q in qs:
        assert [b for b, _ in got[q]] == sent, q
        assert not any(r for _, r in got[q])
    sub.close()
    for q in qs:
        assert pch.queue_declare(q, passive=True).method.message_count == 0
        pch.queue_delete(q)
    pch.exchange_delete(ex)
    pub.close()


@pytest.mark.parametrize("durable", [False, True], ids=["transient", "persistent"])
def test_a_work_queue_with_confirms_is_lent_to_its_consumers_and_loses_nothing(prom, durable):
    """Three consumers on one router and a publisher waiting for each confirm, already
    publishing when the consumers come (the lease is taken while its PUBLISHes are on their
    way: LEASE_TAKE): the router delivers under the lease, round robin, every publish is
    confirmed, and every message arrives once, each consumer's in publish order."""
    q = f"lease-work-{uuid.uuid4().hex[:10]}"
    pub = connect(prom.url)
    pch = pub.channel()
    pch.queue_declare(q, durable=durable)
    pch.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2 if durable else 1)
    sent: list = []

    def send(n):
        for _ in range(n):
            sent.append(f"m{len(sent)}".encode())
            pch.basic_publish("", q, sent[-1], props)   # raises if nacked or returned
    send(50)                                        # a backlog: no lease yet
    subs = [connect(prom.url) for _ in range(3)]
    got: list[list] = [[] for _ in subs]
    for conn, g in zip(subs, got):
        consumer(conn, q, g, prefetch=20)
    before = leased(prom)
    deadline = time.monotonic() + 30
    while leased(prom) < before + 100 and time.monotonic() < deadline:
        send(20)
        for conn in subs:
            conn.process_data_events(0)
    assert leased(prom) >= before + 100, "the work queue was never lent"
    send(300)
    pump(pub, *subs, until=lambda: sum(map(len, got)) >= len(sent))
    everything = [b for g in got for b, _ in g]
    assert sorted(everything) == sorted(sent) and len(everything) == len(sent)
    for g in got:
        assert g, "a consumer got nothing: not round robin"
        mine = [int(b[1:]) for b, _ in g]
        assert mine == sorted(mine)
    for conn in subs:
        conn.close()
    assert pch.queue_declare(q, passive=True).method.message_count == 0
    pch.queue_delete(q)
    pub.close()
