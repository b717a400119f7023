"""AMQP 1.0 on the wire, with raw frames (built with router/amqp10/frames.py): one port for
both protocols, a refused open closed even when the client never answers, and a client that
keeps sending after Shoal's close (OASIS AMQP 1.0 part 2.4)."""
from __future__ import annotations

import socket
import time

import pika
import pytest

from shoal.router.amqp10.codec import Symbol
from shoal.router.amqp10.frames import (HEADER_AMQP, HEADER_SASL, Begin, Close, Open, SaslInit,
                                        frame, parse_body, FRAME_SASL)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def _read_until_closed(sock: socket.socket, limit_s: float = 20.0) -> bytes:
    """Everything the broker writes until it closes the socket (bounded)."""
    sock.settimeout(1.0)
    got = b""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        if not chunk:
            return got
        got += chunk
    raise AssertionError(f"the broker kept the socket open; it sent {got!r}")


def _frames(data: bytes) -> list:
    """The performatives in ``data`` after the two protocol headers."""
    out, pos = [], 0
    while pos < len(data):
        if data[pos:pos + 4] == b"AMQP":
            pos += 8
            continue
        size = int.from_bytes(data[pos:pos + 4], "big")
        doff = data[pos + 4]
        if size > 4 * doff:
            out.append(parse_body(data, pos + 4 * doff, pos + size)[0])
        pos += size
    return out


def _login(cluster, hostname: str) -> socket.socket:
    sock = socket.create_connection((cluster.host, cluster.port), timeout=10)
    sock.sendall(HEADER_SASL + frame(0, SaslInit(Symbol("PLAIN"), b"\x00guest\x00guest"),
                                     kind=FRAME_SASL) +
                 HEADER_AMQP + frame(0, Open("raw-client", hostname)))
    return sock


def test_one_port_serves_both_protocols(cluster, names):
    q = names()
    with pika.BlockingConnection(pika.URLParameters(cluster.url)) as conn:
        conn.channel().queue_declare(q)
    sock = _login(cluster, "vhost:/")
    sock.sendall(frame(0, Close()))
    kinds = [p.label for p in _frames(_read_until_closed(sock))]
    assert kinds == ["sasl-mechanisms", "sasl-outcome", "open", "close"]


def test_a_refused_open_is_closed_even_if_the_client_stays_silent(cluster):
    sock = _login(cluster, "vhost:no-such-vhost")
    perfs = _frames(_read_until_closed(sock))     # we never answer the close
    close = perfs[-1]
    assert close.label == "close" and close.error.condition == "amqp:not-found"
    assert "no-such-vhost" in close.error.description


def test_frames_after_a_refused_open_are_ignored(cluster):
    sock = _login(cluster, "vhost:no-such-vhost")
    sock.sendall(frame(0, Begin(None, 0, 100, 100)) + frame(0, Close()))
    perfs = _frames(_read_until_closed(sock))
    assert [p.label for p in perfs][-2:] == ["open", "close"]     # no begin answered
