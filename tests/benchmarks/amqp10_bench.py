"""AMQP 1.0 side by side: Shoal against RabbitMQ 3.10's ``rabbitmq_amqp1_0`` plugin (issue 37).

    python tests/benchmarks/amqp10_bench.py [--rate 5000] [--time 30] [--warmup 5]
        [--repeat 3] [--brokers shoal,rabbitmq] [--nodes 2] [--embed] [--local-link unix]

One queue, one python-qpid-proton sender and one proton receiver, each in its own process
(``multiprocessing``, spawn), so that the clients' CPU is neither counted in the broker's
figure nor starving the process that samples it.

- The queue: declared with pika (AMQP 0-9-1, non-durable, a fresh name per run), deleted after.
  Addresses: RabbitMQ 3.10 (v1) ``/amq/queue/NAME``; Shoal ``/queues/NAME`` (the v2 form).
- Sender: unsettled transfers (at-least-once; the broker settles each with ``accepted``),
  100-byte body in one data section, application properties ``seq`` and ``ts`` (the send
  time, ``time.monotonic_ns()``, one clock for every process of the machine). Paced by a fixed
  schedule: message ``i`` is due at ``t0 + i / rate``; every ``--tick-ms`` (1 ms) the sender
  sends every message that is due (as far as link credit allows: a sender that falls behind
  catches up, and the lag shows in the achieved rate).
- Receiver: link credit window ``--credit`` (200, proton's prefetch: topped up as messages are
  processed), accepts each message (``accepted`` disposition, settled).
- The measured window: ``--warmup`` seconds after ``t0`` to ``--warmup + --time``. Broker CPU:
  utime+stime (/proc/PID/stat) of the broker's processes, sampled at the window's two ends
  (RabbitMQ: beam.smp; Shoal: the ``shoal serve`` launcher, its routers and nodes, each pid
  once), divided by the messages sent in the window. Latency: receive time minus ``ts`` of
  every message sent in the window, p50/p99. Achieved rate: messages sent in the window / its
  length (and received of those).
- Each broker runs ``--repeat`` times, the brokers alternating (Shoal, RabbitMQ, Shoal, ...),
  a fresh ``shoal serve`` per Shoal run; the table gives every run, the median per broker,
  and the Shoal/RabbitMQ ratios of CPU per message and p99 per pair (Shoal run i against
  RabbitMQ run i) with their median. Read the ratios, not the absolute figures (the machine
  is shared).

RabbitMQ: started if 5672 is closed (``rabbitmq-server -detached``; ``rabbitmqctl
await_startup``), ``rabbitmq_amqp1_0`` enabled and ``rabbitmq_management`` /
``rabbitmq_prometheus`` disabled (``rabbitmq-plugins``); left running at the end unless
``--stop-rabbitmq``. Shoal: ``shoal serve --port P --nodes N`` as compare_rabbitmq.py starts it
(management and Prometheus ports off, as RabbitMQ's plugins are), ``--embed`` adds
``--embed-node`` and puts the queue on node-0.

The clients (the proton sender and receiver processes) are in amqp10_clients.py; this script
starts and stops the brokers, runs and measures, and prints the table.

Not collected by pytest (no ``test_`` prefix): a benchmark asserts no speed.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue as queue_mod
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cluster import cpu_seconds, name_on, port_open, stop_serve  # noqa: E402
from amqp10_clients import BODY, percentile, receiver_main, sender_main  # noqa: E402



def log(msg: str) -> None:
    print(f"[amqp10 {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- brokers --------------------------------------------------------------------------------
class RabbitMQ:
    label = "RabbitMQ"
    port = 5672

    def ensure(self) -> None:
        if not shutil.which("rabbitmq-server"):
            raise SystemExit("amqp10_bench: rabbitmq-server is not installed "
                             "(compare_rabbitmq.py installs it)")
        if not port_open(5672):
            log("starting RabbitMQ")
            subprocess.run(["rabbitmq-server", "-detached"], check=True)
        deadline = time.monotonic() + 180
        while subprocess.run(["rabbitmqctl", "await_startup", "--timeout", "120"], check=False,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode:
            if time.monotonic() > deadline:
                raise RuntimeError("RabbitMQ did not start (see /var/log/rabbitmq)")
            time.sleep(2)
        for cmd in (["rabbitmq-plugins", "enable", "rabbitmq_amqp1_0"],
                    ["rabbitmq-plugins", "disable", "rabbitmq_management",
                     "rabbitmq_prometheus"]):
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        out = subprocess.run(["rabbitmqctl", "eval", "list_to_integer(os:getpid())."],
                             check=True, capture_output=True, text=True).stdout
        self.pid = int(out.strip().splitlines()[-1])
        self.version = subprocess.run(["rabbitmqctl", "version"], capture_output=True,
                                      text=True).stdout.strip()
        log(f"RabbitMQ {self.version} ready (beam.smp pid {self.pid}), rabbitmq_amqp1_0 on")

    def url(self) -> str:
        return "amqp://guest:guest@127.0.0.1:5672"

    def address(self, q: str) -> str:
        return f"/amq/queue/{q}"

    def queue_name(self) -> str:
        return f"amqp10-bench-{uuid.uuid4().hex[:8]}"

    def pids(self) -> list[int]:
        return [self.pid]

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def shutdown(self) -> None:
        subprocess.run(["rabbitmqctl", "stop"], check=False, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        log("RabbitMQ stopped")


class Shoal:
    """A fresh ``shoal serve`` per run."""

    def __init__(self, port: int, nodes: int, work: Path, embed: bool, local_link: str,
                 src: str = "") -> None:
        self.port, self.nodes, self.work = port, nodes, work
        self.embed, self.local_link = embed, local_link
        self.label = f"Shoal ({nodes} nodes{', embed' if embed else ''}" \
                     f"{', ' + local_link if local_link else ''})"
        self.env = {**os.environ, "SHOAL_MANAGEMENT_PORT": "0", "SHOAL_PROMETHEUS_PORT": "0"}
        self.proc: subprocess.Popen | None = None

    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}"

    def address(self, q: str) -> str:
        return f"/queues/{q}"

    def queue_name(self) -> str:
        pattern = f"amqp10-bench-{uuid.uuid4().hex[:8]}"
        return name_on("node-0", self.nodes, pattern + "-{}") if self.embed else pattern

    def start(self) -> None:
        data = Path(tempfile.mkdtemp(prefix="shoal-", dir=self.work))
        self.data = data
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shoal.cli", "serve", "--port", str(self.port),
             "--nodes", str(self.nodes), "--data-dir", str(data), "--log-level", "warning",
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
        pids = [r["pid"] for r in info.get("routers", [])] or [info["router"]["pid"]]
        self.child_pids = list(dict.fromkeys(pids + [n["pid"] for n in info["nodes"]]))

    def pids(self) -> list[int]:
        return [self.proc.pid, *self.child_pids]

    def stop(self) -> None:
        stop_serve(self.proc)
        self.proc = None

    def shutdown(self) -> None:
        self.stop()


def declare(port: int, q: str, delete: bool = False) -> None:
    import pika
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    if delete:
        ch.queue_delete(q)
    else:
        ch.queue_declare(q, durable=False)
    conn.close()


# -- one run --------------------------------------------------------------------------------
def run_once(broker, args) -> dict:
    ctx = mp.get_context("spawn")
    broker.start()
    q = broker.queue_name()
    procs = []
    try:
        declare(broker.port, q)
        out = ctx.Queue()
        t0_box = ctx.Value("q", 0)
        r_ready, s_ready = ctx.Event(), ctx.Event()
        rp = ctx.Process(target=receiver_main, args=(broker.url(), broker.address(q),
                                                      args.credit, args.rate, args.warmup,
                                                      args.time, t0_box, r_ready, out))
        rp.start()
        procs.append(rp)
        if not r_ready.wait(30):
            raise RuntimeError("receiver did not attach: " + _drain_error(out))
        # the sender starts its schedule at t0 (it is passed the time before it connects)
        t0 = time.monotonic_ns() + int(2e9)
        t0_box.value = t0
        sp = ctx.Process(target=sender_main, args=(broker.url(), broker.address(q), args.rate,
                                                    t0, args.warmup, args.time, args.tick_ms,
                                                    s_ready, out))
        sp.start()
        procs.append(sp)
        if not s_ready.wait(30):
            raise RuntimeError("sender did not attach: " + _drain_error(out))
        pids = broker.pids()
        lo, hi = t0 + int(args.warmup * 1e9), t0 + int((args.warmup + args.time) * 1e9)
        time.sleep(max(0.0, (lo - time.monotonic_ns()) / 1e9))
        cpu0, w0 = cpu_seconds(pids), time.monotonic_ns()
        time.sleep(max(0.0, (hi - time.monotonic_ns()) / 1e9))
        cpu1, w1 = cpu_seconds(pids), time.monotonic_ns()
        results = {}
        deadline = time.monotonic() + args.time + args.warmup + 60
        while len(results) < 2 and time.monotonic() < deadline:
            try:
                r = out.get(timeout=1)
                results[r["role"]] = r
            except queue_mod.Empty:
                if all(not p.is_alive() for p in procs) and out.empty():
                    break
        for p in procs:
            p.join(10)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
        try:
            declare(broker.port, q, delete=True)
        except Exception:  # noqa: BLE001 - the broker may be gone
            pass
        broker.stop()
    s, r = results.get("sender", {}), results.get("receiver", {})
    cpu = cpu1 - cpu0
    window_s = (w1 - w0) / 1e9
    n = s.get("sent_in_window") or 0
    lat = r.get("lat_ns") or []
    res = {"broker": broker.label, "queue": q, "cpu_s": round(cpu, 3),
           "window_s": round(window_s, 3), "sent_in_window": n,
           "cpu_us_per_msg": round(cpu / n * 1e6, 2) if n else None,
           "sent_rate": round(n / args.time, 1),
           "recv_rate": round((r.get("window_received") or 0) / args.time, 1),
           "p50_ms": _ms(percentile(lat, 0.50)), "p99_ms": _ms(percentile(lat, 0.99)),
           "max_ms": _ms(lat[-1] if lat else None),
           # the median over the window's seconds (by send time) of each second's p99: one
           # second stalled by another program on the machine does not decide it
           "p99_s_ms": _ms(r.get("median_second_p99_ns")),
           "load_avg": round(os.getloadavg()[0], 2),
           "sent": s.get("sent"), "accepted": s.get("accepted"), "rejected": s.get("rejected"),
           "released": s.get("released"), "received": r.get("received"), "dups": r.get("dups"),
           "sender_max_lag_ms": s.get("max_lag_ms"), "no_credit_ticks": s.get("no_credit_ticks"),
           # whole-process CPU of each client (connect to close), per message sent
           "sender_cpu_us_per_msg": _per(s.get("cpu_s"), s.get("sent")),
           "receiver_cpu_us_per_msg": _per(r.get("cpu_s"), r.get("received")),
           "errors": [e for e in (s.get("error"), r.get("error")) if e]}
    if len(results) < 2:
        res["errors"].append(f"missing client results: {sorted(results)}")
    log(f"{broker.label:<24} cpu {res['cpu_us_per_msg']} us/msg, p50/p99 {res['p50_ms']}/"
        f"{res['p99_ms']} ms (median per-second p99 {res['p99_s_ms']} ms), sent {res['sent_rate']}/s recv {res['recv_rate']}/s, "
        f"accepted {res['accepted']}/{res['sent']}, received {res['received']} "
        f"(dups {res['dups']}), lag max {res['sender_max_lag_ms']} ms, client CPU "
        f"{res['sender_cpu_us_per_msg']}/{res['receiver_cpu_us_per_msg']} us/msg"
        + (f" ERRORS {res['errors']}" if res["errors"] else ""))
    return res


def _per(cpu_s, n) -> float | None:
    return round(cpu_s / n * 1e6, 1) if cpu_s is not None and n else None


def _ms(ns) -> float | None:
    return None if ns is None else round(ns / 1e6, 3)


def _drain_error(out) -> str:
    try:
        return str(out.get(timeout=1))
    except queue_mod.Empty:
        return "(no report)"


def med(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def table(runs: dict[str, list[dict]], shoal_label: str | None, rabbit_label: str | None
          ) -> str:
    cols = [("CPU us/msg", "cpu_us_per_msg"), ("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"),
            ("med. 1-s p99 ms", "p99_s_ms"), ("sent/s", "sent_rate"), ("recv/s", "recv_rate"),
            ("client CPU us/msg snd/rcv", None), ("load", "load_avg")]
    lines = ["| broker | run | " + " | ".join(c[0] for c in cols) + " | errors |",
             "|---|---|" + "---|" * len(cols) + "---|"]
    for label, rs in runs.items():
        for i, r in enumerate(rs, 1):
            cells = [f"{r.get('sender_cpu_us_per_msg')}/{r.get('receiver_cpu_us_per_msg')}"
                     if k is None else str(r.get(k)) for _, k in cols]
            lines.append(f"| {label} | {i} | " + " | ".join(cells) + " | "
                         + ("; ".join(r["errors"]) or "-") + " |")
        cells = ["" if k is None else str(med([r.get(k) for r in rs])) for _, k in cols]
        lines.append(f"| {label} | median | " + " | ".join(cells) + " | |")
    if shoal_label in runs and rabbit_label in runs:
        lines += ["", "Shoal/RabbitMQ per pair (Shoal run i, RabbitMQ run i):"]
        for what, key in (("CPU per message", "cpu_us_per_msg"), ("p99 latency", "p99_ms"),
                          ("median 1-s p99", "p99_s_ms"), ("p50 latency", "p50_ms")):
            ratios = [round(s_[key] / r_[key], 3)
                      for s_, r_ in zip(runs[shoal_label], runs[rabbit_label])
                      if s_.get(key) and r_.get(key)]
            lines.append(f"- {what + ':':<17} {ratios} -> median {med(ratios)}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=int, default=5000)
    p.add_argument("--time", type=float, default=30.0, help="measured seconds")
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--credit", type=int, default=200, help="receiver's link credit window")
    p.add_argument("--tick-ms", type=float, default=1.0, help="sender's pacing tick")
    p.add_argument("--brokers", default="shoal,rabbitmq")
    p.add_argument("--nodes", type=int, default=os.cpu_count() or 2)
    p.add_argument("--shoal-port", type=int, default=5673)
    p.add_argument("--embed", action="store_true",
                   help="shoal serve --embed-node, the queue on node-0")
    p.add_argument("--local-link", choices=["zmq", "unix"], default="")
    p.add_argument("--stop-rabbitmq", action="store_true", help="rabbitmqctl stop at the end")
    p.add_argument("--out", default="", help="write the results as JSON here")
    args = p.parse_args(argv)

    def _exit(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)
    names = [b.strip() for b in args.brokers.split(",") if b.strip()]
    work = Path(tempfile.mkdtemp(prefix="amqp10-bench-"))
    brokers = []
    shoal = rabbit = None
    for name in names:
        if name == "shoal":
            if port_open(args.shoal_port):
                print(f"amqp10_bench: port {args.shoal_port} is in use", file=sys.stderr)
                return 2
            shoal = Shoal(args.shoal_port, args.nodes, work, args.embed, args.local_link)
            brokers.append(shoal)
        elif name == "rabbitmq":
            rabbit = RabbitMQ()
            rabbit.ensure()
            brokers.append(rabbit)
        else:
            p.error(f"unknown broker {name!r}")
    runs: dict[str, list[dict]] = {b.label: [] for b in brokers}
    try:
        for _ in range(args.repeat):
            for b in brokers:
                try:
                    runs[b.label].append(run_once(b, args))
                except (RuntimeError, OSError) as e:   # one failed run, not the whole set
                    log(f"{b.label}: run failed: {e}")
                    runs[b.label].append({"broker": b.label, "errors": [str(e)]})
    finally:
        if shoal:
            shoal.stop()
        if rabbit and args.stop_rabbitmq:
            rabbit.shutdown()
    print(f"\nAMQP 1.0, 1 queue, {args.rate} msg/s, {len(BODY)} B, credit {args.credit}, "
          f"{args.time:g} s measured after {args.warmup:g} s; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(table(runs, shoal.label if shoal else None, rabbit.label if rabbit else None))
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
