"""The Qpid queue model over AMQP 1.0 (issue 37): queues declared with pika (docs/queues.md's
arguments), messages sent and received with proton: priority queues, last-value queues,
message groups, a JMS selector on the receiving link (source filter
``apache.org:selector-filter:string``), per-message TTL, dead-lettering on reject, and a
multi-queue consumer (link property ``x-multiqueue``)."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("proton", reason="python-qpid-proton is not installed "
                    "(pip install -e '.[test]')")

from proton import Delivery, Described, Message, symbol  # noqa: E402
from proton.reactor import Filter, Selector  # noqa: E402

from .helpers import (TIMEOUT, LinkProperties, body, declare, pika_get_all,  # noqa: E402
                      proton_conn, queue_addr, ready_count, receive_n, receive_none, recv,
                      send)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SELECTOR_DESCRIPTOR = symbol("apache.org:selector-filter:string")


def m(b: bytes, **kw) -> Message:
    return Message(body=b, inferred=True, **kw)


def test_priority_queue_delivers_higher_priority_first(cluster, names):
    q = declare(cluster, names(), {"x-max-priority": 10})
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), m(b"low", priority=1), m(b"high", priority=9),
             m(b"mid", priority=5))
        rcv = recv(c, queue_addr(q), credit=10)
        got = [body(x) for x in receive_n(rcv, 3)]
    assert got == [b"high", b"mid", b"low"]


def test_last_value_queue_keeps_the_newest_per_key(cluster, names):
    q = declare(cluster, names(), {"qpid.last_value_queue_key": "ISIN"})
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), m(b"A1", properties={"ISIN": "A"}),
             m(b"B1", properties={"ISIN": "B"}), m(b"A2", properties={"ISIN": "A"}),
             m(b"none"))
        assert ready_count(cluster, q) == 3
        rcv = recv(c, queue_addr(q), credit=10)
        got = sorted(body(x) for x in receive_n(rcv, 3))
        assert receive_none(rcv, 0.5)
    assert got == [b"A2", b"B1", b"none"]


def test_message_groups_stick_to_one_receiver(cluster, names):
    q = declare(cluster, names(), {"qpid.group_header_key": "order"})
    with proton_conn(cluster) as c:
        r1 = recv(c, queue_addr(q), credit=20)
        r2 = recv(c, queue_addr(q), credit=20)
        send(c, queue_addr(q), *[m(f"{g}-{i}".encode(), properties={"order": g})
                                 for i in range(3) for g in ("g1", "g2", "g3")])
        c.wait(lambda: r1.fetcher.has_message + r2.fetcher.has_message == 9, timeout=TIMEOUT)
        seen: dict[str, set[int]] = {}
        for i, r in enumerate((r1, r2)):
            while r.fetcher.has_message:
                msg = r.fetcher.pop()
                seen.setdefault(msg.properties["order"], set()).add(i)
                r.accept()
    assert sorted(seen) == ["g1", "g2", "g3"]
    assert all(len(who) == 1 for who in seen.values()), seen


def test_jms_selector_filters_the_receiving_link(cluster, names):
    q = declare(cluster, names())
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), m(b"r1", properties={"colour": "red"}),
             m(b"b1", properties={"colour": "blue"}), m(b"r2", properties={"colour": "red"}))
        rcv = recv(c, queue_addr(q), credit=10, options=Selector("colour = 'red'"))
        assert [body(x) for x in receive_n(rcv, 2)] == [b"r1", b"r2"]
        assert receive_none(rcv, 0.5)
    assert [b for _, b in pika_get_all(cluster, q)] == [b"b1"]


def test_jms_selector_under_the_jms_selector_key(cluster, names):
    """The filter key is free: Qpid JMS sends ``jms-selector``."""
    q = declare(cluster, names())
    flt = Filter({symbol("jms-selector"): Described(SELECTOR_DESCRIPTOR, "n > 1")})
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), *[m(str(i).encode(), properties={"n": i}) for i in range(4)])
        rcv = recv(c, queue_addr(q), credit=10, options=flt)
        assert [body(x) for x in receive_n(rcv, 2)] == [b"2", b"3"]
    assert ready_count(cluster, q) == 2


def test_per_message_ttl_expires(cluster, names):
    q = declare(cluster, names())
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), m(b"short", ttl=0.05), m(b"kept"))
        time.sleep(0.5)                          # the short one's ttl (50 ms) is over
        rcv = recv(c, queue_addr(q), credit=10)
        assert [body(x) for x in receive_n(rcv, 1)] == [b"kept"]
        assert receive_none(rcv, 0.5)


def test_expired_message_is_dead_lettered(cluster, names):
    q, dlq = names(), names("dlq")
    declare(cluster, dlq)
    declare(cluster, q, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), m(b"late", ttl=0.05))
        time.sleep(0.5)
        assert ready_count(cluster, q) == 0
        rcv = recv(c, queue_addr(dlq), credit=1)
        assert body(rcv.receive(timeout=TIMEOUT)) == b"late"
        rcv.accept()


def test_reject_dead_letters_with_x_death(cluster, names):
    q, dlq = names(), names("dlq")
    declare(cluster, dlq)
    declare(cluster, q, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), m(b"no", properties={"k": "v"}))
        rcv = recv(c, queue_addr(q), credit=1)
        rcv.receive(timeout=TIMEOUT)
        rcv.reject()
    props, got = pika_get_all(cluster, dlq)[0]
    assert got == b"no" and props.headers["k"] == "v"
    death = props.headers["x-death"][0]
    assert death["reason"] == "rejected" and death["queue"] == q


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_drain_on_a_multi_queue_link_empties_every_queue(cluster, names, queue_type):
    """Issue 45: a drain uses the link's credit on every queue in turn (5 + 1 messages, credit
    6: all six), not an even split of it (3 + 3: four, and two credits back unused)."""
    args = {"x-queue-type": queue_type}
    q1 = declare(cluster, names(), args, durable=True)
    q2 = declare(cluster, names(), args, durable=True)
    with proton_conn(cluster) as c:
        send(c, queue_addr(q1), *[m(f"a{i}".encode()) for i in range(5)])
        send(c, queue_addr(q2), m(b"b0"))
        rcv = recv(c, queue_addr(q1), credit=0,
                   options=LinkProperties({"x-multiqueue": [q1, q2]}))
        rcv.link.drain(6)
        c.wait(lambda: rcv.link.credit == 0, timeout=TIMEOUT)   # the drain's answer
        got = sorted(body(rcv.fetcher.pop()) for _ in range(rcv.fetcher.has_message))
        for _ in got:
            rcv.settle(Delivery.ACCEPTED)
    assert got == [b"a0", b"a1", b"a2", b"a3", b"a4", b"b0"]
    assert ready_count(cluster, q1) == 0 and ready_count(cluster, q2) == 0


def test_multi_queue_consumer_via_x_multiqueue(cluster, names):
    q1, q2 = declare(cluster, names()), declare(cluster, names())
    with proton_conn(cluster) as c:
        send(c, queue_addr(q1), m(b"from-q1"))
        send(c, queue_addr(q2), m(b"from-q2"))
        rcv = recv(c, queue_addr(q1), credit=10,
                   options=LinkProperties({"x-multiqueue": [q1, q2]}))
        got = sorted(body(x) for x in receive_n(rcv, 2))
    assert got == [b"from-q1", b"from-q2"]
    assert ready_count(cluster, q1) == 0 and ready_count(cluster, q2) == 0


def test_consumer_priority_link_property(cluster, names):
    """rabbitmq:priority -> x-priority: the higher-priority receiver with credit gets all."""
    q = declare(cluster, names())
    with proton_conn(cluster) as c:
        low = recv(c, queue_addr(q), credit=10, options=LinkProperties({"rabbitmq:priority": 1}))
        high = recv(c, queue_addr(q), credit=10,
                    options=LinkProperties({"rabbitmq:priority": 5}))
        send(c, queue_addr(q), m(b"1"), m(b"2"), m(b"3"))
        c.wait(lambda: high.fetcher.has_message + low.fetcher.has_message == 3,
               timeout=TIMEOUT)
        assert (high.fetcher.has_message, low.fetcher.has_message) == (3, 0)
        for _ in range(3):
            high.fetcher.pop()
            high.settle(Delivery.ACCEPTED)
