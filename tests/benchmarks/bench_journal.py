"""Benchmark (not a test) of the node journal's group commit (issue 5).

For group sizes 1, 10, 100, 1000: append that many ENQUEUE records (100-byte bodies) and
commit them with one write + one fdatasync; report records/s, fsyncs/s and the speed-up over
group size 1, measured in one run so the ratios hold on a noisy machine. Also times the
asyncio variant (commit_async) with a publisher that appends while the disk works.

    python tests/benchmarks/bench_journal.py [--seconds 3] [--dir /path/on/the/disk/to/test]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

from shoal.node.durability.journal import Journal

HEADER = b"\x00\x3c\x00\x00\x00\x00\x00\x00\x00\x00\x00\x64\x10\x00\x02"   # delivery-mode 2
BODY = b"x" * 100


def bench_sync(root: Path, group: int, seconds: float) -> tuple[float, float]:
    d = root / f"sync{group}"
    with Journal.open(d) as j:
        j.declare_queue("/", "q")
        j.commit()
        n = commits = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(group):
                n += 1
                j.enqueue("/", "q", n, "", "q", HEADER, BODY)
            j.settle(range(n - group + 1, n + 1))        # acked: compaction reclaims
            j.commit()
            commits += 1
        dt = time.perf_counter() - t0
        assert j.fsyncs == commits + 1
    shutil.rmtree(d)
    return n / dt, commits / dt


async def _async_publisher(j: Journal, seconds: float, per_turn: int) -> tuple[int, int]:
    n = 0
    t0 = time.perf_counter()
    pending: list[asyncio.Future] = []
    while time.perf_counter() - t0 < seconds:
        for _ in range(per_turn):
            n += 1
            j.enqueue("/", "q", n, "", "q", HEADER, BODY)
        pending.append(j.commit_async())
        if len(pending) > 64:
            await pending.pop(0)
        await asyncio.sleep(0)
    await asyncio.gather(*pending)
    return n, j.fsyncs


def bench_async(root: Path, per_turn: int, seconds: float) -> tuple[float, float]:
    d = root / f"async{per_turn}"
    with Journal.open(d) as j:
        j.declare_queue("/", "q")
        j.commit()
        f0 = j.fsyncs
        t0 = time.perf_counter()
        n, fs = asyncio.run(_async_publisher(j, seconds, per_turn))
        dt = time.perf_counter() - t0
    shutil.rmtree(d)
    return n / dt, (fs - f0) / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    ap.add_argument("--dir", default=None, help="directory on the disk to measure (tmp)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-journal-", dir=args.dir))
    print(f"python {platform.python_version()}, {os.cpu_count()} cpus, {platform.platform()}")
    print(f"journal in {root}, 100-byte bodies, {args.seconds:g} s per row\n")
    print(f"{'mode':<14}{'group':>7}{'records/s':>12}{'fsyncs/s':>10}{'x group 1':>11}")
    base = None
    try:
        for group in (1, 10, 100, 1000):
            rps, fps = bench_sync(root, group, args.seconds)
            base = base or rps
            print(f"{'commit()':<14}{group:>7}{rps:>12,.0f}{fps:>10,.0f}{rps / base:>10.1f}x")
        for per_turn in (1, 10):
            rps, fps = bench_async(root, per_turn, args.seconds)
            print(f"{'commit_async':<14}{per_turn:>7}{rps:>12,.0f}{fps:>10,.0f}"
                  f"{rps / base:>10.1f}x   (appends/turn; groups form while the disk works)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
