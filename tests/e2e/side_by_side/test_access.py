"""Users, permissions, definitions and limits (issue 22, points 1 and 3), end to end with
pika.

A cluster started with ``--definitions`` (``SHOAL_LOAD_DEFINITIONS``) holding
:data:`.parity_access.DEFINITIONS` must answer every scenario of :mod:`.parity_access` as
RabbitMQ 3.10.8 did (``EXPECTED``: records and reply texts). Where a RabbitMQ with
``rabbitmqctl`` runs here, the same definitions are imported into it and the two brokers are
compared live as well (skipped, with the reason, otherwise).
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import tempfile
import time
import urllib.parse

import pika
import pytest

from tests.conftest import EXTERNAL_URL, start_cluster, stop_cluster

from .parity_access import ACCESS_SCENARIOS, DEFINITIONS, PASSWORD, normalized
from .parity_access_expected import EXPECTED
from .test_parity import RABBITMQ_URL

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def access_cluster(tmp_path_factory):
    if EXTERNAL_URL:
        pytest.skip("needs a cluster started with its own definitions file")
    d = tmp_path_factory.mktemp("shoal-access")
    path = d / "definitions.json"
    path.write_text(json.dumps(DEFINITIONS))
    c = start_cluster(d / "cluster", 2, env={"SHOAL_LOAD_DEFINITIONS": str(path),
                                             "SHOAL_CONSUMER_MAX_PER_CHANNEL": "2",
                                             "SHOAL_HANDSHAKE_TIMEOUT": "1000"})
    yield c
    stop_cluster(c)


def _base(url: str) -> str:
    u = urllib.parse.urlparse(url)
    return f"amqp://{u.hostname or '127.0.0.1'}:{u.port or 5672}"


@pytest.mark.parametrize("name", list(ACCESS_SCENARIOS))
def test_access_as_rabbitmq_answers(access_cluster, name):
    notes: list = []
    record = ACCESS_SCENARIOS[name](_base(access_cluster.url), notes=notes)
    assert (record, normalized(notes)) == EXPECTED[name]


@pytest.fixture(scope="module")
def rabbitmq_with_definitions() -> str:
    """RabbitMQ's base URL once DEFINITIONS are imported into it, or a skip saying why."""
    try:
        pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL)).close()
    except Exception as e:  # noqa: BLE001 - any failure means "no RabbitMQ to compare with"
        pytest.skip(f"RabbitMQ is not reachable at {RABBITMQ_URL} ({e!r})")
    try:
        # A world-readable file: Debian's rabbitmqctl runs as the rabbitmq user, who cannot
        # read pytest's temporary folders (and 3.10.8 reads no "-" for standard input).
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(DEFINITIONS, f)
            f.flush()
            os.chmod(f.name, 0o644)
            out = subprocess.run(["rabbitmqctl", "import_definitions", f.name],
                                 capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"cannot import definitions into RabbitMQ with rabbitmqctl ({e!r})")
    if out.returncode != 0:
        pytest.skip(f"rabbitmqctl import_definitions failed: {out.stderr.strip()[-200:]}")
    for _ in range(50):     # the import is asynchronous
        try:
            pika.BlockingConnection(pika.URLParameters(
                _base(RABBITMQ_URL).replace("amqp://", f"amqp://acc-u:{PASSWORD}@"))).close()
            break
        except Exception:  # noqa: BLE001
            time.sleep(0.2)
    return _base(RABBITMQ_URL)


#: RabbitMQ counts a user's or a vhost's connections a moment after they close (its connection
#: tracking is asynchronous), so a scenario that follows another of the same limited user or
#: vhost can be refused at its first connection for connections already gone ("user
#: connection limit (2) is reached", "connection limit (1) is reached"): its run against
#: RabbitMQ is then repeated, up to this many seconds. No scenario expects its first
#: connection refused, and Shoal's run is never repeated.
RABBITMQ_TRACKING_S = 10.0


def _rabbitmq_run(name: str, url: str) -> tuple[list, list]:
    deadline = time.monotonic() + RABBITMQ_TRACKING_S
    while True:
        notes: list = []
        record = ACCESS_SCENARIOS[name](url, notes=notes)
        lagged = record[:1] == [("scenario", "socket-closed")] and \
            re.search(r"connection limit \(\d+\) is reached", str(notes))
        if not lagged or time.monotonic() > deadline:
            return record, notes
        time.sleep(0.5)


@pytest.mark.parametrize("name", list(ACCESS_SCENARIOS))
def test_access_side_by_side_with_rabbitmq(access_cluster, rabbitmq_with_definitions, name):
    a, na = _rabbitmq_run(name, rabbitmq_with_definitions)
    nb: list = []
    b = ACCESS_SCENARIOS[name](_base(access_cluster.url), notes=nb)
    assert (b, normalized(nb)) == (a, normalized(na))


def test_failed_login_is_logged_with_the_peer_never_the_password(access_cluster):
    secret = "not-the-password-4711"
    params = pika.URLParameters(_base(access_cluster.url).replace(
        "amqp://", f"amqp://acc-u:{secret}@"))
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(params)
    log = access_cluster.log_path.read_text(errors="replace")
    lines = [l for l in log.splitlines() if "login refused" in l and "'acc-u'" in l]
    assert lines and "127.0.0.1:" in lines[-1], log[-2000:]
    assert secret not in log


def test_guest_is_not_a_user_when_definitions_are_loaded(access_cluster):
    """As RabbitMQ: with definitions loaded at start, the default user is not created."""
    params = pika.URLParameters(_base(access_cluster.url).replace("amqp://",
                                                                  "amqp://guest:guest@"))
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(params)


def test_consumer_max_per_channel(access_cluster):
    """RabbitMQ's consumer_max_per_channel (3.12's setting): one consumer more closes the
    connection with 530 and RabbitMQ's text."""
    conn = pika.BlockingConnection(pika.URLParameters(_base(access_cluster.url).replace(
        "amqp://", f"amqp://acc-admin:{PASSWORD}@")))
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_consume(q, lambda *a: None)
    ch.basic_consume(q, lambda *a: None)
    other = conn.channel()       # the limit is per channel
    other.basic_consume(q, lambda *a: None)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
        ch.basic_consume(q, lambda *a: None)
    assert (e.value.reply_code, e.value.reply_text) == (
        530, "NOT_ALLOWED - reached maximum (2) of consumers per channel")


def test_a_socket_silent_past_handshake_timeout_is_closed(access_cluster):
    """handshake_timeout (ms, RabbitMQ's name; 1000 here): a client that connects and says
    nothing is disconnected, and the broker goes on serving."""
    u = urllib.parse.urlparse(access_cluster.url)
    with socket.create_connection((u.hostname, u.port), timeout=15) as s:
        assert s.recv(1) == b""          # EOF: closed by the broker (well before 15 s)
    pika.BlockingConnection(pika.URLParameters(_base(access_cluster.url).replace(
        "amqp://", f"amqp://acc-admin:{PASSWORD}@"))).close()
