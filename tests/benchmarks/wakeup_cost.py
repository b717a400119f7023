"""What one sleep and wake-up costs on this machine: a pipe ping-pong between two processes.

    python tests/benchmarks/wakeup_cost.py            # free to run on any CPU
    taskset -c 0 python tests/benchmarks/wakeup_cost.py   # both on one CPU
    python tests/benchmarks/wakeup_cost.py --gap-ms 1     # the woken side idle 1 ms first

Prints wall time and CPU time (both processes) per round trip; each round trip is two
wake-ups. On the 2-core VM of docs/performance.md, crossing CPUs costs about 20 µs of CPU per
wake-up, staying on one about 4. ``--gap-ms G``: the parent busy-waits G ms between round
trips, so the child's CPU idles (halts) before each wake-up, as a broker process's does
between bursts at 5,000 msg/s; prints the child's CPU per wake-up alone (about 36 µs with 1 ms
on that VM, session 17).
"""
from __future__ import annotations

import argparse
import os
import resource
import time

ROUND_TRIPS = 20_000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gap-ms", type=float, default=0.0,
                   help="busy-wait this long between round trips (the child idles)")
    gap = p.parse_args().gap_ms / 1000
    trips = ROUND_TRIPS if not gap else min(ROUND_TRIPS, int(3 / gap))
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        for _ in range(trips):
            os.read(r1, 1)
            os.write(w2, b"x")
        os._exit(0)
    c0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    for _ in range(trips):
        os.write(w1, b"x")
        os.read(r2, 1)
        if gap:
            end = time.perf_counter() + gap
            while time.perf_counter() < end:
                pass
    os.waitpid(pid, 0)
    t1 = time.perf_counter()
    c1 = resource.getrusage(resource.RUSAGE_SELF)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime + ch.ru_utime + ch.ru_stime
    if gap:
        child = ch.ru_utime + ch.ru_stime
        print(f"the child, idle {gap * 1000:g} ms before each wake-up: "
              f"{1e6 * child / trips:.1f} µs CPU per wake-up ({trips} wake-ups)")
        return
    print(f"round trip: {1e6 * (t1 - t0) / trips:.1f} µs wall, "
          f"{1e6 * cpu / trips:.1f} µs CPU (both processes), "
          f"{1e6 * cpu / trips / 2:.1f} µs CPU per wake-up")


if __name__ == "__main__":
    main()
