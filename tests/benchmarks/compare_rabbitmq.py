"""Side-by-side benchmark of Shoal and RabbitMQ with ``shoal loadtest`` (issue 6).

    python tests/benchmarks/compare_rabbitmq.py [--quick] [--nodes 2] [--out DIR]

Installs Debian's ``rabbitmq-server`` when missing (``apt-get update``, then
``apt-get install``), starts it (``rabbitmq-server -detached``; ``rabbitmqctl await_startup``)
on 5672, starts a fresh Shoal cluster (``shoal serve --port 5673``) for every Shoal run, runs
the same loads against both brokers alternately, prints a table of Shoal/RabbitMQ ratios and
writes ``DIR/results.json`` and ``DIR/table.md`` (every run folder stays under ``DIR/runs``).
RabbitMQ is stopped at the end (``rabbitmqctl stop``) so that 5672 is free again.

Loads (issue 6): 1. highest sustainable rate (received >= 99% of sent during the sending window
and p99 <= 50 ms, where p99 is the median over the seconds of each second's p99: see
``median_second_p99``), 1 queue, 100 B, 1 producer, 1 consumer, qos 200, no confirms: found by
doubling then bisecting ``--rate``; 2. needs durability (printed as pending); 3. broker CPU time
per message (utime+stime of every Shoal process from /proc, vs RabbitMQ's beam.smp) and
4. consumer latency p50/p99, both from the same runs at 5,000 msg/s (``--repeat`` runs per
broker, alternating, the best kept; load 3 is also shown pair by pair: the CPU ratio of each
Shoal run and the RabbitMQ run after it, their median and how many are <= 1.0); 5. 8 queues,
4 producers, 4 consumers, no rate limit, ``--confirm 500`` (the confirm window is the flow
control), with Shoal on 1, 2 and 4 node processes.

``--load1-runs N`` runs each step of load 1's search up to N times per broker (a fresh broker
each time) and counts the step as passed when most runs pass: near either broker's limit a
single 10-second run is close to a coin flip.

``--embed-node`` runs every Shoal with ``shoal serve --embed-node`` and puts the queue of loads
1-4 on node-0, the node inside the router (``--queue-node`` picks another node).
``--local-link unix`` runs every Shoal with ``shoal serve --local-link unix`` (the same-host
link without ZeroMQ's I/O threads; the queue still on a node process).

Not collected by pytest (no ``test_`` prefix): a benchmark asserts no speed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _cluster import PACKAGES, cli_module, cpu_seconds, port_open, rss_bytes, stop_serve
from compare_table import FIXED_RATE, best_of, paired, render

RABBIT_URL = "amqp://guest:guest@127.0.0.1:5672/"
SUSTAINABLE_RATIO = 0.99
SUSTAINABLE_P99_MS = 50.0


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def last_line(stderr: str) -> str:
    """The last line a failed command wrote to stderr (its error, as a rule), or ``?``."""
    return (stderr.strip().splitlines() or ["?"])[-1]


def install_rabbitmq() -> None:
    """Install Debian's ``rabbitmq-server`` (``apt-get update``, then ``apt-get install``: a
    fresh machine has no package lists yet). Raises SystemExit with a message when that cannot
    work here (no apt-get, not root) or apt-get fails."""
    if not shutil.which("apt-get"):
        raise SystemExit("compare_rabbitmq: rabbitmq-server is not installed and there is no "
                         "apt-get to install it: install RabbitMQ first")
    if os.geteuid() != 0:
        raise SystemExit("compare_rabbitmq: rabbitmq-server is not installed; run as root to "
                         "install it with apt-get, or install it first")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in (["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", "rabbitmq-server"]):
        log(" ".join(step))
        r = subprocess.run(step, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True, check=False)
        if r.returncode:
            raise SystemExit(f"compare_rabbitmq: {' '.join(step)} failed: "
                             f"{last_line(r.stderr)}")


# -- brokers ------------------------------------------------------------------------------
#: open files RabbitMQ may use (its soft limit; the hard limit must allow it)
NOFILE = 20000


class RabbitMQ:
    label = "RabbitMQ"
    url = RABBIT_URL
    nodes = None

    def ensure(self) -> None:
        if not shutil.which("rabbitmq-server"):
            install_rabbitmq()
        if not port_open(5672):
            log("starting RabbitMQ")
            # with the open-files limit raised: at the soft 1,024 RabbitMQ takes at most 832
            # sockets and leaves more connections without connection.start (matrix.py shape
            # G: 1,000), as an operator raises it for such a load. Debian's wrapper starts it
            # through su, whose PAM limits reset what a parent sets; its environment file is
            # sourced as shell by the server's own script, and su keeps the environment.
            env_file = Path(tempfile.mkdtemp(prefix="rabbitmq-env-")) / "rabbitmq-env.conf"
            env_file.write_text(f"ulimit -n {NOFILE} 2>/dev/null || true\n")
            env_file.parent.chmod(0o755)
            env_file.chmod(0o644)
            subprocess.run(["rabbitmq-server", "-detached"], check=True,
                           env={**os.environ, "RABBITMQ_CONF_ENV_FILE": str(env_file)})
        # right after -detached the node is not registered yet: await_startup then fails
        deadline = time.monotonic() + 180
        while subprocess.run(["rabbitmqctl", "await_startup", "--timeout", "120"], check=False,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode:
            if time.monotonic() > deadline:
                raise RuntimeError("RabbitMQ did not start (see /var/log/rabbitmq)")
            time.sleep(2)
        out = subprocess.run(["rabbitmqctl", "eval", "list_to_integer(os:getpid())."],
                             check=True, capture_output=True, text=True).stdout
        self.pid = int(out.strip().splitlines()[-1])
        log(f"RabbitMQ ready (beam.smp pid {self.pid})")

    def pids(self) -> list[int]:
        return [self.pid]

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def shutdown(self) -> None:
        if not shutil.which("rabbitmqctl"):    # never installed: nothing to stop
            return
        subprocess.run(["rabbitmqctl", "stop"], check=False, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        log("RabbitMQ stopped")


class Shoal:
    """A fresh ``shoal serve`` per run (a run that overloads it does not spoil the next)."""

    def __init__(self, port: int, nodes: int, work: Path, env: dict | None = None,
                 embed: bool = False, queue_node: str = "", local_link: str = "") -> None:
        self.port, self.nodes_n, self.work = port, nodes, work
        self.local_link = local_link
        self.env = env
        #: the shoal command of the tree under test (env's PYTHONPATH shim, see shoal_env)
        self.cli = cli_module(Path(env["PYTHONPATH"]) / "shoal") if env else "shoal.cli"
        self.embed = embed
        #: single-queue loads put their queue on this node ("" = wherever its name hashes)
        self.queue_node = queue_node
        self.label = f"Shoal ({nodes} nodes)"
        self.url = f"amqp://guest:guest@127.0.0.1:{port}/"
        self.nodes = nodes
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        data = Path(tempfile.mkdtemp(prefix="shoal-", dir=self.work))
        self.data = data
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.cli, "serve", "--port", str(self.port),
             "--nodes", str(self.nodes_n), "--data-dir", str(data), "--log-level", "warning",
             *(["--embed-node"] if self.embed else []),
             *(["--local-link", self.local_link] if self.local_link else [])],
            stdout=subprocess.PIPE, stderr=open(data / "serve.log", "wb"), text=True,
            start_new_session=True, env=self.env)
        deadline = time.monotonic() + 60
        for line in self.proc.stdout:
            if "shoal ready" in line:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("shoal serve did not get ready")
        else:
            raise RuntimeError(f"shoal serve exited: see {data / 'serve.log'}")
        info = json.loads((data / "cluster.json").read_text())
        # An embedded node-0 shares the router's pid: count each process once.
        self.child_pids = list(dict.fromkeys([info["router"]["pid"]]
                                             + [n["pid"] for n in info["nodes"]]))

    def pids(self) -> list[int]:
        return [self.proc.pid, *self.child_pids]

    def stop(self) -> None:
        stop_serve(self.proc)
        self.proc = None


def window_cpu(proc: subprocess.Popen, run_dir: Path, pids: list[int], time_s: float,
               per_pid: dict[int, float] | None = None) -> float:
    """Broker CPU seconds during the sending window only: from ``start_ns`` (run.json is
    written when every worker is connected) to ``start_ns + time_s``. ``per_pid``, when
    given, is filled with each process's own seconds over the same window."""
    deadline = time.monotonic() + 90
    start_ns = None
    while start_ns is None and proc.poll() is None and time.monotonic() < deadline:
        try:
            start_ns = json.loads((run_dir / "run.json").read_text())["start_ns"]
        except (OSError, ValueError, KeyError):
            time.sleep(0.02)
    if start_ns is None:
        return 0.0
    time.sleep(max(0.0, (start_ns - time.time_ns()) / 1e9))
    each0 = {pid: cpu_seconds([pid]) for pid in pids}
    time.sleep(max(0.0, (start_ns + time_s * 1e9 - time.time_ns()) / 1e9))
    each = {pid: cpu_seconds([pid]) - each0[pid] for pid in pids}
    if per_pid is not None:
        per_pid.update(each)
    return sum(each.values())


def median_second_p99(run_dir: Path, time_s: float) -> float | None:
    """Median over the seconds of the sending window of that second's p99 (ms; the worst
    consumer's). A backlog that grows makes every later second slow, so this still fails an
    unsustainable rate, while one second stalled by another program on a shared machine does
    not decide the outcome."""
    import pyarrow.compute as pc
    from shoal.pipeline.loadtest.writer import read_run
    t = read_run(run_dir)["per_second"]
    t = t.filter(pc.and_(pc.equal(t["role"], "consumer"), pc.less(t["second"], time_s)))
    worst: dict[int, int] = {}
    for s, p in zip(t["second"].to_pylist(), t["latency_p99_us"].to_pylist()):
        if p is not None:
            worst[s] = max(worst.get(s, 0), p)
    if not worst:
        return None
    values = sorted(worst.values())
    return round(values[len(values) // 2] / 1000, 3)


# -- runs ---------------------------------------------------------------------------------
class Bench:
    def __init__(self, out: Path, quick: bool) -> None:
        self.out = out
        self.quick = quick
        self.time_s = 4 if quick else 10
        #: seconds of rest before each run, after an ``os.sync()`` (0: none); a run after
        #: another once read lower, from a nearly full disk (stream_bench.py ``discard``)
        self.settle_s = 0.0
        self.n = 0
        self.runs: list[dict] = []

    def run(self, broker, name: str, args: list[str], time_s: float | None = None) -> dict:
        """One ``shoal loadtest`` against ``broker``: its summary plus ``ok``, ``cpu_s``."""
        self.n += 1
        time_s = time_s or self.time_s
        tag = "shoal" if isinstance(broker, Shoal) else "rabbitmq"
        run_dir = self.out / "runs" / f"{self.n:02d}-{name}-{tag}"
        cmd = [sys.executable, "-m", "shoal.cli", "loadtest", "--url", broker.url,
               "--out", str(run_dir), "--label", broker.label, "--time", str(time_s),
               "--queue-pattern", queue_pattern(broker, args), *args]
        if broker.nodes:
            cmd += ["--nodes", str(broker.nodes)]
        if self.settle_s:
            os.sync()                   # what the run before left unsynced is not this one's
            time.sleep(self.settle_s)
        broker.start()
        proc = None
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
            cpu = window_cpu(proc, run_dir, broker.pids(), time_s)
            rss = rss_bytes(broker.pids())      # at the window's end: loaded
            stdout, stderr = proc.communicate(timeout=time_s + 150)
            r = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
        finally:
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(10)
            broker.stop()
        result = {"name": name, "broker": broker.label, "args": args, "rc": r.returncode,
                  "cmd": " ".join(cmd), "run_dir": str(run_dir), "cpu_s": round(cpu, 3),
                  "rss_mb": round(rss / 2**20, 1)}
        if r.returncode == 0:
            result.update(json.loads((run_dir / "run.json").read_text())["summary"])
        else:
            result["error"] = last_line(r.stderr)
        lat = result.get("latency_ms") or {}
        result["p99_median_s_ms"] = median_second_p99(run_dir, time_s) if r.returncode == 0 \
            else None
        result["ok"] = (r.returncode == 0 and (result.get("consumed_ratio") or 0)
                        >= SUSTAINABLE_RATIO and result["p99_median_s_ms"] is not None
                        and result["p99_median_s_ms"] <= SUSTAINABLE_P99_MS)
        log(f"{broker.label:<18} {name:<10} {' '.join(args):<60} -> "
            + (f"sent {result.get('send_rate', 0):.0f}/s recv {result.get('receive_rate', 0):.0f}"
               f"/s ratio {result.get('consumed_ratio')} p50/p99 {lat.get('p50')}/"
               f"{lat.get('p99')} ms (median per-second p99 {result['p99_median_s_ms']} ms) "
               f"cpu {cpu:.2f} s" if r.returncode == 0
               else f"FAILED: {result['error']}") + (" [sustainable]" if result["ok"] else ""))
        self.runs.append(result)
        return result


def queue_pattern(broker, args: list[str]) -> str:
    """A fresh queue name pattern; for a single-queue load on a Shoal with ``queue_node``,
    one that the placement puts on that node (the same name goes to RabbitMQ alike)."""
    one_queue = args[args.index("--queues") + 1] == "1" if "--queues" in args else True
    node = getattr(broker, "queue_node", "")
    pattern = f"bench-{uuid.uuid4().hex[:8]}"
    if not (node and one_queue):
        return pattern + "-%d"
    from _cluster import name_on
    return name_on(node, broker.nodes_n, pattern + "-{}-%d")


def bisect_rate(start: int, max_steps: int, precision: float = 0.1):
    """Generator: yields rates to try, is sent True/False (sustainable), returns the best."""
    lo, hi, rate = 0, None, start
    for _ in range(max_steps):
        ok = yield rate
        if ok:
            lo = rate
        else:
            hi = rate
        if hi is None:
            rate = lo * 2
        elif lo == 0:
            rate = hi // 2
        else:
            if (hi - lo) / hi <= precision:
                break
            rate = (lo + hi) // 2
    return lo


LOAD1 = ["--producers", "1", "--consumers", "1", "--queues", "1", "--size", "100",
         "--qos", "200"]
#: Load 2: load 1 with publisher confirms (1000 in flight) and persistent messages on a
#: durable queue, so every confirm waits for the broker's disk (Shoal: group commit).
LOAD2 = LOAD1 + ["--confirm", "1000", "--persistent", "--durable"]
LOAD5 = ["--producers", "4", "--consumers", "4", "--queues", "8", "--size", "100",
         "--qos", "200", "--confirm", "500"]


def load1(bench: Bench, brokers: list, load: list[str] = LOAD1, name: str = "load1",
          runs: int = 1) -> dict:
    """Interleaved searches: one step on each broker in turn. With ``runs`` > 1 a step is
    run up to ``runs`` times (fresh broker each time) and passes when most of them do; it
    stops as soon as the majority is known. Near either broker's limit one run passes or
    fails about as often as a coin (docs/performance-log.md, session 15)."""
    # doubling from 5,000 msg/s takes 5 steps to reach 80,000; 4 more bisect to within 10 %
    steps = 5 if bench.quick else 9
    gens = {b.label: bisect_rate(5000, steps) for b in brokers}
    rates = {label: next(g) for label, g in gens.items()}
    achieved: dict[str, dict[int, float]] = {b.label: {} for b in brokers}
    best = {}
    need = runs // 2 + 1
    while rates:
        for b in brokers:
            if b.label not in rates:
                continue
            votes = [0, 0]      # failed, passed
            while max(votes) < need:
                res = bench.run(b, name, load + ["--rate", str(rates[b.label])])
                votes[bool(res["ok"])] += 1
                if res["ok"]:       # read only at the best passing step
                    achieved[b.label][rates[b.label]] = res.get("send_rate") or 0
            if runs > 1:
                log(f"{b.label} {name} at {rates[b.label]} msg/s: {votes[1]} of "
                    f"{sum(votes)} runs sustainable")
            try:
                rates[b.label] = gens[b.label].send(votes[1] >= need)
            except StopIteration as stop:
                # Report what was achieved at the best passing step: a confirm window can hold
                # a producer below the rate it asked for (load 2).
                got = achieved[b.label].get(stop.value)
                best[b.label] = min(stop.value, round(got)) if got else stop.value
                del rates[b.label]
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="shorter runs, fewer search steps")
    p.add_argument("--nodes", type=int, default=os.cpu_count() or 2,
                   help="Shoal node processes for loads 1, 3, 4 (default: CPU count)")
    p.add_argument("--shoal-port", type=int, default=5673)
    p.add_argument("--out", default="", help="results folder (default: a new temp folder)")
    p.add_argument("--loads", default="1,2,3,4,5",
                   help="which loads to run (default 1,2,3,4,5)")
    p.add_argument("--fixed-rate", type=int, default=FIXED_RATE,
                   help="msg/s of loads 3/4 (default 5000, the issue's; other rates show "
                        "how CPU per message falls with the rate)")
    p.add_argument("--load1-runs", type=int, default=1,
                   help="runs per step of load 1's search (fresh broker each); a step passes "
                        "when most pass (default 1)")
    p.add_argument("--repeat", type=int, default=2,
                   help="runs per broker for loads 3/4, alternating; the best is kept")
    p.add_argument("--embed-node", action="store_true",
                   help="run Shoal with 'shoal serve --embed-node' (node-0 in the router "
                        "process, over ZeroMQ inproc://)")
    p.add_argument("--local-link", choices=["zmq", "unix"], default="",
                   help="run Shoal with 'shoal serve --local-link' (default: serve's own)")
    p.add_argument("--queue-node", default=None,
                   help="put the queue of loads 1-4 on this Shoal node (default: node-0 with "
                        "--embed-node, else wherever a random name hashes)")
    p.add_argument("--shoal-src", default="",
                   help="run Shoal from this source tree (with node/, router/, shared/; e.g. "
                        "'git archive HEAD | tar -x -C DIR') instead of the installed one")
    args = p.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="shoal-bench-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = shoal_env(args.shoal_src, out) if args.shoal_src else None
    loads = {x.strip() for x in args.loads.split(",")}
    if port_open(args.shoal_port):
        print(f"compare_rabbitmq: port {args.shoal_port} is in use", file=sys.stderr)
        return 2
    # SIGTERM/SIGINT: stop the cluster and RabbitMQ on the way out (the finally below)
    def _exit(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)
    bench = Bench(out, args.quick)
    rabbit = RabbitMQ()
    queue_node = args.queue_node if args.queue_node is not None else \
        ("node-0" if args.embed_node else "")
    shoal = Shoal(args.shoal_port, args.nodes, out, env, args.embed_node, queue_node,
                  args.local_link)
    t0 = time.monotonic()
    results: dict = {"machine": machine(), "quick": args.quick, "nodes": args.nodes,
                     "fixed_rate": args.fixed_rate, "embed_node": args.embed_node,
                     "local_link": args.local_link,
                     "queue_node": queue_node}
    try:
        rabbit.ensure()
        results["rabbitmq_version"] = rabbitmq_version()
        if "1" in loads:
            results["load1"] = load1(bench, [shoal, rabbit], runs=args.load1_runs)
            results["load1_runs"] = args.load1_runs
        if "2" in loads:
            results["load2"] = load1(bench, [shoal, rabbit], LOAD2, "load2")
        if loads & {"3", "4"}:
            fixed = LOAD1 + ["--rate", str(args.fixed_rate)]
            tries: dict[str, list[dict]] = {}
            for _ in range(args.repeat):
                for b in (shoal, rabbit):
                    tries.setdefault(b.label, []).append(bench.run(b, "load34", fixed))
            results["load34"] = {label: best_of(rs) for label, rs in tries.items()}
            results["load34_pairs"] = paired(tries[shoal.label], tries[rabbit.label])
        if "5" in loads:
            results["load5"] = {}
            for n in (1, 2, 4):
                s = Shoal(args.shoal_port, n, out, env, args.embed_node, "", args.local_link)
                for b in (s, rabbit) if n == 1 else (s,):
                    r = bench.run(b, "load5", LOAD5)
                    results["load5"][b.label] = {"receive_rate": r.get("receive_rate"),
                                                 "p99_ms": (r.get("latency_ms") or {})
                                                 .get("p99"), "error": r.get("error")}
    finally:
        shoal.stop()
        rabbit.shutdown()
        results["runs"] = bench.runs
        results["wall_s"] = round(time.monotonic() - t0, 1)
        (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    table = render(results, shoal.label)
    (out / "table.md").write_text(table + "\n")
    print(table)
    log(f"done in {results['wall_s']:.0f} s; results in {out}")
    return 0


def shoal_env(src: str, out: Path) -> dict:
    """Environment whose PYTHONPATH imports ``shoal.*`` (node, router, shared, ...) from ``src``
    (a shim folder of symlinks; path entries come before the editable install's finder)."""
    src_path = Path(src).resolve()
    shim = out / "shoal-src" / "shoal"
    shim.mkdir(parents=True, exist_ok=True)
    for part in PACKAGES:
        link = shim / part
        if not link.exists() and (src_path / part).is_dir():
            link.symlink_to(src_path / part)
    return {**os.environ, "PYTHONPATH": str(shim.parent)}


def machine() -> dict:
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    # the interpreter Shoal ran on (this one): its build matters as much as its version (a
    # build without PGO and LTO, as pyenv's default, costs Shoal about 14 % more CPU per
    # message than Debian's /usr/bin/python3: docs/performance.md, "Which Python")
    return {"nproc": os.cpu_count(), "cpu_model": model, "python": sys.version.split()[0],
            "python_executable": os.path.realpath(sys.executable)}


def log_interpreter() -> None:
    """Log the interpreter this bench starts Shoal and the load tool on (``machine()``)."""
    m = machine()
    log(f"Shoal and the load tool on Python {m['python']} ({m['python_executable']})")


def rabbitmq_version() -> str:
    r = subprocess.run(["rabbitmqctl", "version"], capture_output=True, text=True, check=False)
    return r.stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
