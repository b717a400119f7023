"""``shoal loadtest --exchange``: the routes a producer publishes on, the bindings each queue
gets, and loss counted per copy of a fanout (issue 46's shapes E and F)."""
from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pytest
from shoal.pipeline.loadtest.cli import build
from shoal.pipeline.loadtest.plan import assigned, binding_keys, copies, routes
from shoal.pipeline.loadtest.writer import loss_and_duplicates, read_run

CMD = [sys.executable, "-m", "shoal.cli", "loadtest"]


def _cfg(*flags):
    return build(["--url", "amqp://guest:guest@127.0.0.1:1/", "--out", "x", *flags])[0]


def test_without_an_exchange_a_producer_publishes_to_its_queues_by_name():
    cfg = _cfg("--queues", "4", "--producers", "2")
    assert routes(cfg, assigned(4, 2, 1)) == [("perf-2", 0), ("perf-4", 1)]
    assert copies(cfg) == 1


def test_direct_and_topic_bindings_reach_one_queue_each():
    cfg = _cfg("--queues", "3", "--exchange", "ex", "--bindings", "7")
    assert [binding_keys(cfg, q) for q in range(3)] == [["k0", "k3", "k6"], ["k1", "k4"],
                                                         ["k2", "k5"]]
    # producer 0 of 2 has queues 0 and 2: every key bound to them, each to its queue's index
    assert routes(cfg, [0, 2]) == [("k0", 0), ("k2", 1), ("k3", 0), ("k5", 1), ("k6", 0)]
    topic = _cfg("--queues", "2", "--exchange", "ex", "--exchange-type", "topic")
    assert binding_keys(topic, 1) == ["k1.*"]
    assert routes(topic, [0, 1]) == [("k0.x", 0), ("k1.x", 1)]
    assert copies(topic) == 1


def test_a_fanout_reaches_every_queue_and_counts_each_copy():
    cfg = _cfg("--queues", "5", "--exchange", "fan", "--exchange-type", "fanout")
    assert binding_keys(cfg, 3) == [""]
    assert routes(cfg, [0]) == [("", 0)]
    assert copies(cfg) == 5
    # 5 copies expected per seq: seq 0 got 5, seq 1 got 3 (2 lost), seq 2 got 6 (1 duplicate)
    table = pa.table({"seq_start": [0, 1, 2], "seq_end": [1, 2, 3], "count": [5, 3, 6]})
    assert loss_and_duplicates(table, copies=5) == (2, 1)
    assert loss_and_duplicates(table) == (0, 11)         # as if each were wanted once


@pytest.mark.parametrize("flags,why", [
    (["--bindings", "4"], "--bindings needs --exchange"),
    (["--exchange", "f", "--exchange-type", "fanout", "--bindings", "4"],
     "--bindings needs --exchange"),
    (["--exchange", "d", "--queues", "5", "--bindings", "4"], "--bindings must be at least"),
    (["--exchange", "d", "--exchange-type", "headers"], "invalid choice"),
    (["--connections", "0"], "--connections must be >= 1"),
    (["--queues", "3", "--consumers", "2", "--connections", "2"], "each connection needs"),
])
def test_bad_exchange_flags_exit_2_with_one_line(flags, why):
    r = subprocess.run(CMD + flags, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2
    assert why in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.e2e
def test_a_fanout_and_a_topic_run_against_a_cluster(cluster, tmp_path, uid):
    """Every queue of the fanout gets every message (4 queues: 4 deliveries each), the topic
    exchange's 40 bindings route each message to one queue; nothing lost or duplicated."""
    base = ["--url", cluster.url, "--rate", "200", "--time", "2", "--qos", "50",
            "--management-url", "off"]
    fan = tmp_path / "fan"
    r = subprocess.run(CMD + base + ["--exchange", f"lt-fan-{uid}", "--exchange-type", "fanout",
                                     "--queues", "4", "--queue-pattern", f"ltf-{uid}-%d",
                                     "--consumers", "2", "--confirm", "20", "--out", str(fan)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    s = read_run(fan)["run"]["summary"]
    assert s["sent"] > 0 and s["confirmed"] == s["sent"]
    assert s["copies"] == 4 and s["received"] == 4 * s["sent"]
    assert (s["lost"], s["duplicates"]) == (0, 0)
    assert "(4 copies of each message: fanout)" in r.stdout

    top = tmp_path / "topic"
    r = subprocess.run(CMD + base + ["--exchange", f"lt-top-{uid}", "--exchange-type", "topic",
                                     "--bindings", "40", "--queues", "4", "--producers", "2",
                                     "--queue-pattern", f"ltt-{uid}-%d", "--out", str(top)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    run = read_run(top)
    s = run["run"]["summary"]
    assert s["copies"] == 1 and s["received"] == s["sent"] > 0
    assert (s["lost"], s["duplicates"]) == (0, 0)
    per_queue = {}
    for q, n in zip(run["producers"]["queue"].to_pylist(), run["producers"]["sent"].to_pylist()):
        per_queue[q] = per_queue.get(q, 0) + n
    assert sorted(per_queue) == [f"ltt-{uid}-{i}" for i in range(1, 5)]     # all 4 reached


@pytest.mark.e2e
def test_a_consumer_spreads_its_queues_over_its_connections(cluster, tmp_path, uid):
    """Shape G's tool: 2 consumer processes with 3 connections each over 12 queues (2 queues
    per connection); every message arrives once."""
    out = tmp_path / "conns"
    r = subprocess.run(CMD + ["--url", cluster.url, "--rate", "300", "--time", "2", "--qos", "20",
                              "--queues", "12", "--queue-pattern", f"ltc-{uid}-%d",
                              "--consumers", "2", "--connections", "3", "--management-url",
                              "off", "--out", str(out)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    run = read_run(out)
    s = run["run"]["summary"]
    assert s["received"] == s["sent"] > 0 and (s["lost"], s["duplicates"]) == (0, 0)
    ps = run["per_second"]
    got = {q for q, role, n in zip(ps["queue"].to_pylist(), ps["role"].to_pylist(),
                                   ps["received"].to_pylist()) if role == "consumer" and n}
    assert got == {f"ltc-{uid}-{i}" for i in range(1, 13)}     # every queue was consumed
