"""The comparison script's table (tests/benchmarks/compare_table.py, issue 6): what a user
reads from it, built from run records like the ones the script collects; and load 1's search
(compare_rabbitmq.load1, ``--load1-runs``) over scripted run outcomes. No broker runs here and
nothing asserts a speed."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import compare_rabbitmq  # noqa: E402
import compare_table as cmp  # noqa: E402

SHOAL = "Shoal (2 nodes)"


def _run(broker: str, cpu_s: float, p99: float, sent: int = 50_000) -> dict:
    return {"name": "load34", "broker": broker, "cpu_s": cpu_s, "sent": sent,
            "latency_ms": {"p50": p99 / 2, "p99": p99}, "p99_median_s_ms": p99}


def _table(shoal_cpu: list[float], rabbit_cpu: list[float]) -> str:
    shoal = [_run(SHOAL, c, 0.4) for c in shoal_cpu]
    rabbit = [_run("RabbitMQ", c, 0.5) for c in rabbit_cpu]
    res = {"fixed_rate": 5000, "embed_node": True, "queue_node": "node-0",
           "load34": {SHOAL: cmp.best_of(shoal), "RabbitMQ": cmp.best_of(rabbit)},
           "load34_pairs": cmp.paired(shoal, rabbit)}
    return cmp.render(res, SHOAL)


def _row(table: str, prefix: str) -> list[str]:
    line = next(line for line in table.splitlines() if line.startswith(f"| {prefix}"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_best_of_and_pairs_both_shown():
    # Shoal 26, 27, 25 µs/msg; RabbitMQ 30, 26, 29: one RabbitMQ run beats its Shoal pair.
    table = _table([1.30, 1.35, 1.25], [1.50, 1.30, 1.45])
    best = _row(table, "3. broker CPU per message")
    assert best[1:4] == ["25.0", "26.0", "0.96"]
    pairs = _row(table, "3. same, each alternating pair")
    assert pairs[1:] == ["2 of 3 pairs <= 1.0", "range 0.86-1.04", "median 0.87", "<= 1.0"]


def test_even_number_of_pairs_takes_the_middle_two():
    p = cmp.paired([_run(SHOAL, c, 0.4) for c in (1.0, 1.0, 1.0, 1.0)],
                   [_run("RabbitMQ", c, 0.5) for c in (1.25, 1.0, 1.1, 0.8)])
    assert p == {"cpu_ratios": [0.8, 0.91, 1.0, 1.25], "median": 0.955, "at_most_1": 3}


def test_failed_runs_are_left_out_of_the_pairs():
    failed = {"name": "load34", "broker": SHOAL, "cpu_s": 0.0, "rc": 1}
    p = cmp.paired([failed, _run(SHOAL, 1.2, 0.4)],
                   [_run("RabbitMQ", 1.5, 0.5), _run("RabbitMQ", 1.5, 0.5)])
    assert p == {"cpu_ratios": [0.8], "median": 0.8, "at_most_1": 1}
    table = _table([], [])
    assert "each alternating pair" not in table


class _Broker:
    def __init__(self, label: str, outcomes: dict[int, list[bool]], limit: int) -> None:
        self.label, self.outcomes, self.limit = label, outcomes, limit


class _Bench:
    """Stands in for compare_rabbitmq.Bench: each run's outcome comes from a script per rate
    (else: passes up to the broker's limit)."""
    quick = False

    def __init__(self) -> None:
        self.runs: list[tuple[str, int]] = []

    def run(self, broker: _Broker, name: str, args: list[str]) -> dict:
        rate = int(args[args.index("--rate") + 1])
        self.runs.append((broker.label, rate))
        script = broker.outcomes.get(rate)
        ok = script.pop(0) if script else rate <= broker.limit
        return {"ok": ok, "send_rate": rate - 1}


def test_load1_runs_pass_a_step_when_most_of_its_runs_do():
    """``--load1-runs 3``: a step passes on 2 of 3 runs, fails on 1 of 3, and stops as soon as
    the majority is known (an easy step costs two runs)."""
    shoal = _Broker(SHOAL, {70000: [True, False, True]}, 60000)
    rabbit = _Broker("RabbitMQ", {60000: [False, True, False]}, 50000)
    bench = _Bench()
    best = compare_rabbitmq.load1(bench, [shoal, rabbit], runs=3)
    assert best == {SHOAL: 69999, "RabbitMQ": 49999}
    assert bench.runs.count((SHOAL, 5000)) == 2
    assert bench.runs.count((SHOAL, 70000)) == 3
    assert bench.runs.count(("RabbitMQ", 60000)) == 3
    table = cmp.render({"load1": best, "load1_runs": 3}, SHOAL)
    assert "most of 3 runs per step" in table
    assert _row(table, "1. sustainable rate")[3] == "1.4"


def test_load1_with_one_run_per_step_reads_each_run_alone():
    shoal = _Broker(SHOAL, {70000: [False]}, 60000)
    bench = _Bench()
    assert compare_rabbitmq.load1(bench, [shoal], runs=1) == {SHOAL: 59999}
    # one run per step of the search: doubling to a failure, then bisecting to within 10 %
    assert [rate for _, rate in bench.runs] == [5000, 10000, 20000, 40000, 80000, 60000,
                                                70000, 65000]
