"""Scenario 10: malformed input on raw sockets after a valid handshake.

Whatever arrives, the server must answer with connection.close (a valid error code) or close
the socket, within a bound; and, crucially, keep serving everyone else: an already connected
pika client and a fresh one still declare, publish and consume.
"""
from __future__ import annotations

import os
import socket
import uuid

import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands, frame

from ..amqp_raw import Closed, RawAMQP

pytestmark = pytest.mark.e2e

ERROR_CODES = {320, 402, 403, 404, 405, 406, 501, 502, 503, 504, 505, 506, 530, 540, 541}
FUZZ = settings(max_examples=40, deadline=None, derandomize=False,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])


def valid_traffic(frame_max: int = 131072) -> bytes:
    """A realistic stream after channel 1 is open: declare, publish (3 body frames), qos,
    consume, get, a heartbeat."""
    from ..amqp_raw import publish_frames
    q = "fuzz-" + uuid.uuid4().hex[:8]
    out = frame.marshal(commands.Queue.Declare(queue=q, auto_delete=True,
                                               arguments={"x-k": 1, "t": {"n": True}}), 1)
    out += publish_frames(1, "", q, os.urandom(300), frame_max=108,
                          props=commands.Basic.Properties(headers={"a": "b"}, priority=3))
    out += frame.marshal(commands.Basic.Qos(prefetch_count=5), 1)
    out += frame.marshal(commands.Basic.Consume(queue=q, consumer_tag="c"), 1)
    out += frame.marshal(commands.Basic.Get(queue=q), 1)
    out += b"\x08\x00\x00\x00\x00\x00\x00\xce"
    return out


def check_outcome(raw: RawAMQP) -> None:
    """After our input and EOF on our side: connection.close with a known code, or a close."""
    try:
        raw.sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    while True:
        try:
            _, value = raw.read_frame(timeout=15)
        except Closed:
            return
        except AssertionError:
            raise
        except Exception:   # undecodable bytes from the server are a failure too
            raise AssertionError("the server sent something that is not a valid frame")
        if isinstance(value, commands.Connection.Close):
            assert value.reply_code in ERROR_CODES, f"unexpected close code {value.reply_code}"
            return


def assert_broker_serves(url: str, conn: pika.BlockingConnection | None = None) -> None:
    own = conn is None
    conn = conn or pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.confirm_delivery()
        ch.basic_publish("", q, b"still-serving")
        got = []
        ch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)
        for _ in range(100):
            if got:
                break
            conn.process_data_events(time_limit=0.1)
        assert got == [b"still-serving"], "broker stopped serving after malformed input"
        ch.close()
    finally:
        if own:
            conn.close()


@pytest.fixture(scope="module")
def bystander(cluster):
    """A pika connection that stays open while the fuzzing happens on other sockets."""
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    yield conn
    assert_broker_serves(cluster.url, conn)   # still fine after everything
    conn.close()


def _router_alive(cluster) -> None:
    if cluster.router_pid is not None:
        os.kill(cluster.router_pid, 0)      # raises if the router process died


@FUZZ
@given(junk=st.binary(min_size=1, max_size=2048))
def test_random_bytes_after_handshake(cluster, bystander, junk):
    with RawAMQP(cluster.host, cluster.port).open() as raw:
        raw.open_channel(1)
        try:
            raw.send(junk)
        except OSError:
            pass
        check_outcome(raw)
    bystander.process_data_events(time_limit=0)
    _router_alive(cluster)
    assert_broker_serves(cluster.url)


@st.composite
def mutated(draw):
    data = bytearray(valid_traffic())
    how = draw(st.sampled_from(["truncate", "flip", "insert", "duplicate", "length"]))
    if how == "truncate":
        data = data[:draw(st.integers(1, len(data) - 1))]
    elif how == "flip":
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
    elif how == "insert":
        i = draw(st.integers(0, len(data)))
        data[i:i] = draw(st.binary(min_size=1, max_size=64))
    elif how == "duplicate":
        i = draw(st.integers(0, len(data) - 1))
        j = draw(st.integers(i + 1, min(len(data), i + 200)))
        data[j:j] = data[i:j]
    else:       # rewrite the size field of the first frame
        data[3:7] = draw(st.integers(0, 2**32 - 1)).to_bytes(4, "big")
    return bytes(data)


@FUZZ
@given(data=mutated())
def test_mutated_valid_frames(cluster, bystander, data):
    with RawAMQP(cluster.host, cluster.port).open() as raw:
        raw.open_channel(1)
        try:
            raw.send(data)
        except OSError:
            pass
        check_outcome(raw)
    bystander.process_data_events(time_limit=0)
    _router_alive(cluster)
    assert_broker_serves(cluster.url)


@FUZZ
@given(junk=st.binary(min_size=1, max_size=512))
def test_random_bytes_during_handshake(cluster, junk):
    """Garbage instead of start-ok: closed (with or without connection.close)."""
    with RawAMQP(cluster.host, cluster.port) as raw:
        raw.send(b"AMQP\x00\x00\x09\x01")
        raw.expect(commands.Connection.Start, 0)
        try:
            raw.send(junk)
        except OSError:
            pass
        check_outcome(raw)
    _router_alive(cluster)


def test_unmutated_traffic_is_accepted(cluster):
    """Sanity check of the fuzz seed: unchanged, it is valid and gets answered normally."""
    with RawAMQP(cluster.host, cluster.port).open() as raw:
        raw.open_channel(1)
        raw.send(valid_traffic())
        need = {commands.Queue.DeclareOk, commands.Basic.QosOk, commands.Basic.ConsumeOk}
        seen: list = []
        # the one message goes to the consumer (deliver) or to basic.get (get-ok), and the
        # get is answered either way; the order of those answers is the broker's business
        while not (need <= {type(v) for v in seen}
                   and any(isinstance(v, (commands.Basic.GetOk, commands.Basic.GetEmpty))
                           for v in seen)
                   and any(isinstance(v, (commands.Basic.GetOk, commands.Basic.Deliver))
                           for v in seen)):
            seen.append(raw.read_frame()[1])
