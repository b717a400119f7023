"""The local-random exchange (``x-local-random``, RabbitMQ 4.0's
rabbit_exchange_type_local_random) with pika: each message reaches one of its bound classic
queues, picked at random; with none, a mandatory publish comes back; a binding with a key, to
an exchange or to a quorum queue is refused with RabbitMQ 4's texts. RabbitMQ's Python AMQP
1.0 client's tests declare one through the management node (tests/e2e/test_amqp10_client.py
runs that client)."""
from __future__ import annotations

import uuid

import pika
import pika.exceptions
import pytest

pytestmark = pytest.mark.e2e


@pytest.fixture
def conn(cluster):
    c = pika.BlockingConnection(pika.URLParameters(cluster.url))
    yield c
    if c.is_open:
        c.close()


def names(n: int) -> list[str]:
    u = uuid.uuid4().hex[:8]
    return [f"lrx-{u}-{i}" for i in range(n)]


def test_each_message_reaches_one_bound_queue(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    x, *queues = names(4)
    ch.exchange_declare(x, "x-local-random")
    for q in queues:
        ch.queue_declare(q, exclusive=True)
        ch.queue_bind(q, x, "")   # pika binds with the queue's name when none is given
    for i in range(60):
        ch.basic_publish(x, f"request-{i}", f"{i}".encode(), mandatory=True)
    got = []
    for q in queues:
        while (m := ch.basic_get(q, auto_ack=True))[0] is not None:
            got.append((q, int(m[2])))
    assert sorted(i for _, i in got) == list(range(60))     # each once
    # 60 random picks of 3 leave a queue out with probability 3 * (2/3)^60, about 1e-10
    assert {q for q, _ in got} == set(queues)


def test_a_mandatory_publish_with_no_bound_queue_comes_back(conn):
    ch = conn.channel()
    (x,) = names(1)
    ch.exchange_declare(x, "x-local-random")
    returned = []
    ch.add_on_return_callback(lambda c, method, props, body: returned.append(body))
    ch.basic_publish(x, "", b"nobody", mandatory=True)
    conn.process_data_events(time_limit=0)
    while not returned:
        conn.process_data_events(time_limit=0.2)
    assert returned == [b"nobody"]


@pytest.mark.parametrize("case, text", [
    ("key", "PRECONDITION_FAILED - Non empty binding 'rk' key not permitted"),
    ("exchange", "PRECONDITION_FAILED - Destination not found"),
    ("quorum", "PRECONDITION_FAILED - Queue type rabbit_quorum_queue not valid for this "
               "exchange type"),
])
def test_a_binding_it_cannot_route_by_is_refused(conn, case, text):
    ch = conn.channel()
    x, dest = names(2)
    ch.exchange_declare(x, "x-local-random")
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            if case == "exchange":
                ch.exchange_declare(dest, "fanout", auto_delete=True)
                ch.exchange_bind(dest, x)
            else:
                ch.queue_declare(dest, durable=case == "quorum", arguments={
                    "x-queue-type": "quorum" if case == "quorum" else "classic"})
                ch.queue_bind(dest, x, "rk" if case == "key" else "")
        assert (e.value.reply_code, e.value.reply_text) == (406, text)
    finally:
        ch = conn.channel()
        ch.exchange_delete(x)
        if case == "exchange":
            ch.exchange_delete(dest)
        else:
            ch.queue_delete(dest)
