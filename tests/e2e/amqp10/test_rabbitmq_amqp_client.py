"""RabbitMQ's own AMQP 1.0 client for Python, rabbitmq-amqp-python-client (issue 37):
``Environment`` -> ``Connection`` -> ``publisher`` / ``consumer`` on ``/queues/NAME`` and
``/exchanges/X/K`` addresses (``AddressHelper``), a consumer's ``AMQPMessagingHandler``
accepting, requeuing and discarding through its ``delivery_context``.

Queues are declared with pika here; the client's ``Connection.management()`` (RabbitMQ 4's
``/management`` node) is tested in test_management_node.py.

The client refuses any server whose open properties do not say ``product`` ``RabbitMQ`` and a
``version`` of at least 4.0.0 (``Connection._validate_server_properties``); Shoal's open says
so (setting ``amqp10_announce_rabbitmq``, docs/amqp10.md), so the client is used as it is."""
from __future__ import annotations

import contextlib
import time

import pytest

rmq = pytest.importorskip("rabbitmq_amqp_python_client",
                          reason="rabbitmq-amqp-python-client is not installed "
                          "(pip install -e '.[test]')")

from rabbitmq_amqp_python_client import (AddressHelper, AMQPMessagingHandler,  # noqa: E402
                                         ConsumerOptions, ConsumerSettleStrategy, Converter,
                                         Environment, Message)

from .helpers import TIMEOUT, declare, pika_channel, pika_get_all, ready_count  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


class Done(Exception):
    """Raised by a handler to end ``consumer.run()``."""


class TimedOut(Exception):
    pass


def uri(cl) -> str:
    return f"amqp://{cl.user}:{cl.password}@{cl.host}:{cl.port}/"


@pytest.fixture
def connection(cluster):
    """A dialled Connection."""
    env = Environment(uri=uri(cluster))
    conn = env.connection()
    conn.dial()
    yield conn
    with contextlib.suppress(Exception):
        env.close()


class Collect(AMQPMessagingHandler):
    """Settles each message with ``outcome`` (accept / requeue / discard; None: they come
    pre-settled) and stops after ``want`` messages."""

    def __init__(self, want: int, outcome: str = "accept"):
        super().__init__()
        self.want, self.outcome, self.got = want, outcome, []

    def on_amqp_message(self, event):
        self.got.append(Converter.bytes_to_string(event.message.body))
        if self.outcome is not None:
            getattr(self.delivery_context, self.outcome)(event)
        if len(self.got) >= self.want:
            raise Done()


class _Timer:
    def on_timer_task(self, event):
        raise TimedOut()


def run_consumer(consumer) -> None:
    """``consumer.run()`` until the handler raises Done, bounded by TIMEOUT."""
    task = consumer._receiver.container.schedule(TIMEOUT, _Timer())
    try:
        consumer.run()
    except Done:
        pass
    finally:
        task.cancel()


def test_publish_to_a_queue_and_consume_with_accept(cluster, connection, names):
    q = declare(cluster, names())
    pub = connection.publisher(AddressHelper.queue_address(q))
    for i in range(5):
        d = pub.publish(Message(body=Converter.string_to_bytes(f"msg-{i}")))
        assert d.remote_state == d.ACCEPTED
    pub.close()
    handler = Collect(5)
    consumer = connection.consumer(AddressHelper.queue_address(q), message_handler=handler)
    run_consumer(consumer)
    consumer.close()
    assert handler.got == [f"msg-{i}" for i in range(5)]
    assert ready_count(cluster, q) == 0


@pytest.mark.parametrize("qtype", ["classic", "quorum"])
def test_a_pre_settled_consumer_gets_every_message_in_order(cluster, connection, names, qtype):
    """RabbitMQ's client settles nothing itself here (``PreSettled``). Its newer versions
    grant credit twice at attach and then lower it, which lost a message before the fix in
    test_proton.py's ``test_a_pre_settled_receiver_that_lowers_its_credit_*``."""
    q = declare(cluster, names(), {"x-queue-type": qtype}, durable=True)
    pub = connection.publisher(AddressHelper.queue_address(q))
    sent = [f"m{i}" for i in range(50)]
    for b in sent:
        pub.publish(Message(body=Converter.string_to_bytes(b)))
    pub.close()
    handler = Collect(50, None)
    consumer = connection.consumer(
        AddressHelper.queue_address(q), message_handler=handler,
        consumer_options=ConsumerOptions(settle_strategy=ConsumerSettleStrategy.PreSettled))
    run_consumer(consumer)
    consumer.close()
    assert handler.got == sent


def test_publish_to_an_exchange_address(cluster, connection, names):
    q, key = names(), names("key")
    with pika_channel(cluster) as ch:
        ch.queue_declare(q)
        ch.queue_bind(q, "amq.direct", key)
    pub = connection.publisher(AddressHelper.exchange_address("amq.direct", key))
    pub.publish(Message(body=Converter.string_to_bytes("via exchange")))
    pub.close()
    assert [b for _, b in pika_get_all(cluster, q)] == [b"via exchange"]


def test_publisher_without_address_uses_the_message_address(cluster, connection, names):
    q = declare(cluster, names())
    pub = connection.publisher()
    msg = Message(body=Converter.string_to_bytes("addressed"))
    AddressHelper.message_to_address_helper(msg, AddressHelper.queue_address(q))
    pub.publish(msg)
    pub.close()
    assert [b for _, b in pika_get_all(cluster, q)] == [b"addressed"]


def test_requeue_then_accept(cluster, connection, names):
    q = declare(cluster, names())
    pub = connection.publisher(AddressHelper.queue_address(q))
    pub.publish(Message(body=Converter.string_to_bytes("twice")))
    pub.close()
    first = Collect(1, "requeue")
    c1 = connection.consumer(AddressHelper.queue_address(q), message_handler=first)
    run_consumer(c1)
    c1.close()
    again = Collect(1)
    c2 = connection.consumer(AddressHelper.queue_address(q), message_handler=again)
    run_consumer(c2)
    c2.close()
    assert first.got == again.got == ["twice"]


def test_discard_dead_letters(cluster, connection, names):
    q, dlq = names(), names("dlq")
    declare(cluster, dlq)
    declare(cluster, q, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    pub = connection.publisher(AddressHelper.queue_address(q))
    pub.publish(Message(body=Converter.string_to_bytes("discarded")))
    pub.close()
    h = Collect(1, "discard")
    c = connection.consumer(AddressHelper.queue_address(q), message_handler=h)
    run_consumer(c)
    c.close()
    # the dead letter goes from the queue's node through a router to the dead-letter queue's
    # node on its own way, after the discard's disposition: ask until it is there, bounded
    # (as RabbitMQ, dead-lettering is not part of the settlement)
    deadline = time.monotonic() + TIMEOUT
    while ready_count(cluster, dlq) != 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [b for _, b in pika_get_all(cluster, dlq)] == [b"discarded"]
    assert ready_count(cluster, q) == 0


def test_the_client_accepts_shoal_as_it_is(cluster):
    """The client's own server check passes: the open announces RabbitMQ 4 and Shoal."""
    env = Environment(uri=uri(cluster))
    try:
        conn = env.connection()
        conn.dial()
        props = conn._conn.conn.remote_properties
        assert props["product"] == "RabbitMQ" and props["shoal-version"]
    finally:
        env.close()


def close_via_management(cl, container_id: str, dry_run: bool = False) -> int:
    """Close every connection of ``container_id`` as an operator does from the console
    (``DELETE /api/connections/NAME``); returns how many there were (``dry_run``: only
    counts them)."""
    import base64
    import json
    import urllib.parse
    import urllib.request
    auth = {"Authorization": "Basic " + base64.b64encode(
        f"{cl.user}:{cl.password}".encode()).decode()}
    base = f"http://{cl.host}:{cl.mgmt_port}/api/connections"
    with urllib.request.urlopen(urllib.request.Request(base, headers=auth),
                                timeout=TIMEOUT) as r:
        conns = json.load(r)
    mine = [c["name"] for c in conns
            if (c.get("client_properties") or {}).get("container_id") == container_id]
    for name in [] if dry_run else mine:
        req = urllib.request.Request(f"{base}/{urllib.parse.quote(name, safe='')}",
                                     method="DELETE", headers=auth)
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            assert r.status == 204
    return len(mine)


@pytest.mark.layout_free   # the router's forced close and the client's recovery
def test_connection_closed_by_an_operator_recovers(access_cluster, names):
    """The reconnection example's scenario (its README: break the connection from the
    management UI): the connection is closed with ``amqp:connection:forced``; the client's
    automatic recovery reconnects, its management and publisher links work again, and every
    message the publisher had settled as accepted is in the queue."""
    from rabbitmq_amqp_python_client import ConnectionClosed, QuorumQueueSpecification
    cl = access_cluster
    env = Environment(uri=uri(cl))
    try:
        conn = env.connection()
        conn.dial()
        mgmt = conn.management()
        q = names()
        mgmt.declare_queue(QuorumQueueSpecification(name=q))
        pub = conn.publisher(AddressHelper.queue_address(q))
        for i in range(5):
            d = pub.publish(Message(body=Converter.string_to_bytes(f"m{i}")))
            assert d.remote_state == d.ACCEPTED
        container = conn._conn.conn.container
        assert close_via_management(cl, container) == 1
        deadline = time.monotonic() + TIMEOUT      # gone from the API: closed, nothing in flight
        while close_via_management(cl, container, dry_run=True):
            assert time.monotonic() < deadline, "the connection was not closed"
            time.sleep(0.1)
        closed_seen = 0
        for i in range(5, 10):
            for _attempt in range(3):
                try:
                    d = pub.publish(Message(body=Converter.string_to_bytes(f"m{i}")))
                except ConnectionClosed:
                    closed_seen += 1
                    continue
                assert d.remote_state == d.ACCEPTED
                break
        assert closed_seen >= 1, "the publisher never saw its connection closed"
        assert mgmt.purge_queue(q) == 10
        mgmt.delete_queue(q)
    finally:
        env.close()
