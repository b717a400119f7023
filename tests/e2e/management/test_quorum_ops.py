"""Operating quorum queues as RabbitMQ's users do (issue 35, point 5): the queue JSON's type,
leader, members and online; ``shoal ctl`` with rabbitmq-queues' commands (quorum_status,
delete_member, add_member, shrink, grow, rebalance); the ``rabbitmq_raft_*`` metrics."""
from __future__ import annotations

import json
import time
import urllib.request

import pika
import pytest

from tests.conftest import stop_cluster
from .test_management import call, http_cluster
from .test_management_ops import ctl

DEADLINE = 30.0


@pytest.fixture(scope="module")
def qq3(tmp_path_factory):
    c = http_cluster(tmp_path_factory.mktemp("shoal-qq"), nodes=3,
                     mgmt_port="SHOAL_MANAGEMENT_PORT", prom_port="SHOAL_PROMETHEUS_PORT")
    if c.nodes and any(n.embedded for n in c.nodes):
        stop_cluster(c)
        pytest.skip("--embed-node: node-0 lives in router-0 with no links to the other nodes")
    yield c
    stop_cluster(c)


def declare(cl, name: str) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters(cl.host, cl.port))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    ch.basic_publish("", name, b"x", pika.BasicProperties(delivery_mode=2))
    conn.close()


def until(fn, what: str):
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"not within {DEADLINE:.0f} s: {what}")


def queue_json(cl, name: str) -> dict:
    status, body, _ = call(cl, "GET", f"/queues/%2F/{name}")
    assert status == 200, body
    return body


def voters(cl, name: str) -> list[str]:
    out = ctl(cl, "quorum_status", name, "--json")
    assert out.returncode == 0, out.stderr
    return sorted(r["node"] for r in json.loads(out.stdout) if r["membership"] == "voter")


def test_queue_json_has_type_leader_members_and_online(qq3, uid):
    name = f"qq-json-{uid}"
    declare(qq3, name)
    q = until(lambda: (lambda j: j if len(j.get("online", [])) == 3 else None)(
        queue_json(qq3, name)), "three members online")
    assert q["type"] == "quorum"
    assert q["leader"] in qq3.node_ids and q["node"] == q["leader"]
    assert sorted(q["members"]) == sorted(qq3.node_ids)
    assert q["messages"] == 1
    status, rows, _ = call(qq3, "GET", "/queues/%2F")
    assert [r["name"] for r in rows].count(name) == 1     # listed once, by its leader


def test_ctl_member_commands_change_the_members(qq3, uid):
    name = f"qq-members-{uid}"
    declare(qq3, name)
    until(lambda: voters(qq3, name) == sorted(qq3.node_ids), "three voters")
    leader = queue_json(qq3, name)["leader"]
    other = next(n for n in qq3.node_ids if n != leader)
    out = ctl(qq3, "delete_member", name, other)
    assert out.returncode == 0, out.stderr
    until(lambda: other not in voters(qq3, name), f"{other} removed")
    out = ctl(qq3, "add_member", name, other)
    assert out.returncode == 0, out.stderr
    until(lambda: voters(qq3, name) == sorted(qq3.node_ids), f"{other} back as a voter")
    out = ctl(qq3, "shrink", other)
    assert out.returncode == 0 and name in out.stdout, out.stdout + out.stderr
    until(lambda: other not in voters(qq3, name), f"{other} shrunk away")
    out = ctl(qq3, "grow", other, "all")
    assert out.returncode == 0 and name in out.stdout, out.stdout + out.stderr
    until(lambda: voters(qq3, name) == sorted(qq3.node_ids), f"{other} grown back")
    out = ctl(qq3, "rebalance", "quorum")
    assert out.returncode == 0, out.stderr
    # the queue still works, and its messages stayed
    assert queue_json(qq3, name)["messages"] == 1


def test_ctl_refuses_an_unknown_queue_or_node(qq3, uid):
    out = ctl(qq3, "quorum_status", f"nope-{uid}")
    assert out.returncode == 1 and "nope" in out.stderr
    declare(qq3, f"qq-bad-{uid}")
    out = ctl(qq3, "add_member", f"qq-bad-{uid}", "node-99")
    assert out.returncode == 1 and "node-99" in out.stderr


def test_raft_metrics_use_rabbitmqs_names(qq3, uid):
    name = f"qq-metrics-{uid}"
    declare(qq3, name)

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{qq3.prom_port}/metrics",
                                    timeout=10) as r:
            return r.read().decode()
    text = until(lambda: (lambda t: t if f'queue="{name}"' in t else None)(scrape()),
                 "raft metrics for the queue")
    for metric in ("rabbitmq_raft_term_total", "rabbitmq_raft_log_commit_index",
                   "rabbitmq_raft_log_last_applied_index", "rabbitmq_raft_log_snapshot_index",
                   "shoal_raft_member_lag_entries", "shoal_raft_leader_changes_total"):
        assert metric in text, metric


def test_a_node_added_gets_members_and_leaders_after_grow_and_rebalance(tmp_path, uid):
    """Adding a node (``shoal serve`` restarted with one more): ``shoal ctl grow`` puts a
    member of every quorum queue on it and ``rebalance quorum`` moves leaders there."""
    from tests.conftest import EMBED
    if EMBED:
        pytest.skip("--embed-node: node-0 lives in router-0 with no links to the other nodes")
    c = http_cluster(tmp_path / "c", nodes=3, mgmt_port="SHOAL_MANAGEMENT_PORT")
    names = [f"qq-grow-{uid}-{i}" for i in range(8)]
    try:
        for n in names:
            declare(c, n)
    finally:
        stop_cluster(c)
    c = http_cluster(tmp_path / "c", nodes=4, mgmt_port="SHOAL_MANAGEMENT_PORT")
    try:
        until(lambda: all(queue_json(c, n).get("leader") for n in names), "leaders again")
        out = ctl(c, "grow", "node-3", "all")
        assert out.returncode == 0 and f"{len(names)} quorum queues changed" in out.stdout, \
            out.stdout + out.stderr
        until(lambda: all("node-3" in voters(c, n) for n in names), "node-3 a voter of each")
        out = ctl(c, "rebalance", "quorum")
        assert out.returncode == 0, out.stderr
        until(lambda: any(queue_json(c, n)["leader"] == "node-3" for n in names),
              "a leader on node-3")
        for n in names:                    # every message is still there
            assert queue_json(c, n)["messages"] == 1
    finally:
        stop_cluster(c)


def test_a_stream_declared_on_a_node_alone_gets_a_member_once_the_cluster_grows(tmp_path, uid):
    """A stream made by a node alone (``shoal serve --nodes 1``) is replicated with one
    member, so that after a restart with a second node ``shoal ctl add_member`` grows it,
    as RabbitMQ's ``rabbitmq-streams add_replica`` after clustering; the new member gets the
    log, and a reader (which reads from a member that does not lead) gets every message."""
    from tests.conftest import EMBED
    if EMBED:
        pytest.skip("--embed-node: node-0 lives in router-0 with no links to the other nodes")
    name = f"stream-alone-{uid}"
    c = http_cluster(tmp_path / "c", nodes=1, mgmt_port="SHOAL_MANAGEMENT_PORT")
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters(c.host, c.port))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
        for i in range(3):
            ch.basic_publish("", name, b"m%d" % i)
        conn.close()
        assert queue_json(c, name)["members"] == ["node-0"]
    finally:
        stop_cluster(c)
    c = http_cluster(tmp_path / "c", nodes=2, mgmt_port="SHOAL_MANAGEMENT_PORT")
    try:
        until(lambda: queue_json(c, name).get("leader") == "node-0", "its leader again")
        out = ctl(c, "add_member", name, "node-1")
        assert out.returncode == 0, out.stdout + out.stderr
        until(lambda: queue_json(c, name)["members"] == ["node-0", "node-1"], "node-1 added")
        conn = pika.BlockingConnection(pika.ConnectionParameters(c.host, c.port))
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        got = []
        ch.basic_consume(name, lambda c_, m, p, b: got.append((p.headers["x-stream-offset"], b)),
                         arguments={"x-stream-offset": "first"})
        deadline = time.monotonic() + DEADLINE
        while len(got) < 3 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
        assert got == [(i, b"m%d" % i) for i in range(3)]
        conn.close()
    finally:
        stop_cluster(c)


def stream_rows(cl, name: str) -> list[dict]:
    out = ctl(cl, "stream_status", name, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_stream_member_deleted_and_added_back_catches_up_and_follows(qq3, uid):
    """rabbitmq-streams delete_replica then add_replica of the same node: the member made
    again replays the log's old removal of its node as it catches up, and must stay (it
    dropped itself there, and its leader then counted a member that held nothing)."""
    name = f"stream-readd-{uid}"
    conn = pika.BlockingConnection(pika.ConnectionParameters(qq3.host, qq3.port))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    for k in range(50):
        ch.basic_publish("", name, b"m%d" % k, pika.BasicProperties(delivery_mode=2))

    def caught_up(rows: list[dict], nodes: int, offset: int) -> bool:
        return len(rows) == nodes and all(r["offset"] == offset for r in rows)
    until(lambda: caught_up(stream_rows(qq3, name), 3, 49), "three members at offset 49")
    other = next(r["node"] for r in stream_rows(qq3, name) if r["role"] != "writer")
    out = ctl(qq3, "delete_member", name, other)
    assert out.returncode == 0, out.stderr
    until(lambda: other not in {r["node"] for r in stream_rows(qq3, name)}, f"{other} gone")
    out = ctl(qq3, "add_member", name, other)
    assert out.returncode == 0, out.stderr
    until(lambda: caught_up(stream_rows(qq3, name), 3, 49), f"{other} back at offset 49")
    for k in range(10):
        ch.basic_publish("", name, b"n%d" % k, pika.BasicProperties(delivery_mode=2))
    conn.close()
    # the member added back follows the new chunks too (it held nothing before the fix)
    until(lambda: caught_up(stream_rows(qq3, name), 3, 59), f"{other} follows to 59")
