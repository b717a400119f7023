"""Scenarios 9 and 11: the cluster as processes. Queues live on different nodes (killing one
node cancels only its consumers and nacks only its pending confirms), and a graceful shutdown
closes clients with 320 and leaves no process behind. Tests that kill or signal processes use
the function-scoped ``own_cluster``."""
from __future__ import annotations

import os
import signal
import time

import pika
import pika.exceptions
import pytest
from pamqp import commands

from .amqp_raw import RawAMQP
from .clients import BrokerError, Nacked, Returned, connect

pytestmark = pytest.mark.e2e

DETECT = 20.0     # bound for noticing a dead node (link timeout is 3 s)


def test_cluster_processes_match_cluster_json(cluster):
    if cluster.external:
        pytest.skip("external broker: no cluster processes to inspect")
    assert cluster.node_ids == ["node-0", "node-1"]
    for n in cluster.nodes:     # --embed-node: node-0 is the router process itself
        assert (n.pid == cluster.router_pid) == n.embedded, n
    pids = [cluster.router_pid] + [n.pid for n in cluster.nodes if not n.embedded]
    assert len(set(pids)) == len(pids), f"processes share a pid: {pids}"
    for pid in pids:
        os.kill(pid, 0)          # every process named in cluster.json is alive
    assert cluster.launcher.pid not in pids
    assert all(n.endpoint for n in cluster.nodes), "node endpoints missing in cluster.json"


def test_each_process_and_its_threads_hold_the_cpu_cluster_json_gives_it(cluster):
    """pin_cpus (the default): every router and node process, with all its threads (ZeroMQ's
    I/O thread included), runs on the one CPU cluster.json names; routers and nodes apart."""
    if cluster.external:
        pytest.skip("external broker: no cluster processes to inspect")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: shoal serve does not pin")
    import json
    info = json.loads((cluster.data_dir / "cluster.json").read_text())
    procs = info["routers"] + [n for n in info["nodes"] if not n.get("embedded")]
    for p in procs:
        assert isinstance(p.get("cpu"), int), p
        for tid in os.listdir(f"/proc/{p['pid']}/task"):
            assert os.sched_getaffinity(int(tid)) == {p["cpu"]}, (p, tid)
    router_cpus = {r["cpu"] for r in info["routers"]}
    node_cpus = {n["cpu"] for n in info["nodes"] if not n.get("embedded")}
    assert not router_cpus & node_cpus


def test_placement_spreads_queues(cluster):
    """Sanity check of the placement function the router uses (no broker involved)."""
    owners = {cluster.owner(f"spread-{i}") for i in range(64)}
    assert owners == set(cluster.node_ids)


def _wait(conn: pika.BlockingConnection, cond, what: str, timeout: float = DETECT) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        conn.process_data_events(time_limit=0.1)


def test_killing_a_node_affects_only_its_queues(own_cluster):
    """Kill the node owning queue A: A's consumer gets basic.cancel, a confirm pending on A
    gets basic.nack; queue B on the other node keeps publishing and consuming."""
    cl = own_cluster
    qa = cl.queue_on("node-1", "victim")
    qb = cl.queue_on("node-0", "survivor")
    conn = pika.BlockingConnection(pika.URLParameters(cl.url))
    ch = conn.channel()
    cancelled: list[str] = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    got: dict[str, list[bytes]] = {qa: [], qb: []}
    pub = conn.channel()
    pub.confirm_delivery()
    for q in (qa, qb):
        ch.queue_declare(q)
        pub.basic_publish("", q, b"before")
    ch.basic_qos(prefetch_count=10)
    tags = {}
    for q in (qa, qb):
        tags[q] = ch.basic_consume(
            q, lambda c, m, p, body, q=q: (got[q].append(body), c.basic_ack(m.delivery_tag)))
    _wait(conn, lambda: got[qa] and got[qb], "the first delivery from both queues")

    # a publisher with a confirm in flight to queue A when the node dies
    raw = RawAMQP(cl.host, cl.port).open()
    raw.open_channel(1)
    raw.send_frame(commands.Confirm.Select(), 1)
    raw.expect(commands.Confirm.SelectOk, 1)

    cl.killed = True
    cl.kill_node("node-1")
    raw.send(raw.publish(1, "", qa, b"pending-on-dead-node"))
    answer = raw.expect(commands.Basic.Nack, 1, timeout=DETECT)
    assert answer.delivery_tag == 1
    raw.close()

    _wait(conn, lambda: cancelled, "basic.cancel for the consumer on the dead node")
    assert cancelled == [tags[qa]], "only the consumer of the dead node's queue is cancelled"

    pub.basic_publish("", qb, b"after")             # confirmed: node-0 still works
    _wait(conn, lambda: got[qb] == [b"before", b"after"], "delivery from the surviving node")
    assert ch.is_open and conn.is_open
    ch.queue_declare(cl.queue_on("node-0", "new"))   # new queues on the survivor work too
    conn.close()


@pytest.mark.parametrize("kind", ["pika", "aio_pika", "kombu"])
def test_node_death_cancels_consumers_for_every_client(own_cluster, kind):
    cl = own_cluster
    # node-0 unless it runs inside the router (SHOAL_E2E_EMBED): then node-1 dies, node-0 lives
    victim = next(n.id for n in cl.nodes if not n.embedded)
    survivor = next(n.id for n in cl.nodes if n.id != victim)
    qa, qb = cl.queue_on(victim, "victim"), cl.queue_on(survivor, "survivor")
    c = connect(kind, cl.url)
    try:
        for q in (qa, qb):
            c.declare_queue(q)
        tag_a, tag_b = c.consume(qa), c.consume(qb)
        cl.killed = True
        cl.kill_node(victim)
        deadline = time.monotonic() + DETECT
        while not c.cancelled:
            assert time.monotonic() < deadline, "no basic.cancel after the node died"
            c.pump(0.1)
        assert c.cancelled == [tag_a]
        c.publish("", qb, b"still-here")
        [d] = c.wait_for(1)
        assert (d.body, d.consumer_tag) == (b"still-here", tag_b)
    finally:
        c.close()


@pytest.mark.timeout(90)
def test_publish_to_queue_on_dead_node_is_never_acked(own_cluster):
    """A confirmed publish to a queue whose node is gone must not be acked as if it had been
    enqueued: basic.nack, basic.return or a channel error are all honest answers."""
    cl = own_cluster
    qa = cl.queue_on("node-1", "gone")
    c = connect("pika", cl.url, confirms=True)
    try:
        c.declare_queue(qa)
        cl.killed = True
        cl.kill_node("node-1")
        # no timing assumption: this publish may go out before or after the router notices
        with pytest.raises((Nacked, Returned, BrokerError)):
            c.publish("", qa, b"lost?", mandatory=True)
    finally:
        try:
            c.close()
        except Exception:
            pass


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_graceful_shutdown_closes_clients_with_320(own_cluster, sig):
    cl = own_cluster
    conn = pika.BlockingConnection(pika.URLParameters(cl.url))
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_consume(q, lambda *a: None)
    raw = RawAMQP(cl.host, cl.port).open()
    raw.open_channel(1)

    cl.launcher.send_signal(sig)

    close = raw.expect_connection_close(timeout=DETECT)
    assert close.reply_code == 320, close
    raw.close()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
        _wait(conn, lambda: False, "connection.close from the broker")
    assert e.value.reply_code == 320
    assert "CONNECTION_FORCED" in e.value.reply_text
    cl.stop(sig=None)     # launcher exits 0, no child left (asserted)
