"""Scenario 1: declare, bind, publish, consume, ack through every exchange type; message
properties, headers and bodies of every size arrive untouched. Run with every client."""
from __future__ import annotations

import pika
import pytest


pytestmark = pytest.mark.e2e

KIB = 1024


def consume_all(c, queue: str, count: int, timeout: float = 15.0):
    """Consume ``count`` messages from ``queue`` and ack them; return the deliveries."""
    tag = c.consume(queue)
    got = c.wait_for(count, timeout)
    for d in got:
        c.ack(d)
    c.cancel(tag)
    c.take()
    return got


def get_bodies(c, queue: str) -> list[bytes]:
    """Drain ``queue`` with basic.get (no-ack) and return the bodies."""
    out = []
    while (d := c.get(queue, no_ack=True)) is not None:
        out.append(d.body)
    return out


def test_default_exchange_publish_consume_ack(client, names):
    q, _, _ = client.declare_queue(names("q"))
    client.publish("", q, b"hello")
    [d] = consume_all(client, q, 1)
    assert (d.body, d.redelivered, d.exchange, d.routing_key) == (b"hello", False, "", q)
    assert client.declare_queue(q, passive=True)[1] == 0, "acked message still counted"


def test_direct_exchange(client, names, cluster):
    ex = names("direct")
    q1, q2 = cluster.queues_on_distinct_nodes(2, "direct")
    client.declare_exchange(ex, "direct")
    for q in (q1, q2):
        client.declare_queue(q)
    client.bind_queue(q1, ex, "red")
    client.bind_queue(q2, ex, "green")
    client.bind_queue(q2, ex, "red")
    client.publish(ex, "red", b"r")
    client.publish(ex, "green", b"g")
    client.publish(ex, "blue", b"b")
    assert get_bodies(client, q1) == [b"r"]
    assert get_bodies(client, q2) == [b"r", b"g"]


def test_fanout_exchange_reaches_queues_on_every_node(client, names, cluster):
    ex = names("fanout")
    queues = cluster.queues_on_distinct_nodes(2, "fan")
    client.declare_exchange(ex, "fanout")
    for q in queues:
        client.declare_queue(q)
        client.bind_queue(q, ex, "ignored")
    for i in range(5):
        client.publish(ex, f"any-{i}", b"%d" % i)
    for q in queues:
        got = consume_all(client, q, 5)
        assert [d.body for d in got] == [b"0", b"1", b"2", b"3", b"4"]
        assert {d.exchange for d in got} == {ex}


def test_topic_exchange(client, names):
    ex = names("topic")
    client.declare_exchange(ex, "topic")
    patterns = {"star": "a.*.c", "hash": "a.#", "tail": "#.z", "exact": "a.b.c"}
    queues = {}
    for key, pattern in patterns.items():
        queues[key] = client.declare_queue(names(key))[0]
        client.bind_queue(queues[key], ex, pattern)
    for rk in ("a.b.c", "a", "a.x.y.z", "b.z", "a.b", "z", "ab.c"):
        client.publish(ex, rk, rk.encode())
    assert get_bodies(client, queues["star"]) == [b"a.b.c"]
    assert get_bodies(client, queues["hash"]) == [b"a.b.c", b"a", b"a.x.y.z", b"a.b"]
    assert get_bodies(client, queues["tail"]) == [b"a.x.y.z", b"b.z", b"z"]
    assert get_bodies(client, queues["exact"]) == [b"a.b.c"]


def test_headers_exchange_all_and_any(client, names):
    ex = names("headers")
    client.declare_exchange(ex, "headers")
    q_all = client.declare_queue(names("all"))[0]
    q_any = client.declare_queue(names("any"))[0]
    client.bind_queue(q_all, ex, "", {"x-match": "all", "format": "pdf", "type": "report"})
    client.bind_queue(q_any, ex, "", {"x-match": "any", "format": "zip", "type": "log"})
    cases = [
        (b"both", {"format": "pdf", "type": "report"}),         # all
        (b"extra", {"format": "pdf", "type": "report", "z": 1}),  # all
        (b"half", {"format": "pdf"}),                            # neither
        (b"zip", {"format": "zip", "type": "report"}),           # any
        (b"log", {"type": "log"}),                               # any
        (b"none", {}),                                           # neither
    ]
    for body, headers in cases:
        client.publish(ex, "rk-ignored", body, {"headers": headers})
    assert get_bodies(client, q_all) == [b"both", b"extra"]
    assert get_bodies(client, q_any) == [b"zip", b"log"]


def test_exchange_to_exchange_binding_routes(client, names):
    src, dst = names("src"), names("dst")
    client.declare_exchange(src, "topic")
    client.declare_exchange(dst, "direct")
    client.bind_exchange(dst, src, "orders.#")
    q = client.declare_queue(names("e2e"))[0]
    client.bind_queue(q, dst, "orders.eu")
    client.publish(src, "orders.eu", b"via-src")
    client.publish(src, "orders.us", b"not-bound-on-dst")
    client.publish(src, "other", b"not-bound-on-src")
    client.publish(dst, "orders.eu", b"direct-to-dst")
    assert get_bodies(client, q) == [b"via-src", b"direct-to-dst"]


# ---- properties and headers ---------------------------------------------------------------
HEADERS = {
    "str": "text ✓",
    "int": 42,
    "neg": -7,
    "big": 2**40,
    "true": True,
    "false": False,
    "bytes": b"\x00\x01\xfe\xff",
    "nested": {"level": 2, "inner": {"deep": "yes", "n": 3}, "flag": True},
    "list": [1, "two", {"three": 3}],
    "empty": "",
}


def test_properties_and_headers_come_through_untouched(client, names):
    q = client.declare_queue(names("props"))[0]
    props = {
        "content_type": "application/x-shoal-test",
        "content_encoding": "gzip",
        "headers": HEADERS,
        "delivery_mode": 2,
        "priority": 7,
        "correlation_id": "corr-1",
        "reply_to": "reply.queue",
        "expiration": "600000",
        "message_id": "msg-1",
        "timestamp": 1_700_000_000,
        "type": "order.created",
        "app_id": "e2e",
    }
    client.publish("", q, b"payload", props)
    [d] = consume_all(client, q, 1)
    assert d.body == b"payload"
    got = dict(d.props)
    got_headers = got.pop("headers")
    want = dict(props)
    want_headers = want.pop("headers")
    assert got == want
    assert got_headers == want_headers


def test_absent_properties_stay_absent(cluster, names):
    """pika sends exactly the properties it is given (none here): none may appear."""
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    try:
        ch = conn.channel()
        q = ch.queue_declare(names("noprops")).method.queue
        ch.basic_publish("", q, b"x", pika.BasicProperties())
        method, props, body = None, None, None
        for _ in range(50):
            method, props, body = ch.basic_get(q, auto_ack=True)
            if method is not None:
                break
            conn.process_data_events(time_limit=0.1)
        assert method is not None, "message not delivered"
        assert body == b"x"
        assert {k: v for k, v in vars(props).items() if v is not None} == {}
    finally:
        conn.close()


@pytest.mark.parametrize("size", [0, 1, 100 * KIB, 1024 * KIB],
                         ids=["0B", "1B", "100KiB", "1MiB"])
def test_body_sizes_intact(client, names, size):
    q = client.declare_queue(names("size"))[0]
    body = bytes((i * 7 + size) % 251 for i in range(size))
    client.publish("", q, body)
    client.publish("", q, b"after")        # the next message must not be mixed into it
    got = consume_all(client, q, 2, timeout=30)
    assert len(got[0].body) == size
    assert got[0].body == body
    assert got[1].body == b"after"


def test_small_then_large_then_small_pipelined(client, names):
    """A publisher that sends 200 small messages, then 1 MiB ones, then small ones again,
    without waiting: the router sizes its socket reads to the message size as it goes, and
    every body still arrives whole and in order."""
    q = client.declare_queue(names("mixed"))[0]
    bodies = [b"s%03d" % i for i in range(200)]
    bodies += [bytes([i]) * (1024 * KIB) for i in range(3)]
    bodies += [b"t%03d" % i for i in range(200)]
    for body in bodies:
        client.publish("", q, body)
    got = consume_all(client, q, len(bodies), timeout=60)
    assert [len(d.body) for d in got] == [len(b) for b in bodies]
    assert [d.body for d in got] == bodies


def test_basic_get_and_get_empty(client, names):
    q = client.declare_queue(names("get"))[0]
    assert client.get(q) is None, "basic.get on an empty queue must answer get-empty"
    client.publish("", q, b"one")
    client.publish("", q, b"two")
    d = client.get(q)
    assert (d.body, d.redelivered, d.routing_key) == (b"one", False, q)
    client.ack(d)
    d = client.get(q)
    assert d.body == b"two"
    client.reject(d, requeue=True)
    d = client.get(q)
    assert (d.body, d.redelivered) == (b"two", True)
    client.ack(d)
    assert client.get(q) is None


def test_purge_returns_count(make_client, names):
    client = make_client(confirms=True)   # confirmed: every message is on the queue
    q = client.declare_queue(names("purge"))[0]
    for i in range(17):
        client.publish("", q, b"m%d" % i)
    assert client.purge(q) == 17
    assert client.declare_queue(q, passive=True)[1] == 0
    assert client.get(q) is None


def test_server_named_queue(client):
    name, messages, consumers = client.declare_queue("", exclusive=True)
    assert name.startswith("amq.gen-"), name
    assert (messages, consumers) == (0, 0)
    client.publish("", name, b"to-server-named")
    assert client.get(name, no_ack=True).body == b"to-server-named"


def test_declare_ok_counts(make_client, names):
    client = make_client(confirms=True)
    q = client.declare_queue(names("counts"))[0]
    for _ in range(3):
        client.publish("", q, b"x")
    assert client.declare_queue(q, passive=True)[1:] == (3, 0)
    tag = client.consume(q)
    client.wait_for(3)
    assert client.declare_queue(q, passive=True)[2] == 1
    client.cancel(tag)
