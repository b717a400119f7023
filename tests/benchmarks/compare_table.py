"""The comparison's results as a user reads them (tests/benchmarks/compare_rabbitmq.py): CPU per
message of a run, the best of repeated runs, alternating pairs, and the Markdown table with
Shoal/RabbitMQ ratios and issue 6's targets. Pure functions over run records, no broker."""
from __future__ import annotations

import statistics

#: messages per second of loads 3 and 4
FIXED_RATE = 5000


def best_of(runs: list[dict]) -> dict:
    """Loads 3/4 over repeated runs: the lowest CPU per message and the lowest latencies
    (interference from other programs on a shared machine only ever adds to them)."""
    def low(values):
        values = [v for v in values if v is not None]
        return min(values) if values else None
    return {
        "cpu_us_per_msg": low([cpu_us(r) for r in runs]),
        "p50_ms": low([(r.get("latency_ms") or {}).get("p50") for r in runs]),
        "p99_ms": low([(r.get("latency_ms") or {}).get("p99") for r in runs]),
        "p99_median_s_ms": low([r.get("p99_median_s_ms") for r in runs]),
        "receive_rate": low([r.get("receive_rate") for r in runs]),
        "runs": len(runs)}


def ratio(a, b):
    return round(a / b, 2) if a is not None and b else None


def cpu_us(run: dict) -> float | None:
    """Broker CPU µs per message sent in one run, None for a failed run."""
    return round(run["cpu_s"] * 1e6 / run["sent"], 1) if run.get("sent") else None


def paired(shoal_runs: list[dict], rabbit_runs: list[dict]) -> dict:
    """Load 3 run by run: the Shoal/RabbitMQ CPU ratio of each alternating pair (run i of
    each broker, back to back on the same machine), their median and how many are <= 1.0.
    Steadier than best_of when one broker has a single lucky run."""
    ratios = sorted(r for r in (ratio(cpu_us(s), cpu_us(b))
                                for s, b in zip(shoal_runs, rabbit_runs)) if r is not None)
    return {"cpu_ratios": ratios,
            "median": round(statistics.median(ratios), 3) if ratios else None,
            "at_most_1": sum(r <= 1.0 for r in ratios)}


def render(res: dict, shoal_label: str) -> str:
    layout = ["node-0 in the router"] if res.get("embed_node") else []
    if res.get("queue_node"):
        layout.append(f"loads 1-4 on {res['queue_node']}")
    head = f"Shoal ({', '.join(layout)})" if layout else "Shoal"
    rows = [("load", head, "RabbitMQ", "Shoal/RabbitMQ", "target")]
    rl = "RabbitMQ"
    if "load1" in res:
        s, r = res["load1"].get(shoal_label), res["load1"].get(rl)
        runs = res.get("load1_runs", 1)
        each = f", most of {runs} runs per step" if runs > 1 else ""
        rows.append((f"1. sustainable rate, 1q 1p 1c 100 B qos 200{each} (msg/s)", s, r,
                     ratio(s, r), ">= 1.0"))
    if "load2" in res:
        s, r = res["load2"].get(shoal_label), res["load2"].get(rl)
        rows.append(("2. same with --confirm 1000 --persistent, durable queue (msg/s)", s, r,
                     ratio(s, r), "-"))    # issue 6 sets targets for loads 1, 3, 4 only
    if "load34" in res:
        s, r = res["load34"].get(shoal_label, {}), res["load34"].get(rl, {})
        rate = f"{res.get('fixed_rate', FIXED_RATE):,}"
        rows.append((f"3. broker CPU per message at {rate} msg/s (µs)",
                     s.get("cpu_us_per_msg"),
                     r.get("cpu_us_per_msg"),
                     ratio(s.get("cpu_us_per_msg"), r.get("cpu_us_per_msg")), "<= 1.0"))
        pairs = res.get("load34_pairs") or {}
        if pairs.get("cpu_ratios"):
            rs = pairs["cpu_ratios"]
            rows.append(("3. same, each alternating pair of runs (Shoal/RabbitMQ ratios)",
                         f"{pairs['at_most_1']} of {len(rs)} pairs <= 1.0",
                         f"range {rs[0]}-{rs[-1]}", f"median {pairs['median']}", "<= 1.0"))
        rows.append((f"4. consumer latency p50 at {rate} msg/s (ms)", s.get("p50_ms"),
                     r.get("p50_ms"), ratio(s.get("p50_ms"), r.get("p50_ms")), "-"))
        rows.append((f"4. consumer latency p99 at {rate} msg/s (ms)", s.get("p99_ms"),
                     r.get("p99_ms"), ratio(s.get("p99_ms"), r.get("p99_ms")), "<= 1.5"))
        rows.append((f"4. median of per-second p99 at {rate} msg/s (ms)",
                     s.get("p99_median_s_ms"), r.get("p99_median_s_ms"),
                     ratio(s.get("p99_median_s_ms"), r.get("p99_median_s_ms")), "<= 1.5"))
    if "load5" in res:
        r = res["load5"].get(rl, {})
        for n in (1, 2, 4):
            s = res["load5"].get(f"Shoal ({n} nodes)", {})
            rows.append((f"5. 8q 4p 4c confirm 500, Shoal {n} node(s) (msg/s received)",
                         s.get("receive_rate") or s.get("error"), r.get("receive_rate"),
                         ratio(s.get("receive_rate"), r.get("receive_rate")), "-"))
            rows.append(("5. same, p99 latency (ms)", s.get("p99_ms"), r.get("p99_ms"),
                         ratio(s.get("p99_ms"), r.get("p99_ms")), "-"))
    lines = ["| " + " | ".join(str(c) for c in rows[0]) + " |",
             "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join("-" if c is None else str(c) for c in row) + " |"
              for row in rows[1:]]
    return "\n".join(lines)
