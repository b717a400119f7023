"""``shoal serve``: a local cluster of N node processes and R routers, supervised.

The launcher starts each process as ``python -m shoal.node`` / ``python -m shoal.cli router``
(so this package imports neither), waits until the routers accept connections, prints one
ready line, writes ``DATA_DIR/cluster.json`` (pids, ports, endpoints), restarts a child that
dies, and on SIGINT/SIGTERM stops the routers first (clients get ``connection.close`` 320) and
then the nodes.

With ``routers`` > 1 every router listens on the same AMQP port (SO_REUSEPORT: the kernel
spreads new connections over them) and links to every node; each also opens a direct port that
reaches it alone (``direct_port``), listed in cluster.json's ``routers`` for tests. A router
that dies is restarted on the same port while the others keep serving. Children get SIGTERM if
the launcher itself dies (``PR_SET_PDEATHSIG``), so nothing is orphaned.

With ``embed_node`` node-0 is not a process of its own: the router runs it in its event loop
(endpoint ``inproc://node-0``; the router's link hands it frames in memory; docs/performance.md
says why). cluster.json then gives node-0 the router's pid and ``"embedded": true``;
restarting the router restarts it, and it recovers from its journal in ``DATA_DIR/node-0``
like a node process. With several routers node-0 lives in router-0, which also binds the ipc
endpoint (``shared_endpoint``) where the other routers link to it over ZeroMQ.

One data directory holds one broker: ``shoal serve`` locks it before anything else
(shared/datadir.py), and each node process its own ``DATA_DIR/node-N``; a second ``shoal
serve`` on the same directory stops with one line naming it and the pid that holds it.

With ``pin_cpus`` (the default) each process is held to one CPU from before it starts
(``sched_setaffinity`` in the child), routers on the first share of the CPUs and nodes on the
rest (``shoal.shared.settings.cpu_plan``); cluster.json gives each its ``cpu``. On 4 CPUs or
more, with more processes than CPUs (the default layout there: 3 routers and 2 nodes on 4),
none is pinned and the kernel spreads them.
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from shoal.shared.datadir import DataDirLocked, lock_data_dir
from shoal.shared.settings import (ENV_CHECKED, LAUNCHED_FAILURE, LISTENERS, Settings,
                                  listen_error)

log = logging.getLogger("shoal.launcher")

READY_TIMEOUT_S = 60.0
#: A router's ready line (router/server.py).
_READY = re.compile(r"shoal router ready on (?P<host>\S+):(?P<port>\d+)"
                    r"(?: \(direct port (?P<direct>\d+)\))?")
STOP_TIMEOUT_S = 10.0


def _die_with_parent() -> None:
    """Child pre-exec: receive SIGTERM when the launcher dies (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _child_setup(cpu: int | None):
    """Child pre-exec: :func:`_die_with_parent`, and hold the process to ``cpu`` before it
    starts any thread, so that ZeroMQ's I/O thread runs on its Python thread's CPU."""
    def setup() -> None:
        _die_with_parent()
        if cpu is not None:
            try:
                os.sched_setaffinity(0, {cpu})
            except OSError:
                pass
    return setup


class PortError(RuntimeError):
    """A port of the cluster cannot be listened on: ``str()`` is the one line to print."""


class StartInterrupted(RuntimeError):
    """SIGINT/SIGTERM arrived while the cluster was starting (``Cluster.interrupt``)."""


class StopFlag:
    """Set by a signal handler, polled by the main thread. Not a ``threading.Event``: its
    ``set()`` in a handler can deadlock when the signal lands while the same thread is inside
    ``Event.wait()`` holding the event's lock (seen as a ``shoal serve`` that ignored SIGTERM,
    about once in 7 runs on a loaded machine)."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Until set or ``timeout`` s (polled every 50 ms); whether it is set."""
        deadline = time.monotonic() + timeout
        while not self._set and time.monotonic() < deadline:
            time.sleep(0.05)
        return self._set


def _listeners(settings: Settings) -> list[tuple[str, int, str | None]]:
    """The fixed ports the routers of ``shoal serve`` will listen on (0 = any free one, not
    checked): ``(setting, port, flag of shoal serve or None)``."""
    s = settings
    out = [("port", s.port, "--port")]
    if s.serve_routers() == 1:          # several routers: each gets a free direct port
        out.append(("direct_port", s.direct_port, None))
    out += [("tls_port", s.tls_port, None), ("management_port", s.management_port, None),
            ("prometheus_port", s.prometheus_port, None)]
    return [(name, port, flag) for name, port, flag in out if port > 0]


def check_ports(settings: Settings) -> None:
    """Raise PortError (one line naming the port and the flag or setting to change) when a
    fixed port of the cluster is in use or given twice, before any process starts. A socket
    without SO_REUSEPORT is bound and closed: that fails when anything listens there, another
    ``shoal serve`` too (whose routers would otherwise share the port with ours)."""
    seen: dict[int, str] = {}
    for name, port, flag in _listeners(settings):
        if port in seen:
            raise PortError(f"port {port} is given to both the {LISTENERS[seen[port]]} "
                            f"({seen[port]}) and the {LISTENERS[name]} ({name}); choose "
                            f"another for one of them")
        seen[port] = name
        try:
            infos = socket.getaddrinfo(settings.host or None, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        except socket.gaierror as exc:
            raise PortError(f"cannot listen on {settings.host}:{port}: {exc.strerror}; check "
                            f"--host or SHOAL_HOST") from None
        for family, kind, proto, _name, addr in infos:
            with socket.socket(family, kind, proto) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio does
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                try:
                    sock.bind(addr)
                except OSError as exc:
                    raise PortError(listen_error(name, settings.host, port, exc, flag)) \
                        from None


def _child_env() -> dict[str, str]:
    """The children's environment: ours, and ``SHOAL_ENV_CHECKED`` (the launcher warned about
    unknown ``SHOAL_*`` variables already; the children do not repeat it)."""
    return {**os.environ, ENV_CHECKED: "1"}


def _listening(endpoint: str) -> bool:
    """Whether a node bound ``endpoint`` (tcp: it accepts a connection; ipc/unix: its socket
    file exists)."""
    scheme, _, rest = endpoint.partition("://")
    if scheme in ("ipc", "unix"):
        return os.path.exists(rest)
    host, _, port = rest.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def _endpoint(run_dir: Path, node_id: str, local_link: str = "zmq") -> str:
    """Where node ``node_id`` listens: ``ipc://`` (``local_link`` zmq) or ``unix://``
    (``local_link`` unix) in the run directory, or ZeroMQ on a free TCP port when that path is
    too long for a socket address."""
    path = run_dir / f"{node_id}.sock"
    if len(str(path)) < 100:  # sun_path limit
        return f"{'unix' if local_link == 'unix' else 'ipc'}://{path}"
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


class Cluster:
    """The child processes of one ``shoal serve``."""

    def __init__(self, settings: Settings, config_file: str | None) -> None:
        self.settings = settings
        self.config_file = config_file
        self.data_dir = Path(settings.data_dir).expanduser().resolve()
        self.run_dir = self.data_dir / "run"
        self.nodes: list[dict] = []
        #: one dict per router: id, pid, direct_port (routers > 1)
        self.routers: list[dict] = []
        self.router_addr: tuple[str, int] | None = None
        self.procs: dict[str, subprocess.Popen] = {}
        self.stopping = False
        #: set by SIGINT/SIGTERM: the start-up's waits give up (StartInterrupted)
        self.interrupt = StopFlag()
        #: nodes that run inside router-0 (embed_node: node-0) rather than as processes
        self.embedded = 1 if settings.embed_node else 0
        #: the CPU of router i and of node process i (pin_cpus; empty lists: not pinned)
        self.router_cpus, self.node_cpus = settings.serve_cpus(
            settings.serve_routers(), settings.nodes - self.embedded)

    def _common(self) -> list[str]:
        return ["--config", self.config_file] if self.config_file else []

    def _spawn_node(self, node: dict) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "shoal.node", "--node-id", node["id"], "--bind",
               node["endpoint"], "--data-dir", str(self.data_dir / node["id"]), *self._common()]
        if node.get("peer_endpoint"):
            cmd += ["--peer-bind", node["peer_endpoint"]]
        # every other node process, for quorum queues (a node inside router-0 has no peers)
        for other in self.nodes:
            if other is not node and not other.get("embedded"):
                cmd += ["--peer", f"{other['id']}={other.get('peer_endpoint') or other['endpoint']}"]
        proc = subprocess.Popen(cmd, preexec_fn=_child_setup(node.get("cpu")), env=_child_env())
        self.procs[node["id"]] = proc
        node["pid"] = proc.pid
        return proc

    def _spawn_router(self, router: dict) -> subprocess.Popen:
        s = self.settings
        port = self.router_addr[1] if self.router_addr else s.port
        # Through the shoal command, which can host nodes in the router (inproc:// endpoints).
        cmd = [sys.executable, "-m", "shoal.cli", "router", "--host", s.host, "--port",
               str(port), "--data-dir", str(self.data_dir), "--max-message-size",
               str(s.max_message_size), "--launched", *self._common()]
        if s.load_definitions:
            cmd += ["--definitions", str(Path(s.load_definitions).expanduser().resolve())]
        if s.serve_routers() > 1:
            cmd += ["--direct-port", str(router.get("direct_port", 0))]
        for node in self.nodes:
            endpoint = node["endpoint"]
            if node.get("embedded") and router["id"] != "router-0":
                endpoint = node["shared_endpoint"]      # node-0 lives in router-0
            elif node.get("embedded") and "shared_endpoint" in node:
                cmd += ["--embed-bind", node["shared_endpoint"]]
            cmd += ["--node", f"{node['id']}={endpoint}"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=_child_env(),
                                preexec_fn=_child_setup(router.get("cpu")))
        self.procs[router["id"]] = proc
        router["pid"] = proc.pid
        for node in self.nodes:
            if node.get("embedded") and router["id"] == "router-0":
                node["pid"] = proc.pid
        return proc

    def _start_router(self, router: dict) -> None:
        """Spawn ``router`` and wait until it accepts connections; the first one fixes the
        cluster's address (the port chosen for port 0), the others share it."""
        host, port, direct = self._await_ready(self._spawn_router(router))
        if self.router_addr is None:
            self.router_addr = (host, port)
        if direct is not None:
            router["direct_port"] = direct

    def _await_ready(self, proc: subprocess.Popen) -> tuple[str, int, int | None]:
        """Wait for the router's ready line: (host, port, direct port or None). A router that
        cannot start says why in one line (``--launched``): that line is raised as
        PortError, to be printed as the launcher's own."""
        lines: queue.Queue = queue.Queue()

        def reader() -> None:
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)
        threading.Thread(target=reader, daemon=True).start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        failure = ""
        while time.monotonic() < deadline:
            if self.interrupt.is_set():
                raise StartInterrupted("stopped during start-up")
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                code = proc.wait()
                if failure:
                    raise PortError(failure)
                raise RuntimeError(f"router exited with code {code} before it was ready")
            if line.startswith(LAUNCHED_FAILURE):
                failure = line[len(LAUNCHED_FAILURE):].strip()
                continue
            m = _READY.match(line)
            if m:
                direct = m["direct"]
                return m["host"], int(m["port"]), int(direct) if direct else None
        raise RuntimeError(f"router not ready after {READY_TIMEOUT_S:.0f} s")

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        link = self.settings.serve_local_link()
        for i in range(self.settings.nodes):
            node = {"id": f"node-{i}"}
            self.nodes.append(node)
            if i == 0 and self.settings.embed_node:
                node.update(endpoint=f"inproc://{node['id']}", embedded=True)
                if self.settings.serve_routers() > 1:
                    node["shared_endpoint"] = _endpoint(self.run_dir, node["id"], link)
                continue
            node["endpoint"] = _endpoint(self.run_dir, node["id"], link)
            if node["endpoint"].startswith("unix://"):      # the other nodes' own socket
                node["peer_endpoint"] = _endpoint(self.run_dir, node["id"] + "-peer", link)
            if self.node_cpus:
                node["cpu"] = self.node_cpus[i - self.embedded]
        for node in self.nodes:
            if not node.get("embedded"):
                self._spawn_node(node)
        self._await_nodes()
        for i in range(self.settings.serve_routers()):
            router = {"id": f"router-{i}"}
            if self.router_cpus:
                router["cpu"] = self.router_cpus[i]
            self.routers.append(router)
            self._start_router(router)
        self._write_state()

    def _await_nodes(self) -> None:
        """Wait (up to READY_TIMEOUT_S) until every node process listens on its endpoint, so
        that the routers find them all at once: a router serves after 3 s with the nodes that
        answered (router/broker.py), which is right for a node that is down, not for one
        still opening its journal on this host. A node that exits is not waited for."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        waiting = [n for n in self.nodes if not n.get("embedded")]
        while waiting and time.monotonic() < deadline:
            waiting = [n for n in waiting if self.procs[n["id"]].poll() is None
                       and not _listening(n["endpoint"])]
            if self.interrupt.is_set():
                raise StartInterrupted("stopped during start-up")
            if waiting:
                time.sleep(0.05)

    def _write_state(self) -> None:
        host, port = self.router_addr
        state = {"router": {"pid": self.routers[0]["pid"], "host": host, "port": port},
                 "routers": [dict(r) for r in self.routers],
                 "nodes": [dict(n) for n in self.nodes]}
        tmp = self.data_dir / "cluster.json.tmp"
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.data_dir / "cluster.json")

    def supervise(self, stop: StopFlag) -> None:
        """Restart children that die until ``stop`` is set."""
        while not stop.wait(0.5):
            for node in self.nodes:
                proc = self.procs.get(node["id"])   # None: embedded in the router
                if proc is not None and proc.poll() is not None and not stop.is_set():
                    log.warning("%s exited with code %s; restarting it", node["id"],
                                proc.returncode)
                    self._spawn_node(node)
                    self._write_state()
            for router in self.routers:
                proc = self.procs[router["id"]]
                if proc.poll() is not None and not stop.is_set():
                    log.warning("%s exited with code %s; restarting it", router["id"],
                                proc.returncode)
                    try:
                        self._start_router(router)
                        self._write_state()
                    except RuntimeError as exc:
                        log.error("%s", exc)

    def stop(self) -> None:
        """Routers first (clients get 320), then the nodes; SIGKILL what outlives the timeout."""
        routers = [self.procs[r["id"]] for r in self.routers if r["id"] in self.procs]
        for group in (routers, [self.procs[n["id"]] for n in self.nodes if n["id"] in self.procs]):
            for proc in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            for proc in group:
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.error("pid %d did not stop in time; killing it", proc.pid)
                    proc.kill()
                    proc.wait()
        try:
            (self.data_dir / "cluster.json").unlink()
        except OSError:
            pass


def serve(settings: Settings, config_file: str | None) -> int:
    """Run a local cluster until SIGINT/SIGTERM. Returns the exit code (0 on a clean stop)."""
    stop = StopFlag()

    def on_signal(signum, frame) -> None:
        stop.set()
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        lock = lock_data_dir(settings.data_dir)     # held until this process ends
    except (DataDirLocked, OSError) as exc:
        print(f"shoal serve: {exc}", file=sys.stderr)
        return 1
    try:
        check_ports(settings)
    except PortError as exc:
        print(f"shoal serve: {exc}", file=sys.stderr)
        return 1
    cluster = Cluster(settings, config_file)
    cluster.interrupt = stop                # SIGTERM honoured at every point of the start
    try:
        cluster.start()
    except StartInterrupted:
        cluster.stop()
        return 0
    except (RuntimeError, OSError) as exc:
        print(f"shoal serve: {exc}", file=sys.stderr)
        cluster.stop()
        return 1
    host, port = cluster.router_addr
    routers = f", {len(cluster.routers)} routers" if len(cluster.routers) > 1 else ""
    print(f"shoal ready: accepting AMQP 0-9-1 connections on {host}:{port} "
          f"({len(cluster.nodes)} nodes{routers})", flush=True)
    cluster.supervise(stop)
    cluster.stop()
    os.close(lock)
    return 0
