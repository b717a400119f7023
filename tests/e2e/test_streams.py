"""Streams (``x-queue-type: stream``) with real clients against a real cluster: pika,
aio-pika and kombu declare, publish with confirms, read from offsets (first, a number,
last, next, a timestamp, a duration), see ``x-stream-offset`` on every delivery, filter,
and meet RabbitMQ's refusals with its codes and texts (rabbit_stream_queue.erl,
rabbit_channel.erl; docs/streams.md)."""
from __future__ import annotations

import asyncio
import datetime
import uuid

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

pytestmark = pytest.mark.e2e

STREAM = {"x-queue-type": "stream"}


def _name() -> str:
    return f"e2e-stream-{uuid.uuid4().hex[:10]}"


def _publish(ch, q: str, bodies: list[bytes], headers: dict | None = None) -> None:
    for b in bodies:
        ch.basic_publish("", q, b, pika.BasicProperties(headers=headers, delivery_mode=2))


def _read(conn, ch, q: str, n: int, args: dict, prefetch: int = 10) -> list:
    """``n`` deliveries of a consumer with ``args``, acked one by one: [(offset, body)]."""
    ch.basic_qos(prefetch_count=prefetch)
    got = []

    def on_message(c, method, props, body):
        got.append((props.headers["x-stream-offset"], body))
        c.basic_ack(method.delivery_tag)

    tag = ch.basic_consume(q, on_message, arguments=args)
    for _ in range(200):
        if len(got) >= n:
            break
        conn.process_data_events(time_limit=0.05)
    ch.basic_cancel(tag)
    return got


@pytest.fixture
def pika_conn(cluster):
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    yield conn
    if conn.is_open:
        conn.close()


def test_pika_reads_from_every_kind_of_offset(pika_conn) -> None:
    ch = pika_conn.channel()
    q = _name()
    ok = ch.queue_declare(q, durable=True, arguments=STREAM)
    assert ok.method.message_count == 0
    ch.confirm_delivery()
    _publish(ch, q, [b"m%d" % i for i in range(10)])
    assert _read(pika_conn, ch, q, 10, {"x-stream-offset": "first"}) == [
        (i, b"m%d" % i) for i in range(10)]
    assert [b for _, b in _read(pika_conn, ch, q, 4, {"x-stream-offset": 6})] == [
        b"m6", b"m7", b"m8", b"m9"]
    # last: the last chunk written (here one publish per chunk, at least the last message)
    last = _read(pika_conn, ch, q, 1, {"x-stream-offset": "last"})
    assert last[-1] == (9, b"m9")
    # a timestamp (AMQP 0-9-1 type T) and a duration: everything written since
    then = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    assert len(_read(pika_conn, ch, q, 10, {"x-stream-offset": then})) == 10
    assert len(_read(pika_conn, ch, q, 10, {"x-stream-offset": "10m"})) == 10
    # next (the default): only what is published after it subscribed
    ch.basic_qos(prefetch_count=5)
    got = []
    tag = ch.basic_consume(q, lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
    pika_conn.process_data_events(time_limit=0.2)
    _publish(ch, q, [b"after"])
    for _ in range(100):
        if got:
            break
        pika_conn.process_data_events(time_limit=0.05)
    ch.basic_cancel(tag)
    assert got == [b"after"]
    # acks removed nothing: a redeclare counts every message
    assert ch.queue_declare(q, durable=True, arguments=STREAM).method.message_count == 11
    ch.queue_delete(q)


def test_pika_meets_rabbitmqs_refusals(cluster, pika_conn) -> None:
    ch = pika_conn.channel()
    q = _name()
    ch.queue_declare(q, durable=True, arguments=STREAM)
    with pytest.raises(ChannelClosedByBroker) as err:
        ch.basic_consume(q, lambda *a: None)        # no basic.qos
    assert err.value.reply_code == 406
    assert err.value.reply_text == (f"PRECONDITION_FAILED - consumer prefetch count is not "
                                    f"set for stream queue '{q}' in vhost '/'")
    ch = pika_conn.channel()
    with pytest.raises(ChannelClosedByBroker) as err:
        ch.queue_declare(_name(), durable=False, arguments=STREAM)
    assert err.value.reply_code == 406 and "invalid property 'non-durable'" in \
        err.value.reply_text
    ch = pika_conn.channel()
    with pytest.raises(ChannelClosedByBroker) as err:
        ch.queue_declare(_name(), durable=True, arguments={**STREAM, "x-max-length": 5})
    assert err.value.reply_code == 406 and "of queue type rabbit_stream_queue" in \
        err.value.reply_text
    ch = pika_conn.channel()
    with pytest.raises(ConnectionClosedByBroker) as err:
        ch.basic_get(q)
    assert err.value.reply_code == 540
    assert err.value.reply_text == (f"NOT_IMPLEMENTED - basic.get not supported by stream "
                                    f"queues queue '{q}' in vhost '/'")
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=5)
    with pytest.raises(ConnectionClosedByBroker) as err:
        ch.basic_consume(q, lambda *a: None, auto_ack=True)
    assert err.value.reply_code == 540 and "automatic acknowledgement not supported" in \
        err.value.reply_text
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    conn.channel().queue_delete(q)
    conn.close()


def test_aio_pika_filters_and_confirms(cluster) -> None:
    aio_pika = pytest.importorskip("aio_pika")

    async def run() -> list:
        conn = await aio_pika.connect_robust(cluster.url)
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            q = _name()
            queue = await ch.declare_queue(q, durable=True, arguments=STREAM)
            for colour in ("red", "blue", "red", None):
                headers = {"x-stream-filter-value": colour} if colour else None
                await ch.default_exchange.publish(
                    aio_pika.Message(f"{colour}".encode(), headers=headers), routing_key=q)
            await ch.set_qos(prefetch_count=10)
            got = []
            async with queue.iterator(arguments={"x-stream-offset": "first",
                                                 "x-stream-filter": "red"}) as it:
                async for message in it:
                    got.append((message.headers["x-stream-offset"], message.body))
                    await message.ack()
                    if len(got) == 2:
                        break
            await queue.delete(if_unused=False, if_empty=False)
            return got
    assert asyncio.run(run()) == [(0, b"red"), (2, b"red")]


def test_kombu_reads_a_history(cluster) -> None:
    kombu = pytest.importorskip("kombu")
    q = _name()
    with kombu.Connection(cluster.url) as conn:
        queue = kombu.Queue(q, routing_key=q, durable=True, queue_arguments=STREAM,
                            consumer_arguments={"x-stream-offset": "first"})
        producer = conn.Producer()
        producer.publish({"n": 1}, exchange="", routing_key=q, declare=[queue],
                         serializer="json")
        producer.publish({"n": 2}, exchange="", routing_key=q, serializer="json")
        got = []

        def on_message(body, message):
            got.append((message.headers["x-stream-offset"], body["n"]))
            message.ack()
        with conn.Consumer(queue, callbacks=[on_message], prefetch_count=10):
            for _ in range(100):
                if len(got) == 2:
                    break
                try:
                    conn.drain_events(timeout=0.1)
                except TimeoutError:
                    pass
        queue(conn.channel()).delete()
    assert got == [(0, 1), (1, 2)]


def test_a_vhosts_default_queue_type_stream(tmp_path) -> None:
    """A definitions file's vhost ``metadata.default_queue_type: stream`` (RabbitMQ 3.11+)
    makes that vhost's durable queues declared without a type streams; exclusive ones stay
    classic (the stream type's ``is_compatible``), and a redeclare naming no type is the
    stream it is."""
    import json

    from shoal.shared.definitions import hash_password
    from tests.conftest import EXTERNAL_URL, start_cluster, stop_cluster
    if EXTERNAL_URL:
        pytest.skip("starts its own cluster")
    defs = tmp_path / "defs.json"
    defs.write_text(json.dumps({
        "users": [{"name": "guest", "password_hash": hash_password("guest"),
                   "tags": ["administrator"]}],
        "vhosts": [{"name": "/", "metadata": {"default_queue_type": "stream"}}],
        "permissions": [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*",
                         "read": ".*"}]}))
    cluster = start_cluster(tmp_path / "cluster", 2, env={"SHOAL_LOAD_DEFINITIONS": str(defs)})
    try:
        conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
        ch = conn.channel()
        q = _name()
        ch.queue_declare(q, durable=True)
        ch.queue_declare(q, durable=True)                   # the same stream
        ch.confirm_delivery()
        _publish(ch, q, [b"a", b"b"])
        assert _read(conn, ch, q, 2, {"x-stream-offset": "first"}) == [(0, b"a"), (1, b"b")]
        excl = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", excl, b"x")
        assert ch.basic_get(excl, auto_ack=True)[2] == b"x"     # a classic queue
        conn.close()
    finally:
        stop_cluster(cluster)
