"""Issue 21: what standard clients and their own test suites found Shoal doing differently from
RabbitMQ 3.10 (or, where RabbitMQ 4 answers otherwise and its clients expect that, from
RabbitMQ 4), each checked end to end with the client library that exposed it.

Queue names RabbitMQ accepts, an unexpected exception becoming 541 INTERNAL_ERROR (never a
client waiting forever), ``connection.update-secret``, ``channel_max`` as a count of channels,
405 for an exclusive queue redeclared with another exclusivity, and RabbitMQ's 128 MiB
``max_message_size``. The side-by-side comparison with a running RabbitMQ is test_parity.py.
"""
from __future__ import annotations

import asyncio
import os
import time

import aiormq
import pika
import pika.exceptions
import pytest
from pamqp import commands, frame

from .amqp_raw import PROTOCOL_HEADER, RawAMQP, publish_frames, raw_frame
from .clients import BrokerError
from .conftest import unsupported

pytestmark = pytest.mark.e2e

#: Names RabbitMQ 3.10 accepts and the 0-9-1 spec's queue-name pattern (and pamqp) does not:
#: any UTF-8 string of at most 255 octets.
NAMES = ["ünïcode-{}", "q#*-{}", "{}" + "é" * 121 + "x"]


@pytest.mark.parametrize("template", NAMES, ids=["unicode", "hash-star", "255-octets"])
def test_queue_names_rabbitmq_accepts(client, uid, template):
    name = template.format(uid)
    assert len(name.encode()) <= 255
    declared = _declare(client, name)
    assert declared[0] == name
    client.publish("", name, b"hello")
    d = client.get(name, no_ack=True)
    assert d is not None and d.body == b"hello"
    client.delete_queue(name)


def _declare(client, name: str):
    """queue.declare ``name``; skip when the client library refuses the name itself."""
    try:
        return unsupported(client.declare_queue, name)
    except ValueError as exc:       # raised by the client before anything is sent
        pytest.skip(f"the client library refuses this name itself (pamqp's spec pattern): "
                    f"{exc}; pika and kombu send it")


def test_amq_prefix_is_still_reserved_for_unicode_names(client, uid):
    with pytest.raises(BrokerError) as e:
        _declare(client, f"amq.ünï-{uid}")
        client.declare_queue("", exclusive=True)
    assert e.value.code == 403 and not e.value.hard
    client.reopen()


# ---- 541 INTERNAL_ERROR ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """A cluster whose router fails in queue.purge and whose nodes fail in QUEUE_DELETE with
    an unexpected exception (SHOAL_INJECT_FAULTS, a test hook)."""
    from tests.conftest import EXTERNAL_URL, start_cluster, stop_cluster
    if EXTERNAL_URL:
        pytest.skip("injects faults into the cluster's own processes")
    c = start_cluster(tmp_path_factory.mktemp("shoal-faults"), 2,
                      env={"SHOAL_INJECT_FAULTS": "router:queue.purge,node:queue_delete"})
    yield c
    stop_cluster(c)


def _closed_541(fn) -> pika.exceptions.ConnectionClosedByBroker:
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
        fn()
    assert e.value.reply_code == 541, e.value
    assert e.value.reply_text.startswith("INTERNAL_ERROR - "), e.value
    return e.value


def test_an_unexpected_exception_in_a_channel_task_closes_with_541(faulty, uid):
    conn = pika.BlockingConnection(pika.URLParameters(faulty.url))
    ch = conn.channel()
    q = f"fault-{uid}"
    ch.queue_declare(q)
    err = _closed_541(lambda: ch.queue_purge(q))
    assert "queue.purge" in err.reply_text
    # The router is fine: a new connection works, and the log has the traceback.
    conn = pika.BlockingConnection(pika.URLParameters(faulty.url))
    ch = conn.channel()
    assert ch.queue_declare(q, passive=True).method.queue == q
    conn.close()
    log = faulty.log_path.read_text(errors="replace")
    assert "internal error handling queue.purge" in log and "InjectedFault" in log
    assert "Task exception was never retrieved" not in log


def test_an_unexpected_exception_on_a_node_answers_541(faulty, uid):
    conn = pika.BlockingConnection(pika.URLParameters(faulty.url))
    ch = conn.channel()
    q = f"fault-node-{uid}"
    ch.queue_declare(q)
    err = _closed_541(lambda: ch.queue_delete(q))
    assert "queue_delete" in err.reply_text
    conn = pika.BlockingConnection(pika.URLParameters(faulty.url))
    ch = conn.channel()
    ch.basic_publish("", q, b"still here")
    assert ch.basic_get(q, auto_ack=True)[2] == b"still here"
    conn.close()
    assert "internal error handling QUEUE_DELETE" in faulty.log_path.read_text(
        errors="replace")


# ---- connection.update-secret (aiormq, which aio-pika uses, implements it) ------------------
def test_update_secret_for_a_password_user_is_accepted(cluster):
    """As RabbitMQ 3.10 answers a user of its internal store: update-secret-ok whatever the
    new secret (the store does not use secrets after login), and the connection goes on.
    pika's connection.update_secret works the same way (side by side in test_parity.py)."""
    async def run():
        conn = await aiormq.connect(cluster.url)
        for secret in (cluster.password, "not-the-password"):
            ok = await conn.update_secret(secret, reason="token refresh")
            assert isinstance(ok, commands.Connection.UpdateSecretOk)
            ch = await conn.channel()                 # the connection still works
            await ch.queue_declare("", exclusive=True)
        await conn.close()
    asyncio.run(asyncio.wait_for(run(), 30))


def test_pika_update_secret_works(cluster):
    """pika's BlockingConnection.update_secret, which closed the connection with 530 before
    (issue 34): the call returns and the channel keeps working."""
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    ch = conn.channel()
    conn.update_secret("any-new-secret", "token refresh")
    assert ch.queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")
    assert conn.is_open
    conn.close()


# ---- channel_max ---------------------------------------------------------------------------
def test_channel_max_counts_channels_not_channel_numbers(cluster):
    """RabbitMQ: channel_max caps how many channels are open; any number 1-65535 may be
    used. One channel over the negotiated count closes the connection with 530."""
    raw = RawAMQP(cluster.host, cluster.port)
    raw.send(PROTOCOL_HEADER)
    raw.expect(commands.Connection.Start, 0)
    raw.send_frame(commands.Connection.StartOk(
        client_properties={}, mechanism="PLAIN",
        response=f"\0{cluster.user}\0{cluster.password}", locale="en_US"))
    tune = raw.expect(commands.Connection.Tune, 0)
    assert tune.channel_max == 2047
    raw.send_frame(commands.Connection.TuneOk(channel_max=2, frame_max=131072, heartbeat=0))
    raw.send_frame(commands.Connection.Open(virtual_host=cluster.vhost))
    raw.expect(commands.Connection.OpenOk, 0)
    raw.open_channel(65535)
    raw.open_channel(3000)
    raw.send_frame(commands.Channel.Open(), 1)
    close = raw.expect(commands.Connection.Close, 0)
    assert close.reply_code == 530
    assert "negotiated channel_max (2)" in close.reply_text


def test_pika_proposing_channel_max_65535_opens_channels(cluster):
    params = pika.URLParameters(cluster.url)
    params.channel_max = 65535
    conn = pika.BlockingConnection(params)
    assert conn._impl.params.channel_max == 2047          # the lower of the two
    ch = conn.channel(channel_number=2047)
    ch.queue_declare("", exclusive=True)
    conn.close()


# ---- exclusive redeclare: 405 as RabbitMQ 3.10 --------------------------------------------
def test_405_exclusive_queue_redeclared_non_exclusive_on_its_connection(client, names):
    q = names("excl")
    client.declare_queue(q, exclusive=True)
    with pytest.raises(BrokerError) as e:
        client.declare_queue(q, exclusive=False)
        client.declare_queue("", exclusive=True)
    assert e.value.code == 405 and not e.value.hard, e.value
    client.reopen()


# ---- max_message_size: RabbitMQ's 128 MiB default ------------------------------------------
def test_a_message_over_16_mib_is_accepted(cluster, uid):
    body = os.urandom(1024) * (20 * 1024)                 # 20 MiB
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    ch = conn.channel()
    ch.confirm_delivery()
    q = f"big-{uid}"
    ch.queue_declare(q)
    ch.basic_publish("", q, body)
    got = ch.basic_get(q, auto_ack=True)[2]
    assert got == body
    ch.queue_delete(q)
    conn.close()


def test_a_message_over_max_message_size_closes_the_channel_with_406(cluster):
    """The content header's body size alone decides (RabbitMQ's wording); the body is never
    sent."""
    raw = RawAMQP(cluster.host, cluster.port).open()
    raw.open_channel(1)
    size = 128 * 1024 * 1024 + 1
    from pamqp import frame, header
    raw.send(frame.marshal(commands.Basic.Publish(exchange="", routing_key="nowhere"), 1)
             + frame.marshal(header.ContentHeader(0, size, commands.Basic.Properties()), 1))
    close = raw.expect(commands.Channel.Close, 1)
    assert close.reply_code == 406
    assert close.reply_text == (f"PRECONDITION_FAILED - message size {size} is larger than "
                                f"configured max size {128 * 1024 * 1024}")


# ---- heartbeats ----------------------------------------------------------------------------
def test_a_silent_client_is_closed_and_its_unacked_message_redelivered(cluster, uid):
    """Heartbeat 1 s negotiated, then silence: the broker drops the socket after two missed
    intervals (RabbitMQ's rule), and the message the silent client held comes back
    redelivered to another consumer."""
    q = f"hb-{uid}"
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    ch = conn.channel()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"held")
    raw = RawAMQP(cluster.host, cluster.port).open(heartbeat=1)
    raw.open_channel(1)
    raw.send_frame(commands.Basic.Get(queue=q, no_ack=False), 1)
    raw.expect(commands.Basic.GetOk, 1)
    # Silent from here on: the broker sends heartbeats and then closes the socket (bounded).
    raw.read_until_closed(timeout=30)
    for _ in range(100):
        method, _, body = ch.basic_get(q, auto_ack=True)
        if method is not None:
            break
        conn.sleep(0.1)
    assert body == b"held" and method.redelivered
    ch.queue_delete(q)
    conn.close()


# ---- basic.recover requeue=false: 540 as RabbitMQ 3.10 ------------------------------------
def test_basic_recover_without_requeue_is_not_implemented(cluster, uid):
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    ch = conn.channel()
    q = f"recover-{uid}"
    ch.queue_declare(q)
    ch.basic_publish("", q, b"m")
    assert ch.basic_get(q)[2] == b"m"                     # unacked
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
        ch.basic_recover(requeue=False)
    assert (e.value.reply_code, e.value.reply_text) == (540, "NOT_IMPLEMENTED - requeue=false")
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    ch = conn.channel()
    method, _, body = ch.basic_get(q, auto_ack=True)       # requeued when the connection went
    assert body == b"m" and method.redelivered
    ch.queue_delete(q)
    conn.close()


# ---- headers exchange and unbind (found by test_parity.py) ---------------------------------
def test_headers_binding_checks_x_match_and_compares_kinds(cluster, uid):
    """A bad x-match is 406 at bind (an integer one used to break every later publish);
    ``true`` does not match ``1``; unbinding what does not exist is unbind-ok (RabbitMQ)."""
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    ch = conn.channel()
    ex, q = f"hdr-{uid}", f"hdr-q-{uid}"
    ch.exchange_declare(ex, "headers")
    ch.queue_declare(q)
    for bad in ("foo", 1):
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.queue_bind(q, ex, arguments={"x-match": bad, "k": "v"})
        assert e.value.reply_code == 406
        ch = conn.channel()
    ch.queue_bind(q, ex, arguments={"x-match": "all", "t": True})
    ch.basic_publish(ex, "", b"int", pika.BasicProperties(headers={"t": 1}))
    ch.basic_publish(ex, "", b"bool", pika.BasicProperties(headers={"t": True}))
    ch.confirm_delivery()
    ch.basic_publish("", q, b"end")
    got = []
    while True:
        body = ch.basic_get(q, auto_ack=True)[2]
        if body is None:
            break
        got.append(body)
    assert got == [b"bool", b"end"]
    ch.queue_unbind(q, f"missing-{uid}")
    ch.queue_unbind(f"missing-{uid}", ex)
    ch.exchange_delete(ex)
    ch.queue_delete(q)
    conn.close()


def test_an_unknown_exchange_type_closes_the_channel_with_406_as_rabbitmq_4(cluster, uid):
    """RabbitMQ 4's answer (rabbit_exchange:check_type since 4.0.0; 3.10 closed the
    connection with 503), which pika's own acceptance tests expect: the connection stays."""
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            conn.channel().exchange_declare(f"odd-{uid}", "x-no-such-type")
        assert (e.value.reply_code, e.value.reply_text) == (
            406, "PRECONDITION_FAILED - unknown exchange type 'x-no-such-type'")
        ch = conn.channel()
        ch.exchange_declare(f"odd-{uid}", "direct", auto_delete=True)
        ch.exchange_delete(f"odd-{uid}")
    finally:
        conn.close()


def test_body_frames_of_frame_max_octets_are_read_as_rabbitmq_reads_them(cluster, uid):
    """AMQPStorm sends body frames whose payload is frame_max octets (8 over the limit, with
    the framing); RabbitMQ reads them (rabbit_reader's FRAME_SIZE_FUDGE), and so does Shoal.
    AMQPStorm's large-message tests failed with 501 before."""
    q = f"fudge-{uid}"
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    ch = conn.channel()
    ch.queue_declare(q, auto_delete=True)
    raw = RawAMQP(cluster.host, cluster.port).open()
    raw.open_channel(1)
    body = bytes(range(256)) * (2 * raw.frame_max // 256 + 3)   # three body frames
    raw.send(publish_frames(1, "", q, body, frame_max=raw.frame_max + 8))
    raw.send(frame.marshal(commands.Basic.Qos(prefetch_count=1), 1))   # a round trip after
    raw.expect(commands.Basic.QosOk, 1)
    deadline = time.monotonic() + 10
    while (got := ch.basic_get(q, auto_ack=True)[2]) is None and time.monotonic() < deadline:
        conn.sleep(0.05)
    assert got == body
    raw.close()
    conn.close()


def test_queue_delete_ok_comes_before_the_channels_own_consumer_cancel(cluster, uid):
    """As RabbitMQ (side by side: parity scenario queue_delete_with_a_consumer_on_the_channel):
    amqplib's own tests close the connection on the basic.cancel, and a delete-ok coming
    after it was lost ("Channel ended, no reply will be forthcoming")."""
    q = f"del-order-{uid}"
    raw = RawAMQP(cluster.host, cluster.port).open()
    raw.open_channel(1)
    raw.send_frame(commands.Queue.Declare(queue=q), 1)
    raw.expect(commands.Queue.DeclareOk, 1)
    raw.send_frame(commands.Basic.Consume(queue=q, consumer_tag="c1"), 1)
    raw.expect(commands.Basic.ConsumeOk, 1)
    raw.send_frame(commands.Queue.Delete(queue=q), 1)
    raw.expect(commands.Queue.DeleteOk, 1)
    assert raw.expect(commands.Basic.Cancel, 1).consumer_tag == "c1"
    raw.close()


def test_after_a_clients_close_the_socket_is_left_for_the_client_to_close(cluster, uid):
    """As RabbitMQ: after the close-ok of a client's connection.close the broker waits (1 s)
    for the client to close the socket, dropping what still comes; amqplib writes its
    connection.close ahead of channel frames it had buffered, and met EPIPE when the
    broker closed first. The client here sends after close-ok, then closes its side, and
    reads a clean end of stream, not a reset."""
    import socket
    raw = RawAMQP(cluster.host, cluster.port).open()
    raw.open_channel(1)
    raw.send_frame(commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0,
                                             method_id=0), 0)
    raw.send(publish_frames(1, "", f"late-{uid}", b"x" * 1000) * 20)   # after its close
    raw.expect(commands.Connection.CloseOk, 0)
    raw.send(publish_frames(1, "", f"late-{uid}", b"y" * 1000))
    raw.sock.shutdown(socket.SHUT_WR)
    raw.sock.settimeout(10)
    rest = raw.buf
    while chunk := raw.sock.recv(65536):    # a reset raises ConnectionResetError here
        rest += chunk
    assert rest == b""
    raw.close()


@pytest.mark.parametrize("immediate, code, closes", [
    (True, 540, commands.Connection.Close),       # NOT_IMPLEMENTED - immediate=true
    (False, 404, commands.Channel.Close),         # no such exchange
])
def test_a_publish_refused_names_basic_publish_in_the_close(cluster, uid, immediate, code,
                                                            closes):
    """As RabbitMQ: the close names the method that failed, class 60 method 40 (py-amqp's own
    integration tests read it as ``method_name == 'Basic.publish'``; Shoal sent 0, 0)."""
    from pamqp import header
    raw = RawAMQP(cluster.host, cluster.port).open()
    raw.open_channel(1)
    exchange = "" if immediate else f"nowhere-{uid}"
    raw.send(frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key="q",
                                                  immediate=immediate), 1)
             + frame.marshal(header.ContentHeader(0, 1, commands.Basic.Properties()), 1)
             + raw_frame(3, 1, b"x"))
    close = raw.expect(closes)
    assert (close.reply_code, close.class_id, close.method_id) == (code, 60, 40)
    raw.close()
