"""The brokers of tests/benchmarks/quorum_bench.py and failure_table.py: a local Shoal of 3
nodes and 1 router (``shoal serve``) and a 3-node RabbitMQ 3.10 cluster on this machine, each
started afresh and stopped whatever happens, with the process helpers both use (see
quorum_bench.py's docstring for how each is set up and measured), and what failure_table.py
needs: one node killed and restarted on its data, a queue placed on a victim node, and when
the clients' node noticed the victim down."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cluster import stop_serve  # noqa: E402
from compare_rabbitmq import cpu_seconds, install_rabbitmq, last_line, log, port_open  # noqa: E402

QUORUM = {"x-queue-type": "quorum"}
RMQ_NODES = ("rabbit1@localhost", "rabbit2@localhost", "rabbit3@localhost")


# -- processes ----------------------------------------------------------------------------
def proc_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def cpu_by_pid(pids: dict[str, int]) -> dict[str, float]:
    return {label: cpu_seconds([pid]) for label, pid in pids.items()}


def window_cpu_by_proc(proc: subprocess.Popen, run_dir: Path, pids: dict[str, int],
                       time_s: float) -> dict[str, float]:
    """CPU seconds of each of ``pids`` over a loadtest's sending window (``start_ns`` from
    its run.json to ``start_ns + time_s``; as compare_rabbitmq.window_cpu, per process)."""
    deadline = time.monotonic() + 90
    start_ns = None
    while start_ns is None and proc.poll() is None and time.monotonic() < deadline:
        try:
            start_ns = json.loads((run_dir / "run.json").read_text())["start_ns"]
        except (OSError, ValueError, KeyError):
            time.sleep(0.02)
    if start_ns is None:
        return {}
    time.sleep(max(0.0, (start_ns - time.time_ns()) / 1e9))
    cpu0 = cpu_by_pid(pids)
    time.sleep(max(0.0, (start_ns + time_s * 1e9 - time.time_ns()) / 1e9))
    cpu1 = cpu_by_pid(pids)
    return {k: round(cpu1[k] - cpu0[k], 3) for k in pids}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def amqp_url(port: int) -> str:
    return f"amqp://guest:guest@127.0.0.1:{port}/"


def declare(url: str, queue: str, arguments: dict | None = None) -> None:
    """Declare durable ``queue`` (a quorum queue unless other ``arguments`` are given)."""
    import pika
    params = pika.URLParameters(url)
    params.socket_timeout = 10
    conn = pika.BlockingConnection(params)
    try:
        conn.channel().queue_declare(queue, durable=True,
                                     arguments=QUORUM if arguments is None else arguments)
    finally:
        conn.close()


def delete_queue(url: str, queue: str) -> None:
    try:
        import pika
        params = pika.URLParameters(url)
        params.socket_timeout = 10
        conn = pika.BlockingConnection(params)
        conn.channel().queue_delete(queue)
        conn.close()
    except Exception as exc:  # noqa: BLE001 - cleanup only
        log(f"could not delete {queue}: {type(exc).__name__}: {exc}")


# -- brokers ------------------------------------------------------------------------------
class ShoalCluster:
    tag, label = "shoal", "Shoal"

    def __init__(self, work: Path, extra_args: list[str]) -> None:
        self.work, self.extra_args = work, extra_args
        self.proc: subprocess.Popen | None = None
        self.n = 0

    def start(self) -> None:
        self.n += 1
        self.data = self.work / f"shoal-{self.n}"
        self.data.mkdir(parents=True)
        self.log_path = self.work / f"shoal-{self.n}.log"
        env = {**os.environ, "SHOAL_MANAGEMENT_PORT": "0", "SHOAL_PROMETHEUS_PORT": "0"}
        cmd = [sys.executable, "-m", "shoal.cli", "serve", "--nodes", "3", "--routers", "1",
               "--port", "0", "--data-dir", str(self.data), *self.extra_args]
        log("starting Shoal: " + " ".join(cmd[2:]))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env,
                                     stderr=open(self.log_path, "wb"), start_new_session=True)
        line = self.proc.stdout.readline()
        m = re.search(r"shoal ready: .*:(\d+) \(", line)
        if not m:
            self.stop()
            raise RuntimeError(f"shoal serve did not get ready: {line!r}; see {self.log_path}")
        self.port = int(m.group(1))
        self.url = amqp_url(self.port)
        info = self.info()
        self.pids = {"launcher": self.proc.pid, "router-0": info["router"]["pid"],
                     **{n["id"]: n["pid"] for n in info["nodes"]}}
        log(f"Shoal ready on {self.port}: {self.pids}")

    def info(self) -> dict:
        return json.loads((self.data / "cluster.json").read_text())

    def stop(self) -> None:
        if self.proc is None:
            return
        for pid in getattr(self, "pids", {}).values():   # a stopped node would never exit
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        stop_serve(self.proc)
        self.proc = None
        log("Shoal stopped")

    def leader(self, queue: str, after_term: int = 0, timeout: float = 30.0
               ) -> tuple[str, int] | None:
        pat = re.compile(rf"quorum queue '{re.escape(queue)}' in vhost '/': (node-\d+) leads "
                         rf"\(term (\d+)\)")
        deadline = time.monotonic() + timeout
        while True:
            found = [(n, int(t)) for n, t in pat.findall(self.log_path.read_text(
                errors="replace")) if int(t) > after_term]
            if found:
                return max(found, key=lambda f: f[1])
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)

    def load_url(self, queue: str, arguments: dict | None = None) -> str:
        return self.url                 # the router: the load tool declares the queue

    def prepare_failover(self, queue: str) -> tuple[str, str]:
        declare(self.url, queue)
        led = self.leader(queue)
        if led is None:
            raise RuntimeError(f"no leader logged for {queue}; see {self.log_path}")
        return self.url, led[0]

    def node_pid(self, node_id: str) -> int:
        return next(n["pid"] for n in self.info()["nodes"] if n["id"] == node_id)

    def kill_and_wipe(self, node_id: str) -> None:
        os.kill(self.node_pid(node_id), signal.SIGKILL)
        shutil.rmtree(self.data / node_id, ignore_errors=True)

    def signal_node(self, node_id: str, sig: int) -> None:
        os.kill(self.node_pid(node_id), sig)

    def after_fault(self, queue: str, leader: str) -> dict:
        led = self.leader(queue, timeout=0)
        return {"new_leader": f"{led[0]} (term {led[1]})" if led else None}

    def kill_node(self, node_id: str) -> None:
        """SIGKILL ``node_id`` and keep it down: the launcher, which would restart it within
        0.5 s, is held with SIGSTOP until ``restart_node`` (it only supervises; clients talk to
        the router)."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        os.kill(self.node_pid(node_id), signal.SIGKILL)

    def restart_node(self, node_id: str, timeout: float = 60.0) -> None:
        """SIGCONT the launcher, which restarts ``node_id`` on its data; wait until the router
        logs ``node <id> is up`` again."""
        offset = self.log_path.stat().st_size
        os.kill(self.proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + timeout
        while f"node {node_id} is up" not in self.log_tail(offset):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node_id} not up {timeout:.0f} s after its restart")
            time.sleep(0.05)

    def log_tail(self, offset: int) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    # -- a queue on a victim node (tests/benchmarks/failure_table.py) --
    def place_on_victim(self, name: str, arguments: dict) -> tuple[str, str]:
        """Declare a queue named from ``name`` ({} gets a number) that placement puts on
        node-2: (queue, its home node, or its leader as logged for a quorum queue)."""
        from _cluster import name_on
        queue = name_on("node-2", len(self.info()["nodes"]), name)
        declare(self.url, queue, arguments)
        led = self.leader(queue) if arguments.get("x-queue-type") == "quorum" else ("node-2",)
        if led is None:
            raise RuntimeError(f"no leader logged for {queue}; see {self.log_path}")
        return queue, led[0]

    def node_url(self, node_id: str) -> None:
        return None                 # clients reach Shoal's nodes through a router only

    def watch_down(self, node_id: str):
        """A poll function: (done, wall time the router logged ``node_id`` disconnected or
        silent from now on, or None), and a close function."""
        offset = self.log_path.stat().st_size
        pat = re.compile(rf"^(\S+ \S+) router .*node {node_id} (disconnected|silent for)", re.M)

        def poll() -> tuple[bool, float | None]:
            m = pat.search(self.log_tail(offset))
            if m is None:
                return False, None
            return True, datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        return poll, lambda: None

    def partitions(self) -> dict:
        return {}


class RabbitCluster:
    tag, label = "rabbitmq", "RabbitMQ"

    def __init__(self, work: Path, amqp_base: int = 5681, dist_base: int = 25681) -> None:
        self.work = work
        self.ports = {n: amqp_base + i for i, n in enumerate(RMQ_NODES)}
        self.dist_ports = {n: dist_base + i for i, n in enumerate(RMQ_NODES)}
        self.n = 0
        self.pids: dict[str, int] = {}
        self.dead: set[str] = set()
        self.started_epmd = False
        self.base: Path | None = None

    def tool(self, name: str) -> str:
        direct = Path("/usr/lib/rabbitmq/bin") / name
        return str(direct) if direct.exists() else (shutil.which(name) or name)

    def env(self) -> dict:
        return {**os.environ, "HOME": str(self.base / "home"), "LC_ALL": "C.UTF-8"}

    def ctl(self, node: str, *args: str, timeout: float = 120, check: bool = True,
            tool: str = "rabbitmqctl") -> str:
        r = subprocess.run([self.tool(tool), "-n", node, *args], env=self.env(),
                           capture_output=True, text=True, timeout=timeout, check=False)
        if check and r.returncode:
            raise RuntimeError(f"{tool} -n {node} {' '.join(args)}: "
                               f"{last_line(r.stderr or r.stdout)}")
        return r.stdout

    def node_dir(self, node: str) -> Path:
        return self.base / node.split("@")[0]

    def start(self) -> None:
        if not shutil.which("rabbitmq-server") and not Path(
                "/usr/lib/rabbitmq/bin/rabbitmq-server").exists():
            install_rabbitmq()
        busy = [p for p in [*self.ports.values(), *self.dist_ports.values()] if port_open(p)]
        if busy:
            raise RuntimeError(f"ports {busy} are in use (an earlier run left RabbitMQ nodes "
                               "running? 'epmd -names' lists them)")
        if port_open(5672):
            log("a RabbitMQ (or other broker) runs on 5672: left alone (own ports, names, "
                "cookie here)")
        self.started_epmd = self.started_epmd or not port_open(4369)
        self.n += 1
        self.base = self.work / f"rabbitmq-{self.n}"
        (self.base / "home").mkdir(parents=True)
        cookie = self.base / "home" / ".erlang.cookie"
        cookie.write_text("SHOALQUORUMBENCH" + uuid.uuid4().hex[:16].upper())
        cookie.chmod(0o400)
        for empty in ("enabled_plugins", "rabbitmq-env.conf", "rabbitmq.conf"):
            (self.base / empty).write_text("")
        self.pids, self.dead = {}, set()
        log(f"starting RabbitMQ nodes {', '.join(RMQ_NODES)} in {self.base}")
        for node in RMQ_NODES:
            self.node_dir(node).mkdir()
            self.launch(node)
        for node in RMQ_NODES:
            self.await_startup(node)
            self.pids[node] = self.read_pid(node)
        for node in RMQ_NODES[1:]:
            self.ctl(node, "stop_app")
            self.ctl(node, "join_cluster", RMQ_NODES[0])
            self.ctl(node, "start_app")
        self.ctl(RMQ_NODES[0], "await_online_nodes", str(len(RMQ_NODES)), "--timeout", "120")
        log(f"RabbitMQ cluster ready: beam.smp pids {self.pids}")

    def launch(self, node: str) -> None:
        """``rabbitmq-server -detached`` for ``node`` (its folder exists; its data is kept)."""
        d = self.node_dir(node)
        env = {**self.env(),
               "RABBITMQ_NODENAME": node,
               "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
               "RABBITMQ_NODE_PORT": str(self.ports[node]),
               "RABBITMQ_DIST_PORT": str(self.dist_ports[node]),
               "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
               "RABBITMQ_LOG_BASE": str(d / "log"),
               "RABBITMQ_PID_FILE": str(d / "pid"),
               "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.base / "enabled_plugins"),
               "RABBITMQ_CONF_ENV_FILE": str(self.base / "rabbitmq-env.conf"),
               "RABBITMQ_CONFIG_FILE": str(self.base / "rabbitmq.conf"),
               "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.base / "advanced.config")}
        with open(d / "startup.log", "ab") as out:
            subprocess.run([self.tool("rabbitmq-server"), "-detached"], env=env,
                           stdout=out, stderr=subprocess.STDOUT, timeout=120, check=True)

    def await_startup(self, node: str) -> None:
        # right after -detached the node is not registered yet: await_startup then fails
        deadline = time.monotonic() + 180
        while True:
            try:
                self.ctl(node, "await_startup", "--timeout", "120", timeout=150)
                return
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{node} did not start ({exc}); see "
                                       f"{self.node_dir(node) / 'log'}") from exc
                time.sleep(2)

    def read_pid(self, node: str) -> int:
        pid = int((self.node_dir(node) / "pid").read_text().strip())
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        if not comm.startswith("beam"):
            raise RuntimeError(f"{node}'s pid {pid} is {comm!r}, not beam.smp")
        return pid

    def live(self) -> list[str]:
        return [n for n in RMQ_NODES if n not in self.dead]

    def stop(self) -> None:
        if self.base is None:
            return
        for node, pid in self.pids.items():
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        for node in RMQ_NODES:
            if node in self.dead:
                continue
            try:
                self.ctl(node, "stop", timeout=90, check=False)
            except subprocess.TimeoutExpired:
                log(f"rabbitmqctl -n {node} stop timed out")
        deadline = time.monotonic() + 30
        while any(proc_alive(p) for p in self.pids.values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        for node, pid in self.pids.items():
            if proc_alive(pid):
                log(f"{node} (pid {pid}) still running after rabbitmqctl stop: SIGKILL")
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        self.pids, self.base = {}, None
        log("RabbitMQ cluster stopped")

    def cleanup_epmd(self) -> None:
        """Stop the epmd the first node started, when none ran before (refused by epmd while
        another node is registered)."""
        if self.started_epmd and shutil.which("epmd"):
            subprocess.run(["epmd", "-kill"], capture_output=True, check=False, timeout=10)

    def leader(self, queue: str, timeout: float = 30.0) -> str | None:
        deadline = time.monotonic() + timeout
        while True:
            for node in self.live():
                try:
                    out = self.ctl(node, "list_queues", "name", "leader", "--formatter",
                                   "json", "-q", timeout=30)
                    for row in json.loads(out or "[]"):
                        if row.get("name") == queue and row.get("leader"):
                            return row["leader"]
                except (RuntimeError, subprocess.TimeoutExpired, ValueError):
                    continue
                break
            if time.monotonic() > deadline:
                return None
            time.sleep(0.5)

    def place(self, queue: str, arguments: dict | None = None) -> tuple[str, str]:
        """Declare ``queue`` (with ``arguments``, default a plain quorum queue) through the
        first live node (its leader then: client-local) and return (URL of another node for
        the clients, leader)."""
        declare(amqp_url(self.ports[self.live()[0]]), queue, arguments)
        lead = self.leader(queue)
        if lead is None:
            raise RuntimeError(f"no leader for {queue}")
        client = next(n for n in self.live() if n != lead)
        log(f"RabbitMQ queue {queue}: leader {lead}, clients on {client}")
        return amqp_url(self.ports[client]), lead

    def load_url(self, queue: str, arguments: dict | None = None) -> str:
        return self.place(queue, arguments)[0]

    def prepare_failover(self, queue: str) -> tuple[str, str]:
        return self.place(queue)

    def kill_and_wipe(self, node: str) -> None:
        os.kill(self.pids[node], signal.SIGKILL)
        self.dead.add(node)
        shutil.rmtree(self.node_dir(node) / "mnesia", ignore_errors=True)

    def signal_node(self, node: str, sig: int) -> None:
        os.kill(self.pids[node], sig)

    def after_fault(self, queue: str, leader: str) -> dict:
        return {"new_leader": self.leader(queue, timeout=10)}

    def kill_node(self, node: str) -> None:
        """SIGKILL ``node``'s beam.smp, keeping its data (``restart_node`` brings it back)."""
        os.kill(self.pids[node], signal.SIGKILL)
        self.dead.add(node)

    def restart_node(self, node: str) -> None:
        """Start ``node`` again on its data (after ``kill_node``) and wait until it runs."""
        self.launch(node)
        self.await_startup(node)
        self.pids[node] = self.read_pid(node)
        self.dead.discard(node)

    # -- a queue on a victim node (tests/benchmarks/failure_table.py) --
    victim, observer = RMQ_NODES[2], RMQ_NODES[0]

    @property
    def url(self) -> str:
        """Where the clients of failure_table.py connect: not the victim."""
        return amqp_url(self.ports[self.observer])

    def node_url(self, node: str) -> str:
        return amqp_url(self.ports[node])

    def place_on_victim(self, name: str, arguments: dict) -> tuple[str, str]:
        """Declare ``name`` ({} gets 0) through the victim, which the client-local locators
        make its home or leader (checked): (queue, victim)."""
        queue = name.format(0)
        declare(self.node_url(self.victim), queue, arguments)
        column = "leader" if arguments.get("x-queue-type") == "quorum" else "pid"
        out = self.ctl(self.observer, "list_queues", "name", column, "-q",
                       "--no-table-headers", timeout=60)      # pid: <rabbit3@localhost.1.2.3>
        home = next(line.split("\t")[1] for line in out.splitlines()
                    if line.split("\t")[0] == queue)
        if self.victim not in home:
            raise RuntimeError(f"{queue} lives on {home}, not {self.victim}")
        return queue, self.victim

    def watch_down(self, node: str, timeout_s: float = 180.0):
        """A poll function: (done, wall time the observer node got ``nodedown`` for ``node``
        from ``erlang:monitor_node``, or None), and a close function."""
        expr = (f"V = '{node}', erlang:monitor_node(V, true), receive {{nodedown, V}} -> "
                f"{{down, os:system_time(millisecond)}} after {int(timeout_s * 1000)} -> "
                f"timeout end.")
        proc = subprocess.Popen([self.tool("rabbitmqctl"), "-n", self.observer, "eval", expr],
                                env=self.env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        result: list = []

        def poll() -> tuple[bool, float | None]:
            if not result and proc.poll() is not None:
                out = proc.stdout.read()
                m = re.search(r"\{down,(\d+)\}", out)
                result.append(int(m.group(1)) / 1000 if m else None)
                if not m:
                    log(f"nodedown watcher: {out.strip()[:200]}")
            return (True, result[0]) if result else (False, None)
        return poll, proc.kill

    def partitions(self) -> dict:
        out = self.ctl(self.observer, "eval", "rabbit_node_monitor:partitions().",
                       timeout=60, check=False)
        return {f"partitions seen by {self.observer}": out.strip()}


# -- loads --------------------------------------------------------------------------------
