"""Issue 46's benchmark matrix: Shoal and RabbitMQ side by side on the load shapes that most
applications run, not only the one a delivery lease carries.

    python tests/benchmarks/matrix.py [--shapes A,B,C,D,E,F,G] [--repeat 3] [--time 10]
        [--total-rate N] [--rate-search A,D] [--nodes 2] [--out DIR]

Shapes (``shoal loadtest`` arguments; ``--rate`` is per producer, so each shape's total is
its own rate below, or ``--total-rate`` for all):

- A: 1 producer, 1 consumer, 1 queue, 100 B, no confirms, qos 200 (5,000 msg/s);
- B: a work queue: 1 producer with confirms (window 50), 4 consumers, 100 B, qos 50 (5,000);
- C: persistent 1 KB messages on a durable queue, confirms (window 50), 1 consumer (5,000);
- D: 8 queues, 4 producers, 4 consumers, 100 B, qos 200 (5,000);
- E: a fanout exchange to 10 queues, 1 producer, 2 consumers, 100 B, qos 200 (1,000 msg/s
  published, 10,000 deliveries/s);
- F: a topic exchange with 1,000 bindings (``kJ.*``) over 10 queues, each message to one
  queue, 1 producer, 2 consumers, 100 B, qos 200 (5,000);
- G: 10,000 queues, 2 producers, 1,000 consuming connections (4 consumer processes with 250
  connections each, 10 queues per connection), 100 B, qos 10 (2,000 msg/s over all queues).

Each run of E and F declares a fresh exchange. CPU per message is per message published (a
fanout's 10 deliveries count once). RabbitMQ runs on one node that lives through the whole
matrix; after each run of E to G it is reset (``rabbitmqctl stop_app``, ``reset``,
``start_app``) so that the next run does not carry their queues, exchanges and bindings
(Shoal starts afresh for every run anyway).

For each shape, ``--repeat`` runs per broker at the fixed rate, alternating (Shoal, RabbitMQ,
Shoal, ...), a fresh ``shoal serve`` per Shoal run, as compare_rabbitmq.py runs them (its
``Bench``): broker CPU per message over the sending window, consumer p99 (whole run, and the
median of the per-second p99s), broker RSS at the window's end. The table gives each
broker's median and the Shoal/RabbitMQ ratio of each alternating pair with their median.
``--rate-search`` also finds the highest sustainable rate of those shapes (compare_rabbitmq's
load 1 search: received >= 99% of sent, median per-second p99 <= 50 ms).

Not collected by pytest (no ``test_`` prefix): a benchmark asserts no speed.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _cluster import port_open
from compare_rabbitmq import (Bench, RabbitMQ, Shoal, load1, log, log_interpreter, machine,
                             rabbitmq_version)
from compare_table import cpu_us

EXCHANGE = "{exchange}"     #: replaced by a fresh exchange name in each run's arguments
_FAN = ["--exchange", EXCHANGE, "--exchange-type"]

#: shape -> (what it is, loadtest arguments without --rate, producers)
SHAPES: dict[str, tuple[str, list[str], int]] = {
    "A": ("1p 1c, 100 B, no confirms",
          ["--producers", "1", "--consumers", "1", "--queues", "1", "--size", "100",
           "--qos", "200"], 1),
    "B": ("work queue: 1p confirms (50), 4c",
          ["--producers", "1", "--consumers", "4", "--queues", "1", "--size", "100",
           "--qos", "50", "--confirm", "50"], 1),
    "C": ("persistent 1 KB, durable, confirms (50)",
          ["--producers", "1", "--consumers", "1", "--queues", "1", "--size", "1024",
           "--qos", "200", "--confirm", "50", "--persistent", "--durable"], 1),
    "D": ("8 queues, 4p 4c, 100 B",
          ["--producers", "4", "--consumers", "4", "--queues", "8", "--size", "100",
           "--qos", "200"], 4),
    "E": ("fanout to 10 queues, 1p 2c, 100 B",
          ["--producers", "1", "--consumers", "2", "--queues", "10", "--size", "100",
           "--qos", "200", *_FAN, "fanout"], 1),
    "F": ("topic exchange, 1,000 bindings, 10 queues, 1p 2c",
          ["--producers", "1", "--consumers", "2", "--queues", "10", "--size", "100",
           "--qos", "200", *_FAN, "topic", "--bindings", "1000"], 1),
    "G": ("10,000 queues, 1,000 consuming connections, 2p",
          ["--producers", "2", "--consumers", "4", "--connections", "250", "--queues", "10000",
           "--size", "100", "--qos", "10"], 2),
}
#: each shape's total rate at the fixed-rate runs (msg/s published)
RATES = {"A": 5000, "B": 5000, "C": 5000, "D": 5000, "E": 1000, "F": 5000, "G": 2000}
#: shapes after whose runs RabbitMQ is reset (they leave many queues, exchanges, bindings)
RESET = {"E", "F", "G"}


class ResettingRabbitMQ(RabbitMQ):
    """The matrix's RabbitMQ: ``reset_after`` set, a run's end (``stop``) resets the node to
    a virgin state (its beam.smp lives on, so ``pids`` holds)."""

    reset_after = False

    def stop(self) -> None:
        if not self.reset_after:
            return
        for cmd in (["stop_app"], ["reset"], ["start_app"], ["await_startup"]):
            subprocess.run(["rabbitmqctl", *cmd], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=300)


def fresh(args: list[str]) -> list[str]:
    """``args`` with a new exchange name for this run (E, F)."""
    name = f"bench-x-{uuid.uuid4().hex[:8]}"
    return [name if a == EXCHANGE else a for a in args]


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def _pairs(shoal: list, rabbit: list, key) -> dict:
    ratios = [round(key(s) / key(r), 3) for s, r in zip(shoal, rabbit)
              if key(s) is not None and key(r)]
    return {"ratios": ratios, "median": _median(ratios)}


def _p99(run: dict) -> float | None:
    return (run.get("latency_ms") or {}).get("p99")


def summarize(runs: dict[str, list[dict]], shoal_label: str) -> dict:
    """One shape's runs per broker -> medians and pair ratios."""
    s, r = runs.get(shoal_label, []), runs.get("RabbitMQ", [])
    out: dict = {}
    for label, rs in ((shoal_label, s), ("RabbitMQ", r)):
        out[label] = {"cpu_us_per_msg": _median([cpu_us(x) for x in rs]),
                      "p99_ms": _median([_p99(x) for x in rs]),
                      "p99_median_s_ms": _median([x.get("p99_median_s_ms") for x in rs]),
                      "rss_mb": _median([x.get("rss_mb") for x in rs]),
                      "receive_rate": _median([x.get("receive_rate") for x in rs])}
    out["cpu_pairs"] = _pairs(s, r, cpu_us)
    out["p99_pairs"] = _pairs(s, r, _p99)
    out["p99_s_pairs"] = _pairs(s, r, lambda x: x.get("p99_median_s_ms"))
    out["rss_pairs"] = _pairs(s, r, lambda x: x.get("rss_mb"))
    return out


def render(res: dict, shoal_label: str) -> str:
    rows = ["| shape | CPU µs per message published Shoal / RabbitMQ | CPU ratio (pairs' median) | p99 ms "
            "Shoal / RabbitMQ | p99 ratio | median 1-s p99 ratio | RSS MB Shoal / RabbitMQ "
            "| sustainable rate Shoal / RabbitMQ |",
            "|---|---|---|---|---|---|---|---|"]
    for shape, sm in res["shapes"].items():
        s, r = sm[shoal_label], sm["RabbitMQ"]
        rate = res.get("rates", {}).get(shape)
        rate_cell = f"{rate.get(shoal_label)} / {rate.get('RabbitMQ')}" if rate else "-"
        rows.append(
            f"| {shape}: {SHAPES[shape][0]} | {s['cpu_us_per_msg']} / {r['cpu_us_per_msg']} | "
            f"**{sm['cpu_pairs']['median']}** {sm['cpu_pairs']['ratios']} | "
            f"{s['p99_ms']} / {r['p99_ms']} | **{sm['p99_pairs']['median']}** | "
            f"{sm['p99_s_pairs']['median']} | {s['rss_mb']} / {r['rss_mb']} | {rate_cell} |")
    for shape, rate in res.get("rates", {}).items():     # searched, not run at a fixed rate
        if shape not in res["shapes"]:
            rows.append(f"| {shape}: {SHAPES[shape][0]} | - | - | - | - | - | - | "
                        f"{rate.get(shoal_label)} / {rate.get('RabbitMQ')} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="A,B,C,D,E,F,G")
    p.add_argument("--repeat", type=int, default=3, help="runs per broker and shape")
    p.add_argument("--time", type=float, default=10.0, help="sending seconds per run")
    p.add_argument("--total-rate", type=int, default=0,
                   help="msg/s of every shape at the fixed rate, over all its producers "
                        "(default: each shape's own, RATES)")
    p.add_argument("--rate-search", default="",
                   help="shapes whose highest sustainable rate to search (e.g. A,D)")
    p.add_argument("--nodes", type=int, default=os.cpu_count() or 2)
    p.add_argument("--shoal-port", type=int, default=5673)
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    shapes = [x.strip().upper() for x in args.shapes.split(",") if x.strip()]
    searched = [x.strip().upper() for x in args.rate_search.split(",") if x.strip()]
    unknown = [x for x in shapes + searched if x not in SHAPES]
    if unknown:
        print(f"matrix: unknown shape(s) {', '.join(unknown)}; known: {', '.join(SHAPES)}",
              file=sys.stderr)
        return 2
    if port_open(args.shoal_port):
        print(f"matrix: port {args.shoal_port} is in use", file=sys.stderr)
        return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="shoal-matrix-")).resolve()
    out.mkdir(parents=True, exist_ok=True)

    def _exit(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)
    bench = Bench(out, quick=False)
    bench.time_s = args.time
    rabbit = ResettingRabbitMQ()
    shoal = Shoal(args.shoal_port, args.nodes, out)
    res: dict = {"machine": machine(), "nodes": args.nodes, "total_rate": args.total_rate,
                 "time_s": args.time, "repeat": args.repeat, "shapes": {}, "rates": {}}
    t0 = time.monotonic()
    log_interpreter()
    try:
        rabbit.ensure()
        res["rabbitmq_version"] = rabbitmq_version()
        for shape in shapes:
            _, load, producers = SHAPES[shape]
            total = args.total_rate or RATES[shape]
            fixed = load + ["--rate", str(max(1, total // producers))]
            rabbit.reset_after = shape in RESET
            runs: dict[str, list[dict]] = {}
            for _ in range(args.repeat):
                for b in (shoal, rabbit):
                    runs.setdefault(b.label, []).append(bench.run(b, f"shape{shape}",
                                                                  fresh(fixed)))
            res["shapes"][shape] = summarize(runs, shoal.label)
        for shape in searched:
            _, load, producers = SHAPES[shape]
            rabbit.reset_after = shape in RESET
            if EXCHANGE in load:
                load = fresh(load)      # one exchange for the search's runs
            best = load1(bench, [shoal, rabbit], load, f"rate{shape}")
            res["rates"][shape] = {k: v * producers for k, v in best.items()}
    finally:
        shoal.stop()
        rabbit.shutdown()
        res["runs"] = bench.runs
        res["wall_s"] = round(time.monotonic() - t0, 1)
        (out / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    table = render(res, shoal.label)
    (out / "table.md").write_text(table + "\n")
    print(table)
    log(f"done in {res['wall_s']:.0f} s; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
