"""The consistent-hash exchange (``x-consistent-hash``, RabbitMQ's
rabbitmq_consistent_hash_exchange plugin; router/consistent_hash.py) with pika: each message
reaches one bound queue, in shares by the bindings' weights, the same routing key always the
same queue; a binding key that is not a weight and bad exchange arguments are refused with
RabbitMQ 3.10's texts (checked side by side with its plugin enabled). RabbitMQ's JavaScript
AMQP 1.0 client's tests declare one through the management node."""
from __future__ import annotations

import uuid

import pika
import pika.exceptions
import pytest

pytestmark = pytest.mark.e2e


@pytest.fixture
def ch(cluster):
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    c = conn.channel()
    c.confirm_delivery()
    yield c
    if conn.is_open:
        conn.close()


def names(n: int) -> list[str]:
    u = uuid.uuid4().hex[:8]
    return [f"chx-{u}-{i}" for i in range(n)]


# Fixed queue names, so the ring's points (hashes of the names) are the same in every run: with
# random names a weight-1 queue's one arc held none of the 200 keys in about 1 run in 60. With
# these, the 200 keys split 51 / 51 / 98, the shares of the weights 1 / 1 / 2.
SHARE_QUEUES = ("chx-shares-171-a", "chx-shares-171-b", "chx-shares-171-c")


def test_each_message_reaches_one_queue_by_its_routing_keys_hash(ch):
    (x,) = names(1)
    a, b, c = SHARE_QUEUES
    ch.exchange_declare(x, "x-consistent-hash")
    for q, weight in ((a, "1"), (b, "1"), (c, "2")):
        ch.queue_delete(q)      # left by an earlier run against the same cluster
        ch.queue_declare(q)
        ch.queue_bind(q, x, weight)
    try:
        for i in range(200):
            ch.basic_publish(x, f"order-{i}", b"m")
        counts = [ch.queue_declare(q, passive=True).method.message_count for q in (a, b, c)]
        assert counts == [51, 51, 98]
        for q in (a, b, c):
            ch.queue_purge(q)
        for _ in range(5):
            ch.basic_publish(x, "customer-42", b"same key")
        counts = [ch.queue_declare(q, passive=True).method.message_count for q in (a, b, c)]
        assert sorted(counts) == [0, 0, 5]
    finally:
        for q in (a, b, c):
            ch.queue_delete(q)


def test_hash_header_routes_by_the_header(ch):
    x, a, b = names(3)
    ch.exchange_declare(x, "x-consistent-hash", arguments={"hash-header": "user"})
    for q in (a, b):
        ch.queue_declare(q)
        ch.queue_bind(q, x, "10")
    for i in range(40):
        ch.basic_publish(x, f"k{i}", f"{i}".encode(),
                         pika.BasicProperties(headers={"user": "alice"}))
    counts = sorted(ch.queue_declare(q, passive=True).method.message_count for q in (a, b))
    assert counts == [0, 40]


@pytest.mark.parametrize("key, text", [
    ("abc", 'PRECONDITION_FAILED - The binding key must be an integer: <<"abc">>'),
    ("0", "PRECONDITION_FAILED - The binding key must be greater than 0"),
])
def test_a_binding_key_that_is_not_a_weight_is_refused(cluster, key, text):
    x, q = names(2)
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    try:
        c = conn.channel()
        c.exchange_declare(x, "x-consistent-hash")
        c.queue_declare(q)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            c.queue_bind(q, x, key)
        assert (e.value.reply_code, e.value.reply_text) == (406, text)
    finally:
        conn.close()


def test_hash_header_and_hash_property_together_are_refused(cluster):
    (x,) = names(1)
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            conn.channel().exchange_declare(x, "x-consistent-hash", arguments={
                "hash-header": "h", "hash-property": "message_id"})
        assert (e.value.reply_code, e.value.reply_text) == (
            406, "PRECONDITION_FAILED - hash-header and hash-property are mutually exclusive")
    finally:
        conn.close()
