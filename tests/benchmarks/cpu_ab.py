"""Same-run A/B of broker CPU per message: a baseline Shoal tree against the installed one.

    git archive <base-commit> | tar -x -C /tmp/base
    python tests/benchmarks/cpu_ab.py --base /tmp/base [--rate 5000] [--time 6] [--runs 6]
    python tests/benchmarks/cpu_ab.py --threads          # one run, CPU per thread
    python tests/benchmarks/cpu_ab.py --base-local-link zmq --local-link unix  # the two links

Each run starts ``shoal serve --nodes 2`` (from ``--base`` or the installed Shoal), runs
``shoal loadtest`` (1 producer, 1 consumer, 1 queue, 100 B, qos 200) at ``--rate`` and reads
utime+stime of the router and node processes from /proc around it (the base tree gets a
``shoal/`` folder of symlinks so that ``shoal.*`` imports resolve to it). Runs alternate (ABBA...) so
both sides see the same machine; it prints every run, the medians and their ratio. Extra
``shoal loadtest`` flags can follow ``--``. ``--threads`` prints, per thread, user and system
µs per message and voluntary sleeps per message (/proc/PID/task/TID). ``--local-link`` and
``--base-local-link`` pass ``serve --local-link`` to each side; with ``--base-local-link`` and
no ``--base`` both sides run the installed Shoal (an A/B of the two same-host links).
``--base-python PATH`` runs the base side's broker on another interpreter (a venv of it with
Shoal installed, ``pip install -e .``; without ``--base`` the installed tree): an A/B of two
builds of Python, such as Debian's ``/usr/bin/python3`` against pyenv's. The load tool runs on
this script's interpreter on both sides.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _cluster import cli_module, name_on

TCK = os.sysconf("SC_CLK_TCK")


def _threads(pid: int) -> dict[tuple[str, str], tuple[int, int, int]]:
    out = {}
    for t in glob.glob(f"/proc/{pid}/task/*"):
        try:
            raw = Path(t, "stat").read_text()
            status = Path(t, "status").read_text()
        except OSError:
            continue
        name = raw.split("(", 1)[1].rsplit(")", 1)[0]
        f = raw.rsplit(")", 1)[1].split()
        sleeps = int(re.search(r"voluntary_ctxt_switches:\s+(\d+)", status).group(1))
        out[(t.rsplit("/", 1)[1], name)] = (int(f[11]), int(f[12]), sleeps)
    return out


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def run_once(base: str | None, rate: int, time_s: int, extra: list[str],
             embed: bool = False, local_link: str = "", python: str = "") -> dict:
    """One cluster + load run; returns cpu_us (per message), p50/p99 (ms), per-thread rows.
    ``embed``: ``serve --embed-node`` with the queue on node-0 (in the router process);
    ``local_link``: ``serve --local-link`` (zmq, unix; "" = serve's default); ``python``:
    the broker's interpreter ("" = this one)."""
    code = f"import sys; from {cli_module(base)} import main; sys.exit(main())"
    if base:
        code = f"import sys; sys.path.insert(0, {base!r}); " + code
    d = tempfile.mkdtemp(prefix="shoal-ab-")
    proc = subprocess.Popen([python or sys.executable, "-c", code, "serve", "--port", "0",
                             "--nodes", "2", "--data-dir", d, "--log-level", "warning",
                             *(["--embed-node"] if embed else []),
                             *(["--local-link", local_link] if local_link else [])],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=base or d)
    try:
        m = re.search(r":(\d+) \(", proc.stdout.readline())
        if not m:
            raise SystemExit("cluster did not start")
        kids = _children(proc.pid)
        names = {k: " ".join(Path(f"/proc/{k}/cmdline").read_text().split("\0")[2:5])
                 for k in kids}
        before = {k: _threads(k) for k in kids}
        out = subprocess.run(
            [sys.executable, "-m", "shoal.cli", "loadtest",
             "--url", f"amqp://guest:guest@127.0.0.1:{m.group(1)}/", "--producers", "1",
             "--consumers", "1", "--queues", "1", "--size", "100", "--rate", str(rate),
             "--time", str(time_s), "--qos", "200", "--out", d + "/lt",
             *(["--queue-pattern", name_on("node-0", 2, "ab-{}")] if embed else []), *extra],
            capture_output=True, text=True, cwd=d).stdout
        after = {k: _threads(k) for k in kids}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    summary = next(line for line in out.splitlines() if line.startswith("summary"))
    received = int(re.search(r"(\d+) in all", summary).group(1))
    if not received:        # no consumer (--consumers 0): per message confirmed
        received = int(re.search(r"confirmed (\d+)", summary).group(1))
    lat = re.search(r"p50/p95/p99/max ([\d.]+)/([\d.]+)/([\d.]+)", summary)
    p50, _, p99 = lat.groups() if lat else ("nan", "nan", "nan")
    rows, total = [], 0.0
    for k in kids:
        for tid, (u1, s1, z1) in after[k].items():
            u0, s0, z0 = before[k].get(tid, (0, 0, 0))
            u, s = (u1 - u0) / TCK * 1e6 / received, (s1 - s0) / TCK * 1e6 / received
            total += u + s
            rows.append((names[k], tid[1], u, s, (z1 - z0) / received))
    return {"cpu_us": total, "p50": float(p50), "p99": float(p99), "threads": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", help="baseline source tree (with node/, router/, shared/)")
    p.add_argument("--rate", type=int, default=5000)
    p.add_argument("--time", type=int, default=6)
    p.add_argument("--runs", type=int, default=6, help="runs per side")
    p.add_argument("--threads", action="store_true", help="one run, CPU per thread")
    p.add_argument("--embed-node", action="store_true",
                   help="serve --embed-node, the queue on node-0 (inside the router)")
    p.add_argument("--local-link", choices=["zmq", "unix"], default="",
                   help="serve --local-link of the installed side (and of --threads)")
    p.add_argument("--base-local-link", choices=["zmq", "unix"], default="",
                   help="serve --local-link of the base side (without --base: the installed "
                        "tree, so that the two links are compared)")
    p.add_argument("--base-python", default="",
                   help="the base side's broker runs on this interpreter (Shoal installed in "
                        "it; without --base, the installed tree on both sides)")
    p.add_argument("extra", nargs="*", help="more shoal loadtest flags (after --)")
    a = p.parse_args()
    if a.threads:
        r = run_once(None, a.rate, a.time, a.extra, a.embed_node, a.local_link)
        for proc, thread, u, s, z in r["threads"]:
            if u + s >= 0.5:
                print(f"{proc[:40]:40} {thread:14} user {u:6.1f} sys {s:6.1f} µs/msg, "
                      f"{z:.2f} sleeps/msg")
        print(f"total {r['cpu_us']:.1f} µs/msg, p50 {r['p50']} ms, p99 {r['p99']} ms")
        return
    if not a.base and not a.base_local_link and not a.base_python:
        p.error("--base is required (or --base-local-link, --base-python, or --threads)")
    base = str(Path(a.base).resolve()) if a.base else None
    if base:
        shim = Path(base, "shoal")
        shim.mkdir(exist_ok=True)
        for sub in ("node", "router", "shared", "cli", "deploy", "pipeline"):
            if Path(base, sub).is_dir() and not (shim / sub).exists():
                (shim / sub).symlink_to(Path(base, sub))
    res: dict[str, list[dict]] = {"base": [], "installed": []}
    links = {"base": a.base_local_link, "installed": a.local_link}
    pythons = {"base": a.base_python, "installed": ""}
    for i in range(a.runs):
        order = (("base", base), ("installed", None))
        for label, src in order if i % 2 == 0 else order[::-1]:
            r = run_once(src, a.rate, a.time, a.extra, a.embed_node, links[label],
                         pythons[label])
            res[label].append(r)
            print(f"{label:9} {r['cpu_us']:6.1f} µs/msg  p50 {r['p50']} ms  p99 {r['p99']} ms",
                  flush=True)
    med = {k: statistics.median(r["cpu_us"] for r in v) for k, v in res.items()}
    for k, v in res.items():
        print(f"{k:9} median {med[k]:6.1f} µs/msg, median p99 "
              f"{statistics.median(r['p99'] for r in v)} ms")
    print(f"installed/base CPU per message: {med['installed'] / med['base']:.3f}")


if __name__ == "__main__":
    main()
