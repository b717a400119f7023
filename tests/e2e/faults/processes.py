"""A cluster of separate ``shoal node`` and ``shoal router`` processes, as the Helm chart runs
them (one per pod), that a test starts, stops, kills, hangs and restarts one by one; nothing
restarts them behind the test's back (``shoal serve``'s launcher would). For the issue 36
tests (tests/e2e/faults/test_degraded.py): a router that starts while a node is missing, a
node that comes late, a node or a router that hangs.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pika
import zmq

from shoal.shared.wire import WIRE_VERSION, T, decode_batch, encode_batch
from tests.conftest import free_port

#: How long a process may take to start, at most (a bound, not a timing being tested).
START_S = 30.0



class Proc:
    """One process: its command, its log file, and the ``ready`` line it printed."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.name, self.argv, self.log, self.env = name, argv, log, env
        self.popen: subprocess.Popen | None = None
        self.ready = threading.Event()

    def start(self) -> None:
        self.ready.clear()
        err = open(self.log, "ab")
        self.popen = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=err,
                                      env=self.env, start_new_session=True)
        err.close()
        threading.Thread(target=self._read, args=(self.popen,), daemon=True).start()

    def _read(self, popen: subprocess.Popen) -> None:
        for line in popen.stdout:
            if b"ready on" in line:
                self.ready.set()

    def send(self, sig: int) -> None:
        assert self.popen is not None and self.popen.poll() is None, f"{self.name} not running"
        os.kill(self.popen.pid, sig)

    def stop(self, sig: int = signal.SIGTERM, wait: float = 20.0) -> int | None:
        """Send ``sig`` (SIGCONT first, in case it is stopped) and wait; kill -9 after
        ``wait`` s. Returns the exit code."""
        p = self.popen
        if p is None or p.poll() is not None:
            return None if p is None else p.returncode
        os.kill(p.pid, signal.SIGCONT)
        os.kill(p.pid, sig)
        try:
            return p.wait(wait)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
            return None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return f"--- {self.name} ---\n" + self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class Processes:
    """``nodes`` node processes on 127.0.0.1 (linked to each other as peers) and ``routers``
    routers linked to all of them, in ``base``; started one by one by the test."""

    def __init__(self, base: Path, nodes: int = 3, routers: int = 1,
                 env: dict[str, str] | None = None) -> None:
        self.base = base
        self.env = dict(os.environ, SHOAL_MANAGEMENT_PORT="0", SHOAL_PROMETHEUS_PORT="0",
                        SHOAL_LOG_LEVEL="info")
        self.env.update(env or {})
        self.node_ids = [f"node-{i}" for i in range(nodes)]
        self.endpoints = {n: f"tcp://127.0.0.1:{free_port()}" for n in self.node_ids}
        self.nodes: dict[str, Proc] = {}
        for n in self.node_ids:
            peers = [a for m in self.node_ids if m != n for a in
                     ("--peer", f"{m}={self.endpoints[m]}")]
            argv = [sys.executable, "-m", "shoal.cli", "node", "--node-id", n, "--bind",
                    self.endpoints[n], "--data-dir", str(base / n), *peers]
            self.nodes[n] = Proc(n, argv, base / f"{n}.log", self.env)
        self.ports = [free_port() for _ in range(routers)]
        self.routers: list[Proc] = []
        for i, port in enumerate(self.ports):
            argv = [sys.executable, "-m", "shoal.cli", "router", "--port", str(port),
                    *(a for n in self.node_ids for a in ("--node", f"{n}={self.endpoints[n]}"))]
            self.routers.append(Proc(f"router-{i}", argv, base / f"router-{i}.log", self.env))

    def start_all(self) -> None:
        """Every node, then every router (each serving before the next starts)."""
        for n in self.nodes.values():
            n.start()
        for i in range(len(self.routers)):
            self.start_router(i)

    def start_router(self, i: int = 0) -> None:
        r = self.routers[i]
        r.start()
        assert r.ready.wait(START_S), f"router-{i} did not serve\n{self.log_tails()}"

    def params(self, i: int = 0, **kw) -> pika.ConnectionParameters:
        return pika.ConnectionParameters("127.0.0.1", self.ports[i], connection_attempts=3,
                                         retry_delay=0.5, **kw)

    def connect(self, i: int = 0, **kw) -> pika.BlockingConnection:
        return pika.BlockingConnection(self.params(i, **kw))

    def log_tails(self) -> str:
        return "\n".join(p.log_tail() for p in [*self.nodes.values(), *self.routers])

    def stop_all(self) -> list[int | None]:
        codes = [r.stop() for r in self.routers]
        return codes + [n.stop() for n in self.nodes.values()]


def catalogue_of(endpoint: str, node_id: str) -> dict[str, set[str]]:
    """What the node at ``endpoint`` knows of the other nodes' queues (its TOPOLOGY_SNAPSHOT's
    catalogue, node/replication/catalogue.py): node id -> queue names. Asked as a router
    would, over the node link; raises TimeoutError when it does not answer in 5 s."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    try:
        s.send(encode_batch([[T.HELLO, WIRE_VERSION, "probe", node_id],
                             [T.TOPOLOGY_SNAPSHOT, 1]]))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if s.poll(200):
                for msg in decode_batch(s.recv()):
                    if msg[0] == T.REPLY and msg[1] == 1:
                        s.send(encode_batch([[T.GOODBYE]]))
                        return {row[0]: {q[1] for q in row[3]} for row in msg[4][3]}
        raise TimeoutError(f"{node_id} did not answer")
    finally:
        s.close(0)
        ctx.term()


def wait_for(what: str, check, timeout: float = START_S, every: float = 0.2):
    """Call ``check()`` until it returns a true value (returned) or ``timeout`` s pass; an
    exception counts as not yet. Raises AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            got = check()
            if got:
                return got
        except Exception as exc:  # noqa: BLE001 - not yet
            last = exc
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout} s (last error: {last!r})")
