"""What one sleep and wake-up costs on this machine: a pipe ping-pong between two processes.

    python tests/benchmarks/wakeup_cost.py            # free to run on any CPU
    taskset -c 0 python tests/benchmarks/wakeup_cost.py   # both on one CPU

Prints wall time and CPU time (both processes) per round trip; each round trip is two
wake-ups. On the 2-core VM of docs/performance.md, crossing CPUs costs about 20 µs of CPU per
wake-up, staying on one about 4.
"""
from __future__ import annotations

import os
import resource
import time

ROUND_TRIPS = 20_000


def main() -> None:
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        for _ in range(ROUND_TRIPS):
            os.read(r1, 1)
            os.write(w2, b"x")
        os._exit(0)
    c0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    for _ in range(ROUND_TRIPS):
        os.write(w1, b"x")
        os.read(r2, 1)
    os.waitpid(pid, 0)
    t1 = time.perf_counter()
    c1 = resource.getrusage(resource.RUSAGE_SELF)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime + ch.ru_utime + ch.ru_stime
    print(f"round trip: {1e6 * (t1 - t0) / ROUND_TRIPS:.1f} µs wall, "
          f"{1e6 * cpu / ROUND_TRIPS:.1f} µs CPU (both processes), "
          f"{1e6 * cpu / ROUND_TRIPS / 2:.1f} µs CPU per wake-up")


if __name__ == "__main__":
    main()
