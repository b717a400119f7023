"""The run folder round-trips through its schemas; loss and duplicates are counted exactly."""
from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from shoal.pipeline.loadtest import schema as S
from shoal.pipeline.loadtest.cli import build, parse_queue_args
from shoal.pipeline.loadtest.writer import (
    RunWriter,
    loss_and_duplicates,
    merge_counts,
    read_run,
    received_runs,
)


def test_every_column_is_documented():
    for schema in S.FILES.values():
        for f in schema:
            assert f.name in S.__doc__, f"column {f.name} missing from the schema docstring"


def test_received_runs_cover_sent_and_count_loss_and_duplicates():
    # producer 3 sent 10: seq 2 lost, seq 5 received twice, seqs 8-9 lost (counts too short)
    counts = bytes([1, 1, 0, 1, 1, 2, 1, 1])
    rows = received_runs(3, counts, sent=10)
    assert rows == [(3, 0, 2, 1), (3, 2, 3, 0), (3, 3, 5, 1), (3, 5, 6, 2), (3, 6, 8, 1),
                    (3, 8, 10, 0)]
    assert received_runs(3, b"", 0) == []


def test_merge_counts_adds_and_saturates():
    assert merge_counts([bytes([1, 0, 200]), bytes([0, 1, 100, 1])]) == bytes([1, 1, 255, 1])
    assert merge_counts([b"", bytes([2])]) == bytes([2])
    assert merge_counts([]) == b""


def test_run_folder_round_trip(tmp_path):
    run_json = {"format_version": S.FORMAT_VERSION, "run_id": "ab", "params": {"time": 2}}
    w = RunWriter(tmp_path, run_json)
    row = {"second": 0, "time": 1_700_000_000_000_000, "role": S.ROLE_CONSUMER, "worker": 1,
           "queue": "perf-1", "node": "node-0", "sent": 0, "confirmed": 0, "nacked": 0,
           "returned": 0, "received": 5, "redelivered": 1, "foreign": 0,
           "latency_p50_us": 300, "latency_p99_us": 900, "latency_max_us": 950}
    w.add_per_second([row])
    w.add_samples([(0, 0, "perf-1", 1, 10_000, 310_000, 300, False)])
    w.flush()                      # a second row group
    w.add_per_second([{**row, "second": 1, "role": S.ROLE_PRODUCER, "received": 0,
                       "redelivered": 0, "sent": 7, "latency_p50_us": None,
                       "latency_p99_us": None, "latency_max_us": None}])
    w.close([{"producer": 0, "queue": "perf-1", "node": "node-0", "sent": 7, "confirmed": 6,
              "nacked": 1, "returned": 0}],
            received_runs(0, bytes([1, 1, 1, 1, 2]), 7), {"sent": 7})
    run = read_run(tmp_path)
    assert run["run"]["summary"] == {"sent": 7}
    ps = run["per_second"]
    assert ps.schema.equals(S.PER_SECOND, check_metadata=False)
    assert ps.num_rows == 2 and ps["received"].to_pylist() == [5, 0]
    assert ps["latency_p99_us"].to_pylist() == [900, None]
    assert pq.ParquetFile(tmp_path / S.PER_SECOND_FILE).num_row_groups == 2
    assert run["latency"].to_pylist() == [{
        "producer": 0, "seq": 0, "queue": "perf-1", "consumer": 1, "sent_ns": 10_000,
        "received_ns": 310_000, "latency_us": 300, "redelivered": False}]
    assert run["producers"]["sent"].to_pylist() == [7]
    assert loss_and_duplicates(run["received"]) == (2, 1)
    assert json.loads((tmp_path / S.RUN_JSON).read_text())["run_id"] == "ab"


def test_the_first_flush_inside_a_run_does_no_one_time_work(tmp_path):
    """pyarrow imports pandas (about 0.2 s of CPU) on its first conversion of Python values.
    The runner calls ``warm_up()`` before the workers start, so the first ``flush()``, five
    seconds into the measured window, imports nothing (it used to show in both brokers'
    latency as a spike at second 5). A fresh interpreter: other tests may have imported it."""
    script = f"""
import sys
from shoal.pipeline.loadtest.writer import RunWriter, warm_up
warm_up()
w = RunWriter({str(tmp_path)!r}, {{}})
w.add_samples([(0, 0, "perf-1", 1, 10_000, 310_000, 300, False)])
before = set(sys.modules)
w.flush()
print(sorted(set(sys.modules) - before))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_queue_args_and_flags():
    assert parse_queue_args('{"x-max-length": 10}') == {"x-max-length": 10}
    assert parse_queue_args("x-max-length=10,x-queue-type=classic,x-flag=true") == {
        "x-max-length": 10, "x-queue-type": "classic", "x-flag": True}
    with pytest.raises(ValueError, match="key=value"):
        parse_queue_args("oops")
    cfg, _out, run_json, nodes = build(["--url", "amqp://u:secret@h:1/v", "--queues", "3",
                                       "--nodes", "2", "--out", "x"])
    assert cfg.queues == ["perf-1", "perf-2", "perf-3"]
    assert set(nodes.values()) <= {"node-0", "node-1"} and len(nodes) == 3
    assert "secret" not in json.dumps(run_json)
    assert run_json["url"] == "amqp://u@h:1/v"
