"""The soak (issue 22, point 5): a cluster under steady load for a long time keeps its resident
memory and open file descriptors flat. By hand (it takes the machine for ``--minutes``):

``python -m tests.e2e.faults.soak --minutes 60 --rate 40000``

It starts ``shoal serve`` (default layout, ``--nodes``), runs ``shoal loadtest`` against it
(``--producers`` producers at ``--rate`` msg/s in all, as many consumers, 100-byte messages,
qos 200, one queue per producer, confirms), and every ``--every`` seconds records each router
and node process's VmRSS and open file descriptors (``/proc/PID/status``, ``/proc/PID/fd``)
to ``--out``/samples.csv. At the end it prints, per process and for the sum, the value at
``--warmup`` minutes, the last value and the growth between them; the run passes when every
growth is under ``--max-growth`` (5 %) and the load tool saw no errors.
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def sample(pid: int) -> tuple[int, int]:
    """(VmRSS bytes, open file descriptors) of ``pid``; (0, 0) if it is gone."""
    try:
        rss = 0
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0, 0


def growth(rows: list[dict], key: str, warmup_s: float) -> tuple[int, int, float]:
    """(value at the first sample after ``warmup_s``, last value, growth as a fraction)."""
    after = [r for r in rows if r["t"] >= warmup_s] or rows
    first, last = int(after[0][key]), int(rows[-1][key])
    return first, last, (last - first) / first if first else 0.0


def main(argv: list[str] | None = None) -> int:
    from tests.conftest import start_cluster, stop_cluster
    p = argparse.ArgumentParser(prog="python -m tests.e2e.faults.soak")
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--rate", type=int, default=40000, help="msg/s over all producers")
    p.add_argument("--producers", type=int, default=2)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    p.add_argument("--warmup", type=float, default=5.0, help="minutes before the baseline")
    p.add_argument("--max-growth", type=float, default=0.05)
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    out = Path(a.out or tempfile.mkdtemp(prefix="shoal-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    seconds = a.minutes * 60
    with tempfile.TemporaryDirectory(prefix="shoal-soak-data-") as d:
        cl = start_cluster(Path(d) / "cluster", a.nodes)
        procs = {r.id: r.pid for r in cl.routers}
        procs.update({n.id: n.pid for n in cl.nodes if n.pid})
        load = subprocess.Popen(
            [sys.executable, "-m", "shoal.cli", "loadtest", "--url", cl.url,
             "--producers", str(a.producers), "--consumers", str(a.producers),
             "--queues", str(a.producers), "--queue-pattern", "soak-%d",
             "--rate", str(a.rate // a.producers), "--time", str(int(seconds)),
             "--size", "100", "--qos", "200", "--confirm", "500", "--sample-every", "1000",
             "--out", str(out / "loadtest")],
            stdout=open(out / "loadtest.log", "w"), stderr=subprocess.STDOUT)
        rows: list[dict] = []
        t0 = time.monotonic()
        try:
            while load.poll() is None:
                row: dict = {"t": round(time.monotonic() - t0, 1)}
                for name, pid in procs.items():
                    row[f"{name}_rss"], row[f"{name}_fds"] = sample(pid)
                row["total_rss"] = sum(row[f"{n}_rss"] for n in procs)
                row["total_fds"] = sum(row[f"{n}_fds"] for n in procs)
                rows.append(row)
                time.sleep(a.every)
        finally:
            if load.poll() is None:
                load.kill()
            stop_cluster(cl, require_clean_exit=False)
    with open(out / "samples.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    summary = [ln for ln in (out / "loadtest.log").read_text().splitlines()
               if ln.startswith("summary:")]
    ok = load.returncode == 0 and bool(summary) and " lost 0," in summary[-1]
    print(summary[-1] if summary else "the load tool printed no summary")
    print(f"{len(rows)} samples over {rows[-1]['t']:.0f} s; load tool exit {load.returncode}; "
          f"results in {out}")
    for name in list(procs) + ["total"]:
        for key, unit in (("rss", "MiB"), ("fds", "")):
            first, last, g = growth(rows, f"{name}_{key}", a.warmup * 60)
            scale = 1 << 20 if key == "rss" else 1
            print(f"{name} {key}: {first / scale:.1f}{unit} at {a.warmup:g} min -> "
                  f"{last / scale:.1f}{unit} at the end ({g:+.1%})")
            ok = ok and g < a.max_growth
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
