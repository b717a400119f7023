"""Consumer-side delivery rules with real clients (issue 3): consumer priorities, single
active consumer, browsers, JMS selectors (consume and bind), message groups, consumer timeout,
no_local. These need ``basic.consume`` arguments, which the shared adapters do not take, so
they drive pika directly (plus py-amqp, kombu's transport, for no_local).
"""
from __future__ import annotations

import time

import amqp
import pika
import pytest

pytestmark = pytest.mark.e2e


@pytest.fixture
def chan(cluster):
    """``chan()`` -> a new pika BlockingChannel on its own connection (closed after)."""
    conns = []

    def make():
        conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
        conns.append(conn)
        ch = conn.channel()
        ch.confirm_delivery()
        return ch
    yield make
    for conn in conns:
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - already closed by the broker in some tests
            pass


class Got:
    """A pika consumer callback that records (body, method, properties)."""

    def __init__(self, ack: bool = False) -> None:
        self.items: list = []
        self.ack = ack

    def __call__(self, ch, method, props, body) -> None:
        self.items.append((body, method, props))
        if self.ack:
            ch.basic_ack(method.delivery_tag)

    @property
    def bodies(self) -> list[bytes]:
        return [b for b, _, _ in self.items]


def pump(ch, until=lambda: False, seconds: float = 10.0) -> None:
    """Process events until ``until()`` or ``seconds`` passed."""
    deadline = time.monotonic() + seconds
    while not until() and time.monotonic() < deadline:
        ch.connection.process_data_events(time_limit=0.05)


def publish(ch, q: str, bodies, headers=None, **props) -> None:
    for b in bodies:
        ch.basic_publish("", q, b, pika.BasicProperties(headers=headers, **props))


def fresh(ch, names, prefix: str, **args) -> str:
    q = names(prefix)
    ch.queue_declare(q, arguments=args or None)
    return q


# ---- consumer priorities and single active consumer ---------------------------------------
def test_higher_priority_consumer_gets_messages_while_it_has_credit(chan, names):
    ch = chan()
    q = fresh(ch, names, "cprio")
    ch.basic_qos(prefetch_count=2)
    low, high = Got(), Got()
    ch.basic_consume(q, low, arguments={"x-priority": 0})
    ch.basic_consume(q, high, arguments={"x-priority": 10})
    publish(ch, q, [b"%d" % i for i in range(5)])
    pump(ch, lambda: len(low.items) + len(high.items) >= 4)
    assert high.bodies == [b"0", b"1"]        # until its prefetch (credit) is used up
    assert low.bodies == [b"2", b"3"]


def test_bad_x_priority_is_406(chan, names):
    ch = chan()
    q = fresh(ch, names, "cprio")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.basic_consume(q, Got(), arguments={"x-priority": "high"})
    assert e.value.reply_code == 406 and "x-priority" in e.value.reply_text


def test_single_active_consumer(chan, names):
    ch = chan()
    q = fresh(ch, names, "sac", **{"x-single-active-consumer": True})
    first, second = Got(ack=True), Got(ack=True)
    t1 = ch.basic_consume(q, first)
    ch.basic_consume(q, second)
    publish(ch, q, [b"a", b"b", b"c"])
    pump(ch, lambda: len(first.items) == 3)
    ch.basic_cancel(t1)
    publish(ch, q, [b"d"])
    pump(ch, lambda: second.items)
    assert first.bodies == [b"a", b"b", b"c"] and second.bodies == [b"d"]


# ---- browsers -----------------------------------------------------------------------------
def test_browser_sees_everything_and_removes_nothing(chan, names):
    ch = chan()
    q = fresh(ch, names, "browse")
    publish(ch, q, [b"1", b"2", b"3"])
    seen = Got(ack=True)
    ch.basic_consume(q, seen, arguments={"x-filter-no-consume": True})
    pump(ch, lambda: len(seen.items) == 3)
    publish(ch, q, [b"4"])                      # browsers are always notified
    pump(ch, lambda: len(seen.items) == 4)
    assert seen.bodies == [b"1", b"2", b"3", b"4"]
    assert ch.queue_declare(q, passive=True).method.message_count == 4


def test_browser_auto_close_cancels_at_the_end(chan, names):
    ch = chan()
    q = fresh(ch, names, "browse")
    publish(ch, q, [b"1", b"2"])
    seen, cancelled = Got(ack=True), []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume(q, seen, arguments={"x-filter-no-consume": True,
                                               "x-filter-auto-close": True})
    pump(ch, lambda: cancelled)
    assert seen.bodies == [b"1", b"2"] and cancelled == [tag]
    assert ch.queue_declare(q, passive=True).method.message_count == 2


# ---- selectors ----------------------------------------------------------------------------
def test_consumer_selector_takes_only_matching_messages(chan, names):
    ch = chan()
    q = fresh(ch, names, "sel")
    red = Got(ack=True)
    ch.basic_consume(q, red, arguments={
        "x-filter-jms-selector": "color = 'red' AND size BETWEEN 1 AND 10"})
    for color, size in [("red", 5), ("blue", 5), ("red", 50), ("red", 1)]:
        publish(ch, q, [f"{color}{size}".encode()], headers={"color": color, "size": size})
    pump(ch, lambda: len(red.items) == 2)
    pump(ch, seconds=0.3)                       # nothing else arrives
    assert red.bodies == [b"red5", b"red1"]
    assert ch.queue_declare(q, passive=True).method.message_count == 2   # others stay


def test_selector_on_jms_fields(chan, names):
    ch = chan()
    q = fresh(ch, names, "sel")
    got = Got(ack=True)
    ch.basic_consume(q, got, arguments={"x-filter-jms-selector":
                                        "JMSPriority > 5 OR JMSType LIKE 'ord%'"})
    publish(ch, q, [b"p9"], priority=9)
    publish(ch, q, [b"p1"], priority=1)
    publish(ch, q, [b"order"], type="order.created")
    pump(ch, lambda: len(got.items) == 2)
    assert got.bodies == [b"p9", b"order"]


def test_invalid_consume_selector_is_406_naming_the_position(chan, names):
    ch = chan()
    q = fresh(ch, names, "sel")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.basic_consume(q, Got(), arguments={"x-filter-jms-selector": "color == 'red'"})
    assert e.value.reply_code == 406 and "position 8" in e.value.reply_text


@pytest.mark.parametrize("ex_type,key", [("fanout", ""), ("direct", "k"), ("topic", "a.*")])
def test_binding_selector_filters_routing(chan, names, ex_type, key):
    ch = chan()
    ex, qa, qb = names("ex"), names("qa"), names("qb")
    ch.exchange_declare(ex, ex_type)
    ch.queue_declare(qa)
    ch.queue_declare(qb)
    ch.queue_bind(qa, ex, key, arguments={"x-filter-jms-selector": "app = 'app1'"})
    ch.queue_bind(qb, ex, key)
    rk = "a.b" if ex_type == "topic" else key
    for app in ("app1", "app2"):
        ch.basic_publish(ex, rk, app.encode(), pika.BasicProperties(headers={"app": app}))
    a = ch.basic_get(qa, auto_ack=True)
    assert a[2] == b"app1" and ch.basic_get(qa, auto_ack=True)[0] is None
    assert ch.queue_declare(qb, passive=True).method.message_count == 2


def test_invalid_bind_selector_is_406(chan, names):
    ch = chan()
    q = fresh(ch, names, "sel")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.queue_bind(q, "amq.fanout", arguments={"x-filter-jms-selector": "a = 1 AND"})
    assert e.value.reply_code == 406 and "position" in e.value.reply_text


def test_headers_exchange_any_with_x(chan, names):
    ch = chan()
    ex, q = names("hx"), names("hq")
    ch.exchange_declare(ex, "headers")
    ch.queue_declare(q)
    ch.queue_bind(q, ex, arguments={"x-match": "any-with-x", "x-kind": "a", "other": "b"})
    ch.basic_publish(ex, "", b"by-x", pika.BasicProperties(headers={"x-kind": "a"}))
    ch.basic_publish(ex, "", b"none", pika.BasicProperties(headers={"x-kind": "z"}))
    assert ch.basic_get(q, auto_ack=True)[2] == b"by-x"
    assert ch.basic_get(q, auto_ack=True)[0] is None


# ---- message groups -------------------------------------------------------------------------
def test_standard_groups_stick_to_one_consumer(chan, names):
    ch = chan()
    q = fresh(ch, names, "grp", **{"qpid.group_header_key": "g"})
    for i in range(12):
        publish(ch, q, [b"%s%d" % (b"AB"[i % 2:i % 2 + 1], i)], headers={"g": "AB"[i % 2]})
    c1, c2 = Got(ack=True), Got(ack=True)
    ch.basic_qos(prefetch_count=1)
    ch.basic_consume(q, c1)
    ch.basic_consume(q, c2)
    pump(ch, lambda: len(c1.items) + len(c2.items) == 12)
    groups1 = {b[:1] for b in c1.bodies}
    groups2 = {b[:1] for b in c2.bodies}
    assert len(groups1) <= 1 and len(groups2) <= 1 and groups1 | groups2 == {b"A", b"B"}
    for got in (c1, c2):                   # order within a group kept
        assert got.bodies == sorted(got.bodies, key=lambda b: int(b[1:]))


def test_shared_groups_block_only_while_unacked(chan, names):
    ch = chan()
    q = fresh(ch, names, "sgrp", **{"qpid.group_header_key": "g", "qpid.shared_msg_group": 1})
    publish(ch, q, [b"a1", b"a2"], headers={"g": "A"})
    publish(ch, q, [b"x"])                              # qpid.no-group: its own group
    m1 = ch.basic_get(q)
    assert m1[2] == b"a1"
    # "a2" is blocked while a1 is unacknowledged... by a consumer; basic.get holds no group,
    # so use two consumers instead
    ch.basic_nack(m1[0].delivery_tag, requeue=True)
    c1, c2 = Got(), Got()
    ch.basic_qos(prefetch_count=5)
    ch.basic_consume(q, c1)
    pump(ch, lambda: len(c1.items) == 3)
    ch.basic_consume(q, c2)
    publish(ch, q, [b"a3"], headers={"g": "A"})
    publish(ch, q, [b"b1"], headers={"g": "B"})
    pump(ch, lambda: len(c1.items) + len(c2.items) == 5)
    assert b"a3" in c1.bodies                 # c1 still holds A's unacked messages
    for _, m, _ in c1.items:
        ch.basic_ack(m.delivery_tag)
    for _, m, _ in c2.items:
        ch.basic_ack(m.delivery_tag)


# ---- consumer timeout -----------------------------------------------------------------------
@pytest.mark.parametrize("where", ["consumer", "queue"])
def test_consumer_timeout_releases_instead_of_closing(chan, names, where):
    ch = chan()
    qargs = {"x-consumer-timeout": 200} if where == "queue" else {}
    q = fresh(ch, names, "cto", **qargs)
    publish(ch, q, [b"slow"])
    got = Got()
    cargs = {"x-consumer-timeout": 200} if where == "consumer" else None
    ch.basic_consume(q, got, arguments=cargs)
    pump(ch, lambda: len(got.items) == 2)
    (b1, m1, _), (b2, m2, _) = got.items[:2]
    assert b1 == b2 == b"slow" and not m1.redelivered and m2.redelivered
    ch.basic_ack(m2.delivery_tag)             # the channel is still open
    assert ch.is_open


# ---- no_local ---------------------------------------------------------------------------------
def test_no_local_skips_own_connection(cluster, names):
    q = names("nolocal")
    conn = amqp.Connection(f"{cluster.host}:{cluster.port}", userid=cluster.user,
                           password=cluster.password, virtual_host=cluster.vhost)
    other = amqp.Connection(f"{cluster.host}:{cluster.port}", userid=cluster.user,
                            password=cluster.password, virtual_host=cluster.vhost)
    conn.connect()
    other.connect()
    try:
        ch, och = conn.channel(), other.channel()
        ch.queue_declare(q)
        got = []
        ch.basic_consume(q, no_local=True, callback=lambda m: got.append(m.body))
        ch.basic_publish(amqp.Message(b"mine"), "", q)
        och.basic_publish(amqp.Message(b"theirs"), "", q)
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            try:
                conn.drain_events(timeout=0.1)
            except TimeoutError:
                pass
        assert got == [b"theirs"]
    finally:
        conn.close()
        other.close()
