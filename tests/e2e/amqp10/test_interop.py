"""One message, two protocols (issue 37; the contract's mapping, docs/amqp10.md): pika (AMQP
0-9-1) publishes and proton (AMQP 1.0) receives, and the reverse, on the same queue. Body,
content-type, content-encoding, message-id, correlation-id, reply-to, priority, TTL
(expiration <-> header ttl), timestamp <-> creation-time, headers <-> application-properties
(``x-`` headers <-> message-annotations), delivery_mode 2 <-> durable."""
from __future__ import annotations

import pika
import pytest

pytest.importorskip("proton", reason="python-qpid-proton is not installed "
                    "(pip install -e '.[test]')")

from proton import Delivery, Message, symbol  # noqa: E402
from proton.utils import SendException  # noqa: E402

from .helpers import (TIMEOUT, body, declare, exchange_addr, pika_channel,  # noqa: E402
                      pika_get_all, proton_conn, queue_addr, recv, send)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def proton_receive_one(cl, q) -> Message:
    with proton_conn(cl) as c:
        rcv = recv(c, queue_addr(q), credit=1)
        m = rcv.receive(timeout=TIMEOUT)
        rcv.accept()
        return m


def pika_get_one(cl, q):
    got = pika_get_all(cl, q, limit=2)
    assert len(got) == 1, got
    return got[0]


# ---------------------------------------------------------------- 0-9-1 -> 1.0

def test_pika_to_proton_properties(cluster, names):
    q = declare(cluster, names(), {"x-max-priority": 9})
    with pika_channel(cluster) as ch:
        ch.basic_publish("", q, b"\x00binary body\xff", pika.BasicProperties(
            content_type="application/octet-stream", content_encoding="gzip",
            message_id="m-1", correlation_id="c-1", reply_to="replies", priority=7,
            expiration="60000", delivery_mode=2, timestamp=1_700_000_000,
            headers={"colour": "red", "n": 42, "ok": True, "x-custom": "annotated"}))
    m = proton_receive_one(cluster, q)
    assert body(m) == b"\x00binary body\xff"                # one data section, as is
    assert m.content_type == "application/octet-stream"
    assert m.content_encoding == "gzip"
    assert m.id == "m-1"
    assert m.correlation_id == "c-1"
    assert m.reply_to == "/queues/replies"      # a 0-9-1 queue as a 1.0 address (RabbitMQ 4)
    assert m.priority == 7
    assert m.ttl == 60.0                                      # header ttl 60000 ms
    assert m.durable is True
    assert m.creation_time == 1_700_000_000.0                 # s -> ms (proton shows s)
    assert m.properties == {"colour": "red", "n": 42, "ok": True}
    assert (m.annotations or {}).get(symbol("x-custom")) == "annotated"
    assert m.first_acquirer is True or m.delivery_count == 0


def test_pika_transient_is_not_durable(cluster, names):
    q = declare(cluster, names())
    with pika_channel(cluster) as ch:
        ch.basic_publish("", q, b"plain", pika.BasicProperties(delivery_mode=1))
        ch.basic_publish("", q, b"bare")
    with proton_conn(cluster) as c:
        rcv = recv(c, queue_addr(q), credit=2)
        a, b = rcv.receive(timeout=TIMEOUT), rcv.receive(timeout=TIMEOUT)
        rcv.settle(Delivery.ACCEPTED)
    assert (body(a), a.durable, body(b), b.durable) == (b"plain", False, b"bare", False)
    assert a.ttl == 0 and not a.properties


def test_pika_delivery_carries_exchange_and_routing_key_annotations(cluster, names):
    q, key = names(), names("key")
    with pika_channel(cluster) as ch:
        ch.queue_declare(q)
        ch.queue_bind(q, "amq.direct", key)
        ch.basic_publish("amq.direct", key, b"routed")
    m = proton_receive_one(cluster, q)
    assert m.annotations[symbol("x-exchange")] == "amq.direct"
    assert m.annotations[symbol("x-routing-key")] == key


# ---------------------------------------------------------------- 1.0 -> 0-9-1

def test_proton_to_pika_properties(cluster, names):
    q = declare(cluster, names(), {"x-max-priority": 9})
    with proton_conn(cluster) as c:
        assert send(c, queue_addr(q), Message(
            body=b"\x01data\x02", inferred=True, content_type="text/plain",
            content_encoding="utf-8", id="m-2", correlation_id="c-2",
            reply_to="/queues/replies",
            priority=5, ttl=60.0, durable=True, creation_time=1_700_000_000.0,
            properties={"colour": "blue", "n": 7, "ok": False},
            annotations={symbol("x-annotated"): "yes"})) == [Delivery.ACCEPTED]
    props, got = pika_get_one(cluster, q)
    assert got == b"\x01data\x02"
    assert props.content_type == "text/plain"
    assert props.content_encoding == "utf-8"
    assert props.message_id == "m-2"
    assert props.correlation_id == "c-2"
    assert props.reply_to == "replies"          # the queue of a /queues/ address
    assert props.priority == 5
    assert props.expiration == "60000"
    assert props.delivery_mode == 2
    assert props.timestamp == 1_700_000_000
    assert props.headers["colour"] == "blue"
    assert props.headers["n"] == 7
    assert props.headers["ok"] is False
    assert props.headers["x-annotated"] == "yes"


def test_proton_not_durable_is_delivery_mode_1(cluster, names):
    q = declare(cluster, names())
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), Message(body=b"t", inferred=True, durable=False))
    props, got = pika_get_one(cluster, q)
    assert got == b"t" and props.delivery_mode in (None, 1)
    assert props.expiration is None


def test_proton_amqp_value_body_reaches_pika_encoded(cluster, names):
    """An amqp-value body has no 0-9-1 form: the 0-9-1 body is the section, AMQP-encoded
    (descriptor 0x77, str8 "hello"), type amqp-1.0; a 1.0 consumer gets the value back."""
    q = declare(cluster, names())
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), Message(body="hello"), Message(body="again"))
    props, got = pika_get_one_of_two(cluster, q)
    assert got == b"\x00\x53\x77\xa1\x05hello"
    assert props.type == "amqp-1.0"
    m = proton_receive_one(cluster, q)
    assert m.body == "again"


def pika_get_one_of_two(cl, q):
    with pika_channel(cl) as ch:
        method, props, got = ch.basic_get(q, auto_ack=True)
        assert method is not None
        return props, got


def test_round_trip_1_0_to_1_0_keeps_the_mapped_fields(cluster, names):
    q = declare(cluster, names())
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), Message(body=b"rt", inferred=True, id="m-3",
                                       correlation_id="c-3", content_type="a/b",
                                       properties={"k": "v", "i": -3}, durable=True,
                                       priority=3))
        rcv = recv(c, queue_addr(q), credit=1)
        m = rcv.receive(timeout=TIMEOUT)
        rcv.accept()
    assert (body(m), m.id, m.correlation_id, m.content_type, m.durable, m.priority) == \
        (b"rt", "m-3", "c-3", "a/b", True, 3)
    assert m.properties == {"k": "v", "i": -3}


def test_round_trip_0_9_1_to_0_9_1_through_a_1_0_hop(cluster, names):
    """pika -> q1, proton moves it to q2 (receive, send on), pika reads q2: what pika sent."""
    q1, q2 = declare(cluster, names()), declare(cluster, names())
    with pika_channel(cluster) as ch:
        ch.basic_publish("", q1, b"hop", pika.BasicProperties(
            content_type="text/x", message_id="m-4", headers={"a": "b"}, delivery_mode=2))
    with proton_conn(cluster) as c:
        rcv = recv(c, queue_addr(q1), credit=1)
        m = rcv.receive(timeout=TIMEOUT)
        m.annotations = None
        assert send(c, queue_addr(q2), m) == [Delivery.ACCEPTED]
        rcv.accept()
    props, got = pika_get_one(cluster, q2)
    assert (got, props.content_type, props.message_id, props.headers, props.delivery_mode) \
        == (b"hop", "text/x", "m-4", {"a": "b"}, 2)


# ---------------------------------------------------------------- sender-selected distribution

def test_an_x_cc_annotation_routes_by_its_keys_too_and_reaches_091_as_cc(cluster, names):
    """RabbitMQ 4's sender-selected distribution over AMQP 1.0: the ``x-cc`` message
    annotation (a list of strings) adds routing keys; a 0-9-1 consumer sees it as the ``CC``
    header (mc_amqpl); any other value is rejected with amqp:invalid-field."""
    x = names("x")
    queues = {k: names(k) for k in ("one", "two", "three")}
    with pika_channel(cluster) as ch:
        ch.exchange_declare(x, "direct")
        for key, q in queues.items():
            ch.queue_declare(q)
            ch.queue_bind(q, x, key)
    with proton_conn(cluster) as c:
        assert send(c, exchange_addr(x, "one"), Message(
            body=b"cc", inferred=True,
            annotations={symbol("x-cc"): ["two"]})) == [Delivery.ACCEPTED]
        with pytest.raises(SendException) as refused:       # proton raises on rejected
            send(c, exchange_addr(x, "one"), Message(
                body=b"bad", inferred=True, annotations={symbol("x-cc"): "two"}))
        assert refused.value.state == Delivery.REJECTED
    props, got = pika_get_one(cluster, queues["two"])
    assert got == b"cc" and props.headers["CC"] == ["two"]
    assert pika_get_one(cluster, queues["one"])[1] == b"cc"
    assert pika_get_all(cluster, queues["three"]) == []
