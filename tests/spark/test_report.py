"""``shoal report``: aggregates of a recorded load-test folder checked against numpy, the
output files, and the one-line errors for bad input."""
from __future__ import annotations

import json

import numpy as np
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyspark", reason="pyspark not installed: pip install 'shoal[spark]' "
                                  "runs the Spark tests")
from shoal.pipeline.spark import cli

from .loadtest_data import make_run

PCTS = {"p50": 50, "p95": 95, "p99": 99, "p999": 99.9}


@pytest.fixture(scope="module")
def report_out(spark, tmp_path_factory):
    base = tmp_path_factory.mktemp("report")
    exp_a = make_run(base / "shoal-2n", "shoal 2 nodes", seed=1)
    # one producer over both queues: per-queue loss is not attributable (null)
    exp_b = make_run(base / "rabbit", "rabbitmq", seed=2, producers_queues=((0, ("qa", "qb")),),
                     latency_scale_us=2500)
    # a fanout to 3 queues: each seq wanted 3 times (params.copies)
    exp_c = make_run(base / "fanout", "fanout", seed=3, copies=3)
    out = base / "out"
    html = cli.run([str(base / "shoal-2n"), str(base / "rabbit"), str(base / "fanout")],
                   "local[2]", str(out))
    tables = {n: pq.read_table(out / f"{n}.parquet").to_pylist()
              for n in ("runs", "queues", "nodes", "timeline", "latency_hist")}
    return {"shoal 2 nodes": exp_a, "rabbitmq": exp_b, "fanout": exp_c}, tables, out, html


def test_per_run_totals_match_independent_computation(report_out):
    expected, tables, _, _ = report_out
    runs = {r["run"]: r for r in tables["runs"]}
    assert set(runs) == set(expected)
    for name, exp in expected.items():
        r = runs[name]
        sent = sum(exp.sent.values())
        assert r["sent"] == sent
        assert r["received"] == sum(exp.received.values())
        assert r["redelivered"] == sum(exp.redelivered.values())
        assert r["sent_per_s"] == pytest.approx(sent / 5)
        assert r["received_per_s"] == pytest.approx(sum(exp.received_window.values()) / 5)
        assert r["lost"] == sum(exp.lost_by_producer.values())
        assert r["duplicates"] == sum(exp.dup_by_producer.values())
        lats = np.array([x for v in exp.lat_window.values() for x in v])
        assert r["latency_samples"] == len(lats)
        for p, q in PCTS.items():
            assert r[f"latency_{p}_ms"] == pytest.approx(np.percentile(lats, q) / 1000)


def test_per_queue_and_per_node_match(report_out):
    expected, tables, _, _ = report_out
    for row in tables["queues"]:
        exp = expected[row["run"]]
        q = row["queue"]
        assert row["node"] == {"qa": "node-0", "qb": "node-1"}[q]
        assert row["sent"] == exp.sent[q]
        assert row["received"] == exp.received[q]
        assert row["redelivered"] == exp.redelivered[q]
        assert row["received_per_s"] == pytest.approx(exp.received_window[q] / 5)
        for p, pct in PCTS.items():
            assert row[f"latency_{p}_ms"] == pytest.approx(
                np.percentile(exp.lat_window[q], pct) / 1000)
    lost = {(r["run"], r["queue"]): r["lost"] for r in tables["queues"]}
    a = expected["shoal 2 nodes"].lost_by_producer
    assert lost == {("shoal 2 nodes", "qa"): a[0], ("shoal 2 nodes", "qb"): a[1],
                    ("rabbitmq", "qa"): None, ("rabbitmq", "qb"): None,
                    ("fanout", "qa"): None, ("fanout", "qb"): None}    # a copy of any queue
    nodes = {(r["run"], r["node"]): r for r in tables["nodes"]}
    assert nodes[("shoal 2 nodes", "node-1")]["received"] == \
        expected["shoal 2 nodes"].received["qb"]
    assert nodes[("shoal 2 nodes", "node-0")]["lost"] == a[0]


def test_timeline_and_histogram(report_out):
    expected, tables, _, _ = report_out
    for name, exp in expected.items():
        got = {r["second"]: r["received"] for r in tables["timeline"] if r["run"] == name}
        assert got == exp.timeline_received
        hist = sum(r["count"] for r in tables["latency_hist"] if r["run"] == name)
        assert hist > sum(len(v) for v in exp.lat_window.values())   # drain samples too


def test_output_files(report_out):
    _, tables, out, html = report_out
    with open(html, encoding="utf-8") as f:
        text = f.read()
    assert text.count("src='data:image/png;base64,") == 3
    assert "shoal 2 nodes" in text and "rabbitmq" in text
    csv_runs = pcsv.read_csv(out / "runs.csv").to_pylist()
    assert {r["run"] for r in csv_runs} == {r["run"] for r in tables["runs"]}


def test_missing_folder_is_one_line_error(tmp_path, capsys):
    assert cli.main([str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"shoal report: {tmp_path / 'nope'}: no such folder"


def test_not_loadtest_output_is_one_line_error(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text(json.dumps({"hello": 1}))
    assert cli.main([str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"shoal report: {tmp_path / 'run'}: not load-test output (missing ")


@pytest.mark.e2e
def test_per_node_table_of_a_real_run_on_a_cluster(spark, tmp_path):
    """Issue 43 point 6: ``shoal loadtest`` asks the management API which node holds each
    queue (no ``--nodes`` given), and ``shoal report``'s per-node table then has each node's
    rates and latencies."""
    import socket
    import subprocess
    import sys
    import urllib.request
    import uuid

    from tests.conftest import EXTERNAL_URL, start_cluster, stop_cluster
    if EXTERNAL_URL:
        pytest.skip("starts a cluster with its management API; SHOAL_E2E_URL is external")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        mgmt = s.getsockname()[1]
    c = start_cluster(tmp_path / "cluster", 2, env={"SHOAL_MANAGEMENT_PORT": str(mgmt)})
    try:
        # one run over two queues, one on each node
        pattern = next(p for p in (f"rep-{uuid.uuid4().hex[:10]}-%d" for _ in range(10_000))
                       if [c.owner(p % 1), c.owner(p % 2)] == ["node-0", "node-1"])
        queues = [pattern % 1, pattern % 2]
        run_dir = tmp_path / "run"
        r = subprocess.run([sys.executable, "-m", "shoal.cli", "loadtest", "--url", c.url,
                            "--queues", "2", "--queue-pattern", pattern, "--rate", "200",
                            "--time", "2", "--sample-every", "7",
                            "--management-url", f"http://127.0.0.1:{mgmt}",
                            "--label", "shoal", "--out", str(run_dir)],
                           capture_output=True, text=True, timeout=90)
        assert r.returncode == 0, r.stdout + r.stderr
        req = urllib.request.Request(f"http://127.0.0.1:{mgmt}/api/queues/%2F")
        req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        with urllib.request.urlopen(req, timeout=10) as resp:
            listed = {q["name"]: q["node"] for q in json.loads(resp.read())}
    finally:
        stop_cluster(c)
    assert [listed[q] for q in queues] == ["node-0", "node-1"]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["placement"] == "management"
    assert run["queues"] == [{"queue": queues[0], "node": "node-0"},
                             {"queue": queues[1], "node": "node-1"}]
    out = tmp_path / "out"
    cli.run([str(run_dir)], "local[2]", str(out))
    nodes = {r["node"]: r for r in pq.read_table(out / "nodes.parquet").to_pylist()}
    assert set(nodes) == {"node-0", "node-1"}
    for r in nodes.values():
        assert r["sent"] > 0 and r["received"] == r["sent"] and r["sent_per_s"] > 0
        assert r["latency_p50_ms"] is not None and r["latency_p99_ms"] >= r["latency_p50_ms"]
