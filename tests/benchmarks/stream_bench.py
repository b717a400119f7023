"""Streams side by side with RabbitMQ 3.10's streams (issue 47, point 6), over AMQP 0-9-1,
1 KB messages, confirms on:

    python tests/benchmarks/stream_bench.py [--repeat 3] [--time 10] [--seek-mb 1024]
        [--nodes 2] [--members N] [--rabbitmq-nodes 1|3] [--out DIR]

- **publish**: 2 producers as fast as a confirm window of 500 lets them, persistent, no
  consumer: the confirmed rate, and broker CPU per message;
- **fanout**: 1 producer at ``--rate`` msg/s (2,000), five consumers reading every message
  (a stream consumer from ``next``, subscribed before the producer starts, reads all it
  publishes): broker CPU per *published* message, consumer p99;
- **seek**: a stream filled with ``--seek-mb`` MB (64 KiB bodies, confirmed), then a new
  consumer at an offset in its middle: the time from ``basic.consume`` to its first
  delivery, the median of 5 consumers (a lookup in Shoal's index: docs/streams.md).

With ``--rabbitmq-nodes 3`` RabbitMQ runs as the 3-node cluster of quorum_bench.py
(``_quorum_clusters.RabbitCluster``: rabbit1..3@localhost on AMQP ports 5681-5683, started
once for the whole bench and stopped at its end), and the load's clients connect to rabbit1,
which leads the stream it declares (streams' leader locator is client-local). Give Shoal
``--nodes 3`` with it, so that both brokers replicate each stream to 3 members and confirm a
publish once 2 of them have it.

Runs alternate (Shoal, RabbitMQ, Shoal, ...), a fresh ``shoal serve`` per Shoal run, as
compare_rabbitmq.py's ``Bench`` runs them; the table gives each broker's median and the
Shoal/RabbitMQ ratio of each alternating pair with their median. The seek time is a
benchmark figure, not a test: nothing here asserts a speed (no ``test_`` prefix).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pika

from _cluster import port_open
from compare_rabbitmq import (Bench, RabbitMQ, Shoal, log, log_interpreter, machine,
                             rabbitmq_version)
from _quorum_clusters import RMQ_NODES, RabbitCluster, amqp_url
from compare_table import cpu_us

STREAM = ["--queue-args", "x-queue-type=stream", "--durable", "--persistent", "--size", "1024",
          "--confirm", "500", "--queues", "1"]
LOADS: dict[str, tuple[str, list[str]]] = {
    "publish": ("2 producers, confirms (500), no consumer",
                STREAM + ["--producers", "2", "--consumers", "0"]),
    "fanout": ("1 producer at --rate, 5 consumers reading all",
               STREAM + ["--producers", "1", "--consumers", "5", "--qos", "500"]),
}


class RabbitStreams3:
    """RabbitMQ on 3 nodes for ``Bench``: the cluster starts once (``ensure``) and serves
    every run (each declares a stream of its own name); ``pids`` are the 3 beam.smp."""
    label = "RabbitMQ (3 nodes)"
    nodes = None

    def __init__(self, work: Path) -> None:
        self.cluster = RabbitCluster(work)
        self.url = amqp_url(self.cluster.ports[RMQ_NODES[0]])

    def ensure(self) -> None:
        self.cluster.start()

    def version(self) -> str:
        return self.cluster.ctl(RMQ_NODES[0], "version").strip()

    def pids(self) -> list[int]:
        return list(self.cluster.pids.values())

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def shutdown(self) -> None:
        self.cluster.stop()
        self.cluster.cleanup_epmd()


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def seek(url: str, megabytes: int) -> dict:
    """Fill a stream with ``megabytes`` MB of 64 KiB messages, then time 5 new consumers
    from its middle offset to their first delivery (s)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    name = f"seek-{uuid.uuid4().hex[:8]}"
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    body = os.urandom(65536)
    n = megabytes * 16
    t0 = time.monotonic()
    for _ in range(n):
        ch.basic_publish("", name, body, pika.BasicProperties(delivery_mode=2))
    fill_s = time.monotonic() - t0
    times = []
    for k in range(5):
        c = conn.channel()
        c.basic_qos(prefetch_count=1)
        first: list[float] = []
        target = n // 2 + k
        t = time.monotonic()
        c.basic_consume(name, lambda ch_, m, p, b: first.append(time.monotonic()),
                        arguments={"x-stream-offset": target})
        while not first and time.monotonic() - t < 60:
            conn.process_data_events(time_limit=0.001)
        times.append(first[0] - t if first else None)
        c.close()
    ch.queue_delete(name)
    conn.close()
    return {"messages": n, "fill_s": round(fill_s, 2),
            "seek_s": [round(x, 4) if x is not None else None for x in times],
            "seek_median_s": _median(times)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3, help="runs per broker and load")
    p.add_argument("--time", type=float, default=10.0, help="sending seconds per run")
    p.add_argument("--rate", type=int, default=2000, help="the fanout load's publish rate")
    p.add_argument("--seek-mb", type=int, default=1024, help="the seek load's stream size")
    p.add_argument("--loads", default="publish,fanout,seek")
    p.add_argument("--nodes", type=int, default=os.cpu_count() or 2)
    p.add_argument("--shoal-port", type=int, default=5673)
    p.add_argument("--settle", type=float, default=0.0,
                   help="seconds of rest (after an os.sync()) before each run (a run after "
                        "another once read lower; the cause was a nearly full disk, which "
                        "discard() now prevents)")
    p.add_argument("--members", type=int, default=0,
                   help="x-initial-cluster-size for both brokers (default: each broker's own, "
                        "3 at most the nodes there are: 2 on Shoal's 2 nodes, 1 on RabbitMQ's "
                        "one). 1 compares like for like with RabbitMQ on one node")
    p.add_argument("--rabbitmq-nodes", type=int, choices=(1, 3), default=1,
                   help="1: the RabbitMQ on 5672 (started when not running); 3: a 3-node "
                        "RabbitMQ cluster of its own on ports 5681-5683 (module docstring)")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    loads = [x.strip() for x in args.loads.split(",") if x.strip()]
    if port_open(args.shoal_port):
        print(f"stream_bench: port {args.shoal_port} is in use", file=sys.stderr)
        return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="shoal-streams-")).resolve()
    out.mkdir(parents=True, exist_ok=True)

    def _exit(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)
    bench = Bench(out, quick=False)
    bench.time_s = args.time
    bench.settle_s = args.settle
    rabbit = RabbitMQ() if args.rabbitmq_nodes == 1 else RabbitStreams3(out)
    shoal = Shoal(args.shoal_port, args.nodes, out)
    brokers = (shoal, rabbit)
    res: dict = {"machine": machine(), "nodes": args.nodes, "members": args.members,
                 "settle_s": args.settle, "rabbitmq_nodes": args.rabbitmq_nodes,
                 "time_s": args.time,
                 "repeat": args.repeat, "loads": {}}
    t0 = time.monotonic()
    log_interpreter()
    try:
        rabbit.ensure()
        res["rabbitmq_version"] = (rabbitmq_version() if args.rabbitmq_nodes == 1
                                   else rabbit.version())
        for load in loads:
            runs: dict[str, list[dict]] = {}
            for _ in range(args.repeat):
                for b in brokers:
                    if load == "seek":
                        b.start()
                        try:
                            r = seek(b.url, args.seek_mb)
                        finally:
                            b.stop()
                        log(f"{b.label:<18} seek: {r}")
                    else:
                        extra = ["--rate", str(args.rate)] if load == "fanout" else []
                        r = bench.run(b, load, _with_members(LOADS[load][1], args.members)
                                      + extra)
                        discard(b, r)
                    runs.setdefault(b.label, []).append(r)
            res["loads"][load] = summarize(load, runs, shoal.label)
    finally:
        shoal.stop()
        rabbit.shutdown()
        res["runs"] = bench.runs
        res["wall_s"] = round(time.monotonic() - t0, 1)
        (out / "results.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    table = render(res, shoal.label)
    (out / "table.md").write_text(table + "\n")
    print(table)
    log(f"done in {res['wall_s']:.0f} s; results in {out}")
    return 0


def discard(broker, run: dict) -> None:
    """Free the disk a publish run filled (up to 2 GB a run on 3 members): RabbitMQ's
    stream is deleted (the broker keeps serving), Shoal's data folder emptied but for its logs
    (its ``serve`` has stopped). Left in place, a bench filled this VM's disk to 96 %, and every
    later run, of either broker, read lower (docs/performance-log.md, issue 47)."""
    if isinstance(broker, Shoal):
        data = getattr(broker, "data", None)
        for p in (data.iterdir() if data is not None and data.exists() else ()):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
        return
    path = Path(run.get("run_dir", "")) / "run.json"     # the load tool's queues
    queues = [q["queue"] for q in json.loads(path.read_text()).get("queues", [])] \
        if path.is_file() else []
    if not queues:
        return
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        for q in queues:
            ch.queue_delete(q)
    finally:
        conn.close()


def _with_members(load_args: list[str], members: int) -> list[str]:
    """``load_args`` with ``x-initial-cluster-size=members`` added to its queue arguments
    (none when ``members`` is 0)."""
    if not members:
        return load_args
    out = list(load_args)
    i = out.index("--queue-args") + 1
    out[i] += f",x-initial-cluster-size={members}"
    return out


def _figure(load: str, run: dict) -> dict:
    if load == "seek":
        return {"seek_ms": None if run.get("seek_median_s") is None
                else round(run["seek_median_s"] * 1000, 1)}
    return {"rate": round(run.get("send_rate") or 0), "cpu_us": cpu_us(run),
            "p99_ms": (run.get("latency_ms") or {}).get("p99")}


def summarize(load: str, runs: dict[str, list[dict]], shoal_label: str) -> dict:
    """Each broker's medians, and the Shoal/RabbitMQ ratio of each alternating pair."""
    figs = {label: [_figure(load, r) for r in rs] for label, rs in runs.items()}
    out: dict = {"medians": {}, "pairs": {}}
    for label, fs in figs.items():
        out["medians"][label] = {k: _median([f[k] for f in fs]) for k in fs[0]}
    rabbit_label = next(k for k in figs if k != shoal_label)
    for key in figs[shoal_label][0]:
        ratios = [round(s[key] / b[key], 2) for s, b in zip(figs[shoal_label],
                                                              figs[rabbit_label])
                  if s[key] and b[key]]
        out["pairs"][key] = {"ratios": ratios, "median": _median(ratios)}
    return out


def render(res: dict, shoal_label: str) -> str:
    members = f", x-initial-cluster-size {res['members']}" if res.get("members") else ""
    lines = [f"Streams, Shoal ({res['nodes']} nodes) vs {res.get('rabbitmq_version', 'RabbitMQ')}"
             f" on {res.get('rabbitmq_nodes', 1)} node(s)"
             f", {res['repeat']} alternating pairs{members}",
             "", "| load | figure | Shoal | RabbitMQ | pairs (Shoal/RabbitMQ) | median |",
             "|---|---|---|---|---|---|"]
    for load, s in res["loads"].items():
        rabbit = next(k for k in s["medians"] if k != shoal_label)
        for key, pair in s["pairs"].items():
            lines.append(f"| {load} | {key} | {s['medians'][shoal_label][key]} | "
                         f"{s['medians'][rabbit][key]} | "
                         f"{', '.join(map(str, pair['ratios']))} | {pair['median']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
