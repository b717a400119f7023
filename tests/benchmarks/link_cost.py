"""Where the link's CPU goes (issue 20, point 1): per message and per wake-up, on each side.

    python tests/benchmarks/link_cost.py [--rate 5000] [--time 8] [--strace] [--pyspy] [--perf]

Starts ``shoal serve --nodes 2`` (the default layout: the queue on node-1, a process behind
ZeroMQ ``ipc://``), runs load 3's shape (1 producer, 1 consumer, 1 queue, 100 B, qos 200, at
``--rate`` msg/s) and prints, per process (router, node-1) and thread (the Python thread and
ZeroMQ's I/O thread ``ZMQbg/IO/0``):

1. always, with no tracer attached: user and system CPU in µs per message and voluntary
   context switches (each one is a sleep, so a wake-up) per message, from /proc/PID/task;
2. ``--strace``, a second run under ``strace -f``: system calls per message by thread and
   name (strace slows the processes, so only its counts are used);
3. ``--pyspy``, a third run under ``py-spy record``: the Python thread's busy samples by
   stage (client I/O and AMQP, routing, link send, link receive, the queue model, pyzmq calls,
   the event loop), as % of that thread's busy time and as µs per message (scaled by the
   thread's CPU from pass 1). py-spy counts a thread as busy while the kernel wakes it up in
   ``epoll_pwait``, so the C code under the event loop ("event loop, other") is over-counted;
   pass 4 gives the true split;
4. ``--perf``, a fourth run under ``perf record -e cpu-clock -g`` (the kernel's timer samples
   only a thread on a CPU): CPU in µs per message split by where it is spent, the Python
   interpreter (all of Shoal's Python), uvloop, msgpack, ZeroMQ, libc, and the kernel by
   system call (``write``, which also wakes the reader; ``read``; ``epoll_pwait``, which is
   going to sleep and being woken; other), scaled by the thread's CPU from pass 1.

Set ``SHOAL_LOCAL_LINK=unix`` to measure the same-host link. Needs ptrace permission for
passes 2 to 4 (root here); ``pip install py-spy`` for pass 3, ``apt-get install linux-perf``
for pass 4.
"""
from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _cluster import name_on, start_cluster, stop_serve
from cpu_ab import TCK, _children, _threads

#: py-spy frames (file name or function) -> stage; the first match wins, searched from the
#: leaf up, so the innermost Shoal stage gets the sample.
STAGES = [
    ("pyzmq calls", ("zmq/sugar", "zmq/backend", "socket.py:send", "socket.py:recv")),
    ("link send (batch, msgpack)", ("link.py:_flush", "link.py:_send_now", "link.py:send",
                                    "wire.py:encode_batch", "peers.py")),
    ("link receive (decode, dispatch)", ("link.py:_drain", "link.py:_handle",
                                         "wire.py:decode_batch", "server.py:_drain",
                                         "server.py:_on_frame", "server.py:_handle")),
    ("queue model (node)", ("node/queue", "node/messages", "node/shard", "node/consumer",
                            "node/entries", "node/credit", "node/journal")),
    ("deliveries to clients", ("fastpath.py", "consumers.py", "delivery", "deliver")),
    ("client I/O and AMQP (router)", ("router/frontend/client.py", "router/amqp", "router/channel",
                                      "router/broker.py", "pamqp")),
    ("event loop, other", ("",)),
]


def _stage(stack: list[str]) -> str:
    for frame in reversed(stack):
        m = re.match(r"(?:\w+\.)*(\w+) \(([^:)]*)", frame)
        key = f"{m.group(2)}:{m.group(1)}" if m else frame
        for stage, needles in STAGES[:-1]:
            if any(n in key for n in needles):
                return stage
    return STAGES[-1][0]


def _roles(launcher_pid: int) -> dict[int, str]:
    """pid -> "router" / "node-N" for the launcher's children."""
    out = {}
    for k in _children(launcher_pid):
        cmd = Path(f"/proc/{k}/cmdline").read_text().split("\0")
        if "router" in cmd:
            out[k] = "router"
        elif "--node-id" in cmd:
            out[k] = cmd[cmd.index("--node-id") + 1]
        else:
            out[k] = next((a for a in cmd if a.startswith("node-")), "node")
    return out


def _run(rate: int, time_s: float, tracer=None) -> dict:
    """One cluster and one load run; ``tracer(pids, seconds) -> Popen`` runs beside the load.
    Returns received count, per-thread CPU rows and the tracer's output folder."""
    d = tempfile.mkdtemp(prefix="shoal-linkcost-")
    proc, port = start_cluster(d, 2)
    try:
        roles = _roles(proc.pid)
        pids = [p for p, r in roles.items() if r in ("router", "node-1")]
        queue = name_on("node-1", 2, "lc-{}")
        load = subprocess.Popen(
            [sys.executable, "-m", "shoal.cli", "loadtest", "--url",
             f"amqp://guest:guest@127.0.0.1:{port}/", "--producers", "1", "--consumers", "1",
             "--queues", "1", "--queue-pattern", queue, "--size", "100", "--rate", str(rate),
             "--time", str(time_s), "--qos", "200", "--out", d + "/lt"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(2.0)                      # connections up and the rate reached
        before = {p: _threads(p) for p in pids}
        t0 = time.monotonic()
        tr = tracer(pids, max(1.0, time_s - 4.0), d) if tracer else None
        if tr is not None:
            tr.wait()
        else:
            time.sleep(max(1.0, time_s - 4.0))
        after = {p: _threads(p) for p in pids}
        window = time.monotonic() - t0
        names = {tid: (roles[p], name) for p in pids for (tid, name) in after[p]}
        out, _ = load.communicate(timeout=time_s + 120)
    finally:
        stop_serve(proc)
    summary = next((ln for ln in out.splitlines() if ln.startswith("summary")), "")
    m = re.search(r"\((\d+) msg/s\)", summary)
    msgs = (int(m.group(1)) if m else rate) * window
    rows = []
    for p in pids:
        for (tid, name), (u1, s1, z1) in after[p].items():
            u0, s0, z0 = before[p].get((tid, name), (0, 0, 0))
            rows.append((roles[p], name, tid, (u1 - u0) / TCK * 1e6 / msgs,
                         (s1 - s0) / TCK * 1e6 / msgs, (z1 - z0) / msgs))
    return {"msgs": msgs, "rows": rows, "dir": d, "roles": roles, "summary": summary,
            "names": names}


def _strace(pids, secs, d):
    args = ["timeout", "-s", "INT", str(secs), "strace", "-f", "-qq", "-o", f"{d}/strace"]
    for p in pids:
        args += ["-p", str(p)]
    return subprocess.Popen(args, stderr=subprocess.DEVNULL)


def _pyspy(pids, secs, d):
    procs = [subprocess.Popen(["py-spy", "record", "--pid", str(p), "--duration",
                               str(int(secs)), "--rate", "250", "--format", "raw",
                               "--output", f"{d}/spy-{p}.txt", "--nonblocking"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for p in pids]

    class Both:
        def wait(self):
            for pr in procs:
                pr.wait()
    return Both()


def _perf(pids, secs, d):
    return subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", "1999", "-g",
                             "-o", f"{d}/perf.data", "-p", ",".join(map(str, pids)), "--",
                             "sleep", str(secs)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


#: native library (a substring of the sampled code's file) -> where the CPU went
LIBRARIES = [("libpython", "Python interpreter (Shoal's Python)"), ("uvloop", "uvloop"),
             ("msgpack", "msgpack"), ("zmq", "ZeroMQ"), ("libc.so", "libc (malloc, copies)")]
#: system call name prefixes (of the innermost user-space frame, libc's ``__GI___libc_``
#: and ``__libc_`` prefixes removed) -> kernel stage
SYSCALLS = [(("write", "send"), "kernel: write/send (wakes the reader)"),
            (("read", "recv"), "kernel: read/recv"),
            (("epoll", "poll"), "kernel: epoll_pwait (sleep, wake-up)")]


def _where(frames: list[tuple[str, str]]) -> str:
    """One perf sample's call chain, leaf first, as (symbol, object) -> its stage."""
    dso = frames[0][1]
    if "kernel" not in dso:
        return next((stage for lib, stage in LIBRARIES if lib in dso), "other native code")
    user = next((s for s, o in frames if "kernel" not in o), None)
    if user is None:
        return "kernel: other (interrupts, timers)"
    call = re.sub(r"^_*(?:GI_+)?(?:libc_)?", "", user)
    return next((stage for names, stage in SYSCALLS if call.startswith(names)),
                "kernel: other system calls")


def perf_stages(perf_data: Path) -> collections.Counter:
    """(tid, stage) -> samples, from ``perf script`` over a ``perf record -g`` file."""
    out = subprocess.run(["perf", "script", "-i", str(perf_data), "-F", "tid,ip,sym,dso"],
                         capture_output=True, text=True, check=True).stdout
    counts: collections.Counter = collections.Counter()
    for block in out.split("\n\n"):
        lines = block.strip().splitlines()
        if len(lines) < 2:
            continue
        frames = []
        for ln in lines[1:]:
            m = re.match(r"\s*[0-9a-f]+ (.*) \((.*)\)$", ln)
            if m:
                frames.append((m.group(1), m.group(2)))
        if frames:
            counts[(lines[0].split()[0], _where(frames))] += 1
    return counts


def _traced(tool: str, hint: str, a: argparse.Namespace, tracer) -> dict | None:
    """One run under ``tracer``, or None (and how to install it) when ``tool`` is missing."""
    if not shutil.which(tool):
        print(f"{tool} not found: {hint}", file=sys.stderr)
        return None
    return _run(a.rate, a.time, tracer)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=int, default=5000)
    p.add_argument("--time", type=float, default=8.0)
    p.add_argument("--strace", action="store_true")
    p.add_argument("--pyspy", action="store_true")
    p.add_argument("--perf", action="store_true")
    a = p.parse_args()
    clean = _run(a.rate, a.time)
    print(f"## {a.rate} msg/s, {clean['msgs']:.0f} messages in the window\n")
    print("| process | thread | user µs/msg | sys µs/msg | wake-ups/msg |")
    print("|---|---|---|---|---|")
    cpu = {}
    for role, name, _tid, u, s, z in sorted(clean["rows"]):
        if u + s + z >= 0.05:
            print(f"| {role} | {name} | {u:.1f} | {s:.1f} | {z:.2f} |")
            cpu[(role, name)] = cpu.get((role, name), 0.0) + u + s
    print(f"| all | | | total {sum(cpu.values()):.1f} µs/msg | |\n")
    if a.strace:
        r = _traced("strace", "apt-get install strace", a, _strace)
        if r is None:
            return 2
        names = r["names"]
        counts: collections.Counter = collections.Counter()
        for line in Path(r["dir"], "strace").read_text(errors="replace").splitlines():
            m = re.match(r"(\d+)\s+(\w+)\(", line)
            if m:
                counts[(m.group(1), m.group(2))] += 1
        print("| process | thread | system call | calls/msg |\n|---|---|---|---|")
        for (tid, call), n in sorted(counts.items(), key=lambda kv: (names.get(kv[0], ("?",)),
                                                                      -kv[1])):
            if n / r["msgs"] >= 0.05:
                role, name = names.get(tid, ("?", tid))
                print(f"| {role} | {name} | {call} | {n / r['msgs']:.2f} |")
        print()
    if a.pyspy:
        r = _traced("py-spy", "pip install py-spy", a, _pyspy)
        if r is None:
            return 2
        print("| process | stage | % of busy Python samples | µs/msg |\n|---|---|---|---|")
        for pid, role in sorted(r["roles"].items(), key=lambda kv: kv[1]):
            f = Path(r["dir"], f"spy-{pid}.txt")
            if not f.exists():
                continue
            stages: collections.Counter = collections.Counter()
            for line in f.read_text().splitlines():
                stack, _, n = line.rpartition(" ")
                stages[_stage(stack.split(";"))] += int(n)
            total = sum(stages.values()) or 1
            py_cpu = max((v for (ro, nm), v in cpu.items()
                          if ro == role and not nm.startswith("ZMQ")), default=0.0)
            for stage, n in stages.most_common():
                print(f"| {role} | {stage} | {100 * n / total:.0f} % | "
                      f"{py_cpu * n / total:.1f} |")
        print()
    if a.perf:
        r = _traced("perf", "apt-get install linux-perf", a, _perf)
        if r is None:
            return 2
        counts = perf_stages(Path(r["dir"], "perf.data"))
        per_thread: collections.Counter = collections.Counter()
        for (tid, _stage_), n in counts.items():
            per_thread[tid] += n
        print("| process | thread | where | % of the thread's CPU | µs/msg |\n|---|---|---|---|---|")
        rows = []
        for (tid, stage), n in counts.items():
            role, name = r["names"].get(tid, ("?", tid))
            share = n / per_thread[tid]
            rows.append((role, name, -share, stage, cpu.get((role, name), 0.0) * share))
        for role, name, neg, stage, us in sorted(rows):
            if -neg >= 0.01:
                print(f"| {role} | {name} | {stage} | {-100 * neg:.0f} % | {us:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
