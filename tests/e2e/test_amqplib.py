"""Node's amqplib against Shoal (issue 21): tests/e2e/amqplib/scenarios.js runs the same
scenarios (names RabbitMQ accepts, reserved names, passive declares, exclusive queues, nack
multiple, exchange-to-exchange and headers bindings, unknown exchange types, update-secret,
many channels) and prints what the client saw. Shoal must give what RabbitMQ 3.10.8 gave
(``EXPECTED``, session 11), and the same as a RabbitMQ running here, when one does, except
for an unknown exchange type: Shoal answers as RabbitMQ 4 (406 on the channel, where 3.10
closes the connection with 503; docs/conformance.md), ``RABBITMQ_4``.

Needs Node.js and ``npm ci`` in tests/e2e/amqplib (.ci/run does it); skipped otherwise."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import urllib.parse
from pathlib import Path

import pytest

from .side_by_side.test_parity import RABBITMQ_URL

pytestmark = pytest.mark.e2e

HERE = Path(__file__).parent / "amqplib"
EXPECTED = json.loads('{"unicode_and_reserved_names":[true,"hi",0,true,"hi",0,["channel-error",403]],"passive_declare_and_get_empty":[["channel-error",404],false,["channel-error",404]],"exclusive_queue_from_another_connection":[["channel-error",405],["channel-error",405]],"nack_multiple_and_requeue":[[["m1",true],["m2",true]],0],"exchange_to_exchange_and_headers":[{},["match-b","match-a"],["channel-error",406]],"unknown_exchange_type":[["channel-error",406]],"update_secret":["ok","ok"],"many_channels":[50]}')


#: where Shoal answers as RabbitMQ 4, not as the RabbitMQ 3.10 that EXPECTED came from (3.10.8
#: gave ``[["error", "Channel ended, no reply will be forthcoming"]]``: its connection closed)
RABBITMQ_4 = ("unknown_exchange_type",)


def run(url: str) -> dict:
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed")
    if not (HERE / "node_modules" / "amqplib").is_dir():
        pytest.skip("amqplib is not installed: run 'npm ci' in tests/e2e/amqplib (.ci/run does)")
    out = subprocess.run([node, "scenarios.js", url], cwd=HERE, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_amqplib_sees_what_rabbitmq_answers(cluster):
    assert run(cluster.url) == EXPECTED


def test_amqplib_side_by_side_with_rabbitmq(cluster):
    u = urllib.parse.urlparse(RABBITMQ_URL)
    try:
        socket.create_connection((u.hostname or "127.0.0.1", u.port or 5672), timeout=2).close()
    except OSError as e:
        pytest.skip(f"RabbitMQ is not reachable at {RABBITMQ_URL} ({e!r})")
    shoal, rabbitmq = run(cluster.url), run(RABBITMQ_URL)
    for key in RABBITMQ_4:
        shoal.pop(key)
        rabbitmq.pop(key)
    assert shoal == rabbitmq
