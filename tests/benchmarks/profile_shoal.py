"""Profile Shoal's router and the node owning the queue under load 1 with py-spy.

    python tests/benchmarks/profile_shoal.py --rate 4000 [--shape B] [--duration 15] [--out DIR]

Starts ``shoal serve --port 5673 --nodes 2``, runs ``shoal loadtest`` (load 1: 1 queue,
100 B, 1 producer, 1 consumer, qos 200; or ``--shape`` A, B or C of matrix.py, the
single-queue shapes) at ``--rate`` msg/s in all, records the router and the owning node with
``py-spy record --format raw`` (collapsed stacks) for ``--duration`` seconds, and prints per
process the CPU of each of its threads over that window (µs per message: the event loop,
ZeroMQ's I/O thread, the journal's writer) and the top functions by self time and by
inclusive time (% of samples).
``pip install py-spy`` first; py-spy needs ptrace permission (root, or
``kernel.yama.ptrace_scope=0``).
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

IDLE_LEAVES = ("epoll_wait", "epoll_pwait", "poll", "select", "nanosleep", "futex")
BORING = ("runpy", "runners.py", "__main__.py", "cli.py", "threading.py", "core.c", "loop.c",
          "object.h", "libc.so", "queue.h")


def _name(frame: str) -> str:
    """``func (path/file.py:12)`` -> ``func (file.py)``."""
    if " (" not in frame:
        return frame
    func, where = frame.split(" (", 1)
    return f"{func} ({where.split(':')[0].rsplit('/', 1)[-1].rstrip(')')})"


def top(collapsed: Path, n: int = 15) -> str:
    """Self and inclusive % per function from a py-spy raw (collapsed) file, over the busy
    samples only (a leaf blocked in epoll/poll is idle time: with ``--native`` py-spy samples
    it too)."""
    self_c, incl_c, total, idle = Counter(), Counter(), 0, 0
    # split on newlines only: py-spy may name a frame with bytes that splitlines() also
    # splits on (seen: a frame named "\x06 (" after \x1c)
    for line in collapsed.read_text().split("\n"):
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        frames = [_name(f) for f in stack.split(";")]
        if frames[-1].split(" (")[0] in IDLE_LEAVES:
            idle += k
            continue
        total += k
        self_c[frames[-1]] += k
        for f in set(frames):
            if not any(b in f for b in BORING):
                incl_c[f] += k
    if not total:
        return "  (no busy samples)"
    out = [f"  {total} busy samples ({idle} idle samples left out); self time:"]
    out += [f"    {100 * c / total:5.1f}%  {f}" for f, c in self_c.most_common(n)]
    out.append("  inclusive time:")
    out += [f"    {100 * c / total:5.1f}%  {f}" for f, c in incl_c.most_common(2 * n)]
    return "\n".join(out)


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Each thread of ``pid``: its name and CPU seconds so far (utime+stime)."""
    import os
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            out[int(task.name)] = (comm, (int(fields[11]) + int(fields[12])) / ticks)
        except (OSError, ValueError, IndexError):
            pass
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=int, default=4000, help="msg/s, all producers together")
    p.add_argument("--shape", choices=["A", "B", "C"], default="",
                   help="a single-queue shape of matrix.py instead of load 1")
    p.add_argument("--duration", type=int, default=15)
    p.add_argument("--sample-rate", type=int, default=100, help="py-spy samples per second")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--port", type=int, default=5673)
    p.add_argument("--embed-node", action="store_true",
                   help="serve --embed-node, queue on node-0: one profile of router+node-0")
    p.add_argument("--out", default="")
    p.add_argument("--native", action="store_true",
                   help="include C frames (uvloop, pyzmq, libzmq); pauses the process to sample")
    p.add_argument("--shoal-src", default="",
                   help="run Shoal from this source tree (see compare_rabbitmq.py)")
    args = p.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="shoal-profile-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(Path(__file__).parent))
    from compare_rabbitmq import shoal_env
    env = shoal_env(args.shoal_src, out) if args.shoal_src else None
    data = out / "cluster"
    serve = subprocess.Popen([sys.executable, "-m", "shoal.cli", "serve", "--port",
                              str(args.port), "--nodes", str(args.nodes), "--data-dir",
                              str(data), "--log-level", "warning",
                              *(["--embed-node"] if args.embed_node else [])],
                             stdout=subprocess.PIPE, text=True, start_new_session=True,
                             env=env)
    try:
        for line in serve.stdout:
            if "shoal ready" in line:
                break
        info = json.loads((data / "cluster.json").read_text())
        from shoal.shared.placement import owner
        ids = [n["id"] for n in info["nodes"]]
        queue = f"profile-{int(time.time())}"
        if args.embed_node:       # a queue on node-0, in the router process
            from _cluster import name_on
            queue = name_on("node-0", len(ids), queue + "-{}")
        node_id = owner("/", queue, ids)
        node_pid = next(n["pid"] for n in info["nodes"] if n["id"] == node_id)
        pids = {"router": info["router"]["pid"]}
        if node_pid == pids["router"]:
            pids = {f"router+{node_id}": node_pid}
        else:
            pids[node_id] = node_pid
        shape, producers = ["--qos", "200", "--size", "100"], 1
        if args.shape:
            from matrix import SHAPES
            _, shape, producers = SHAPES[args.shape]
        load = subprocess.Popen(
            [sys.executable, "-m", "shoal.cli", "loadtest", "--url",
             f"amqp://guest:guest@127.0.0.1:{args.port}/", "--queue-pattern", queue,
             "--rate", str(max(1, args.rate // producers)), "--time",
             str(args.duration + 6), *shape, "--out", str(out / "run"), "--nodes",
             str(args.nodes)],
            stdout=open(out / "loadtest.log", "w"), stderr=subprocess.STDOUT)
        time.sleep(4)
        before = {name: thread_cpu(pid) for name, pid in pids.items()}
        t0 = time.monotonic()
        spies = {name: subprocess.Popen(
            ["py-spy", "record", "--pid", str(pid), "--duration", str(args.duration),
             "--format", "raw", "--output", str(out / f"{name}.txt"),
             "--rate", str(args.sample_rate),
             "--native" if args.native else "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for name, pid in pids.items()}
        for s in spies.values():
            s.wait()
        window = time.monotonic() - t0
        after = {name: thread_cpu(pid) for name, pid in pids.items()}
        load.wait(args.duration + 120)
        print((out / "loadtest.log").read_text().strip().splitlines()[-2])
        print(f"CPU of the sampled processes: see /proc; sampling at {args.sample_rate} Hz")
        for name in spies:
            print(f"== {name} (pid {pids[name]})")
            for tid, (comm, cpu) in after[name].items():
                used = cpu - before[name].get(tid, (comm, 0.0))[1]
                if used > 0:
                    print(f"  thread {comm:<14} {used * 1e6 / (args.rate * window):7.1f} "
                          f"µs/msg")
            print(top(out / f"{name}.txt"))
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(30)
    print(f"profiles in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
