"""Run the Raft simulator (sim.py) over many seeds, or replay one seed's trace.

    python3 tests/node/replication/raft_sim.py --schedules 100000 [--start SEED] [--jobs 1]
    python3 tests/node/replication/raft_sim.py --replay SEED [--variant NAME]

Each seed is one schedule (a cluster of 3 or 5 members, faults, then a quiet phase that must
end with a leader, a committed final proposal and a repaired membership). The run prints its
progress and ends with ``N schedules, V violations, S steps, T s``; it exits 1 on any violation
(each violating seed is printed with the invariant and the command that replays it).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sim  # noqa: E402  (this folder, imported by path so the script runs from anywhere)


def run_range(start: int, count: int, variant: str | None = None,
              progress: bool = False) -> tuple[int, list[sim.Violation], Counter]:
    """Seeds ``start .. start + count - 1``: (steps, violations, statistics)."""
    steps, violations, stats = 0, [], Counter()
    t0 = time.monotonic()
    for k, seed in enumerate(range(start, start + count), 1):
        try:
            st = sim.Sim(seed, variant=variant).run()
            steps += st["steps"]
            stats.update(st)
        except sim.Violation as v:
            steps += v.step
            violations.append(v)
            if progress:
                print(f"VIOLATION {v}", flush=True)
        if progress and (k % 5000 == 0 or k == count):
            print(f"{k} schedules, {len(violations)} violations, {steps} steps, "
                  f"{time.monotonic() - t0:.1f} s", flush=True)
    return steps, violations, stats


def _job(args: tuple) -> tuple[int, list[tuple], Counter]:
    start, count, variant = args
    steps, violations, stats = run_range(start, count, variant)
    return steps, [(v.seed, v.step, v.invariant, v.details) for v in violations], stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--schedules", type=int, default=1000)
    p.add_argument("--start", type=int, default=0, help="the first seed")
    p.add_argument("--jobs", type=int, default=1, help="processes (seeds split in chunks)")
    p.add_argument("--replay", type=int, metavar="SEED", help="print SEED's full trace")
    p.add_argument("--variant", choices=sim.VARIANTS,
                   help="a deliberately unsafe host (the checker must catch it)")
    a = p.parse_args(argv)
    if a.replay is not None:
        trace, v = sim.trace_of(a.replay, variant=a.variant)
        print("\n".join(trace))
        return 1 if v else 0
    t0 = time.monotonic()
    if a.jobs <= 1:
        steps, violations, stats = run_range(a.start, a.schedules, a.variant, progress=True)
        found = [(v.seed, v.step, v.invariant, v.details) for v in violations]
    else:
        from multiprocessing import Pool
        chunk = 1000
        parts = [(s, min(chunk, a.start + a.schedules - s), a.variant)
                 for s in range(a.start, a.start + a.schedules, chunk)]
        steps, found, stats = 0, [], Counter()
        with Pool(a.jobs) as pool:
            for k, (st, vs, sts) in enumerate(pool.imap(_job, parts), 1):
                steps += st
                found += vs
                stats.update(sts)
                for v in vs:
                    print(f"VIOLATION {sim.Violation(*v)}", flush=True)
                print(f"{sum(x[1] for x in parts[:k])} schedules, {len(found)} violations, "
                      f"{steps} steps, {time.monotonic() - t0:.1f} s", flush=True)
    elapsed = time.monotonic() - t0
    print("passing schedules: " + ", ".join(f"{k} {v}" for k, v in sorted(stats.items())))
    if found:
        by = Counter(v[2] for v in found)
        print("violations by invariant: " + ", ".join(f"{k} {n}" for k, n in by.items()))
        print("violating seeds: " + " ".join(str(v[0]) for v in found[:50]))
    print(f"{a.schedules} schedules, {len(found)} violations, {steps} steps, {elapsed:.1f} s")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
