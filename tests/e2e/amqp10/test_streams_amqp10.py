"""Streams over AMQP 1.0 (docs/streams.md): RabbitMQ's Python AMQP 1.0 client declares a
stream through the management node, publishes with ``x-stream-filter-value`` annotations and
consumes with its stream options (an offset spec: first, an offset, a time; filter values,
match-unfiltered); every message carries ``x-stream-offset`` as a message annotation, and a
0-9-1 publisher's messages reach a 1.0 reader. proton's raw source filters show which
filters the attach honoured."""
from __future__ import annotations

import contextlib
import datetime
import uuid

import pika
import pytest

rmq = pytest.importorskip("rabbitmq_amqp_python_client",
                          reason="rabbitmq-amqp-python-client is not installed "
                          "(pip install -e '.[test]')")

from rabbitmq_amqp_python_client import (AddressHelper, AMQPMessagingHandler,  # noqa: E402
                                         Converter, Environment, Message, MessageProperties,
                                         OffsetSpecification, StreamConsumerOptions,
                                         StreamFilterOptions, StreamSpecification)

from .test_rabbitmq_amqp_client import Done, run_consumer, uri  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


class Read(AMQPMessagingHandler):
    """Accepts ``want`` messages: [(x-stream-offset annotation, body)]."""

    def __init__(self, want: int):
        super().__init__()
        self.want, self.got = want, []

    def on_amqp_message(self, event):
        self.got.append((event.message.annotations["x-stream-offset"],
                         Converter.bytes_to_string(event.message.body)))
        self.delivery_context.accept(event)
        if len(self.got) >= self.want:
            raise Done()


@pytest.fixture
def env(cluster):
    e = Environment(uri=uri(cluster))
    yield e
    with contextlib.suppress(Exception):
        e.close()


def _read(conn, q: str, want: int, options: StreamConsumerOptions) -> list:
    handler = Read(want)
    consumer = conn.consumer(AddressHelper.queue_address(q), message_handler=handler,
                             consumer_options=options)
    run_consumer(consumer)
    consumer.close()
    return handler.got


def test_the_rabbitmq_client_reads_a_stream_from_offsets_and_filters(cluster, env):
    conn = env.connection()
    conn.dial()
    q = f"s10-{uuid.uuid4().hex[:10]}"
    management = conn.management()
    management.declare_queue(StreamSpecification(name=q, max_age=datetime.timedelta(days=1)))
    assert str(management.queue_info(q).queue_type).lower().endswith("stream")
    pub = conn.publisher(AddressHelper.queue_address(q))
    for i in range(4):
        colour = "apple" if i % 2 == 0 else "banana"
        d = pub.publish(Message(body=Converter.string_to_bytes(f"{colour}-{i}"),
                                annotations={"x-stream-filter-value": colour}))
        assert d.remote_state == d.ACCEPTED
    pub.close()
    with pika.BlockingConnection(pika.URLParameters(cluster.url)) as pc:
        pc.channel().basic_publish("", q, b"plain-4")       # a 0-9-1 publisher's
    assert _read(conn, q, 5, StreamConsumerOptions(OffsetSpecification.first)) == [
        (0, "apple-0"), (1, "banana-1"), (2, "apple-2"), (3, "banana-3"), (4, "plain-4")]
    assert _read(conn, q, 2, StreamConsumerOptions(3)) == [(3, "banana-3"), (4, "plain-4")]
    an_hour_ago = datetime.datetime.now() - datetime.timedelta(hours=1)
    assert len(_read(conn, q, 5, StreamConsumerOptions(an_hour_ago))) == 5
    assert _read(conn, q, 2, StreamConsumerOptions(
        OffsetSpecification.first, StreamFilterOptions(values=["apple"]))) == [
        (0, "apple-0"), (2, "apple-2")]
    assert _read(conn, q, 3, StreamConsumerOptions(
        OffsetSpecification.first, StreamFilterOptions(values=["banana"],
                                                       match_unfiltered=True))) == [
        (1, "banana-1"), (3, "banana-3"), (4, "plain-4")]
    management.delete_queue(q)
    management.close()
    conn.close()


def test_the_attach_names_the_filters_it_honoured(cluster):
    """proton's source filter with a stream offset and a filter nobody knows: the attach's
    answer names the first only (RabbitMQ 4's parse_filter)."""
    from proton import Described, symbol
    from proton.reactor import Filter

    from .helpers import amqp10_url, queue_addr
    from proton.utils import BlockingConnection
    q = f"s10f-{uuid.uuid4().hex[:10]}"
    with pika.BlockingConnection(pika.URLParameters(cluster.url)) as pc:
        ch = pc.channel()
        ch.queue_declare(q, durable=True, arguments={"x-queue-type": "stream"})
        ch.confirm_delivery()
        for i in range(3):
            ch.basic_publish("", q, b"m%d" % i)
    conn = BlockingConnection(amqp10_url(cluster), timeout=10)
    try:
        spec = symbol("rabbitmq:stream-offset-spec")
        unknown = symbol("example:unknown-filter")
        rcv = conn.create_receiver(queue_addr(q), options=Filter({
            spec: Described(spec, 1), unknown: Described(unknown, "x")}), credit=10)
        remote = rcv.link.remote_source.filter
        got = [rcv.receive(timeout=10) for _ in range(2)]
        assert [m.body for m in got] == [b"m1", b"m2"]
        assert [m.annotations["x-stream-offset"] for m in got] == [1, 2]
        remote.rewind()
        remote.next()
        assert {str(k) for k in remote.get_object()} == {"rabbitmq:stream-offset-spec"}
        rcv.close()
    finally:
        conn.close()
    with pika.BlockingConnection(pika.URLParameters(cluster.url)) as pc:
        pc.channel().queue_delete(q)


def test_property_filter_expressions_on_a_stream(cluster, env):
    """RabbitMQ 4.1's property filters (``amqp:properties-filter`` on ``subject``,
    ``amqp:application-properties-filter``) with the stream filter, as the client's
    streams_with_filters example uses them: only yellow bananas from Italy arrive, and the
    messages left out use no credit (10 wanted of 60, with a link credit of the client's)."""
    conn = env.connection()
    conn.dial()
    q = f"s10p-{uuid.uuid4().hex[:10]}"
    management = conn.management()
    management.declare_queue(StreamSpecification(name=q))
    pub = conn.publisher(AddressHelper.queue_address(q))
    want = []
    for fruit in ("apple", "banana"):
        for i in range(30):
            colour = "green" if i % 2 == 0 else "yellow"
            origin = "italy" if i % 3 == 0 else "spain"
            pub.publish(Message(body=Converter.string_to_bytes(f"{fruit}-{i}"),
                                annotations={"x-stream-filter-value": fruit},
                                subject=colour, application_properties={"from": origin}))
            if fruit == "banana" and colour == "yellow" and origin == "italy":
                want.append(f"{fruit}-{i}")
    pub.close()
    got = _read(conn, q, len(want), StreamConsumerOptions(
        OffsetSpecification.first, StreamFilterOptions(
            values=["banana"], message_properties=MessageProperties(subject="yellow"),
            application_properties={"from": "italy"})))
    assert [b for _, b in got] == want
    # on a classic queue a property filter is not applied, and the attach says so
    classic = f"c10p-{uuid.uuid4().hex[:10]}"
    with pika.BlockingConnection(pika.URLParameters(cluster.url)) as pc:
        ch = pc.channel()
        ch.queue_declare(classic)
        ch.basic_publish("", classic, b"any")
    from proton import Described, symbol
    from proton.reactor import Filter
    from proton.utils import BlockingConnection

    from .helpers import amqp10_url, queue_addr
    bc = BlockingConnection(amqp10_url(cluster), timeout=10)
    try:
        key = symbol("amqp:application-properties-filter")
        rcv = bc.create_receiver(queue_addr(classic), options=Filter(
            {key: Described(key, {"from": "nowhere"})}), credit=5)
        remote = rcv.link.remote_source.filter
        remote.rewind()
        assert not remote.next() or not remote.get_object()
        assert rcv.receive(timeout=10).body == b"any"
        rcv.close()
    finally:
        bc.close()
    management.delete_queue(q)
    management.close()
    conn.close()


def test_sql_filter_expressions_on_a_stream(cluster, env):
    """RabbitMQ 4.2's SQL filter (``StreamFilterOptions(sql=...)``), as the client's
    streams_with_sql_filters example writes it: only the matching messages arrive."""
    conn = env.connection()
    conn.dial()
    q = f"s10s-{uuid.uuid4().hex[:10]}"
    management = conn.management()
    management.declare_queue(StreamSpecification(name=q))
    pub = conn.publisher(AddressHelper.queue_address(q))
    for i, (subject, value) in enumerate([("not_this", "x"), ("is_in_the_filter_too", "v"),
                                          ("is_in_the_filter", "no"),
                                          ("also_in_the_filter", "v")]):
        pub.publish(Message(body=Converter.string_to_bytes(f"m{i}"), subject=subject,
                            application_properties={"key": value}))
    pub.close()
    got = _read(conn, q, 2, StreamConsumerOptions(
        OffsetSpecification.first, StreamFilterOptions(
            sql="properties.subject LIKE '%in_the_filter%' AND key = 'v'")))
    assert got == [(1, "m1"), (3, "m3")]
    management.delete_queue(q)
    management.close()
    conn.close()
