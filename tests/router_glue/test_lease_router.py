"""Delivery leases, the router's side (router/lease.py): which grants it takes, which
publishes it delivers itself, and what it tells the node, in which order."""
from __future__ import annotations

from types import SimpleNamespace

from shoal.router.consumers import Consumer, ConsumerTarget, CreditPool
from shoal.router.lease import Leases
from shoal.shared.wire import T

PLAIN = b"\x00\x3c\x00\x00" + bytes(8) + b"\x00\x00"       # no properties
EXPIRING = b"\x00\x3c\x00\x00" + bytes(8) + b"\x01\x00" + b"\x0560000"


class FakeLink:
    def __init__(self):
        self.node_id = "node-0"
        self.publishes = 0
        self.leases = 0
        self.records: list = []

    def send_record(self, msg, now=False):
        self.records.append((msg[0], msg[1], now))


class FakeChannel:
    def __init__(self):
        self.vhost = "/"
        self.closed = False
        self.pool = CreditPool(prefetch_count=10)
        self.client = SimpleNamespace(owner="r1/c1")
        self.delivered: list = []

    def deliver(self, c, did, redelivered, exchange, routing_key, header, body):
        self.delivered.append((did, body))


def setup(queues=("q",)):
    link = FakeLink()
    ch = FakeChannel()
    t = ConsumerTarget("ctag", 1, "/", False)
    for i, q in enumerate(queues):
        t.consumers.append(Consumer(7 + i, q, "node-0", t, granted=5))
    broker = SimpleNamespace(consumers={c.consumer_id: (ch, c) for c in t.consumers},
                             links={"node-0": link}, stats={"routed": 0, "delivered": 0,
                                                            "leased": 0},
                             mark_dirty=lambda client: None,
                             delivery_failed=lambda *a: None)
    return Leases(broker), link, ch, t


def publish(body, header=PLAIN):
    return SimpleNamespace(exchange="", routing_key="q", header=header, body=body)


def test_a_grant_is_taken_and_publishes_are_delivered_then_recorded():
    leases, link, ch, t = setup()
    leases.on_grant(link, 7, 0)
    assert leases.holds(t.consumers[0]) and link.leases == 1 and link.records == []
    assert leases.deliver(ch, publish(b"a"), "q") and leases.deliver(ch, publish(b"b"), "q")
    assert ch.delivered == [(-1, b"a"), (-2, b"b")]
    assert link.records == [(T.LEASED, 7, False), (T.LEASED, 7, False)]
    assert leases._broker.stats["leased"] == 2


def test_a_grant_is_declined_when_publishes_the_node_had_not_seen_were_sent():
    leases, link, ch, t = setup()
    link.publishes = 3
    leases.on_grant(link, 7, 2)
    assert not leases.holds(t.consumers[0])
    assert link.records == [(T.LEASE_END, 7, True)]
    assert not leases.deliver(ch, publish(b"a"), "q")


def test_a_multi_queue_consumer_or_a_gone_one_declines():
    leases, link, ch, t = setup(queues=("q", "q2"))
    leases.on_grant(link, 7, 0)
    leases.on_grant(link, 99, 0)
    assert link.records == [(T.LEASE_END, 7, True), (T.LEASE_END, 99, True)]


def test_no_credit_an_expiration_or_another_route_ends_the_lease_first():
    for case in ("no credit", "expiration", "through the node"):
        leases, link, ch, t = setup()
        leases.on_grant(link, 7, 0)
        if case == "no credit":
            t.consumers[0].granted = 0
            assert not leases.deliver(ch, publish(b"a"), "q")
        elif case == "expiration":
            assert not leases.deliver(ch, publish(b"a", EXPIRING), "q")
        else:
            leases.end_for("/", {"q", "other"})
        assert link.records == [(T.LEASE_END, 7, False)], case
        assert not leases.holds(t.consumers[0]) and link.leases == 0 and not leases.held


def test_a_revoke_is_answered_at_once_and_a_cancel_forgets_quietly():
    leases, link, ch, t = setup()
    leases.on_grant(link, 7, 0)
    leases.on_revoke(link, 7)
    leases.on_revoke(link, 7)                     # already returned: nothing more
    assert link.records == [(T.LEASE_END, 7, True)]
    leases.on_grant(link, 7, 0)
    leases.forget(t)
    assert link.records == [(T.LEASE_END, 7, True)] and not leases.held
