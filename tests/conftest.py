"""Shared fixtures: a real Shoal cluster started as processes (``shoal serve``).

Contract used (see tests/e2e/README in the e2e module docstrings):

``python -m shoal.cli serve --host 127.0.0.1 --port 0 --nodes N --data-dir DIR`` prints
one line ``shoal ready: accepting AMQP 0-9-1 connections on HOST:PORT (N nodes)`` when the
router accepts connections and writes ``DIR/cluster.json``. SIGTERM stops it: exit status 0 and
every child process gone.

``SHOAL_E2E_EMBED=1`` starts every cluster with ``--embed-node`` (node-0 inside the router
process); tests that need node-0 to be a process of its own are then skipped.
``SHOAL_LOCAL_LINK=zmq`` (a setting, passed on to ``shoal serve``) links every cluster's
routers and nodes with ZeroMQ's ``ipc://`` instead of serve's default, the same-host
``unix://`` link.

Every cluster runs with ``SHOAL_WIRE_CHECK=1`` (shared/wire.py): batches handed over in memory
between the router and node-0 are checked to carry what the ZeroMQ link would, and a cluster
whose log says ``wire check failed`` fails the test at shutdown.

``SHOAL_E2E_URL=amqp://guest:guest@127.0.0.1:5672/`` runs the client scenarios against an
already running broker (e.g. RabbitMQ, to debug the tests themselves); tests that need the
cluster's processes (kill a node, SIGTERM) are then skipped.
"""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

READY_RE = re.compile(
    r"shoal ready: accepting AMQP 0-9-1 connections on (?P<host>\S+):(?P<port>\d+) "
    r"\((?P<nodes>\d+) nodes(?:, (?P<routers>\d+) routers)?\)")
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 20.0
EXTERNAL_URL = os.environ.get("SHOAL_E2E_URL", "").strip()
EMBED = os.environ.get("SHOAL_E2E_EMBED", "").strip().lower() in ("1", "true", "yes")
#: What shared/wire.py logs when a batch handed over in memory breaks the wire's rules.
WIRE_CHECK_FAILED = "wire check failed"


#: Ports :func:`free_port` hands out: below the kernel's ephemeral range, one slice per
#: pytest-xdist worker.
PORT_BASE, PORT_SLICE = 20000, 1500
_next_port: list[int] = []


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a cluster's fixed ports (management,
    Prometheus, TLS, a process's AMQP port). Taken below the kernel's ephemeral range
    (``net.ipv4.ip_local_port_range``), which ``bind(0)`` (``shoal serve --port 0``) and
    outgoing connections draw from. It is picked in turn from this xdist worker's own slice.
    Two workers never pick the same port, and the kernel never hands out one picked here.
    Before, a port picked with ``bind(0)`` was once handed out again to another cluster's
    AMQP listener before our router bound it, and the two shared it silently
    (SO_REUSEPORT): an HTTP request read "AMQP" back."""
    import socket

    from shoal.deploy.dockercluster import first_free   # no docker needed to import it
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    k = int(worker[2:]) if worker[2:].isdigit() else 0
    base = PORT_BASE + (k % 8) * PORT_SLICE
    if base + PORT_SLICE > low:             # an unusual range: the kernel's choice
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    if not _next_port:
        _next_port.append(base + (os.getpid() % PORT_SLICE))
    start = _next_port[0] - base
    port = first_free(base + (start + i) % PORT_SLICE for i in range(PORT_SLICE))
    if port is None:
        raise RuntimeError(f"no free port in {base}-{base + PORT_SLICE - 1}")
    _next_port[0] = port + 1
    return port


def _proc_start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time): tells a live pid from a reused one."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = data.rsplit(")", 1)[-1].split()
    if len(fields) > 19 and fields[0] != "Z":       # fields[0] is the state; Z = zombie
        return fields[19]
    return None


def _pid_alive(pid: int, start_time: str | None) -> bool:
    now = _proc_start_time(pid)
    return now is not None and (start_time is None or now == start_time)


@dataclass
class NodeInfo:
    id: str
    pid: int | None
    endpoint: str = ""
    start_time: str | None = None
    embedded: bool = False    #: runs inside the router process (``--embed-node``)


@dataclass
class RouterInfo:
    id: str
    pid: int
    direct_port: int | None = None   #: reaches this router alone (clusters of several routers)
    start_time: str | None = None


@dataclass
class Cluster:
    """What a test sees of a running broker."""

    host: str
    port: int
    node_ids: list[str]
    nodes: list[NodeInfo] = field(default_factory=list)
    router_pid: int | None = None
    launcher: subprocess.Popen | None = None
    data_dir: Path | None = None
    external: bool = False
    vhost: str = "/"
    user: str = "guest"
    password: str = "guest"
    log_path: Path | None = None
    stdout_lines: list[str] = field(default_factory=list)
    router_start: str | None = None
    killed: bool = False      #: a test killed a process: the launcher may exit non-zero
    stopped: bool = False
    routers: list[RouterInfo] = field(default_factory=list)

    @property
    def url(self) -> str:
        return (f"amqp://{self.user}:{self.password}@{self.host}:{self.port}/"
                f"{urllib.parse.quote(self.vhost, safe='')}")

    def router_url(self, index: int) -> str:
        """The URL of router ``index`` alone (its direct port; clusters of several routers)."""
        port = self.routers[index].direct_port
        assert port, "this cluster has one router: use url"
        return (f"amqp://{self.user}:{self.password}@{self.host}:{port}/"
                f"{urllib.parse.quote(self.vhost, safe='')}")

    def kill_router(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Kill router ``index`` (the launcher restarts it on the same ports)."""
        self.killed = True
        os.kill(self.routers[index].pid, sig)

    def node(self, node_id: str) -> NodeInfo:
        return next(n for n in self.nodes if n.id == node_id)

    def owner(self, queue_name: str) -> str:
        """The node owning ``queue_name`` (the router's own placement function)."""
        from shoal.shared.placement import owner
        return owner(self.vhost, queue_name, self.node_ids)

    def queue_on(self, node_id: str, prefix: str = "q") -> str:
        """A fresh unique queue name that the placement puts on ``node_id``."""
        for _ in range(10_000):
            name = f"e2e-{prefix}-{uuid.uuid4().hex[:12]}"
            if self.owner(name) == node_id:
                return name
        raise AssertionError(f"no queue name found for {node_id}")

    def queues_on_distinct_nodes(self, count: int, prefix: str = "q") -> list[str]:
        assert count <= len(self.node_ids), "more queues than nodes"
        return [self.queue_on(n, prefix) for n in self.node_ids[:count]]

    def log_tail(self, chars: int = 4000) -> str:
        out = "\n".join(self.stdout_lines[-40:])
        err = ""
        if self.log_path and self.log_path.exists():
            err = self.log_path.read_text(errors="replace")[-chars:]
        return f"--- stdout ---\n{out}\n--- stderr (tail) ---\n{err}"

    def stop(self, require_clean_exit: bool = True, sig: int | None = signal.SIGTERM) -> None:
        """Stop the cluster now and assert a clean exit (see ``stop_cluster``)."""
        self.stopped = True
        stop_cluster(self, require_clean_exit, sig)

    def kill_node(self, node_id: str, sig: int = signal.SIGKILL) -> None:
        node = self.node(node_id)
        assert node.pid is not None
        if node.embedded:
            pytest.skip(f"{node_id} runs inside the router process (--embed-node): killing it "
                        "would kill the router too, which this test does not mean")
        os.kill(node.pid, sig)


def _external_cluster(nodes: int) -> Cluster:
    u = urllib.parse.urlparse(EXTERNAL_URL)
    vhost = urllib.parse.unquote(u.path[1:]) if u.path not in ("", "/") else "/"
    ids = [f"node-{i}" for i in range(nodes)]
    return Cluster(host=u.hostname or "127.0.0.1", port=u.port or 5672, node_ids=ids,
                   nodes=[NodeInfo(i, None) for i in ids], external=True, vhost=vhost,
                   user=urllib.parse.unquote(u.username or "guest"),
                   password=urllib.parse.unquote(u.password or "guest"))


def _reader(stream, lines: "queue.Queue[str | None]", keep: list[str]) -> None:
    for line in stream:
        line = line.rstrip("\n")
        keep.append(line)
        lines.put(line)
    lines.put(None)


def start_cluster(data_dir: Path, nodes: int, embed: bool = EMBED, routers: int = 1,
                  env: dict[str, str] | None = None) -> Cluster:
    """Start ``shoal serve`` (``--embed-node`` when ``embed``: node-0 then lives in router-0;
    ``--routers`` when ``routers`` > 1; ``env``: extra environment) and wait (bounded) until
    it is ready and cluster.json is written."""
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "launcher.stderr.log"
    log = open(log_path, "wb")
    # SHOAL_E2E_SERVE_CMD replaces "python -m shoal.cli" (to test this harness itself)
    prefix = os.environ.get("SHOAL_E2E_SERVE_CMD", "").split() or [
        sys.executable, "-m", "shoal.cli"]
    cmd = prefix + ["serve", "--host", "127.0.0.1", "--port", "0", "--nodes", str(nodes),
                    "--data-dir", str(data_dir), *(["--embed-node"] if embed else []),
                    *(["--routers", str(routers)] if routers > 1 else [])]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                            text=True, bufsize=1, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1",
                                 "SHOAL_WIRE_CHECK": "1", "SHOAL_MANAGEMENT_PORT": "0",
                                 "SHOAL_PROMETHEUS_PORT": "0",
                                 **(env or {})})
    log.close()
    lines: queue.Queue[str | None] = queue.Queue()
    kept: list[str] = []
    threading.Thread(target=_reader, args=(proc.stdout, lines, kept), daemon=True).start()
    partial = Cluster(host="127.0.0.1", port=0, node_ids=[], launcher=proc, data_dir=data_dir,
                      log_path=log_path, stdout_lines=kept)

    def fail(why: str) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        pytest.fail(f"shoal serve ({' '.join(cmd)}): {why}\n{partial.log_tail()}",
                    pytrace=False)

    deadline = time.monotonic() + READY_TIMEOUT
    match = None
    while match is None:
        left = deadline - time.monotonic()
        if left <= 0:
            fail(f"no ready line within {READY_TIMEOUT:.0f} s")
        try:
            line = lines.get(timeout=min(left, 0.5))
        except queue.Empty:
            continue
        if line is None:
            fail(f"stdout closed before the ready line (exit status {proc.wait(5)})")
        match = READY_RE.search(line)
    if int(match["nodes"]) != nodes:
        fail(f"ready line announces {match['nodes']} nodes, expected {nodes}")
    if int(match["routers"] or 1) != routers:
        fail(f"ready line announces {match['routers'] or 1} routers, expected {routers}")
    port = int(match["port"])
    if port == 0:
        fail("ready line shows port 0, expected the port actually bound")

    info_path = data_dir / "cluster.json"
    info = None
    while info is None:
        try:
            info = json.loads(info_path.read_text())
        except (OSError, ValueError):
            if time.monotonic() > deadline + 5:
                fail(f"{info_path} missing or not valid JSON after the ready line")
            time.sleep(0.05)
    node_infos = [NodeInfo(n["id"], int(n["pid"]), n.get("endpoint", ""),
                           _proc_start_time(int(n["pid"])), bool(n.get("embedded")))
                  for n in info["nodes"]]
    if [n.id for n in node_infos] != [f"node-{i}" for i in range(nodes)]:
        fail(f"cluster.json node ids {[n.id for n in node_infos]} are not node-0..node-{nodes-1}")
    if info["router"]["port"] != port:
        fail(f"cluster.json router port {info['router']['port']} != ready line port {port}")
    partial.host = match["host"]
    partial.port = port
    partial.node_ids = [n.id for n in node_infos]
    partial.nodes = node_infos
    partial.router_pid = int(info["router"]["pid"])
    partial.router_start = _proc_start_time(partial.router_pid)
    partial.routers = [RouterInfo(r["id"], int(r["pid"]), r.get("direct_port"),
                                  _proc_start_time(int(r["pid"])))
                       for r in info.get("routers", [])]
    if len(partial.routers) != routers or (routers > 1 and not all(
            r.direct_port for r in partial.routers)):
        fail(f"cluster.json lists routers {info.get('routers')}, expected {routers} "
             "(each with a direct port when several)")
    return partial


def stop_cluster(cluster: Cluster, require_clean_exit: bool = True,
                 sig: int | None = signal.SIGTERM) -> None:
    """Send ``sig`` to the launcher (``None``: a test already did), wait, assert exit 0 and
    that no child survives (then clean up anyway)."""
    proc = cluster.launcher
    assert proc is not None
    problems = []
    children = [(f"router pid {cluster.router_pid}", cluster.router_pid,
                 cluster.router_start)]
    children += [(f"{r.id} pid {r.pid}", r.pid, r.start_time) for r in cluster.routers
                 if r.pid != cluster.router_pid]
    children += [(f"{n.id} pid {n.pid}", n.pid, n.start_time) for n in cluster.nodes]
    # The launcher may have replaced a dead node or router: look at cluster.json again.
    try:
        info = json.loads((cluster.data_dir / "cluster.json").read_text())
        for n in info["nodes"] + info.get("routers", []):
            if all(int(n["pid"]) != c[1] for c in children):
                children.append((f"{n['id']} pid {n['pid']} (restarted)", int(n["pid"]),
                                 _proc_start_time(int(n["pid"]))))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    already = proc.poll() if sig is not None else None
    if already is None:
        if sig is not None:
            proc.send_signal(sig)
        try:
            rc = proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            rc = None
            problems.append(f"launcher still running {STOP_TIMEOUT:.0f} s after the signal")
        if rc is not None and rc != 0 and require_clean_exit:
            problems.append(f"launcher exited with status {rc} after the signal, expected 0")
    elif require_clean_exit:
        problems.append(f"launcher had already exited (status {already}) before SIGTERM")
    deadline = time.monotonic() + 3.0
    alive = [c for c in children if c[1] and _pid_alive(c[1], c[2])]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [c for c in alive if _pid_alive(c[1], c[2])]
    if alive:
        problems.append("orphaned child processes still alive after the launcher exited: "
                        + ", ".join(c[0] for c in alive))
    for _, pid, st in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait(5)
    if cluster.log_path and cluster.log_path.exists() and \
            WIRE_CHECK_FAILED in cluster.log_path.read_text(errors="replace"):
        problems.append(f"the cluster's log says '{WIRE_CHECK_FAILED}' "
                        f"(see {cluster.log_path})")
    if problems:
        pytest.fail("cluster shutdown: " + "; ".join(problems) + "\n" + cluster.log_tail(),
                    pytrace=False)


#: Test folders whose tests share one outside resource and so run on one pytest-xdist worker
#: (one after another): RabbitMQ on 127.0.0.1:5672 (test_access imports definitions into it),
#: one local Spark session (a JVM) for the whole folder.
SHARED_RESOURCE_GROUPS = {"tests/e2e/side_by_side/": "rabbitmq", "tests/spark/": "spark"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """With pytest-xdist (``-n N --dist loadgroup``, the default in pyproject.toml) each test
    module runs whole on one worker, so a module's cluster (``cluster3``, ``routers2``) is
    started once; the folders of SHARED_RESOURCE_GROUPS run on one worker each. A module may
    name its own group with ``pytest.mark.xdist_group``.

    ``tryfirst``: xdist's worker reads the markers in its own hook of this name (it appends
    the group to each test's node id, which its scheduler groups by). Run after it, as this
    hook did until issue 47's session, the markers were added too late, and each module's
    tests, Spark's and RabbitMQ's side-by-side ones too, went to every worker
    (tests/house/test_grouping.py)."""
    root = Path(str(config.rootpath))
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        path = Path(str(item.fspath)).relative_to(root).as_posix()
        group = next((g for prefix, g in SHARED_RESOURCE_GROUPS.items()
                      if path.startswith(prefix)), path)
        item.add_marker(pytest.mark.xdist_group(group))


def _cluster_fixture(tmp_path_factory, nodes: int) -> Iterator[Cluster]:
    if EXTERNAL_URL:
        yield _external_cluster(nodes)
        return
    c = start_cluster(tmp_path_factory.mktemp(f"shoal-{nodes}n"), nodes)
    yield c
    stop_cluster(c)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    """A 2-node cluster shared by the whole session. Tests must use unique names."""
    yield from _cluster_fixture(tmp_path_factory, 2)


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory) -> Iterator[Cluster]:
    """A 3-node cluster shared by one module."""
    yield from _cluster_fixture(tmp_path_factory, 3)


@pytest.fixture(scope="module")
def routers2(tmp_path_factory) -> Iterator[Cluster]:
    """A cluster of 2 routers and 2 nodes shared by one module (``router_url(i)`` reaches
    router i alone). Never external; with SHOAL_E2E_EMBED node-0 lives in router-0."""
    if EXTERNAL_URL:
        pytest.skip("needs a cluster of several routers; SHOAL_E2E_URL points at one broker")
    c = start_cluster(tmp_path_factory.mktemp("shoal-2r"), 2, routers=2)
    yield c
    stop_cluster(c)


@pytest.fixture
def own_routers2(tmp_path) -> Iterator[Cluster]:
    """A private cluster of 2 routers and 2 nodes, for tests that kill a router."""
    if EXTERNAL_URL:
        pytest.skip("needs the cluster's own processes; SHOAL_E2E_URL points at an external "
                    "broker")
    c = start_cluster(tmp_path / "cluster", 2, routers=2)
    yield c
    if not c.stopped:
        stop_cluster(c, require_clean_exit=not c.killed)


@pytest.fixture
def own_cluster(tmp_path, request) -> Iterator[Cluster]:
    """A private 2-node cluster for tests that kill or stop processes (never external).

    ``@pytest.mark.parametrize("own_cluster", [3], indirect=True)`` asks for another size.
    """
    if EXTERNAL_URL:
        pytest.skip("needs the cluster's own processes; SHOAL_E2E_URL points at an external "
                    "broker")
    nodes = getattr(request, "param", 2)
    c = start_cluster(tmp_path / "cluster", nodes)
    yield c
    if not c.stopped:
        # After a test killed a node the contract says nothing about the launcher's exit
        # status; we still require that nothing is left running.
        stop_cluster(c, require_clean_exit=not c.killed)


@pytest.fixture
def uid() -> str:
    """A unique suffix for queue/exchange names in this test."""
    return uuid.uuid4().hex[:12]
