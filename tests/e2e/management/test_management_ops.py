"""The management API's message endpoints and ``shoal ctl`` (issue 23, points 1 and 4): get
messages with RabbitMQ's ackmodes, the aliveness test, and the operator's command line over
the API, against a real cluster."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pika
import pytest

from tests.conftest import EMBED
from tests.e2e.management.test_management import call, mgmt  # noqa: F401 (the fixture)

pytestmark = pytest.mark.e2e


def publish(cl, queue: str, *bodies: bytes, **props) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(cl.url))
    ch = conn.channel()
    ch.confirm_delivery()
    for b in bodies:
        ch.basic_publish("", queue, b, pika.BasicProperties(**props))
    conn.close()


def ctl(cl, *args: str, user: str = "guest") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shoal.cli", "ctl", "--url", f"http://127.0.0.1:{cl.mgmt_port}",
         "--user", user, "--password", "guest", *args],
        capture_output=True, text=True, timeout=60, check=False)


def test_get_messages_requeue_then_drop(mgmt, uid):
    q = f"get-{uid}"
    assert call(mgmt, "PUT", f"/queues/%2F/{q}", {"durable": False})[0] == 201
    publish(mgmt, q, b"one", b"\xff\xfe", content_type="text/plain",
            headers={"k": "v"}, delivery_mode=2)
    status, got, _ = call(mgmt, "POST", f"/queues/%2F/{q}/get",
                          {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert status == 200 and len(got) == 2
    assert got[0]["payload"] == "one" and got[0]["payload_encoding"] == "string"
    assert got[0]["payload_bytes"] == 3 and got[0]["message_count"] == 1
    assert got[0]["properties"] == {"content_type": "text/plain", "headers": {"k": "v"},
                                    "delivery_mode": 2}
    assert got[1]["payload_encoding"] == "base64" and got[1]["payload"] == "//4="
    assert call(mgmt, "GET", f"/queues/%2F/{q}")[1]["messages_ready"] == 2   # requeued
    status, again, _ = call(mgmt, "POST", f"/queues/%2F/{q}/get",
                            {"count": 1, "ackmode": "ack_requeue_false", "encoding": "base64",
                             "truncate": 2})
    assert again[0]["redelivered"] is True and again[0]["payload"] == "b24="   # "on"
    row = call(mgmt, "GET", f"/queues/%2F/{q}")[1]
    assert row["messages_ready"] == 1
    stats = row["message_stats"]                    # RabbitMQ's per-queue counters
    assert (stats["publish"], stats["deliver_get"], stats["ack"]) == (2, 3, 1)
    assert {"rate"} == set(stats["publish_details"])


def test_get_messages_bad_input_is_the_apis_error_json(mgmt, uid):
    q = f"get-bad-{uid}"
    call(mgmt, "PUT", f"/queues/%2F/{q}", {})
    status, body, _ = call(mgmt, "POST", f"/queues/%2F/{q}/get", {"count": 1, "ackmode": "x"})
    assert status == 400 and body["error"] == "bad_request" and "ackmode" in body["reason"]
    status, body, _ = call(mgmt, "POST", f"/queues/%2F/{q}/get", {"count": 0})
    assert status == 400 and "count" in body["reason"]
    status, body, _ = call(mgmt, "POST", "/queues/%2F/no-such-queue-at-all/get", {"count": 1})
    assert status == 404 and body["error"] == "not_found"


def test_aliveness_test(mgmt):
    assert call(mgmt, "GET", "/aliveness-test/%2F")[:2] == (200, {"status": "ok"})
    status, body, _ = call(mgmt, "GET", "/aliveness-test/no-such-vhost")
    assert status == 404 and body == {"error": "not_found", "reason": "vhost_not_found"}


def test_ctl_lists_purges_deletes_and_exports(mgmt, uid, tmp_path):
    q = f"ctl-{uid}"
    call(mgmt, "PUT", f"/queues/%2F/{q}", {"durable": True})
    publish(mgmt, q, b"a", b"b")
    r = ctl(mgmt, "list", "queues")
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    assert header.split() == ["vhost", "name", "node", "messages_ready",
                              "messages_unacknowledged", "consumers", "durable"]
    assert [row.split()[1:] for row in rows if row.split()[1] == q] == \
        [[q, mgmt.owner(q), "2", "0", "0", "true"]]
    listed = json.loads(ctl(mgmt, "list", "queues", "--json").stdout)
    assert any(x["name"] == q and x["messages"] == 2 for x in listed)
    assert ctl(mgmt, "purge", q).stdout.strip() == f"purged queue '{q}'"
    assert call(mgmt, "GET", f"/queues/%2F/{q}")[1]["messages"] == 0
    out = tmp_path / "defs.json"
    assert ctl(mgmt, "export", str(out)).returncode == 0
    assert any(x["name"] == q for x in json.loads(out.read_text())["queues"])
    assert ctl(mgmt, "delete", "queue", q).returncode == 0
    assert call(mgmt, "GET", f"/queues/%2F/{q}")[0] == 404
    assert ctl(mgmt, "import", str(out)).returncode == 0          # the queue is back
    assert call(mgmt, "GET", f"/queues/%2F/{q}")[0] == 200
    assert ctl(mgmt, "-p", "/", "delete", "queue", q).returncode == 0


def test_ctl_errors_are_one_line_and_exit_non_zero(mgmt):
    r = ctl(mgmt, "purge", "no-such-queue-at-all")
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "shoal ctl: DELETE /api/queues/%2F/no-such-queue-at-all/contents: 404 not_found: "
        "no queue 'no-such-queue-at-all' in vhost '/'"]
    r = ctl(mgmt, "list", "queues", user="nobody")
    assert r.returncode == 1 and "401 not_authorised: Login failed" in r.stderr
    r = subprocess.run([sys.executable, "-m", "shoal.cli", "ctl", "--url",
                        "http://127.0.0.1:1", "list", "nodes"], capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 1 and r.stderr.startswith(
        "shoal ctl: cannot reach the management API at http://127.0.0.1:1")
    assert ctl(mgmt, "list", "everything").returncode == 2             # argparse: bad usage


@pytest.mark.skipif(EMBED, reason="--embed-node: node-0 has no links to the other node, so a "
                                  "stream has one member and no member to add")
def test_a_stream_declared_with_one_member_gets_another(mgmt, uid):
    """``x-initial-cluster-size: 1`` on a cluster, then ``shoal ctl add_member``, as
    rabbitmq-streams' add_replica: the new member gets the log, and a reader (which reads
    from a member that does not lead: the new one) gets every message."""
    q = f"stream-one-{uid}"
    conn = pika.BlockingConnection(pika.URLParameters(mgmt.url))
    ch = conn.channel()
    ch.queue_declare(q, durable=True, arguments={"x-queue-type": "stream",
                                                 "x-initial-cluster-size": 1})
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", q, b"m%d" % i)
    row = call(mgmt, "GET", f"/queues/%2F/{q}")[1]
    assert row["members"] == [row["node"]] == [row["leader"]]
    other = next(n for n in ["node-0", "node-1"] if n != row["node"])
    r = ctl(mgmt, "add_member", q, other)
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and \
            call(mgmt, "GET", f"/queues/%2F/{q}")[1]["members"] != ["node-0", "node-1"]:
        time.sleep(0.2)
    assert call(mgmt, "GET", f"/queues/%2F/{q}")[1]["members"] == ["node-0", "node-1"]
    ch.basic_publish("", q, b"m3")
    ch.basic_qos(prefetch_count=10)
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append((p.headers["x-stream-offset"], b)),
                     arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + 30
    while len(got) < 4 and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.2)
    assert got == [(i, b"m%d" % i) for i in range(4)]
    conn.close()


@pytest.mark.skipif(EMBED, reason="--embed-node: node-0 has no links to the other node, so a "
                                  "stream has one member and no member to add")
def test_shoal_ctl_deletes_and_adds_a_streams_member(mgmt, uid):
    """rabbitmq-streams' delete_replica and add_replica as ``shoal ctl delete_member`` and
    ``add_member``: the members change one at a time, the stream keeps its messages, and
    the last member cannot go (docs/streams.md)."""
    import time
    q = f"stream-members-{uid}"
    conn = pika.BlockingConnection(pika.URLParameters(mgmt.url))
    ch = conn.channel()
    ch.queue_declare(q, durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"kept")
    conn.close()

    def members() -> list[str]:
        return call(mgmt, "GET", f"/queues/%2F/{q}")[1]["members"]

    def until(want: list[str]) -> None:
        deadline = time.monotonic() + 30
        while members() != want and time.monotonic() < deadline:
            time.sleep(0.2)
        assert members() == want
    until(["node-0", "node-1"])
    leader = call(mgmt, "GET", f"/queues/%2F/{q}")[1]["leader"]
    other = next(n for n in ["node-0", "node-1"] if n != leader)
    r = ctl(mgmt, "delete_member", q, other)
    assert r.returncode == 0 and r.stdout.strip() == f"queue '{q}': members {leader}", r.stderr
    until([leader])
    r = ctl(mgmt, "delete_member", q, leader)
    assert r.returncode != 0 and "last member" in r.stderr
    r = ctl(mgmt, "add_member", q, other)
    assert r.returncode == 0, r.stderr
    until(["node-0", "node-1"])
    row = call(mgmt, "GET", f"/queues/%2F/{q}")[1]
    assert row["messages"] == 1 and row["committed_offset"] == 0


def test_a_stream_in_the_api_and_shoal_ctl_stream_status(mgmt, uid):
    """A stream's row has RabbitMQ's stream keys (type, leader, members, committed_offset,
    segments) and its bytes; ``shoal ctl stream_status`` prints rabbitmq-streams' columns;
    a queue that is not a stream is a 404 there; the definitions export has the stream as
    RabbitMQ writes one (docs/streams.md)."""
    q = f"stream-{uid}"
    conn = pika.BlockingConnection(pika.URLParameters(mgmt.url))
    ch = conn.channel()
    ch.queue_declare(q, durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", q, b"x" * 100)
    conn.close()
    row = call(mgmt, "GET", f"/queues/%2F/{q}")[1]
    # a stream on every node of this 2-node cluster (x-initial-cluster-size: 3, at most
    # the nodes there are), led by one; with --embed-node, node-0 (in the router) has no
    # links to the other node, and a stream has one member
    want = [row["node"]] if EMBED else ["node-0", "node-1"]
    assert row["type"] == "stream" and row["members"] == want
    assert row["leader"] == row["node"] and row["leader"] in row["members"]
    assert (row["first_offset"], row["committed_offset"], row["segments"]) == (0, 2, 1)
    assert row["messages"] == 3 and row["message_bytes"] > 300
    r = ctl(mgmt, "stream_status", q, "--json")
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    assert status == [{"role": "writer", "node": row["node"], "epoch": row["epoch"],
                       "offset": 2, "committed_offset": 2, "first_offset": 0, "readers": 0,
                       "segments": 1}] + [
                      {"role": "replica", "node": other, "epoch": row["epoch"], "offset": 2,
                       "committed_offset": 2, "first_offset": None, "readers": 0,
                       "segments": None} for other in row["members"] if other != row["node"]]
    r = ctl(mgmt, "stream_status", q)
    assert r.returncode == 0 and "committed_offset" in r.stdout.splitlines()[0]
    exported = call(mgmt, "GET", "/definitions")[1]["queues"]     # a definitions file's form
    assert {"name": q, "vhost": "/", "durable": True, "auto_delete": False,
            "arguments": {"x-queue-type": "stream"}} in exported
    assert call(mgmt, "PUT", f"/queues/%2F/classic-{uid}", {"durable": False})[0] == 201
    r = ctl(mgmt, "stream_status", f"classic-{uid}")
    assert r.returncode != 0 and "not a stream" in r.stderr
    r = ctl(mgmt, "stream_status", f"missing-{uid}")
    assert r.returncode != 0 and r.stderr


@pytest.mark.skipif(EMBED, reason="--embed-node: node-0 has no links to the other node, so a "
                                  "stream has one member")
def test_stream_consumers_read_from_a_member_that_does_not_lead(mgmt, uid):
    """Consumers of a replicated stream read from a member that does not lead, as RabbitMQ's
    stream clients prefer (node/streams/readers.py): each gets every message, and
    ``stream_status`` counts them as that member's readers, not the leader's."""
    q = f"readers-{uid}"
    conn = pika.BlockingConnection(pika.URLParameters(mgmt.url))
    ch = conn.channel()
    ch.queue_declare(q, durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", q, b"m%d" % i)
    reader = conn.channel()
    reader.basic_qos(prefetch_count=10)
    got: dict[str, list[bytes]] = {"r1": [], "r2": []}

    def on_message(c, method, props, body):
        got[method.consumer_tag].append(body)
        c.basic_ack(method.delivery_tag)
    for tag in got:
        reader.basic_consume(q, on_message, consumer_tag=tag,
                             arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + 30
    status: list = []
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.2)
        r = ctl(mgmt, "stream_status", q, "--json")
        assert r.returncode == 0, r.stderr
        status = json.loads(r.stdout)
        if all(len(v) == 3 for v in got.values()) and \
                sum(row["readers"] for row in status) == 2:
            break
    assert got == {"r1": [b"m0", b"m1", b"m2"], "r2": [b"m0", b"m1", b"m2"]}
    readers = {row["role"]: row["readers"] for row in status}
    assert readers == {"writer": 0, "replica": 2}, status
    conn.close()
