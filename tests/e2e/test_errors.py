"""Scenarios 7-8: every error a user can provoke, with the reply code the client sees.

Channel errors run with every client through the adapter; authentication and vhost errors
check each library's own exception; frame-level errors use a raw socket (amqp_raw).
"""
from __future__ import annotations

import asyncio
import struct
import time

import aio_pika
import aiormq
import amqp
import kombu
import pika
import pika.exceptions
import pytest
from pamqp import commands, frame, header

from .amqp_raw import PROTOCOL_HEADER, Closed, RawAMQP, method_frame, raw_frame
from .clients import BrokerError
from .conftest import QUEUE_TYPE, unsupported

pytestmark = pytest.mark.e2e


def expect_error(c, code: int, fn, *args, **kwargs) -> BrokerError:
    """Run ``fn`` (and a synchronous round trip after it, for asynchronous methods such as
    basic.publish / basic.ack) and assert the channel is closed with ``code``. Reopens."""
    with pytest.raises(BrokerError) as e:
        fn(*args, **kwargs)
        c.declare_queue("", exclusive=True)     # a round trip that surfaces a pending close
        for _ in range(20):                     # aio-pika may report the close a bit later
            c.pump(0.05)
            c.declare_queue("", exclusive=True)
    assert e.value.code == code, f"expected reply code {code}, got {e.value}"
    assert not e.value.hard, f"expected a channel error, the connection was closed: {e.value}"
    c.reopen()
    return e.value


# ---- 404 NOT_FOUND ---------------------------------------------------------------------------
def test_404_passive_declare_missing_queue(client, names):
    expect_error(client, 404, client.declare_queue, names("missing"), passive=True)
    client.declare_queue(names("ok"))           # the connection is still good


def test_404_consume_missing_queue(client, names):
    expect_error(client, 404, client.consume, names("missing"))


def test_404_bind_missing_queue_and_missing_exchange(client, names):
    ex = names("ex")
    client.declare_exchange(ex, "direct")
    expect_error(client, 404, client.bind_queue, names("missing"), ex, "rk")
    q = client.declare_queue(names("q"))[0]
    expect_error(client, 404, client.bind_queue, q, names("missing-ex"), "rk")


def test_404_passive_declare_missing_exchange(client, names):
    expect_error(client, 404, client.declare_exchange, names("missing"), "direct", passive=True)


def test_404_publish_to_missing_exchange_closes_channel(client, names):
    expect_error(client, 404, client.publish, names("missing-ex"), "rk", b"x")


def test_exchange_delete(client, names):
    ex = names("del")
    client.declare_exchange(ex, "fanout")
    q = client.declare_queue(names("q"))[0]
    client.bind_queue(q, ex)
    client.delete_exchange(ex)
    expect_error(client, 404, client.declare_exchange, ex, "fanout", passive=True)
    expect_error(client, 404, client.publish, ex, "", b"x")
    client.declare_queue(q, passive=True)       # the bound queue survives its exchange


# ---- 405 RESOURCE_LOCKED / exclusive ---------------------------------------------------------
def test_405_exclusive_queue_of_another_connection(make_client, names):
    owner, other = make_client(), make_client()
    q = owner.declare_queue(names("excl"), exclusive=True)[0]
    expect_error(other, 405, other.declare_queue, q)
    expect_error(other, 405, other.consume, q)
    owner.publish("", q, b"mine")
    assert owner.get(q, no_ack=True).body == b"mine"


def test_exclusive_queue_deleted_when_its_connection_closes(make_client, names):
    owner, other = make_client(), make_client()
    q = owner.declare_queue(names("excl"), exclusive=True)[0]
    owner.close()
    deadline = time.monotonic() + 10
    while True:         # deletion follows the close asynchronously; bounded
        try:
            other.declare_queue(q, passive=True)
        except BrokerError as e:
            assert e.code == 404, e
            break
        assert time.monotonic() < deadline, "exclusive queue outlived its connection"
        other.pump(0.1)


# ---- 406 PRECONDITION_FAILED -----------------------------------------------------------------
def test_406_redeclare_queue_with_different_durable(client, names):
    if QUEUE_TYPE == "quorum":
        pytest.skip("SHOAL_E2E_QUEUE_TYPE=quorum declares every named queue durable (a "
                    "quorum queue is), so the two declares cannot differ")
    q = client.declare_queue(names("dur"), durable=False)[0]
    expect_error(client, 406, client.declare_queue, q, durable=True)
    client.delete_queue(q)


def test_406_redeclare_exchange_with_different_type(client, names):
    ex = names("ex")
    client.declare_exchange(ex, "direct")
    expect_error(client, 406, client.declare_exchange, ex, "fanout")
    client.delete_exchange(ex)


def test_406_delete_if_unused_and_if_empty(make_client, names):
    c, consumer = make_client(confirms=True), make_client()
    q = c.declare_queue(names("ifu"))[0]
    consumer.consume(q)
    expect_error(c, 406, c.delete_queue, q, if_unused=True)
    consumer.close()
    c.publish("", q, b"x")
    expect_error(c, 406, c.delete_queue, q, if_empty=True)
    c.declare_queue(q, passive=True)            # still there after both refusals
    c.delete_queue(q)
    expect_error(c, 404, c.declare_queue, q, passive=True)


def test_406_unknown_delivery_tag(client, names):
    q = client.declare_queue(names("tag"))[0]
    client.publish("", q, b"x")
    d = client.get(q)
    assert d is not None and d.delivery_tag == 1
    err = expect_error(client, 406, client.ack_tag, 7)
    if client.name == "pika":
        assert err.text == "PRECONDITION_FAILED - unknown delivery tag 7"
    else:
        assert "unknown delivery tag 7" in err.text
    # the unacked delivery went back to the queue with the closed channel
    again = client.get(q)
    assert (again.body, again.redelivered) == (b"x", True)


def test_406_unknown_tag_inside_a_run_of_acks(make_client, names, cluster):
    """Acks that arrive together are settled together; one with an unknown delivery tag in
    the middle settles the acks before it, closes the channel with 406, and the deliveries
    acked after it (on a closing channel) come back redelivered with the rest."""
    q = names("ackrun")
    c = make_client()
    c.declare_queue(q)
    for body in (b"m1", b"m2", b"m3"):
        c.publish("", q, body)
    with RawAMQP(cluster.host, cluster.port).open() as raw:
        raw.open_channel(1)
        for tag in (1, 2, 3):
            raw.send_frame(commands.Basic.Get(queue=q), 1)
            ok = raw.expect(commands.Basic.GetOk, 1)
            assert ok.delivery_tag == tag
            raw.read_frame()                    # content header
            raw.read_frame()                    # body
        raw.send(b"".join(frame.marshal(commands.Basic.Ack(delivery_tag=t), 1)
                          for t in (1, 99, 2)))            # one write: one run of acks
        close = raw.expect(commands.Channel.Close, 1)
        assert (close.reply_code, close.reply_text) == (
            406, "PRECONDITION_FAILED - unknown delivery tag 99")
        raw.send_frame(commands.Channel.CloseOk(), 1)
    got = [c.get(q) for _ in range(3)]
    assert [(d.body, d.redelivered) for d in got if d is not None] == [
        (b"m2", True), (b"m3", True)], "m1 was acked before the bad tag: it must be gone"


# ---- 403 ACCESS_REFUSED ----------------------------------------------------------------------
@pytest.mark.parametrize("what", ["exchange", "queue"])
def test_403_reserved_amq_names(client, names, what):
    name = "amq." + names("reserved")
    if what == "exchange":
        expect_error(client, 403, unsupported, client.declare_exchange, name, "direct")
    else:
        expect_error(client, 403, client.declare_queue, name)


def test_403_bad_credentials(cluster, kind):
    url = cluster.url.replace(f":{cluster.password}@", ":wrong-password@")
    if kind == "pika":
        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as e:
            pika.BlockingConnection(pika.URLParameters(url))
        assert "403" in str(e.value) or "ACCESS_REFUSED" in str(e.value)
    elif kind == "aio_pika":
        async def connect():
            await aio_pika.connect(url, timeout=10)
        with pytest.raises(aiormq.exceptions.ProbableAuthenticationError) as e:
            asyncio.run(connect())
        assert "ACCESS_REFUSED" in str(e.value)
    else:
        conn = kombu.Connection(url, transport="pyamqp", connect_timeout=10)
        with pytest.raises(amqp.exceptions.AccessRefused) as e:
            conn.connect()
        assert e.value.reply_code == 403


def test_530_unknown_vhost(cluster, kind, names):
    url = f"amqp://{cluster.user}:{cluster.password}@{cluster.host}:{cluster.port}/" \
          + names("no-such-vhost")
    if kind == "pika":
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as e:
            pika.BlockingConnection(pika.URLParameters(url))
        assert "530" in str(e.value)
    elif kind == "aio_pika":
        async def connect():
            await aio_pika.connect(url, timeout=10)
        # aio-pika reports the connection.close it got instead of open-ok, without its code
        with pytest.raises(aiormq.exceptions.AMQPError, match="Connection.Close|530|NOT_ALLOWED"):
            asyncio.run(connect())
    else:
        conn = kombu.Connection(url, transport="pyamqp", connect_timeout=10)
        with pytest.raises(amqp.exceptions.NotAllowed) as e:
            conn.connect()
        assert e.value.reply_code == 530


# ---- frame-level errors on a raw socket --------------------------------------------------------
def raw_close_code(cluster, send, open_channel: bool = True) -> int:
    with RawAMQP(cluster.host, cluster.port).open() as raw:
        if open_channel:
            raw.open_channel(1)
        send(raw)
        close = raw.expect_connection_close()
        with pytest.raises(Closed):        # after close-ok the server closes the socket
            raw.read_frame(timeout=10)
        return close.reply_code


def test_raw_handshake_and_clean_close(cluster):
    with RawAMQP(cluster.host, cluster.port).open() as raw:
        raw.open_channel(1)
        raw.send_frame(commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 1)
        raw.expect(commands.Channel.CloseOk, 1)
        raw.send_frame(commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 0)
        raw.expect(commands.Connection.CloseOk, 0)


@pytest.mark.parametrize("hdr", [b"AMQP\x00\x00\x08\x00", b"AMQP\x01\x01\x00\x0a",
                                 b"GET / HTTP/1.1\r\n\r\n"], ids=["0-8", "1-0", "http"])
def test_wrong_protocol_header_gets_ours_back(cluster, hdr):
    with RawAMQP(cluster.host, cluster.port) as raw:
        raw.send(hdr)
        assert raw.read_until_closed().startswith(PROTOCOL_HEADER)


def test_501_bad_frame_end(cluster):
    bad = raw_frame(1, 1, struct.pack(">HH", 60, 10) + b"\x00" * 7, end=b"\x00")
    assert raw_close_code(cluster, lambda r: r.send(bad)) == 501


def test_501_unknown_frame_type(cluster):
    assert raw_close_code(cluster, lambda r: r.send(raw_frame(9, 0, b"xx"))) == 501


def test_501_frame_larger_than_frame_max(cluster):
    assert raw_close_code(
        cluster, lambda r: r.send(raw_frame(1, 1, b"x" * (r.frame_max + 10)))) == 501


def test_501_truncated_method_arguments(cluster):
    # queue.declare whose argument list stops after one octet
    assert raw_close_code(cluster, lambda r: r.send(method_frame(1, 50, 10, b"\x00"))) == 501


def test_501_unparseable_properties_are_refused_and_never_delivered(cluster, names):
    """A content header whose headers table claims more octets than the frame holds (found
    by the fuzz test): the publisher's connection gets 501, no consumer ever sees the
    message, and the next good message arrives alone."""
    q = names("q")
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    try:
        ch = conn.channel()
        ch.queue_declare(q, auto_delete=True)
        bad_header = struct.pack(">HHQH", 60, 0, 3, 0x2000) + struct.pack(">I", 0x80161) \
            + b"\x01aS\x00\x00\x00\x01b"

        def send(raw):
            raw.send(frame.marshal(commands.Basic.Publish(exchange="", routing_key=q), 1)
                     + raw_frame(2, 1, bad_header) + raw_frame(3, 1, b"bad"))
        assert raw_close_code(cluster, send) == 501
        ch.basic_publish("", q, b"good", pika.BasicProperties(headers={"a": "b"}))
        got = []
        ch.basic_consume(q, lambda c, m, p, b: got.append((b, p.headers)), auto_ack=True)
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        conn.process_data_events(time_limit=0.3)     # anything behind it would come now
        assert got == [(b"good", {"a": "b"})]
    finally:
        conn.close()


def test_505_body_without_method(cluster):
    assert raw_close_code(cluster, lambda r: r.send(raw_frame(3, 1, b"hello"))) == 505


def test_505_content_header_without_method(cluster):
    hdr = frame.marshal(header.ContentHeader(0, 5, commands.Basic.Properties()), 1)
    assert raw_close_code(cluster, lambda r: r.send(hdr)) == 505


def test_505_method_where_content_header_expected(cluster):
    def send(r):
        r.send(frame.marshal(commands.Basic.Publish(exchange="", routing_key="x"), 1))
        r.send_frame(commands.Basic.Qos(prefetch_count=1), 1)
    assert raw_close_code(cluster, send) == 505


def test_heartbeat_on_a_channel_is_a_frame_error(cluster):
    # spec 4.2.7 says 501; RabbitMQ 3.10 answers 505, and so do we (tests/e2e/side_by_side/test_parity.py)
    assert raw_close_code(cluster, lambda r: r.send(raw_frame(8, 1, b""))) == 505


def test_503_connection_method_on_a_channel(cluster):
    def send(r):
        r.send_frame(commands.Connection.Open(virtual_host="/"), 1)
    assert raw_close_code(cluster, send) == 503


def test_504_method_on_unopened_channel(cluster):
    send = lambda r: r.send_frame(commands.Basic.Qos(prefetch_count=1), 5)  # noqa: E731
    assert raw_close_code(cluster, send, open_channel=False) == 504


def test_504_second_channel_open(cluster):
    assert raw_close_code(cluster, lambda r: r.send_frame(commands.Channel.Open(), 1)) == 504


@pytest.mark.parametrize("class_id,method_id", [(999, 1), (60, 999)],
                         ids=["unknown-class", "unknown-method"])
def test_unknown_method_closes_with_503_or_540(cluster, class_id, method_id):
    with RawAMQP(cluster.host, cluster.port).open() as raw:
        raw.open_channel(1)
        raw.send(method_frame(1, class_id, method_id))
        try:
            close = raw.expect_connection_close()
        except AssertionError:
            if cluster.external:
                pytest.skip("the external broker closed the socket without connection.close "
                            "(RabbitMQ does this for unknown methods)")
            raise
        assert close.reply_code in (503, 540), close


def test_server_still_serves_after_raw_errors(cluster, names):
    """The raw tests above must not have hurt the router: a normal client works."""
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    try:
        ch = conn.channel()
        q = ch.queue_declare(names("after")).method.queue
        ch.basic_publish("", q, b"ok")
        for _ in range(50):
            m, _, body = ch.basic_get(q, auto_ack=True)
            if m:
                break
            conn.process_data_events(time_limit=0.1)
        assert body == b"ok"
    finally:
        conn.close()


def test_half_open_protocol_header_is_not_answered_early(cluster):
    """A partial header is waited for, not treated as wrong (the server needs 8 octets)."""
    with RawAMQP(cluster.host, cluster.port, timeout=2.0) as raw:
        raw.send(PROTOCOL_HEADER[:5])
        with pytest.raises(AssertionError, match="timed out"):
            raw.read_exactly(1, timeout=1.0)
        raw.send(PROTOCOL_HEADER[5:])
        raw.expect(commands.Connection.Start, 0, timeout=10)

