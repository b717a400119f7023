"""Node's rhea (AMQP 1.0) against Shoal (issue 37): tests/e2e/amqp10/rhea/scenarios.js connects
with SASL PLAIN, sends and receives on ``/queues/NAME``, sends to ``/exchanges/X/K``, settles
with released and rejected, uses a dynamic receiver as reply-to (the server answering on an
anonymous-relay link), and reports the errors of a missing queue and a wrong password. The
queues are declared here with pika; the script prints one JSON object checked here.

Needs Node.js and ``npm ci`` in tests/e2e/amqp10/rhea (.ci/run does it); skipped otherwise."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from .helpers import declare, pika_channel, ready_count

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

HERE = Path(__file__).parent / "rhea"


def run(cl, config: dict, *scenarios: str) -> dict:
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed")
    if not (HERE / "node_modules" / "rhea").is_dir():
        pytest.skip("rhea is not installed: run 'npm ci' in tests/e2e/amqp10/rhea (.ci/run does)")
    cfg = {"host": cl.host, "port": cl.port, "user": cl.user, "password": cl.password,
           **config}
    out = subprocess.run([node, "scenarios.js", json.dumps(cfg), *scenarios], cwd=HERE,
                         capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def config(cluster, names):
    c = {"queue": names(), "exchange_queue": names(), "exchange": "amq.direct",
         "key": names("key"), "release_queue": names(), "reject_queue": names(),
         "dlq": names("dlq"), "request_queue": names(), "missing": names("missing"),
         "mgmt_queue": names("mgmt")}
    for q in ("queue", "release_queue", "dlq", "request_queue"):
        declare(cluster, c[q])
    declare(cluster, c["reject_queue"], {"x-dead-letter-exchange": "",
                                         "x-dead-letter-routing-key": c["dlq"]})
    with pika_channel(cluster) as ch:
        ch.queue_declare(c["exchange_queue"])
        ch.queue_bind(c["exchange_queue"], c["exchange"], c["key"])
    return c


def test_rhea_send_receive_and_exchange(cluster, config):
    got = run(cluster, config, "queue_send_receive", "exchange_address")
    assert got["queue_send_receive"] == [["accepted"] * 3, ["a", "b", "c"]]
    assert got["exchange_address"] == [["accepted"], ["routed"]]
    assert ready_count(cluster, config["queue"]) == 0


def test_rhea_release_and_reject(cluster, config):
    got = run(cluster, config, "release_then_accept", "reject_dead_letters")
    assert got["release_then_accept"] == [["again"], ["again"]]
    assert got["reject_dead_letters"] == [["bad"], ["bad"]]
    assert ready_count(cluster, config["release_queue"]) == 0
    assert ready_count(cluster, config["dlq"]) == 0


def test_rhea_dynamic_receiver_request_reply(cluster, config):
    got = run(cluster, config, "dynamic_request_reply")
    assert got["dynamic_request_reply"] == [True, "pong:ping", "c-1"]


def test_rhea_errors(cluster, config):
    got = run(cluster, config, "missing_queue", "wrong_password")
    assert got["missing_queue"] == ["link", "amqp:not-found"]
    assert got["wrong_password"][0] == "disconnected"


def test_rhea_message_kept_whole(cluster, config):
    """Every section and type a 1.0 publisher sends comes back as sent (issue 45)."""
    got = run(cluster, config, "whole_round_trip")["whole_round_trip"]
    assert got["body"] == {"k": [1, "two"]}                     # an amqp-value, not bytes
    assert (got["subject"], got["to"], got["group_id"], got["reply_to_group_id"],
            got["group_sequence"], got["message_id"], got["content_type"], got["user_id"],
            got["creation_time"]) == ("subj", f"/queues/{config['queue']}", "g", "rg", 3, "m-1",
                                      "text/plain", cluster.user, 1700000000123)
    assert got["annotations"]["x-opt-u"] == 9 and got["annotations"]["x-opt-s"] == "s"
    assert got["annotations"]["x-routing-key"] == config["queue"]
    assert got["properties"] == {
        "ubyte": 200, "ushort": 60000, "uint": 4000000000, "byte": -100, "short": -30000,
        "int": -5, "long": -2, "float": 1.5, "double": 2.25, "bool": True, "str": "text",
        "sym": "sym", "bin": ["binary", [0, 255]], "ts": ["timestamp", 1700000000123],
        "nul": None}
    assert got["footer"] == ["sig"]


def test_rhea_management_node(cluster, config):
    """RabbitMQ 4's management node from rhea: PUT, GET, purge, DELETE, then 404. The queue's
    flags come as RabbitMQ 4 encodes them (0x56 booleans), which rhea reads as 1 and 0:
    RabbitMQ's JavaScript client (rabbitmq-amqp-js-client) compares ``durable`` with 1."""
    got = run(cluster, config, "management_node")["management_node"]
    assert got == ["201", "200", "quorum", "200", "200", "404", [1, 0, 0]]
    assert [type(v) for v in got[-1]] == [int] * 3         # JSON 1 and 0, not true and false
