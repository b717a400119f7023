"""``shoal serve --embed-node``: node-0 runs inside the router process, linked over ZeroMQ
``inproc://``, and behaves as a node process does to every client.

What a user can see: cluster.json names node-0 as embedded with the router's pid; queues on
node-0 and on node-1 (its own process) work alike for every client library, also under one
multi-queue consumer spanning both; persistent messages on node-0 survive a kill -9 of the
router (the launcher restarts it and node-0 recovers from its journal); a graceful stop exits 0
and leaves no process behind (checked by the fixture).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pika
import pytest

from tests.conftest import EXTERNAL_URL, start_cluster, stop_cluster

from .clients import connect
from .durability.test_durability import drain, kill9, session, wait_serving

pytestmark = pytest.mark.e2e

PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    if EXTERNAL_URL:
        pytest.skip("needs the cluster's own processes; SHOAL_E2E_URL points at an external "
                    "broker")
    c = start_cluster(tmp_path_factory.mktemp("shoal-embedded"), 2, embed=True)
    yield c
    stop_cluster(c)


@pytest.fixture
def own_embedded(tmp_path):
    if EXTERNAL_URL:
        pytest.skip("needs the cluster's own processes; SHOAL_E2E_URL points at an external "
                    "broker")
    c = start_cluster(tmp_path / "cluster", 2, embed=True)
    yield c
    stop_cluster(c, require_clean_exit=not c.killed)


def test_cluster_json_names_node0_as_part_of_the_router(embedded):
    node0, node1 = embedded.nodes
    assert node0.embedded and node0.endpoint == "inproc://node-0"
    assert node0.pid == embedded.router_pid
    assert not node1.embedded and node1.pid != embedded.router_pid
    assert node1.endpoint.startswith(("ipc://", "unix://", "tcp://"))
    os.kill(node1.pid, 0)


@pytest.mark.parametrize("node_id", ["node-0", "node-1"])
def test_every_client_publishes_and_consumes_on_both_kinds_of_node(embedded, kind, node_id):
    q = embedded.queue_on(node_id, f"emb-{kind}")
    c = connect(kind, embedded.url, confirms=True)
    try:
        c.declare_queue(q)
        for i in range(50):
            c.publish("", q, f"m{i}".encode(), {"headers": {"i": i}})
        c.qos(10)
        tag = c.consume(q)
        got = []
        while len(got) < 50:        # prefetch 10: the rest comes only as we ack
            c.wait_for(1)
            batch = c.take()
            for d in batch:
                c.ack(d)
            got += batch
        assert [d.body for d in got] == [f"m{i}".encode() for i in range(50)]
        assert [d.props["headers"]["i"] for d in got] == list(range(50))
        assert {d.consumer_tag for d in got} == {tag}
        assert not any(d.redelivered for d in got)
        c.cancel(tag)
        c.delete_queue(q)
    finally:
        c.close()


def test_multiqueue_consumer_spans_the_embedded_node_and_a_node_process(embedded):
    queues = embedded.queues_on_distinct_nodes(2, "emb-mq")
    conn = pika.BlockingConnection(pika.URLParameters(embedded.url))
    try:
        pub = conn.channel()
        pub.confirm_delivery()
        for q in queues:
            pub.queue_declare(q)
            for i in range(30):
                pub.basic_publish("", q, f"{q}:{i}".encode())
        ch = conn.channel()
        ch.basic_qos(prefetch_count=5)
        unacked: list[int] = []
        bodies: list[bytes] = []
        peak = [0]

        def on_message(c, method, props, body):
            bodies.append(body)
            unacked.append(method.delivery_tag)
            peak[0] = max(peak[0], len(unacked))

        ch.basic_consume("", on_message, arguments={"x-multiqueue": queues})
        deadline = time.monotonic() + 20
        while len(bodies) < 60:
            assert time.monotonic() < deadline, f"only {len(bodies)} of 60 delivered"
            conn.process_data_events(time_limit=0.05)
            while unacked:
                ch.basic_ack(unacked.pop(0))
        assert peak[0] <= 5, "more unacknowledged deliveries than the prefetch allows"
        for q in queues:   # every queue served, each in its own order, nothing twice
            mine = [b for b in bodies if b.startswith(f"{q}:".encode())]
            assert mine == [f"{q}:{i}".encode() for i in range(30)]
    finally:
        conn.close()


def _fill_and_take(cl, q: str, publish: int, take: int):
    """Declare durable ``q`` on node-0, publish ``publish`` confirmed persistent messages and
    leave the first ``take`` delivered but unacknowledged; returns the open session."""
    s = session(cl)
    s.ch.queue_declare(q, durable=True)
    for i in range(publish):
        s.ch.basic_publish("", q, f"p{i}".encode(), PERSISTENT)   # confirmed: on disk
    for i in range(take):
        method, _props, body = s.ch.basic_get(q, auto_ack=False)
        assert body == f"p{i}".encode()
    return s


def test_node0_recovers_exactly_after_a_clean_router_restart(own_embedded, uid):
    """SIGTERM to the router stops node-0 cleanly too (journal committed and marked clean);
    the launcher restarts the router and node-0 comes back with every message, exactly the
    delivered ones marked redelivered (as a node process does after a clean stop)."""
    cl = own_embedded
    q = cl.queue_on("node-0", f"emb-clean-{uid}")
    s = _fill_and_take(cl, q, 12, 4)
    kill9(cl, "router", signal.SIGTERM)
    s.close()
    assert wait_serving(cl, q) == 12
    assert drain(cl, q, 12) == [(f"p{i}".encode(), i < 4) for i in range(12)]


def test_node0_keeps_confirmed_messages_through_a_router_kill(own_embedded, uid):
    """kill -9 of the router takes node-0 with it; the launcher restarts both and node-0
    recovers its durable queue from the journal, in order. As for a node process killed
    mid-turn, every recovered message says redelivered ("may have been delivered")."""
    cl = own_embedded
    q = cl.queue_on("node-0", f"emb-kill-{uid}")
    survivor = cl.queue_on("node-1", f"emb-kill-other-{uid}")
    s = _fill_and_take(cl, q, 20, 3)
    s.ch.queue_declare(survivor, durable=True)
    s.ch.basic_publish("", survivor, b"on-node-1", PERSISTENT)
    kill9(cl, "router")
    s.close()
    assert wait_serving(cl, q) == 20
    got = drain(cl, q, 20)
    assert [b for b, _ in got] == [f"p{i}".encode() for i in range(20)]
    assert all(r for _, r in got)
    assert drain(cl, survivor, 1) == [(b"on-node-1", False)]   # node-1 never went away


def test_router_command_without_the_shoal_entry_point_refuses_inproc(tmp_path):
    """``python -m shoal.router`` cannot host a node (the router never imports the node
    package): an inproc:// endpoint is a clear start-up error, not a hang."""
    r = subprocess.run([sys.executable, "-m", "shoal.router", "--port", "0", "--data-dir",
                        str(tmp_path), "--node", "node-0=inproc://node-0"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "inproc://" in r.stderr and "shoal router" in r.stderr


def test_hosted_node_with_unusable_journal_stops_the_router_with_exit_3(tmp_path):
    (tmp_path / "node-0").write_text("not a directory")
    r = subprocess.run([sys.executable, "-m", "shoal.cli", "router", "--port", "0",
                        "--data-dir", str(tmp_path), "--node", "node-0=inproc://node-0"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 3, r.stderr
    assert "node-0" in r.stderr and "journal" in r.stderr
    assert "Traceback" not in r.stderr


def test_turning_the_flag_on_and_off_keeps_node0s_data(tmp_path, uid):
    """node-0 keeps its journal in DATA_DIR/node-0 in both layouts: durable messages
    published with node-0 as a process are there when it runs inside the router, and back."""
    if EXTERNAL_URL:
        pytest.skip("needs the cluster's own processes; SHOAL_E2E_URL points at an external "
                    "broker")
    data = tmp_path / "cluster"
    layouts = [False, True, False]
    q = None
    for i, embed in enumerate(layouts):
        cl = start_cluster(data, 2, embed=embed)
        try:
            q = q or cl.queue_on("node-0", f"emb-flip-{uid}")
            s = session(cl)
            s.ch.queue_declare(q, durable=True)
            assert s.ch.queue_declare(q, passive=True).method.message_count == i
            s.ch.basic_publish("", q, f"layout-{i}".encode(), PERSISTENT)
            s.close()
        finally:
            stop_cluster(cl)
    cl = start_cluster(data, 2, embed=True)
    try:
        assert [b for b, _ in drain(cl, q, 3)] == [b"layout-0", b"layout-1", b"layout-2"]
    finally:
        stop_cluster(cl)


def test_with_two_routers_node0_lives_in_router0_and_router1_reaches_it(tmp_path, uid):
    """``--embed-node --routers 2``: node-0 runs in router-0, router-1 links to it over its
    ipc endpoint; a persistent message published through router-1 to node-0 survives a kill -9
    of router-0 (node-0 restarts with it) and is read through router-1 again."""
    if EXTERNAL_URL:
        pytest.skip("needs the cluster's own processes; SHOAL_E2E_URL points at an external "
                    "broker")
    c = start_cluster(tmp_path / "cluster", 2, embed=True, routers=2)
    try:
        node0 = c.node("node-0")
        assert node0.embedded and node0.pid == c.routers[0].pid != c.routers[1].pid
        q = c.queue_on("node-0", "emb2")
        b = pika.BlockingConnection(pika.URLParameters(c.router_url(1)))
        ch = b.channel()
        ch.queue_declare(q, durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", q, b"kept", PERSISTENT)
        b.close()
        c.kill_router(0)
        deadline = time.monotonic() + 30
        while True:             # router-1 answers for node-0 again once router-0 is back
            try:
                b = pika.BlockingConnection(pika.URLParameters(c.router_url(1)))
                method, _props, body = b.channel().basic_get(q, auto_ack=True)
                if method is not None:
                    break
                b.close()
            except pika.exceptions.AMQPError:
                pass
            assert time.monotonic() < deadline, "node-0's message did not come back"
            time.sleep(0.3)
        assert body == b"kept"
        b.close()
    finally:
        stop_cluster(c, require_clean_exit=False)
