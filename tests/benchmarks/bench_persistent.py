"""Benchmark (not a test) of confirmed persistent publishing (issue 5).

Starts a 1-node cluster (``shoal serve --port 0``) with the node writing its journal counters
to a stats file (``SHOAL_NODE_STATS_FILE``, ``{node}`` replaced by the node id). For each
number of concurrent publishers (each an aio-pika channel with publisher confirms, awaiting
every confirm before the next publish), publishes persistent 100-byte messages to one durable
queue for ``--seconds`` and reports messages/s, confirm latency p50/p99 (ms) and the node's
fsyncs/s and messages per fsync: with group commit, more publishers share each fsync.

    python tests/benchmarks/bench_persistent.py [--seconds 5] [--publishers 1,4,16,64]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
import uuid

import aio_pika

from _cluster import start_cluster


def read_stats(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


async def run(port: int, publishers: int, seconds: float, stats: str) -> dict:
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
    setup = await conn.channel()
    name = f"bench-persistent-{publishers}-{uuid.uuid4().hex[:6]}"
    queue = await setup.declare_queue(name, durable=True)
    latencies: list[float] = []
    body = b"x" * 100

    async def publisher() -> int:
        ch = await conn.channel(publisher_confirms=True)
        n = 0
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            await ch.default_exchange.publish(
                aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), name)
            latencies.append((time.perf_counter() - t0) * 1000.0)
            n += 1
        await ch.close()
        return n

    await asyncio.sleep(1.2)
    before = read_stats(stats)
    t0 = time.perf_counter()
    counts = await asyncio.gather(*(publisher() for _ in range(publishers)))
    elapsed = time.perf_counter() - t0
    await asyncio.sleep(1.2)              # the node rewrites its stats file every second
    after = read_stats(stats)
    await queue.purge()
    await queue.delete()
    await conn.close()
    total = sum(counts)
    fsyncs = after["fsyncs"] - before["fsyncs"]
    latencies.sort()
    return {"publishers": publishers, "msgs_s": total / elapsed,
            "p50": statistics.median(latencies),
            "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
            "fsyncs_s": fsyncs / elapsed, "per_fsync": total / max(1, fsyncs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--publishers", default="1,4,16,64")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="shoal-bench-") as d:
        stats = os.path.join(d, "stats-{node}.json")
        proc, port = start_cluster(d, 1, {"SHOAL_NODE_STATS_FILE": stats})
        try:
            stats = stats.replace("{node}", "node-0")
            print(f"# {platform.python_version()} {platform.platform()}; 100-byte persistent "
                  f"messages, one durable queue, 1 node")
            print("| publishers | msgs/s | confirm p50 ms | confirm p99 ms | fsyncs/s | "
                  "msgs per fsync |")
            print("|---:|---:|---:|---:|---:|---:|")
            for p in [int(x) for x in args.publishers.split(",")]:
                r = asyncio.run(run(port, p, args.seconds, stats))
                print(f"| {p} | {r['msgs_s']:,.0f} | {r['p50']:.2f} | {r['p99']:.2f} | "
                      f"{r['fsyncs_s']:,.0f} | {r['per_fsync']:.1f} |", flush=True)
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
