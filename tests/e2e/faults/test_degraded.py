"""A cluster that serves with members missing, late or hung (issue 36, points 1 and 2), with
pika against separate ``shoal node`` / ``shoal router`` processes, as the Helm chart runs them:

- a router starts and serves with a node that never answers, and takes it in when it does;
- a classic queue whose node is down answers 404 with RabbitMQ's text (declare, consume,
  get), a confirmed publish to it is nacked, a new queue whose usual node is down is made on
  a reachable one and found there again after a router restart, and everything heals when
  the node returns, without restarting anything;
- a hung node (SIGSTOP) is treated as down after ``link_heartbeat_timeout``; a hung router's
  consumers' unacked messages are released to the others, flagged redelivered;
- SIGTERM stops a router that is still waiting for its nodes.

Nothing here asserts a timing: waits are bounds. Skipped in the one-process layouts
(``SHOAL_E2E_EMBED``, and ``SHOAL_LOCAL_LINK=unix``, whose link is not the one the chart
uses), which ``shoal serve`` runs and whose processes the launcher restarts.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid

import pika
import pika.exceptions
import pytest

from shoal.shared.placement import owner

from .processes import Processes, catalogue_of, free_port, wait_for

EMBED = os.environ.get("SHOAL_E2E_EMBED", "").strip().lower() in ("1", "true", "yes")
pytestmark = [pytest.mark.layout_free, pytest.mark.skipif(
    EMBED or os.environ.get("SHOAL_LOCAL_LINK", "") == "unix",
    reason="runs its own shoal node / shoal router processes over ZeroMQ TCP, as the Helm "
           "chart does; the embed and unix layouts are shoal serve's")]

PERSISTENT = pika.BasicProperties(delivery_mode=2)
#: a shorter link_heartbeat_timeout than the 5 s default, so the hung-peer tests wait less
FAST = {"SHOAL_LINK_HEARTBEAT_TIMEOUT": "2"}


def name_on(node: str, ids: list[str], prefix: str = "q", kind: str = "q") -> str:
    while True:
        name = f"deg-{prefix}-{uuid.uuid4().hex[:10]}"
        if owner("/", name, ids, kind) == node:
            return name


def channel_error(fn) -> tuple[int, str]:
    """Run ``fn(channel)`` on a fresh channel; the channel error it gets (code, text)."""
    def run(conn):
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            fn(ch)
        return err.value.reply_code, err.value.reply_text
    return run


def home_down_text(node: str, queue: str) -> str:
    return (f"NOT_FOUND - home node '{node}' of durable queue '{queue}' in vhost '/' is down "
            f"or inaccessible")


@pytest.fixture
def procs(tmp_path, request):
    p = Processes(tmp_path, nodes=3, routers=getattr(request, "param", 1), env=FAST)
    yield p
    codes = p.stop_all()
    assert all(c in (0, None, -signal.SIGKILL) for c in codes), (codes, p.log_tails())


def test_a_router_serves_without_a_node_and_takes_it_in_later(procs):
    """The router serves with 2 of its 3 nodes; node-0, never started, is taken in when it
    comes (the late node), without restarting the router."""
    for n in ("node-1", "node-2"):
        procs.nodes[n].start()
    procs.start_router()                  # serves although node-0 never answered
    on1 = name_on("node-1", procs.node_ids)
    on0 = name_on("node-0", procs.node_ids)
    conn = procs.connect()
    ch = conn.channel()
    ch.queue_declare(on1, durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", on1, b"m1", PERSISTENT)
    assert ch.basic_get(on1, auto_ack=True)[2] == b"m1"
    # nothing is known of node-0's queues (it never ran): its queues are not made elsewhere;
    # the declare waits link_heartbeat_timeout (2 s here) for node-0, then answers 404
    code, text = channel_error(lambda c: c.queue_declare(on0, durable=True))(conn)
    assert (code, text) == (404, home_down_text("node-0", on0))
    procs.nodes["node-0"].start()          # the late node
    wait_for("node-0 taken in", lambda: declared(procs, on0) is not None)
    ch = conn.channel()
    assert ch.queue_declare(on0, passive=True).method.message_count == 0
    conn.close()


def test_a_declare_on_a_cluster_still_forming_waits_for_the_queues_node(tmp_path):
    """Issue 43 point 5: pods start in any order. While node-0, which no node has heard from
    yet, is absent, a declare of a new queue whose usual node it is waits for it (up to
    link_heartbeat_timeout, 20 s here) and succeeds once it came, instead of answering 404."""
    procs = Processes(tmp_path, nodes=3, env={"SHOAL_LINK_HEARTBEAT_TIMEOUT": "20"})
    try:
        for n in ("node-1", "node-2"):
            procs.nodes[n].start()
        procs.start_router()
        on0 = name_on("node-0", procs.node_ids)
        outcome: list = []

        def declare() -> None:
            conn = procs.connect()
            try:
                ch = conn.channel()
                outcome.append(ch.queue_declare(on0, durable=True).method.queue)
                ch.confirm_delivery()
                ch.basic_publish("", on0, b"kept", PERSISTENT)
            except pika.exceptions.AMQPError as exc:
                outcome.append(exc)
            finally:
                conn.close()
        waiting = threading.Thread(target=declare)
        waiting.start()
        time.sleep(0.5)                 # the declare is on its way (not a bound on anything)
        procs.nodes["node-0"].start()
        waiting.join(60)
        assert outcome == [on0]
        conn = procs.connect()
        assert conn.channel().queue_declare(on0, passive=True).method.message_count == 1
        conn.close()
    finally:
        codes = procs.stop_all()
    assert all(c in (0, None) for c in codes), (codes, procs.log_tails())


def test_a_dead_nodes_queues_answer_404_new_ones_go_elsewhere_and_all_heal(procs):
    procs.start_all()
    ids = procs.node_ids
    old, new = name_on("node-0", ids, "old"), name_on("node-0", ids, "new")
    elsewhere, ex = name_on("node-1", ids, "q1"), name_on("node-0", ids, "x", kind="e")
    conn = procs.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(old, durable=True)
    ch.basic_publish("", old, b"kept", PERSISTENT)
    ch.exchange_declare(ex, "direct", durable=True)       # node-0's exchange, to node-1
    ch.queue_declare(elsewhere, durable=True)
    ch.queue_bind(elsewhere, ex, "k")
    for n in ("node-1", "node-2"):       # the others know where it is (their catalogues)
        wait_for(f"{n} knows of {old}", lambda n=n: old in catalogue_of(
            procs.endpoints[n], n).get("node-0", ()))
    procs.nodes["node-0"].stop(signal.SIGKILL)
    expected = (404, home_down_text("node-0", old))
    # declare, consume and get: RabbitMQ's 404 for a durable queue whose home node is down
    assert wait_for("404 on declare", lambda: channel_error(
        lambda c: c.queue_declare(old, durable=True))(conn) == expected)
    assert channel_error(lambda c: c.basic_consume(old, lambda *a: None))(conn) == expected
    assert channel_error(lambda c: c.basic_get(old))(conn) == expected
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.NackError):   # never confirmed
        ch.basic_publish("", old, b"lost?", PERSISTENT)
    # a new queue whose usual node is down is made on a reachable one
    ch.queue_declare(new, durable=True)
    ch.basic_publish("", new, b"placed", PERSISTENT)
    conn.close()
    # ... and found there again by a restarted router, node-0 still down
    assert procs.routers[0].stop() == 0
    procs.start_router()
    conn = procs.connect()
    ch = conn.channel()
    assert ch.queue_declare(new, durable=True).method.message_count == 1
    assert channel_error(lambda c: c.queue_declare(old, durable=True))(conn) == expected
    # node-0's exchange is known from the others: redeclared, and routes to node-1's queue
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare(ex, "direct", durable=True)
    ch.basic_publish(ex, "k", b"routed", PERSISTENT, mandatory=True)
    assert ch.basic_get(elsewhere, auto_ack=True)[2] == b"routed"
    # node-0 comes back: its queue is served again, with its message; nothing restarted
    procs.nodes["node-0"].start()
    assert wait_for("node-0's queue back", lambda: declared(procs, old)) == [1]
    ch = conn.channel()
    assert ch.basic_get(old, auto_ack=True)[2] == b"kept"
    assert ch.basic_get(new, auto_ack=True)[2] == b"placed"
    assert ch.queue_declare(new, durable=True).method.message_count == 0   # one queue, not two
    conn.close()


def declared(procs: Processes, queue: str) -> list[int] | None:
    """``[message_count]`` of a durable declare of ``queue`` on a new connection, or None."""
    conn = procs.connect()
    try:
        return [conn.channel().queue_declare(queue, durable=True).method.message_count]
    except pika.exceptions.ChannelClosedByBroker:
        return None
    finally:
        if conn.is_open:
            conn.close()


def test_a_hung_node_is_treated_as_down_and_heals_on_sigcont(procs):
    procs.start_all()
    ids = procs.node_ids
    hung, fine = name_on("node-0", ids), name_on("node-1", ids)
    conn = procs.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    for q in (hung, fine):
        ch.queue_declare(q, durable=True)
        ch.basic_publish("", q, b"before", PERSISTENT)
    cancelled: list[str] = []
    consumer = conn.channel()
    consumer.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    consumer.basic_qos(prefetch_count=0)
    tag = consumer.basic_consume(hung, lambda *a: None)
    procs.nodes["node-0"].send(signal.SIGSTOP)
    try:
        # silent for link_heartbeat_timeout: its consumers are cancelled, confirms nacked
        wait_for("consumer cancelled", lambda: conn.process_data_events(0.2) or cancelled)
        assert cancelled == [tag]
        pub = conn.channel()
        pub.confirm_delivery()
        with pytest.raises(pika.exceptions.NackError):
            pub.basic_publish("", hung, b"during", PERSISTENT)
        pub.basic_publish("", fine, b"during", PERSISTENT)     # the others serve on
        assert pub.basic_get(fine, auto_ack=True)[2] == b"before"
    finally:
        procs.nodes["node-0"].send(signal.SIGCONT)
    wait_for("node-0 back", lambda: conn.channel().basic_get(hung, auto_ack=True)[2] == b"before")
    conn.close()


@pytest.mark.parametrize("procs", [2], indirect=True)
def test_a_hung_routers_unacked_messages_go_to_other_consumers_flagged(procs):
    procs.start_all()
    q = name_on("node-1", procs.node_ids)
    a = procs.connect(0, heartbeat=0)
    ch = a.channel()
    ch.confirm_delivery()
    ch.queue_declare(q, durable=True)
    for i in range(5):
        ch.basic_publish("", q, str(i).encode(), PERSISTENT)
    held = []
    ch.basic_qos(prefetch_count=5)
    ch.basic_consume(q, lambda c, m, p, body: held.append((body, m.redelivered)))
    wait_for("router-0's consumer holds 5", lambda: a.process_data_events(0.2) or len(held) == 5)
    procs.routers[0].send(signal.SIGSTOP)
    try:
        b = procs.connect(1)
        got = []
        ch_b = b.channel()
        ch_b.basic_consume(q, lambda c, m, p, body: (got.append((body, m.redelivered)),
                                                       c.basic_ack(m.delivery_tag)))
        # router-0 silent for link_heartbeat_timeout: the node releases its deliveries
        wait_for("released to router-1", lambda: b.process_data_events(0.2) or len(got) == 5)
        assert sorted(body for body, _ in got) == [b"0", b"1", b"2", b"3", b"4"]
        assert all(redelivered for _, redelivered in got)     # delivered twice: flagged
        b.close()
    finally:
        procs.routers[0].send(signal.SIGCONT)


def test_sigterm_at_start_and_readiness_means_reaching_a_node(tmp_path):
    """No node answers: SIGTERM at any point of the router's start stops it (exit 0); it
    serves anyway, and its readiness check (the chart's probe) says 503 until a node answers,
    then 200."""
    mgmt = free_port()
    procs = Processes(tmp_path, nodes=1, env={"SHOAL_MANAGEMENT_PORT": str(mgmt)})
    ready_url = f"http://127.0.0.1:{mgmt}/api/health/checks/ready-to-serve-clients"
    r = procs.routers[0]
    try:
        r.start()
        # early, Python may still be importing (the default action: ended by the signal)
        assert r.stop(signal.SIGTERM, wait=20) in (0, -signal.SIGTERM), procs.log_tails()
        r.start()
        assert r.ready.wait(30), procs.log_tails()     # serving with no node at all
        assert _status(ready_url) == (503, {"status": "failed",
                                            "reason": "no node is reachable"})
        procs.nodes["node-0"].start()
        wait_for("ready once node-0 answers", lambda: _status(ready_url)[0] == 200)
        assert r.stop(signal.SIGTERM, wait=20) == 0, procs.log_tails()
    finally:
        procs.stop_all()


def _status(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def test_a_quorum_consumer_survives_its_router_hanging(procs):
    """A router hung longer than link_heartbeat_timeout: the nodes forget it (releasing its
    deliveries); when it wakes, its quorum queue consumer is registered again with the same
    leader and publishes go on, without the client doing anything (the campaign found the
    consumer left subscribed with nothing registered)."""
    procs.start_all()
    q = name_on("node-1", procs.node_ids, "qq")
    conn = procs.connect(heartbeat=0)
    ch = conn.channel()
    ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum"})
    got: list[tuple[bytes, bool]] = []
    cancelled: list = []
    cons = conn.channel()
    cons.add_on_cancel_callback(cancelled.append)
    cons.basic_consume(q, lambda c, m, p, body: (got.append((body, m.redelivered)),
                                                  c.basic_ack(m.delivery_tag)))
    pub = conn.channel()
    pub.confirm_delivery()
    pub.basic_publish("", q, b"before", PERSISTENT)
    wait_for("delivered before", lambda: conn.process_data_events(0.2) or got)
    procs.routers[0].send(signal.SIGSTOP)
    try:
        # the nodes forget the silent router (FAST: 2 s), its links to them time out too
        wait_for("the nodes forgot router-0", lambda: "silent" in procs.nodes[
            "node-1"].log.read_text(errors="replace"), timeout=30)
    finally:
        procs.routers[0].send(signal.SIGCONT)
    pub.basic_publish("", q, b"after", PERSISTENT)           # confirmed: raises on a nack
    wait_for("delivered after", lambda: conn.process_data_events(0.2) or
             b"after" in [body for body, _ in got])
    assert cancelled == []                                   # the consumer was kept
    before = [redelivered for body, redelivered in got if body == b"before"]
    assert before[0] is False and all(before[1:])    # its ack may have been lost: flagged
    conn.close()


def test_users_stored_before_a_restart_log_in_once_the_first_node_comes(tmp_path):
    """A whole cluster restarted, its router before node-0 (which keeps users and
    permissions, router/access_sync.py): the router starts with what it loaded, and reads
    the stored users when node-0 comes, so a user made before the restart logs in. It was
    refused until the next change (CI saw it once after a whole cluster's restart)."""
    before = Processes(tmp_path, nodes=2, env={**FAST, "SHOAL_USERS": "guest:guest,app:s3cret"})
    try:
        before.start_all()
        conn = before.connect(credentials=pika.PlainCredentials("app", "s3cret"))
        conn.close()
    finally:
        before.stop_all()
    after = Processes(tmp_path, nodes=2, env=FAST)      # this router loads guest only
    try:
        after.nodes["node-1"].start()
        after.start_router()                            # node-0 absent: nothing read
        after.nodes["node-0"].start()
        conn = wait_for("app logs in", lambda: after.connect(
            credentials=pika.PlainCredentials("app", "s3cret")))
        conn.close()
    finally:
        after.stop_all()
