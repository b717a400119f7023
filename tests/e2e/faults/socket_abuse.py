"""Socket abuse against a running cluster (issue 22, point 5): while hostile clients do their
worst, a normal client keeps publishing and consuming, its latency stays within ``MAX_RATIO``
of what it was before, and the router's and nodes' memory stays bounded.

The abusers, all at once:

- ``idle``: many TCP connections that send nothing (half-open handshakes), closed by the
  broker after ``handshake_timeout``;
- ``slow reader``: a consumer with no prefetch limit on a queue fed by a producer, whose
  socket is never read again (the router's output buffer for it fills, then pauses);
- ``flooder``: a publisher that publishes as fast as its socket takes and never reads;
- ``huge``: a content header announcing a 1 GiB body (refused at once by max_message_size).

The normal client publishes one message every 5 ms and consumes it, measuring each round
trip. Figures go to docs/reliability.md; CI runs a small version (tests/e2e/
test_socket_abuse.py).

``python -m tests.e2e.faults.socket_abuse --idle 2000 --seconds 30``
"""
from __future__ import annotations

import argparse
import resource
import socket
import statistics
import threading
import time
from dataclasses import dataclass

import pika
from pamqp import body, commands as C, frame, header

from .fuzz_campaign import handshake

MAX_RATIO = 10.0


def _m(method, channel: int = 0) -> bytes:
    return frame.marshal(method, channel)


def _read_until_open(s: socket.socket) -> None:
    """Read the server's start, tune and open-ok (enough to go on)."""
    s.settimeout(5)
    got = b""
    while b"\x00\x0a\x00\x29" not in got:     # connection.open-ok (10, 41)
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed during the handshake")
        got += chunk


def _session(host: str, port: int) -> socket.socket:
    s = socket.create_connection((host, port))
    s.sendall(handshake())
    _read_until_open(s)
    s.sendall(_m(C.Channel.Open(), 1))
    return s


def latency_ms(url: str, seconds: float, queue: str) -> tuple[list[float], int]:
    """A normal client: publish one message every 5 ms and consume it. Returns the round
    trips in ms and how many messages never came back (within 5 s of the end)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare(queue, auto_delete=True)
    sent: dict[bytes, float] = {}
    out: list[float] = []

    def on_message(c, m, p, data):
        t0 = sent.pop(data, None)
        if t0 is not None:
            out.append((time.perf_counter() - t0) * 1000)
    ch.basic_consume(queue, on_message, auto_ack=True)
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        data = str(i).encode()
        sent[data] = time.perf_counter()
        ch.basic_publish("", queue, data)
        i += 1
        conn.process_data_events(time_limit=0.005)
    deadline = time.monotonic() + 5
    while sent and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    conn.close()
    return out, len(sent)


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else float("nan")


@dataclass
class Abuse:
    host: str
    port: int
    idle: int
    stop: threading.Event

    def run(self) -> dict:
        """Start every abuser; returns counters when ``stop`` is set."""
        found = {"idle_opened": 0, "idle_closed_by_broker": 0, "flood_bytes": 0,
                 "huge_refused": False}
        raise_fd_limit(self.idle + 512)
        idle = []
        for _ in range(self.idle):
            try:
                idle.append(socket.create_connection((self.host, self.port), timeout=5))
                found["idle_opened"] += 1
            except OSError:
                break
        threads = [threading.Thread(target=self._flood, args=(found,), daemon=True),
                   threading.Thread(target=self._slow_reader, daemon=True)]
        for t in threads:
            t.start()
        found["huge_refused"] = self._huge()
        self.stop.wait()
        for s in idle:
            try:
                s.setblocking(False)
                if s.recv(1) == b"":
                    found["idle_closed_by_broker"] += 1
            except (BlockingIOError, OSError):
                pass
            s.close()
        for t in threads:
            t.join(10)
        return found

    def _flood(self, found: dict) -> None:
        s = _session(self.host, self.port)
        frames = (_m(C.Basic.Publish(exchange="", routing_key="abuse-flood-nowhere"), 1)
                  + frame.marshal(header.ContentHeader(0, 100, C.Basic.Properties()), 1)
                  + frame.marshal(body.ContentBody(b"f" * 100), 1)) * 100
        s.settimeout(0.5)
        while not self.stop.is_set():
            try:
                s.sendall(frames)
                found["flood_bytes"] += len(frames)
            except socket.timeout:
                continue            # the router stopped reading: good
            except OSError:
                break
        s.close()

    def _slow_reader(self) -> None:
        s = _session(self.host, self.port)
        s.sendall(_m(C.Queue.Declare(queue="abuse-slow", auto_delete=True), 1)
                  + _m(C.Basic.Consume(queue="abuse-slow", no_ack=True), 1))
        feeder = pika.BlockingConnection(pika.ConnectionParameters(self.host, self.port))
        ch = feeder.channel()
        time.sleep(0.5)
        while not self.stop.is_set():     # never read by the slow reader
            try:
                ch.basic_publish("", "abuse-slow", b"s" * 1000)
                feeder.process_data_events(time_limit=0.001)
            except pika.exceptions.AMQPError:
                break
        feeder.close()
        s.close()

    def _huge(self) -> bool:
        s = _session(self.host, self.port)
        s.sendall(_m(C.Basic.Publish(exchange="", routing_key="abuse-huge"), 1)
                  + frame.marshal(header.ContentHeader(0, 1 << 30, C.Basic.Properties()), 1))
        s.settimeout(5)
        got = b""
        try:
            while b"\x00\x14\x00\x28" not in got:   # channel.close (20, 40)
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        except OSError:
            pass
        s.close()
        return b"\x01\x96" in got      # 406 in the close


def raise_fd_limit(want: int) -> None:
    """Raise this process's open-file limit toward ``want`` (children inherit it: call before
    starting a cluster that must accept that many connections)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, want), hard))


def rss_kb(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in open(f"/proc/{pid}/status"):
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def campaign(cl, idle: int, seconds: float) -> dict:
    """Baseline latency, then the same under abuse. Returns the figures."""
    pids = [r.pid for r in cl.routers] or [cl.router_pid]
    pids += [n.pid for n in cl.nodes if n.pid]
    base, base_missing = latency_ms(cl.url, seconds / 3, "abuse-normal-0")
    rss_before = rss_kb(pids)
    stop = threading.Event()
    abuse = Abuse(cl.host, cl.port, idle, stop)
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(abuse.run()), daemon=True)
    t.start()
    time.sleep(2.0)
    under, missing = latency_ms(cl.url, seconds, "abuse-normal-1")
    rss_peak = rss_kb(pids)
    stop.set()
    t.join(60)
    return dict(result, base_p99_ms=p99(base), abuse_p99_ms=p99(under),
                ratio=p99(under) / p99(base), base_n=len(base), abuse_n=len(under),
                missing=base_missing + missing,
                rss_before_mib=rss_before / 1024, rss_during_mib=rss_peak / 1024)


def main(argv: list[str] | None = None) -> int:
    import tempfile
    from pathlib import Path

    from tests.conftest import start_cluster, stop_cluster
    p = argparse.ArgumentParser(prog="python -m tests.e2e.faults.socket_abuse")
    p.add_argument("--idle", type=int, default=2000)
    p.add_argument("--seconds", type=float, default=30.0)
    a = p.parse_args(argv)
    raise_fd_limit(2 * a.idle + 1024)       # the cluster's processes inherit it
    with tempfile.TemporaryDirectory(prefix="shoal-abuse-") as d:
        cl = start_cluster(Path(d) / "cluster", 2)
        try:
            figures = campaign(cl, a.idle, a.seconds)
        finally:
            stop_cluster(cl, require_clean_exit=False)
    for k, v in figures.items():
        print(f"{k}: {v:.2f}" if isinstance(v, float) else f"{k}: {v}")
    ok = figures["ratio"] <= MAX_RATIO and figures["huge_refused"] and not figures["missing"]
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
