"""Scaling on emulated cores (issue 19): Shoal and RabbitMQ on K = 1, 2, 4, 8 "cores" of a
small machine, each core a CPU quota of a Linux cgroup.

Each Shoal process (router or node) runs in a cgroup of its own holding ``--quota`` CPU (0.1 by
default: one emulated core); when the layout has more processes than K cores (K = 1: one router
and one node; ``--layout``) they share one cgroup of K x quota, each still in a cgroup of its
own of one core within it (as on K real cores, where one Python thread has one core at most). Shoal runs the routers/nodes split that
``shoal serve`` chooses for K cores (``shoal.shared.settings.default_layout``). RabbitMQ's
beam.smp gets K x quota in one cgroup and K schedulers (``+S K:K``), once as shipped and once
with scheduler busy-waiting off (``+sbwt none``, how RabbitMQ is tuned for CPU-limited
containers). So the brokers, not the load generator, are the bottleneck; ``cpu.stat``'s
``nr_throttled`` shows the quota binds.

Loads (``shoal loadtest``): 16 queues, 16 producers, 16 consumers, 100 B, qos 200, as fast as
possible; once without confirms and once with confirms and persistent messages. Printed: msg/s
received in the sending window per K for each broker, Shoal's scaling efficiency
T(K) / (K T(1)), the Shoal/RabbitMQ ratio, lost and duplicate messages; raw runs in
``--out``/results.json. Needs root (cgroups) and Debian's rabbitmq-server (installed when
missing, as compare_rabbitmq.py does).

    python tests/benchmarks/scaling.py [--ks 1,2,4,8] [--quota 0.1] [--time 15] [--no-rabbitmq]
        [--layout R:N[,R:N...]] [--repeat N] [--queue-pattern NAME%d]

Queue names are new each run unless ``--queue-pattern`` fixes them: Shoal places queues by a
hash of the name (shared/placement.py), so 16 random names split over 2 nodes anywhere from
8/8 to 12/4 (or worse), and the busier node can bound the run. Each Shoal run logs its split.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from _cluster import stop_serve
from compare_rabbitmq import RabbitMQ, last_line, log, log_interpreter, window_cpu

from shoal.shared.settings import default_layout

PERIOD_US = 100_000
LOADS = {
    "no-confirm": ["--queues", "16", "--producers", "16", "--consumers", "16", "--size", "100",
                   "--qos", "200"],
    "confirm-persistent": ["--queues", "16", "--producers", "16", "--consumers", "16",
                           "--size", "100", "--qos", "200", "--confirm", "200",
                           "--persistent"],
}


# -- cgroups ----------------------------------------------------------------------------------
class CpuGroups:
    """CPU-quota cgroups under one parent folder: cgroup v1 (``cpu`` controller, as on these
    machines) or v2 (``cpu.max``). ``close`` moves every process back and removes them."""

    def __init__(self) -> None:
        v1 = Path("/sys/fs/cgroup/cpu")
        if (v1 / "cpu.cfs_quota_us").exists():
            self.root, self.v2 = v1, False
        elif Path("/sys/fs/cgroup/cgroup.controllers").exists():
            self.root, self.v2 = Path("/sys/fs/cgroup"), True
        else:
            raise SystemExit("scaling: no writable CPU cgroup controller found")
        self.parent = self.root / f"shoal-scaling-{uuid.uuid4().hex[:6]}"
        self.parent.mkdir()
        if self.v2:
            (self.parent / "cgroup.subtree_control").write_text("+cpu")
        self.groups: list[Path] = []

    def group(self, name: str, cpus: float, pids: list[int], within: Path | None = None) -> Path:
        """A cgroup holding ``cpus`` CPU (a fraction of one) with ``pids`` in it, under
        ``within`` (a group of this object's: both quotas bind) or the parent folder."""
        g = (within or self.parent) / name
        g.mkdir()
        if self.v2 and within is not None:
            (within / "cgroup.subtree_control").write_text("+cpu")
        quota = max(1000, int(cpus * PERIOD_US))
        if self.v2:
            (g / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (g / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (g / "cpu.cfs_quota_us").write_text(str(quota))
        for pid in pids:
            (g / "cgroup.procs").write_text(str(pid))
        self.groups.append(g)
        return g

    @staticmethod
    def throttled(g: Path) -> int:
        """How many periods the group was throttled in (its quota bound)."""
        for line in (g / "cpu.stat").read_text().splitlines():
            if line.startswith("nr_throttled"):
                return int(line.split()[1])
        return 0

    def release(self) -> None:
        """Move every process back to the root group and remove the groups (the groups
        within another first)."""
        for g in reversed(self.groups):
            try:
                for pid in (g / "cgroup.procs").read_text().split():
                    try:
                        (self.root / "cgroup.procs").write_text(pid)
                    except OSError:
                        pass
                g.rmdir()
            except OSError:
                pass
        self.groups = []

    def close(self) -> None:
        self.release()
        try:
            self.parent.rmdir()
        except OSError:
            pass


# -- brokers ----------------------------------------------------------------------------------
class ShoalK:
    """``shoal serve`` with the default layout for K cores, each process in its cgroup."""

    def __init__(self, k: int, quota: float, cg: CpuGroups, work: Path,
                 layout: tuple[int, int] | None = None) -> None:
        self.k, self.quota, self.cg, self.work = k, quota, cg, work
        self.routers, self.nodes = layout or default_layout(k)
        self.label = f"Shoal {self.routers}r+{self.nodes}n"
        self.proc: subprocess.Popen | None = None

    def start(self) -> list[Path]:
        data = Path(tempfile.mkdtemp(prefix="shoal-", dir=self.work))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shoal.cli", "serve", "--port", "0", "--nodes",
             str(self.nodes), "--routers", str(self.routers), "--data-dir", str(data),
             "--log-level", "warning"],
            stdout=subprocess.PIPE, stderr=open(data / "serve.log", "wb"), text=True,
            start_new_session=True)
        m = re.search(r"shoal ready: .* on \S+:(\d+) ", self.proc.stdout.readline())
        if not m:
            raise RuntimeError(f"shoal serve did not start: see {data / 'serve.log'}")
        self.url = f"amqp://guest:guest@127.0.0.1:{m.group(1)}/"
        info = json.loads((data / "cluster.json").read_text())
        self.child_pids = [r["pid"] for r in info["routers"]] + [n["pid"] for n in info["nodes"]]
        self.names = [f"router-{i}" for i in range(len(info["routers"]))] \
            + [f"node-{i}" for i in range(len(info["nodes"]))]
        if len(self.child_pids) <= self.k:      # one emulated core per process
            return [self.cg.group(f"k{self.k}-{i}", self.quota, [pid])
                    for i, pid in enumerate(self.child_pids)]
        # More processes than cores: K cores between them, and none more than one, as on K
        # real cores (a process is one Python thread: it could not have more there either)
        top = self.cg.group(f"k{self.k}-all", self.k * self.quota, [])
        return [top] + [self.cg.group(self.names[i], self.quota, [pid], within=top)
                        for i, pid in enumerate(self.child_pids)]

    def pids(self) -> list[int]:
        return self.child_pids

    def name_of(self, pid: int) -> str:
        return self.names[self.child_pids.index(pid)]

    def stop(self) -> None:
        stop_serve(self.proc)
        self.cg.release()


class RabbitK:
    """RabbitMQ restarted with K schedulers (``+S K:K``, optionally ``+sbwt none``) and
    beam.smp in one cgroup of K x quota."""

    def __init__(self, k: int, quota: float, cg: CpuGroups, sbwt_none: bool) -> None:
        self.k, self.quota, self.cg, self.sbwt_none = k, quota, cg, sbwt_none
        self.label = "RabbitMQ" + (" +sbwt none" if sbwt_none else "")
        self.url = "amqp://guest:guest@127.0.0.1:5672/"
        self.rabbit = RabbitMQ()

    def start(self) -> list[Path]:
        self.rabbit.shutdown()
        args = f"+S {self.k}:{self.k}" + (" +sbwt none +sbwtdcpu none +sbwtdio none"
                                          if self.sbwt_none else "")
        os.environ["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"] = args
        try:
            self.rabbit.ensure()
        finally:
            del os.environ["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"]
        return [self.cg.group(f"rabbit-k{self.k}", self.k * self.quota, [self.rabbit.pid])]

    def pids(self) -> list[int]:
        return [self.rabbit.pid]

    def name_of(self, pid: int) -> str:
        return "beam.smp"

    def stop(self) -> None:
        self.cg.release()


def left_in_queues(url: str, pattern: str, queues: int, settle_s: float = 3.0,
                   limit_s: float = 180.0) -> int:
    """Messages still in the load's queues (a backlog the load tool stopped draining after
    its ``DRAIN_MAX_S``: not lost, just not consumed yet), counted once the count has not
    changed for ``settle_s`` (a no-confirm load leaves publishes in the socket buffers that a
    throttled broker is still parsing when the tool exits), or after ``limit_s``."""
    import time

    import pika
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()

        def count() -> int:
            return sum(ch.queue_declare(pattern % i, passive=True).method.message_count
                       for i in range(1, queues + 1))
        last, since, deadline = count(), time.monotonic(), time.monotonic() + limit_s
        while time.monotonic() - since < settle_s and time.monotonic() < deadline:
            conn.sleep(0.5)
            now = count()
            if now != last:
                last, since = now, time.monotonic()
        return last
    finally:
        conn.close()


def queues_per_node(pattern: str, nodes: int, queues: int = 16) -> list[int]:
    """How many of the load's queues (``pattern % 1`` .. ``pattern % queues``) placement puts
    on each of ``nodes`` nodes (shared/placement.py): the busiest node bounds a run."""
    from shoal.shared.placement import owner
    ids = [f"node-{i}" for i in range(nodes)]
    split = [0] * nodes
    for i in range(1, queues + 1):
        split[ids.index(owner("/", pattern % i, ids))] += 1
    return split


def run_load(broker, load: str, time_s: float, out: Path, pattern: str = "") -> dict:
    """Start ``broker``, run one load against it, stop it. Returns the run record: the load
    tool's summary, broker CPU seconds in the sending window, throttled periods, and
    ``left`` (messages still queued at the end; ``lost`` counts them, ``lost_for_good`` not).
    ``pattern``: the queues' names (``%d`` = 1..16); "" = new random names each run, so each
    Shoal run gets its own placement over the nodes (``queues_per_node`` in the record)."""
    run_dir = out / "runs" / f"{len(list((out / 'runs').glob('*'))):02d}-k{broker.k}-" \
        f"{broker.label.replace(' ', '_').replace('+', '')}-{load}"
    groups = broker.start()
    pattern = pattern or f"scale-{uuid.uuid4().hex[:6]}-%d"
    cmd = [sys.executable, "-m", "shoal.cli", "loadtest", "--url", broker.url, "--out",
           str(run_dir), "--label", broker.label, "--time", str(time_s), "--queue-pattern",
           pattern, *LOADS[load]]
    left = None
    proc = None
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        per_pid: dict[int, float] = {}
        cpu = window_cpu(proc, run_dir, broker.pids(), time_s, per_pid)
        stdout, stderr = proc.communicate(timeout=time_s + 300)
        by_group = {g.name: CpuGroups.throttled(g) for g in groups}
        throttled = sum(by_group.values())
        if proc.returncode == 0:
            left = left_in_queues(broker.url, pattern, 16)
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(10)
        broker.stop()
    rec = {"k": broker.k, "broker": broker.label, "load": load, "rc": proc.returncode,
           "cpu_s": round(cpu, 2), "nr_throttled": throttled, "run_dir": str(run_dir),
           # Where the quota went: each process's CPU seconds in the window, and the periods
           # each cgroup was throttled in (a process at its quota is the ceiling).
           "cpu_s_by_process": {broker.name_of(pid): round(c, 2) for pid, c in per_pid.items()},
           "nr_throttled_by_group": by_group}
    if isinstance(broker, ShoalK):
        rec["queues_per_node"] = queues_per_node(pattern, broker.nodes)
    if proc.returncode == 0:
        rec.update(json.loads((run_dir / "run.json").read_text())["summary"])
        rec["left"] = left
        rec["lost_for_good"] = rec["lost"] - left
    else:
        rec["error"] = last_line(stderr)
    log(f"K={broker.k} {broker.label:<22} {load:<19} -> "
        + (f"recv {rec['receive_rate']:.0f} msg/s, sent {rec['send_rate']:.0f}, still queued "
           f"{left}, lost {rec['lost_for_good']}, dup {rec['duplicates']}, cpu {cpu:.2f} s, "
           f"throttled {throttled}; "
           + (f"queues per node {'/'.join(map(str, rec['queues_per_node']))}; "
              if "queues_per_node" in rec else "") + "by process "
           + ", ".join(f"{n} {c:.2f} s" for n, c in rec["cpu_s_by_process"].items())
           if proc.returncode == 0 else f"FAILED: {rec['error']}"))
    return rec


def _median_rate(runs: list[dict]) -> float | None:
    rates = [r["receive_rate"] for r in runs if r.get("receive_rate")]
    return statistics.median(rates) if rates else None


def table(runs: list[dict], ks: list[int], brokers: list[str]) -> str:
    """The markdown table: msg/s per K and broker (the median of the repeats), Shoal's
    efficiency and ratios, one row per Shoal layout run at that K."""
    head = ["load", "K", "Shoal layout", "runs", "Shoal msg/s", "efficiency T(K)/(K·T(1))"]
    for b in brokers:
        head += [f"{b} msg/s", f"Shoal/{b}"]
    head.append("lost/dup (all brokers)")
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for load in dict.fromkeys(r["load"] for r in runs):
        base = None
        for k in ks:
            mine = [r for r in runs if r["load"] == load and r["k"] == k]
            layouts = dict.fromkeys(r["broker"] for r in mine if r["broker"].startswith("Shoal"))
            for label in layouts or ["-"]:
                shoal = [r for r in mine if r["broker"] == label]
                t = _median_rate(shoal)
                if k == ks[0] and t and k == 1 and base is None:
                    base = t
                eff = round(t / (k * base), 2) if t and base else None
                cells = [load, str(k), label.replace("Shoal ", ""),
                         ", ".join(f"{r['receive_rate']:,.0f}" for r in shoal
                                   if r.get("receive_rate")),
                         f"{t:,.0f}" if t else "failed", str(eff) if eff is not None else "-"]
                for b in brokers:
                    rt = _median_rate([r for r in mine if r["broker"] == b])
                    cells += [f"{rt:,.0f}" if rt else "-",
                              f"{t / rt:.2f}" if t and rt else "-"]
                lost = sum(r.get("lost_for_good", 0) or 0 for r in mine)
                dup = sum(r.get("duplicates", 0) or 0 for r in mine)
                cells.append(f"{lost}/{dup}")
                rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ks", default="1,2,4,8", help="emulated core counts")
    p.add_argument("--quota", type=float, default=0.1, help="CPU of one emulated core")
    p.add_argument("--time", type=float, default=15.0, help="seconds of sending per run")
    p.add_argument("--loads", default=",".join(LOADS), help="which loads")
    p.add_argument("--no-rabbitmq", action="store_true", help="Shoal only")
    p.add_argument("--layout", default="", metavar="R:N[,R:N...]",
                   help="run Shoal with R routers and N nodes at every K instead of the "
                        "default layout; several: each in turn (to compare layouts)")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of each broker and layout per K and load, alternating; the "
                        "table gives the medians")
    p.add_argument("--out", default="", help="results folder (default: a temporary one)")
    p.add_argument("--queue-pattern", default="", metavar="NAME%%d",
                   help="the same queue names in every run (so the same placement over "
                        "Shoal's nodes, for an A/B of two trees); default: new random names "
                        "each run")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("scaling: needs root (it writes CPU cgroups)", file=sys.stderr)
        return 2
    ks = [int(k) for k in args.ks.split(",")]
    layouts: list = [tuple(int(x) for x in one.split(":")) for one in args.layout.split(",")
                     ] if args.layout else [None]
    loads = [x for x in args.loads.split(",") if x]
    bad = [x for x in loads if x not in LOADS]
    if bad:
        print(f"scaling: unknown load {bad[0]!r} (known: {', '.join(LOADS)})", file=sys.stderr)
        return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="shoal-scaling-"))
    (out / "runs").mkdir(parents=True, exist_ok=True)
    log_interpreter()
    cg = CpuGroups()
    # SIGTERM as Ctrl-C: the cgroups are removed and RabbitMQ stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs: list[dict] = []
    brokers = [] if args.no_rabbitmq else ["RabbitMQ", "RabbitMQ +sbwt none"]
    try:
        for k in ks:
            for load in loads:
                for _ in range(args.repeat):
                    for layout in layouts:
                        runs.append(run_load(ShoalK(k, args.quota, cg, out, layout), load,
                                             args.time, out, args.queue_pattern))
                    for sbwt_none in ([] if args.no_rabbitmq else [False, True]):
                        runs.append(run_load(RabbitK(k, args.quota, cg, sbwt_none), load,
                                             args.time, out, args.queue_pattern))
                    (out / "results.json").write_text(json.dumps(runs, indent=2) + "\n")
    finally:
        cg.close()
        if not args.no_rabbitmq and shutil.which("rabbitmqctl"):
            RabbitMQ().shutdown()
    text = table([r for r in runs if r["load"] in loads], ks, brokers)
    (out / "table.md").write_text(text + "\n")
    print(text)
    log(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
