"""The parent process of ``shoal loadtest``: starts the workers, prints one line per second,
writes the run folder (``writer.RunWriter``) and the summary.

Timeline: consumers and producers start (``multiprocessing`` spawn), connect and declare; when
all are ready the parent sets ``start_ns`` (second 0) and releases them. Producers publish for
``time_s`` seconds, then wait (bounded) for their confirms. Consumers keep consuming until they
received everything that was sent (minus returns), or until nothing arrived for
``DRAIN_IDLE_S`` seconds, or ``DRAIN_MAX_S`` passed: the drain phase (seconds >= ``time_s``).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import socket
import sys
import time
from array import array
from datetime import UTC, datetime

from . import schema as S
from .client import AMQPUrl
from .entry import run_worker
from .plan import Config, copies
from .workers import CLOSE_S, DONE, ERROR, FLUSH_S, READY, SECOND
from .writer import RunWriter, loss_and_duplicates, merge_counts, received_runs, warm_up

READY_TIMEOUT_S = 60.0
#: and this much longer per queue and per consumer connection to set up (a broker that declares
#: a queue in 5 ms takes 50 s for 10,000: RabbitMQ 3.10 here, issue 46 shape G)
READY_PER_OBJECT_S = 0.02
DRAIN_IDLE_S = 3.0
DRAIN_MAX_S = 30.0
FLUSH_EVERY_S = 5
LATE_PRINT_S = 2.5       #: print a second at the latest this long after it ended


class LoadTestFailed(Exception):
    """A worker failed (message: ``role index: reason``)."""


def _pct(sorted_values, q: float):
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def host_info() -> dict:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"hostname": socket.gethostname(), "nproc": os.cpu_count(), "cpu_model": model}


class Runner:
    """One run. ``nodes``: queue name -> owning node id (``""`` when unknown)."""

    def __init__(self, cfg: Config, out_dir: str, run_json: dict, nodes: dict[str, str],
                 out=sys.stdout) -> None:
        self.cfg = cfg
        self.copies = copies(cfg)       #: deliveries wanted per message (a fanout's queues)
        self.out_dir = out_dir
        self.run_json = run_json
        self.nodes = nodes
        self.out = out
        self.workers = ([(S.ROLE_CONSUMER, i) for i in range(cfg.consumers)]
                        + [(S.ROLE_PRODUCER, i) for i in range(cfg.producers)])
        #: second -> {"sent", "received", "errors" (nacked + returned), "lat", "seen"}
        self.per_second: dict[int, dict] = {}
        self.window_lat = array("q")
        self.all_lat_count = 0
        self.producer_totals: dict[int, list] = {}
        self.consumer_counts: dict[int, dict[int, bytes]] = {}
        self.done: set[tuple[str, int]] = set()
        self.received_total = 0
        self.printed = 0

    def log(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    # -- reports ----------------------------------------------------------------------
    def on_second(self, role, index, second, rows, extra, writer: RunWriter) -> None:
        agg = self.per_second.setdefault(second, {"sent": 0, "received": 0, "errors": 0,
                                                  "lat": array("q"), "seen": set()})
        agg["seen"].add((role, index))
        t_us = (self.start_ns + second * 1_000_000_000) // 1000
        out = []
        for qi, counters, lat in rows:
            name = self.cfg.queues[qi]
            row = {"second": second, "time": t_us, "role": role, "worker": index,
                   "queue": name, "node": self.nodes.get(name, "")}
            row.update(zip(S.COUNTERS, counters))
            p50, p99, mx = lat if lat else (None, None, None)
            row.update(latency_p50_us=p50, latency_p99_us=p99, latency_max_us=mx)
            out.append(row)
            agg["sent"] += counters[0]
            agg["received"] += counters[4]
            agg["errors"] += counters[2] + counters[3]      # nacked + returned
            self.received_total += counters[4]
        writer.add_per_second(out)
        if extra is not None:
            lat_bytes, samples = extra
            lats = array("q")
            lats.frombytes(lat_bytes)
            agg["lat"].extend(lats)
            if second < self.cfg.time_s:
                self.window_lat.extend(lats)
            writer.add_samples(samples)

    def print_ready_seconds(self, force_until: float | None = None) -> None:
        now = time.time_ns()
        while self.printed in self.per_second:
            s = self.printed
            agg = self.per_second[s]
            alive = [w for w in self.workers if w not in self.done]
            complete = all(w in agg["seen"] for w in alive)
            late = now > self.start_ns + (s + 1 + LATE_PRINT_S) * 1e9
            if not (complete or late or (force_until is not None and s <= force_until)):
                return
            lat = sorted(agg["lat"])
            ms = [f"{_pct(lat, q) / 1000:.1f}" if lat else "-" for q in (0.5, 0.95, 0.99)]
            phase = "" if s < self.cfg.time_s else " (drain)"
            self.log(f"time {s + 1:>3} s{phase}, sent {agg['sent']} msg/s, received "
                     f"{agg['received']} msg/s, consumer latency p50/p95/p99 "
                     f"{ms[0]}/{ms[1]}/{ms[2]} ms, errors {agg['errors']}")
            agg["lat"] = array("q")
            self.printed += 1

    # -- the run ------------------------------------------------------------------------
    def _locate_queues(self) -> None:
        """Once the workers declared the queues: ask the management API
        (``params.management_url``) which node holds each (pipeline/loadtest/placement.py);
        its answer replaces ``--nodes``'s hash. Unreachable: left as it was, and said."""
        management = self.run_json.get("params", {}).get("management_url")
        if not management:
            return
        from .placement import queue_nodes
        try:
            found = queue_nodes(management, AMQPUrl.parse(self.cfg.url), self.cfg.queues)
        except (OSError, ValueError) as exc:
            self.log(f"shoal loadtest: queue placement not recorded from {management}: {exc}")
            return
        if not found:
            self.log(f"shoal loadtest: the management API at {management} lists none of the "
                     f"run's queues; queue placement not recorded from it")
            return
        self.nodes.update(found)
        self.run_json["placement"] = "management"
        self.run_json["queues"] = [{"queue": q, "node": self.nodes.get(q, "")}
                                   for q in self.cfg.queues]

    def run(self) -> dict:
        """Run the test; return the summary. Raises ``LoadTestFailed``."""
        warm_up()
        ctx = mp.get_context("spawn")
        reports = ctx.Queue()
        go, stop = ctx.Event(), ctx.Event()
        start_value = ctx.Value("q", 0)
        procs = [ctx.Process(target=run_worker, args=(role, i, self.cfg, reports, go,
                                                      start_value, stop),
                             name=f"loadtest-{role}-{i}", daemon=True)
                 for role, i in self.workers]
        for p in procs:
            p.start()
        self.procs = dict(zip(self.workers, procs))
        writer = None
        try:
            ready, server = set(), ""
            c = self.cfg
            # each queue (and binding) declared by its producer and its consumer
            objects = 2 * (len(c.queues) + c.bindings) + c.consumers * c.connections
            deadline = time.monotonic() + READY_TIMEOUT_S + READY_PER_OBJECT_S * objects
            while len(ready) < len(self.workers):
                msg = self._get(reports, deadline, "workers to connect")
                if msg[0] == READY:
                    ready.add((msg[1], msg[2]))
                    server = msg[3]
            self._locate_queues()
            self.start_ns = time.time_ns() + 200_000_000
            self.run_json.update(broker=server, start_ns=self.start_ns,
                                 start_iso=datetime.fromtimestamp(
                                     self.start_ns / 1e9, UTC).isoformat())
            writer = RunWriter(self.out_dir, self.run_json)
            start_value.value = self.start_ns
            go.set()
            self._collect(reports, stop, writer)
        except BaseException:
            stop.set()
            go.set()
            for p in procs:
                p.join(2)
                if p.is_alive():
                    p.terminate()
            if writer is not None:
                writer.abort()
            raise
        for p in procs:
            p.join(CLOSE_S + 10)       # the workers' connection.close (see workers.CLOSE_S)
            if p.is_alive():
                p.terminate()
        summary = self.summarize(writer)
        return summary

    def _get(self, reports, deadline: float, what: str):
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LoadTestFailed(f"timed out waiting for {what}")
            try:
                msg = reports.get(timeout=min(left, 0.2))
            except queue_mod.Empty:
                for (role, index), proc in self.procs.items():
                    if (role, index) not in self.done and proc.exitcode is not None:
                        raise LoadTestFailed(f"{role} {index}: exited with status "
                                             f"{proc.exitcode} without reporting")
                continue
            if msg[0] == ERROR:
                raise LoadTestFailed(f"{msg[1]} {msg[2]}: {msg[3]}")
            return msg

    def _collect(self, reports, stop, writer: RunWriter) -> None:
        producers = {w for w in self.workers if w[0] == S.ROLE_PRODUCER}
        end_ns = self.start_ns + int(self.cfg.time_s * 1e9)
        hard_deadline = time.monotonic() + self.cfg.time_s + 30 + FLUSH_S + DRAIN_MAX_S
        last_flush = time.monotonic()
        drain_started = None
        last_progress = (0, time.monotonic())
        while len(self.done) < len(self.workers):
            try:
                msg = self._get(reports, hard_deadline, "the workers to finish")
            except LoadTestFailed:
                stop.set()
                raise
            kind, role, index = msg[0], msg[1], msg[2]
            if kind == SECOND:
                self.on_second(role, index, msg[3], msg[4], msg[5], writer)
            elif kind == DONE:
                self.done.add((role, index))
                if role == S.ROLE_PRODUCER:
                    self.producer_totals[index] = msg[3]
                else:
                    self.consumer_counts[index] = msg[3]
            self.print_ready_seconds()
            now = time.monotonic()
            if now - last_flush >= FLUSH_EVERY_S:
                writer.flush()
                last_flush = now
            if producers <= self.done and not stop.is_set():
                if drain_started is None:
                    drain_started = now
                expected = self.copies * sum(t[0] - t[3] for rows in
                                             self.producer_totals.values() for _, t in rows)
                if self.received_total != last_progress[0]:
                    last_progress = (self.received_total, now)
                if (self.received_total >= expected or now - last_progress[1] >= DRAIN_IDLE_S
                        or now - drain_started >= DRAIN_MAX_S) and time.time_ns() > end_ns:
                    stop.set()
        self.print_ready_seconds(force_until=float("inf"))

    def summarize(self, writer: RunWriter) -> dict:
        c = self.cfg
        totals = dict.fromkeys(S.COUNTERS, 0)
        producers_rows = []
        for p, rows in sorted(self.producer_totals.items()):
            for qi, (sent, confirmed, nacked, returned) in rows:
                name = c.queues[qi]
                producers_rows.append({"producer": p, "queue": name,
                                       "node": self.nodes.get(name, ""), "sent": sent,
                                       "confirmed": confirmed, "nacked": nacked,
                                       "returned": returned})
                for k, v in zip(("sent", "confirmed", "nacked", "returned"),
                                (sent, confirmed, nacked, returned)):
                    totals[k] += v
        received_rows = []
        for p in sorted(self.producer_totals):
            sent = sum(t[0] for _, t in self.producer_totals[p])
            merged = merge_counts([counts.get(p, b"")
                                   for counts in self.consumer_counts.values()])
            received_rows.extend(received_runs(p, merged, sent))
        window_received = 0
        for s, agg in self.per_second.items():
            if s < c.time_s:
                window_received += agg["received"]
        lat = sorted(self.window_lat)
        import pyarrow as pa
        n = self.copies
        lost, dup = loss_and_duplicates(pa.table({
            "seq_start": pa.array([r[1] for r in received_rows], pa.int64()),
            "seq_end": pa.array([r[2] for r in received_rows], pa.int64()),
            "count": pa.array([r[3] for r in received_rows], pa.int32())}), n)
        received = sum(r[3] * (r[2] - r[1]) for r in received_rows)
        summary = {
            **totals, "received": received, "lost": lost, "duplicates": dup,
            "received_in_window": window_received,
            "time_s": c.time_s,
            "send_rate": round(totals["sent"] / c.time_s, 1),
            "receive_rate": round(window_received / c.time_s, 1),
            "copies": n,
            "consumed_ratio": round(window_received / (n * totals["sent"]), 4)
            if totals["sent"] else None,
            "latency_ms": {k: (round(_pct(lat, q) / 1000, 3) if lat else None)
                           for k, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99),
                                        ("max", 1.0))},
        }
        writer.close(producers_rows, received_rows, summary)
        ms = summary["latency_ms"]
        self.log(f"summary: sent {summary['sent']} ({summary['send_rate']:.0f} msg/s), "
                 f"received {summary['received_in_window']} in the sending window "
                 f"({summary['receive_rate']:.0f} msg/s), {received} in all"
                 + (f" ({n} copies of each message: fanout)" if n > 1 else "") +
                 f", lost {lost}, "
                 f"duplicates {dup}, confirmed {totals['confirmed']}, nacked "
                 f"{totals['nacked']}, returned {totals['returned']}; consumer latency "
                 f"p50/p95/p99/max {ms['p50']}/{ms['p95']}/{ms['p99']}/{ms['max']} ms")
        self.log(f"results: {self.out_dir}")
        return summary
