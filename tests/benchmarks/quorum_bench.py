"""Quorum queues side by side: Shoal (3 nodes, 1 router) vs a 3-node RabbitMQ cluster on this
machine (issue 35, point 7).

    python3 tests/benchmarks/quorum_bench.py [--quick] [--only shoal|rabbitmq] [--repeat N]
                                             [--out RESULTS.json] [--work DIR]
                                             [--shoal-args "--no-pin-cpus ..."]

Brokers, started afresh for every round and stopped at the end whatever happens:

- Shoal: ``shoal serve --nodes 3 --routers 1 --port 0 --data-dir D`` (with
  ``SHOAL_MANAGEMENT_PORT=0 SHOAL_PROMETHEUS_PORT=0``; its default log level, which logs the
  nodes' ``quorum queue 'Q' in vhost '/': node-N leads (term T)`` lines the leader is read
  from). Clients connect to the router.
- RabbitMQ (Debian's ``rabbitmq-server`` 3.10, installed with apt-get when missing): three
  ``rabbitmq-server -detached`` nodes rabbit1..3@localhost on AMQP ports 5681-5683 and
  distribution ports 25681-25683, their mnesia, logs and pid files in the work folder, one
  Erlang cookie (``HOME`` of every RabbitMQ command points at a folder holding it), no plugins
  (an empty ``RABBITMQ_ENABLED_PLUGINS_FILE``), no system config
  (``RABBITMQ_CONF_ENV_FILE``/``RABBITMQ_CONFIG_FILE`` point at empty files), rabbit2 and 3
  joined to rabbit1 (``stop_app``, ``join_cluster``, ``start_app``). The scripts of
  /usr/lib/rabbitmq/bin are called directly (Debian's /usr/sbin wrappers switch to the
  rabbitmq user and its cookie). A RabbitMQ already running on 5672 is left alone: nothing
  of it is shared but epmd. A queue is declared through the node it should be led from
  (quorum queues' leader locator is client-local) and the clients connect to another node.

Measures, the same for both, on one durable quorum queue (``x-queue-type: quorum``) per
measure, 1 KB persistent messages, publisher confirms:

1. CPU and latency at 5,000 msg/s for 10 s (``shoal loadtest``: 1 producer rate-limited with
   at most 1,000 unconfirmed, 1 consumer with prefetch 200 and manual acks): broker CPU
   seconds per message sent = utime+stime (/proc/PID/stat) over the sending window of every
   Shoal process (launcher, router, nodes) vs the three beam.smp processes; consumer
   end-to-end latency p50/p99 (the send time is stamped in the body), also the median of
   the per-second p99s.
2. Highest sustainable confirmed rate: the same load with no rate limit and at most 500
   unconfirmed, 5 s: confirms received during the sending window / 5 s (the consumer's rate
   is shown beside it). Per-process CPU of the same window says which process saturates.
3. kill -9 of the leader's node (run last): one publisher (aio-pika) publishing one message at a time
   and waiting for each confirm, on a node other than the leader's (Shoal: the router);
   after 2 s the leader's node is killed with SIGKILL and its data deleted (RabbitMQ: the
   leader from ``rabbitmqctl list_queues name leader``, its beam.smp and its mnesia base
   folder; Shoal: the leader from the log line, its pid from cluster.json, ``D/<node-id>``);
   publishing goes on for 8 s after. Measure: the longest gap between consecutive confirms.
4. With a length limit (issue 44): measure 1 on a queue with ``x-max-length`` 100,000 and
   reject-publish (checked on every publish, never reached).
5. At-least-once dead-lettering (issue 44): 2,000 msg/s for the unlimited run's time, no
   consumer, into a queue with ``x-message-ttl`` 0 that dead-letters at least once into a
   second quorum queue: messages into the target per second (from the start until all
   confirmed ones are there), CPU per message, and confirmed messages never dead-lettered.
6. SIGSTOP of the leader's node for 15 s, then SIGCONT, the same publisher, 5 s after.
   Measure: the longest gap between consecutive confirms.
   After 3 and 4 the queue is drained by a consumer: confirmed messages not received are
   counted as lost (must be 0).

Each round runs both brokers (the order alternates from round to round); with ``--repeat N``
each measure's median over the rounds is kept, and the ratios Shoal/RabbitMQ are taken of
these medians (both brokers are measured within the same invocation: the machine is shared
and noisy). Targets: CPU per message <= 1.0x, consumer p99 <= 1.5x, sustainable confirmed
rate >= 1.3x, kill -9 and SIGSTOP pauses <= RabbitMQ's, 0 lost.

``--quick``: 4 s at the fixed rate, 3 s unlimited, 8 s SIGSTOP, 4 s after a fault.
The work folder (loadtest run folders, Shoal's and RabbitMQ's logs) is kept and printed.

Not collected by pytest (no ``test_`` prefix): a benchmark asserts no speed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_rabbitmq import last_line, log, machine, median_second_p99  # noqa: E402
from _quorum_clusters import (QUORUM, RabbitCluster, ShoalCluster, delete_queue,  # noqa: E402
                              window_cpu_by_proc)

SIZE = 1024
FIXED_RATE = 5000
FIXED_CONFIRM = 1000
MAX_CONFIRM = 500
DL_RATE = 2000          #: msg/s into the queue whose messages are all dead-lettered
QOS = 200
PRE_FAULT_S = 2.0
CAP_S = 60.0            #: a failover with no confirm for this long counts as failed
TARGETS = {"cpu_us_per_msg": ("<=", 1.0), "p99_ms": ("<=", 1.5),
           "max_confirmed_rate": (">=", 1.3), "kill9_gap_s": ("<=", 1.0),
           "sigstop_gap_s": ("<=", 1.0)}


class Bench:
    def __init__(self, work: Path, quick: bool) -> None:
        self.work = work
        self.quick = quick
        self.fixed_s = 4 if quick else 10
        self.max_s = 3 if quick else 5
        self.stop_s = 8 if quick else 15
        self.kill_post_s = 4 if quick else 8
        self.stop_post_s = 4 if quick else 5
        self.n = 0

    def loadtest(self, broker, name: str, args: list[str], time_s: float,
                 queue_args: dict | None = None, queue: str | None = None) -> dict:
        """One ``shoal loadtest`` on a fresh quorum queue (``queue_args`` besides its type):
        its summary, the confirms received during the sending window, and each broker
        process's CPU over that window."""
        self.n += 1
        queue = queue or f"qb-{name}-{uuid.uuid4().hex[:8]}"
        url = broker.load_url(queue, {**QUORUM, **(queue_args or {})})
        run_dir = self.work / "runs" / f"{self.n:02d}-{name}-{broker.tag}"
        cmd = [sys.executable, "-m", "shoal.cli", "loadtest", "--url", url,
               "--out", str(run_dir), "--label", broker.label, "--time", str(time_s),
               "--queue-pattern", queue, "--producers", "1", "--consumers", "1",
               "--queues", "1", "--size", str(SIZE), "--qos", str(QOS), "--persistent",
               "--durable", "--queue-args", json.dumps({**QUORUM, **(queue_args or {})}),
               *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            cpu = window_cpu_by_proc(proc, run_dir, broker.pids, time_s)
            stdout, stderr = proc.communicate(timeout=time_s + 180)
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)
        res: dict = {"queue": queue, "url": url, "cmd": " ".join(cmd[2:]),
                     "run_dir": str(run_dir), "rc": proc.returncode,
                     "cpu_s": round(sum(cpu.values()), 3), "cpu_by_proc": cpu,
                     "cpu_pct_by_proc": {k: round(100 * v / time_s) for k, v in cpu.items()}}
        if broker.tag == "shoal":
            led = broker.leader(queue, timeout=2)
            res["leader"] = led[0] if led else None
        if proc.returncode:
            res["error"] = last_line(stderr)
            log(f"{broker.label} {name} FAILED: {res['error']}")
            return res
        res.update(json.loads((run_dir / "run.json").read_text())["summary"])
        res["confirmed_in_window"] = confirmed_in_window(run_dir, time_s)
        res["p99_median_s_ms"] = median_second_p99(run_dir, time_s)
        if res.get("sent"):
            res["cpu_us_per_msg"] = round(res["cpu_s"] * 1e6 / res["sent"], 1)
        delete_queue(url, queue)
        return res

    def fixed(self, broker) -> dict:
        r = self.loadtest(broker, "fixed", ["--rate", str(FIXED_RATE), "--confirm",
                                            str(FIXED_CONFIRM)], self.fixed_s)
        lat = r.get("latency_ms") or {}
        log(f"{broker.label} {FIXED_RATE} msg/s: sent {r.get('sent')} confirmed "
            f"{r.get('confirmed')} received {r.get('received')}, p50/p99 {lat.get('p50')}/"
            f"{lat.get('p99')} ms, CPU {r['cpu_s']} s = {r.get('cpu_us_per_msg')} us/msg "
            f"{r['cpu_pct_by_proc']} %")
        return r

    def max_length(self, broker) -> dict:
        """Measure 1 on a queue with a length limit (``x-max-length`` 100,000 with
        reject-publish: checked on every publish, never reached)."""
        r = self.loadtest(broker, "maxlen", ["--rate", str(FIXED_RATE), "--confirm",
                                             str(FIXED_CONFIRM)], self.fixed_s,
                          {"x-max-length": 100_000, "x-overflow": "reject-publish"})
        lat = r.get("latency_ms") or {}
        log(f"{broker.label} {FIXED_RATE} msg/s, x-max-length: p50/p99 {lat.get('p50')}/"
            f"{lat.get('p99')} ms, CPU {r.get('cpu_us_per_msg')} us/msg")
        return r

    def dead_letters(self, broker) -> dict:
        """At-least-once dead-lettering: DL_RATE msg/s for max_s seconds, no consumer, into
        a quorum queue whose messages expire at once (``x-message-ttl`` 0) and are
        dead-lettered at least once into a second quorum queue. Measures the time from the
        start until every confirmed message is in the target, and the broker's CPU per
        message over the sending window."""
        import pika
        src = f"qb-dl-src-{uuid.uuid4().hex[:8]}"
        dst = src.replace("src", "dst")
        url = broker.load_url(dst)                  # the target first
        conn = pika.BlockingConnection(pika.URLParameters(url))
        conn.channel().queue_declare(dst, durable=True, arguments=QUORUM)
        t0 = time.monotonic()
        r = self.loadtest(broker, "dlx", ["--rate", str(DL_RATE), "--confirm",
                                          str(FIXED_CONFIRM), "--consumers", "0"], self.max_s,
                          {"x-message-ttl": 0, "x-dead-letter-strategy": "at-least-once",
                           "x-overflow": "reject-publish", "x-dead-letter-exchange": "",
                           "x-dead-letter-routing-key": dst}, queue=src)
        want = r.get("sent") or 0       # those not confirmed in the window too
        ch = conn.channel()
        count = 0
        while time.monotonic() - t0 < CAP_S:
            count = ch.queue_declare(dst, passive=True).method.message_count
            if count >= want:
                break
            time.sleep(0.05)
        r["dead_lettered"] = count
        r["dl_all_in_s"] = round(time.monotonic() - t0, 2) if count >= want else None
        if r["dl_all_in_s"]:
            r["dl_rate"] = round(count / r["dl_all_in_s"], 1)
        conn.close()
        delete_queue(url, dst)
        log(f"{broker.label} at-least-once dead letters: {count} of {want} sent in "
            f"{r['dl_all_in_s']} s, CPU {r.get('cpu_us_per_msg')} us/msg")
        return r

    def max_rate(self, broker) -> dict:
        r = self.loadtest(broker, "max", ["--rate", "0", "--confirm", str(MAX_CONFIRM)],
                          self.max_s)
        if r.get("confirmed_in_window") is not None:
            r["confirmed_rate"] = round(r["confirmed_in_window"] / self.max_s, 1)
        log(f"{broker.label} unlimited: confirmed {r.get('confirmed_rate')} msg/s, consumer "
            f"{r.get('receive_rate')} msg/s, CPU {r['cpu_pct_by_proc']} %")
        return r

    def failover(self, broker, kind: str) -> dict:
        queue = f"qb-{kind}-{uuid.uuid4().hex[:8]}"
        url, leader = broker.prepare_failover(queue)
        post = self.kill_post_s if kind == "kill9" else self.stop_post_s
        stop_s = self.stop_s

        async def fault(state: dict) -> None:
            state["fault_at"] = time.monotonic()
            if kind == "kill9":
                broker.kill_and_wipe(leader)
                state["done_at"] = time.monotonic()
                return
            broker.signal_node(leader, signal.SIGSTOP)
            try:
                await asyncio.sleep(stop_s)
            finally:
                broker.signal_node(leader, signal.SIGCONT)
                state["done_at"] = time.monotonic()

        log(f"{broker.label} {kind}: leader {leader}, publisher on {url}")
        res = asyncio.run(publish_through_fault(url, queue, fault, PRE_FAULT_S, post))
        res.update({"queue": queue, "leader": leader, "client_url": url})
        res.update(broker.after_fault(queue, leader))
        time.sleep(1.0)
        confirmed = set(res.pop("confirmed_seqs"))
        drained = asyncio.run(drain(url, queue, confirmed))
        got = drained.pop("seqs")
        res["drain"] = drained
        res["lost"] = len(confirmed - got)
        res["lost_sample"] = sorted(confirmed - got)[:20]
        log(f"{broker.label} {kind}: longest confirm gap {res['longest_gap_s']} s (after the "
            f"fault {res['fault_gap_s']} s), {res['confirmed']} confirmed, {res['lost']} lost, "
            f"errors {res['errors'][:3]}, new leader {res.get('new_leader')}; drain {drained} "
            f"(message in flight at the fault: {res['in_flight_at_fault']})")
        delete_queue(url, queue)
        return res


def confirmed_in_window(run_dir: Path, time_s: float) -> int | None:
    try:
        import pyarrow.compute as pc
        from shoal.pipeline.loadtest.writer import read_run
        t = read_run(run_dir)["per_second"]
        t = t.filter(pc.and_(pc.equal(t["role"], "producer"), pc.less(t["second"], time_s)))
        return int(pc.sum(t["confirmed"]).as_py() or 0)
    except Exception as exc:  # noqa: BLE001 - reported as missing
        log(f"could not read {run_dir}: {exc}")
        return None


def body(seq: int) -> bytes:
    return f"{seq:>12}".encode().ljust(SIZE, b"\0")


async def publish_through_fault(url: str, queue: str, fault, pre_s: float, post_s: float
                                ) -> dict:
    """Publish persistent messages one at a time, each waiting for its confirm, while
    ``fault(state)`` runs (started after ``pre_s``; it sets ``state['fault_at']`` and, when
    its last action is done, ``state['done_at']``); stop ``post_s`` after that once a confirm
    has come after it, or give up ``CAP_S`` after it. A publish that fails (closed channel or
    connection, nack, timeout) is not counted as confirmed; the connection is reopened."""
    import aio_pika
    from pamqp.commands import Basic
    state: dict = {}
    times: list[float] = []
    confirmed: list[int] = []
    errors: list[str] = []
    reconnects = 0
    conn = ex = None
    seq = 0
    failed = False

    async def run_fault():
        await asyncio.sleep(pre_s)
        state["in_flight_at_fault"] = seq      # the publish awaiting its confirm
        await fault(state)

    async def close():
        nonlocal conn, ex
        if conn is not None:
            try:
                await asyncio.wait_for(conn.close(), 2)
            except BaseException:  # noqa: BLE001 - broken already
                pass
        conn = ex = None

    t0 = time.monotonic()
    task = None
    try:
        while True:
            now = time.monotonic()
            done = state.get("done_at")
            if done is not None:
                recovered = bool(times) and times[-1] > done
                if now >= done + post_s and recovered:
                    break
                if now >= done + CAP_S:
                    failed = True
                    errors.append(f"no confirm within {CAP_S:.0f} s of the fault")
                    break
            elif now - t0 > pre_s + CAP_S + 60:
                failed = True
                errors.append("the fault never finished")
                break
            if conn is None:
                try:
                    conn = await asyncio.wait_for(aio_pika.connect(url), 10)
                    ch = await conn.channel(publisher_confirms=True)
                    ex = ch.default_exchange
                    if task is None:
                        task = asyncio.ensure_future(run_fault())
                    else:
                        reconnects += 1
                except Exception as exc:  # noqa: BLE001 - retried until the cap
                    errors.append(f"connect: {type(exc).__name__}: {exc}"[:200])
                    await close()
                    await asyncio.sleep(0.1)
                    continue
            msg = aio_pika.Message(body(seq), delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            try:
                r = await ex.publish(msg, routing_key=queue, mandatory=False, timeout=CAP_S)
                if isinstance(r, Basic.Ack):
                    confirmed.append(seq)
                    times.append(time.monotonic())
                else:
                    errors.append(f"publish {seq}: {r!r}"[:200])
            except Exception as exc:  # noqa: BLE001 - counted, then reconnect
                errors.append(f"publish {seq}: {type(exc).__name__}: {exc}"[:200])
                await close()
            seq += 1
    finally:
        if task is not None and not task.done():
            task.cancel()       # a SIGSTOP fault sends SIGCONT on its way out
            try:
                await task
            except BaseException:  # noqa: BLE001
                pass
        await close()
    gaps = [b - a for a, b in zip(times, times[1:])]
    longest = max(gaps, default=0.0)
    fault_at = state.get("fault_at")
    if failed and times:
        longest = max(longest, time.monotonic() - times[-1])
    before = [t for t in times if fault_at and t <= fault_at]
    # the longest gap ending after the fault started (the publish in flight at the fault may
    # have been confirmed just before it, so the gap across the fault itself can be short)
    fault_gap = max((b - a for a, b in zip(times, times[1:]) if fault_at and b > fault_at),
                    default=None)
    done = state.get("done_at")
    return {"published": seq, "confirmed": len(confirmed), "confirmed_seqs": confirmed,
            "longest_gap_s": round(longest, 3), "failed": failed,
            "fault_gap_s": round(fault_gap, 3) if fault_gap is not None else None,
            "confirmed_during_fault": sum(1 for t in times if fault_at and done
                                          and fault_at < t <= done),
            "confirm_rate_before": round(len(before) / pre_s, 1) if fault_at else None,
            "in_flight_at_fault": state.get("in_flight_at_fault"),
            "reconnects": reconnects, "errors": errors[:20], "error_count": len(errors)}


async def drain(url: str, queue: str, expected: set[int], idle_s: float = 5.0,
                cap_s: float = 120.0) -> dict:
    """Consume ``queue`` until every expected message came and nothing more for 1 s, or
    nothing came for ``idle_s``, or ``cap_s``."""
    import aio_pika
    seqs: list[int] = []
    redelivered: dict[int, list[bool]] = {}
    conn = await asyncio.wait_for(aio_pika.connect(url), 20)
    try:
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=500)
        q = await ch.declare_queue(queue, durable=True, arguments=QUORUM)

        async def on_message(m) -> None:
            seq = int(m.body[:12])
            seqs.append(seq)
            redelivered.setdefault(seq, []).append(bool(m.redelivered))
            await m.ack()
        await q.consume(on_message)
        t0 = last = time.monotonic()
        count = 0
        while True:
            await asyncio.sleep(0.2)
            now = time.monotonic()
            if len(seqs) != count:
                count, last = len(seqs), now
            if (expected <= set(seqs) and now - last >= 1.0) or now - last >= idle_s \
                    or now - t0 >= cap_s:
                break
    finally:
        await conn.close()
    got = set(seqs)
    return {"seqs": got, "received": len(seqs), "distinct": len(got),
            "duplicates": len(seqs) - len(got), "unconfirmed_received": len(got - expected),
            # each message delivered more than once: its redelivered flags in order
            "duplicated": {s: f for s, f in redelivered.items() if len(f) > 1}}


# -- rounds, medians, table ---------------------------------------------------------------
def measures(fixed: dict, mx: dict, kill: dict, stop: dict, maxlen: dict | None = None,
             dlx: dict | None = None) -> dict:
    lat = fixed.get("latency_ms") or {}
    ml, dl = maxlen or {}, dlx or {}
    return {"maxlen_cpu_us_per_msg": ml.get("cpu_us_per_msg"),
            "maxlen_p99_ms": (ml.get("latency_ms") or {}).get("p99"),
            "dlx_cpu_us_per_msg": dl.get("cpu_us_per_msg"), "dlx_rate": dl.get("dl_rate"),
            "dlx_lost": max(0, (dl.get("confirmed") or 0) - (dl.get("dead_lettered") or 0))
            if dl.get("confirmed") is not None else None,
            "cpu_us_per_msg": fixed.get("cpu_us_per_msg"), "p50_ms": lat.get("p50"),
            "p99_ms": lat.get("p99"), "p99_median_s_ms": fixed.get("p99_median_s_ms"),
            "fixed_send_rate": fixed.get("send_rate"),
            "max_confirmed_rate": mx.get("confirmed_rate"),
            "max_receive_rate": mx.get("receive_rate"),
            "kill9_gap_s": kill.get("longest_gap_s"), "kill9_lost": kill.get("lost"),
            "sigstop_gap_s": stop.get("longest_gap_s"), "sigstop_lost": stop.get("lost")}


def run_broker(bench: Bench, broker) -> dict:
    out: dict = {}
    broker.start()
    try:
        for name, fn in (("fixed", bench.fixed), ("max", bench.max_rate),
                         ("maxlen", bench.max_length), ("dlx", bench.dead_letters),
                         ("sigstop", lambda b: bench.failover(b, "sigstop")),
                         ("kill9", lambda b: bench.failover(b, "kill9"))):
            try:
                out[name] = fn(broker)
            except Exception as exc:  # noqa: BLE001 - recorded, the next measure still runs
                out[name] = {"error": f"{type(exc).__name__}: {exc}"}
                log(f"{broker.label} {name} FAILED: {out[name]['error']}")
            if name == "sigstop":
                time.sleep(3)       # let the SIGCONTed node catch up before the next fault
    finally:
        broker.stop()
    out["measures"] = measures(out.get("fixed", {}), out.get("max", {}),
                               out.get("kill9", {}), out.get("sigstop", {}),
                               out.get("maxlen", {}), out.get("dlx", {}))
    return out


def median(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def ratio(a, b):
    return round(a / b, 2) if a is not None and b else None


ROWS = [("cpu_us_per_msg", f"broker CPU per message at {FIXED_RATE} msg/s (us)"),
        ("p50_ms", "consumer latency p50 (ms)"),
        ("p99_ms", "consumer latency p99 (ms)"),
        ("p99_median_s_ms", "  median of per-second p99s (ms)"),
        ("fixed_send_rate", "  publish rate reached in that run (msg/s)"),
        ("max_confirmed_rate", f"sustainable confirmed rate, window {MAX_CONFIRM} (msg/s)"),
        ("max_receive_rate", "  consumer rate in that run (msg/s)"),
        ("maxlen_cpu_us_per_msg", f"with x-max-length: CPU per message at {FIXED_RATE} "
                                  f"msg/s (us)"),
        ("maxlen_p99_ms", "  consumer latency p99 (ms)"),
        ("dlx_rate", "at-least-once dead-lettering: messages into the target per s"),
        ("dlx_cpu_us_per_msg", "  CPU per message published (us)"),
        ("dlx_lost", "  confirmed but not dead-lettered"),
        ("kill9_gap_s", "kill -9 leader: longest confirm gap (s)"),
        ("kill9_lost", "  confirmed but lost"),
        ("sigstop_gap_s", "SIGSTOP leader: longest confirm gap (s)"),
        ("sigstop_lost", "  confirmed but lost")]


def render(summary: dict) -> str:
    s, r = summary.get("shoal", {}), summary.get("rabbitmq", {})
    rows = [("measure", "Shoal", "RabbitMQ", "Shoal/RabbitMQ", "target", "met")]
    for key, label in ROWS:
        a, b = s.get(key), r.get(key)
        q = ratio(a, b)
        target, met = "", ""
        if key in TARGETS:
            op, limit = TARGETS[key]
            target = f"{op} {limit}x"
            if q is not None:
                met = "yes" if (q <= limit if op == "<=" else q >= limit) else "NO"
        elif key.endswith("_lost"):
            target = "0"
            if a is not None or b is not None:
                met = "yes" if (a or 0) == 0 and (b or 0) == 0 else "NO"
        rows.append((label, fmt(a), fmt(b), fmt(q), target, met))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for i, row in enumerate(rows):
        lines.append("| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |")
        if i == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and v >= 100:
        return f"{v:,.0f}"
    return str(v)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="shorter runs")
    p.add_argument("--only", choices=["shoal", "rabbitmq"], help="measure one broker only")
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds (brokers alternate; each measure's median is kept)")
    p.add_argument("--out", default="", help="results JSON path (default: WORK/results.json)")
    p.add_argument("--work", default="", help="work folder (default: a new temp folder)")
    p.add_argument("--shoal-args", default="",
                   help="extra 'shoal serve' arguments, e.g. '--no-pin-cpus'")
    args = p.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="quorum-bench-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out).resolve() if args.out else work / "results.json"

    def _exit(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)

    bench = Bench(work, args.quick)
    shoal = ShoalCluster(work, shlex.split(args.shoal_args))
    rabbit = RabbitCluster(work)
    brokers = [b for b in (shoal, rabbit) if args.only in (None, b.tag)]
    results: dict = {"machine": machine(), "loadavg_start": os.getloadavg(),
                     "quick": args.quick, "repeat": args.repeat, "work": str(work),
                     "shoal_commit": git_head(), "shoal_args": args.shoal_args,
                     "params": {"size": SIZE, "fixed_rate": FIXED_RATE,
                                "fixed_confirm": FIXED_CONFIRM, "max_confirm": MAX_CONFIRM,
                                "qos": QOS, "fixed_s": bench.fixed_s, "max_s": bench.max_s,
                                "sigstop_s": bench.stop_s, "pre_fault_s": PRE_FAULT_S},
                     "rounds": []}
    t0 = time.monotonic()
    log(f"work folder {work}")
    try:
        for i in range(args.repeat):
            rnd = {}
            for b in (brokers if i % 2 == 0 else brokers[::-1]):
                log(f"round {i + 1}/{args.repeat}: {b.label}")
                rnd[b.tag] = run_broker(bench, b)
            results["rounds"].append(rnd)
    finally:
        shoal.stop()
        rabbit.stop()
        rabbit.cleanup_epmd()
        if any(b.tag == "rabbitmq" for b in brokers):
            results["rabbitmq_version"] = rabbitmq_version()
        results["summary"] = {
            b.tag: {key: median([r[b.tag]["measures"].get(key) for r in results["rounds"]
                                 if b.tag in r]) for key, _ in ROWS}
            for b in brokers}
        if len(brokers) == 2:
            results["ratios"] = {key: ratio(results["summary"]["shoal"][key],
                                            results["summary"]["rabbitmq"][key])
                                 for key, _ in ROWS}
        results["wall_s"] = round(time.monotonic() - t0, 1)
        results["loadavg_end"] = os.getloadavg()
        out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    table = render(results["summary"])
    print(table)
    log(f"done in {results['wall_s']:.0f} s; results in {out}; logs in {work}")
    return 0


def git_head() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parent, check=False)
    return r.stdout.strip()


def rabbitmq_version() -> str:
    r = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"],
                       capture_output=True, text=True, check=False)
    return r.stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
