"""A consumer that stops reading its socket is reset after ``send_timeout`` and its
unacknowledged deliveries go back to the queue, as on RabbitMQ (Ranch's ``send_timeout`` 30 s
and ``linger {true, 0}``: a pika consumer that stopped reading there saw ECONNRESET 30 s
after its window filled, checked by hand side by side on RabbitMQ 3.10.8); one that reads
slowly keeps its connection. The RabbitMQ Java client's NoAutoRecoveryWhenTcpWindowIsFullTest
recovers only once that reset comes (router/frontend/send_timeout.py)."""
from __future__ import annotations

import contextlib
import errno
import socket
import time

import pika
import pytest

from tests.conftest import EXTERNAL_URL, start_cluster, stop_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.layout_free]

MESSAGES = 300
BODY = b"x" * 65536     # 300 x 64 KiB: more than the kernel's buffers and our 4 MiB pause


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """A 1-node cluster whose routers reset a non-reading client after 1.5 s."""
    if EXTERNAL_URL:
        pytest.skip("sets the cluster's send_timeout")
    c = start_cluster(tmp_path_factory.mktemp("shoal-send-timeout"), 1,
                      env={"SHOAL_SEND_TIMEOUT": "1500"})
    yield c
    stop_cluster(c)


def _fill(url: str, queue: str) -> pika.BlockingConnection:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare(queue)
    ch.confirm_delivery()
    for _ in range(MESSAGES):
        ch.basic_publish("", queue, BODY)
    return conn


def _consumer(url: str, queue: str) -> tuple[pika.BlockingConnection, socket.socket]:
    """A consumer with no prefetch limit and no heartbeat, whose socket nobody reads (pika
    reads only inside its calls), with a small receive buffer."""
    params = pika.URLParameters(url)
    params.heartbeat = 0
    conn = pika.BlockingConnection(params)
    sock = conn._impl._transport._sock
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn.channel().basic_consume(queue, lambda *a: None)
    return conn, sock


def _wait_reset(sock: socket.socket, seconds: float) -> int:
    """The socket's pending error once it has one (getsockopt clears it), else 0."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            return err
        time.sleep(0.1)
    return 0


def _ready(ch, queue: str, want: int, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while True:
        n = ch.queue_declare(queue, passive=True).method.message_count
        if n == want or time.monotonic() > deadline:
            return n
        time.sleep(0.1)


def test_a_consumer_that_reads_nothing_is_reset_and_its_deliveries_requeued(quick, uid):
    queue = f"send-timeout-{uid}"
    producer = _fill(quick.url, queue)
    try:
        consumer, sock = _consumer(quick.url, queue)
        try:
            assert _wait_reset(sock, 30) == errno.ECONNRESET
        finally:
            sock.close()
        assert _ready(producer.channel(), queue, MESSAGES, 15) == MESSAGES
    finally:
        producer.close()


def test_a_consumer_that_reads_slowly_keeps_its_connection(quick, uid):
    """Slowly: 64 KiB a second, while megabytes wait for it (the kernel takes no more of the
    router's buffer until about half its send buffer has gone: what the client reads shows
    in the kernel's queue for it)."""
    queue = f"send-slow-{uid}"
    producer = _fill(quick.url, queue)
    try:
        consumer, sock = _consumer(quick.url, queue)
        sock.settimeout(5)
        got = 0
        deadline = time.monotonic() + 6         # four send_timeouts
        while time.monotonic() < deadline:
            time.sleep(1.0)
            want = got + 65536
            while got < want:
                chunk = sock.recv(65536)
                assert chunk, "the broker closed the connection"
                got += len(chunk)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
        sock.close()
    finally:
        producer.close()


def test_an_amqp10_receiver_that_reads_nothing_is_dropped_and_its_deliveries_requeued(
        quick, uid):
    """The same over AMQP 1.0 (RabbitMQ 4's listener is the same Ranch socket): a proton
    receiver with credit for every message, whose socket is never read again (proton reads
    only inside its own calls)."""
    from proton.utils import BlockingConnection

    from .amqp10.helpers import amqp10_url, queue_addr, recv
    queue = f"send-timeout-10-{uid}"
    producer = _fill(quick.url, queue)
    c = BlockingConnection(amqp10_url(quick), timeout=3, allowed_mechs="PLAIN")
    try:
        ch = producer.channel()
        recv(c, queue_addr(queue), credit=MESSAGES)
        deadline = time.monotonic() + 15
        while ch.queue_declare(queue, passive=True).method.message_count == MESSAGES:
            assert time.monotonic() < deadline, "nothing was delivered"
            time.sleep(0.1)
        assert _ready(ch, queue, MESSAGES, 30) == MESSAGES
    finally:
        producer.close()
        with contextlib.suppress(Exception):    # reset under it: proton's close may time out
            c.close()
