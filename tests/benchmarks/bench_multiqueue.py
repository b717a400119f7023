"""Benchmark (not a test): multi-queue consumers, wake-ups per delivery and throughput.

Starts a 3-node cluster (``shoal serve --port 0``) with the router writing its pull counters
(``SHOAL_STATS_FILE``), then, for 1, 3 and 8 queues per consumer, runs a steady load and a
bursty load through one consumer (``x-multiqueue`` when more than one queue, prefetch 50,
acking every message) and prints:

* delivered msg/s;
* WORK notifications per delivered message (seed 002 DG3: no spurious wake-ups);
* empty pulls (drain grants that came back with nothing delivered) per delivered message.

Usage: ``python tests/benchmarks/bench_multiqueue.py [--seconds 5] [--rate 2000]``.
Figures are from one run on a shared machine: compare rows with each other, not with runs on
other days.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
import uuid

import aio_pika

from _cluster import start_cluster


def read_stats(path: str) -> dict:
    time.sleep(1.2)  # the router rewrites the file every second
    with open(path) as f:
        return json.load(f)


async def run_load(port: int, n_queues: int, mode: str, seconds: float, rate: int) -> int:
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
    pub_ch = await conn.channel(publisher_confirms=False)
    names = [f"bench-{n_queues}-{mode}-{i}-{uuid.uuid4().hex[:6]}" for i in range(n_queues)]
    for q in names:
        await pub_ch.declare_queue(q, auto_delete=False)
    ch = await conn.channel()
    await ch.set_qos(prefetch_count=50)
    done = asyncio.Event()
    count = 0
    total = 0

    async def on_message(msg: aio_pika.abc.AbstractIncomingMessage) -> None:
        nonlocal count
        await msg.ack()
        count += 1
        if count >= total and total:
            done.set()

    args = {"x-multiqueue": names} if n_queues > 1 else {}
    queue = await ch.get_queue(names[0], ensure=False)
    await queue.consume(on_message, arguments=args)
    ex = pub_ch.default_exchange
    start = time.monotonic()
    sent = 0
    body = b"x" * 100
    if mode == "steady":
        step = 1.0 / rate * 20
        while time.monotonic() - start < seconds:
            for _ in range(20):
                await ex.publish(aio_pika.Message(body), routing_key=names[sent % n_queues])
                sent += 1
            await asyncio.sleep(max(0.0, start + sent / rate - time.monotonic()) or step / 20)
    else:  # bursts: a second's worth at once, then silence
        bursts = max(1, int(seconds))
        for _ in range(bursts):
            for _ in range(rate):
                await ex.publish(aio_pika.Message(body), routing_key=names[sent % n_queues])
                sent += 1
            await asyncio.sleep(1.0)
    total = sent
    if count >= total:
        done.set()
    await asyncio.wait_for(done.wait(), 60)
    elapsed = time.monotonic() - start
    for q in names:
        await pub_ch.queue_delete(q)
    await conn.close()
    return sent, elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rate", type=int, default=2000, help="published msg/s")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stats_path = os.path.join(tmp, "stats.json")
        proc, port = start_cluster(os.path.join(tmp, "data"), 3, {"SHOAL_STATS_FILE": stats_path})
        try:
            print(f"{'queues':>6} {'load':>7} {'delivered':>9} {'msg/s':>8} "
                  f"{'wake-ups/msg':>12} {'empty pulls/msg':>15}")
            for n in (1, 3, 8):
                for mode in ("steady", "bursts"):
                    before = read_stats(stats_path)
                    sent, elapsed = asyncio.run(run_load(port, n, mode, args.seconds, args.rate))
                    after = read_stats(stats_path)
                    d = after["delivered"] - before["delivered"]
                    work = after["work"] - before["work"]
                    empty = after["empty_drains"] - before["empty_drains"]
                    print(f"{n:>6} {mode:>7} {d:>9} {sent / elapsed:>8.0f} "
                          f"{work / max(d, 1):>12.3f} {empty / max(d, 1):>15.3f}", flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


if __name__ == "__main__":
    main()
