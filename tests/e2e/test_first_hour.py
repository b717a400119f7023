"""The first hour of a new user (issue 34 part 2): a taken port, ``shoal --version``, and a
misspelt ``SHOAL_*`` variable each say so in one line.

Each test runs ``python -m shoal.cli`` as a subprocess, the way a user runs ``shoal``; ports
are held by a socket the test opens, every other port is 0 (a free one) or off.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shoal.shared.settings import LAUNCHED_FAILURE

from tests.conftest import EXTERNAL_URL, READY_RE

pytestmark = pytest.mark.skipif(bool(EXTERNAL_URL), reason="runs shoal's own processes")

SHOAL = [sys.executable, "-m", "shoal.cli"]
#: Unknown SHOAL_* variables of the test run's own environment would add warning lines.
BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
QUIET = {**BASE_ENV, "SHOAL_MANAGEMENT_PORT": "0", "SHOAL_PROMETHEUS_PORT": "0",
         "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def held_port():
    """A port that something else listens on (no SO_REUSEPORT): the test's own socket."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def serve(tmp_path: Path, *flags: str, env: dict | None = None,
          timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*SHOAL, "serve", "--host", "127.0.0.1", "--nodes", "1",
                           "--routers", "1", "--no-pin-cpus", "--data-dir", str(tmp_path),
                           *flags], env={**QUIET, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def one_line(result: subprocess.CompletedProcess) -> str:
    """The one line of error output; asserts there is no other (nor a traceback)."""
    assert result.returncode != 0, result
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    assert not result.stdout.strip(), result.stdout
    return lines[0]


# ---- a taken port: one line naming it and what changes it ------------------------------------
def test_amqp_port_in_use(tmp_path, held_port):
    line = one_line(serve(tmp_path, "--port", str(held_port)))
    assert line == (f"shoal serve: port {held_port} is in use (AMQP listener); choose another "
                    f"with --port or SHOAL_PORT")


@pytest.mark.parametrize("setting, what", [
    ("management_port", "management API"),
    ("prometheus_port", "Prometheus metrics"),
    ("direct_port", "direct AMQP port of one router"),
    ("tls_port", "AMQP over TLS listener"),
])
def test_other_ports_in_use(tmp_path, held_port, setting, what):
    env = {f"SHOAL_{setting.upper()}": str(held_port)}
    if setting == "tls_port":       # checked before a router starts: the files are not read
        env.update(SHOAL_TLS_CERTFILE=str(tmp_path / "cert.pem"),
                   SHOAL_TLS_KEYFILE=str(tmp_path / "key.pem"))
    line = one_line(serve(tmp_path, "--port", "0", env=env))
    assert line.startswith(f"shoal serve: port {held_port} is in use ({what}); choose another "
                           f"with the {setting} setting (SHOAL_{setting.upper()} or --config)")


def test_one_port_for_two_listeners(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    line = one_line(serve(tmp_path, "--port", str(port),
                          env={"SHOAL_MANAGEMENT_PORT": str(port)}))
    assert f"port {port} is given to both the AMQP listener (port) and the management API " \
           f"(management_port)" in line


@pytest.mark.parametrize("flags, setting, what, flag", [
    ([], "port", "AMQP listener", "--port"),
    (["--port", "0"], "direct_port", "direct AMQP port of one router", "--direct-port"),
    (["--port", "0"], "management_port", "management API", None),
])
def test_router_process_port_in_use(tmp_path, held_port, flags, setting, what, flag):
    """``shoal router`` on its own (as in a container): one line on stderr, exit 4."""
    env = {**QUIET, "SHOAL_LOG_LEVEL": "warning"}
    endpoint = f"ipc://{tmp_path}/n.sock"
    node = subprocess.Popen([*SHOAL, "node", "--node-id", "node-0", "--bind", endpoint,
                             "--data-dir", str(tmp_path / "node-0")], env=env)
    try:
        args = flags or ["--port", str(held_port)]
        if setting == "direct_port":
            args += ["--direct-port", str(held_port)]
        elif setting == "management_port":
            env["SHOAL_MANAGEMENT_PORT"] = str(held_port)
        result = subprocess.run([*SHOAL, "router", "--node", endpoint, *args], env=env,
                                capture_output=True, text=True, timeout=60)
    finally:
        node.terminate()
        node.wait(20)
    assert result.returncode == 4
    line = one_line(result)
    how = f"{flag} or SHOAL_{setting.upper()}" if flag else f"the {setting} setting"
    assert line.startswith(f"shoal router: port {held_port} is in use ({what}); choose "
                           f"another with {how}")


def test_node_bind_in_use(tmp_path, held_port):
    result = subprocess.run([*SHOAL, "node", "--node-id", "node-9", "--bind",
                             f"tcp://127.0.0.1:{held_port}", "--data-dir", str(tmp_path)],
                            env=QUIET, capture_output=True, text=True, timeout=60)
    line = one_line(result)
    assert str(held_port) in line and "--bind or SHOAL_NODE_BIND" in line


def test_a_router_of_serve_that_cannot_listen_is_told_by_serve(tmp_path):
    """A router started by ``shoal serve`` (``--launched``) says on stdout why it cannot
    start; the launcher raises that line, which ``serve`` prints as its own."""
    from shoal.deploy.launcher import Cluster, PortError
    from shoal.shared.settings import load_settings
    cluster = Cluster(load_settings(env={}, overrides={"data_dir": str(tmp_path)}), None)
    fake = subprocess.Popen([sys.executable, "-c", f"print({LAUNCHED_FAILURE!r} + 'port 5 is "
                             f"in use (AMQP listener); choose another with --port or "
                             f"SHOAL_PORT'); raise SystemExit(4)"],
                            stdout=subprocess.PIPE, text=True)
    with pytest.raises(PortError) as e:
        cluster._await_ready(fake)
    assert str(e.value) == ("port 5 is in use (AMQP listener); choose another with --port or "
                            "SHOAL_PORT")


# ---- shoal --version ----------------------------------------------------------------------------
@pytest.mark.parametrize("arg", ["--version", "version"])
def test_version(arg):
    from importlib.metadata import version
    result = subprocess.run([*SHOAL, arg], env=BASE_ENV, capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout == f"shoal {version('shoal')}\n"


# ---- a SHOAL_* variable that names no setting -------------------------------------------------
def test_serve_warns_once_about_an_unknown_variable(tmp_path):
    """``SHOAL_PROT``: one warning from ``shoal serve`` (not again from each router and node),
    and the cluster starts as if it were not set."""
    proc = subprocess.Popen([*SHOAL, "serve", "--host", "127.0.0.1", "--port", "0", "--nodes",
                             "2", "--routers", "1", "--no-pin-cpus", "--data-dir",
                             str(tmp_path), "--log-level", "warning"],
                            env={**QUIET, "SHOAL_PROT": "5673"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        ready = proc.stdout.readline()
        assert READY_RE.search(ready), ready
        time.sleep(0.5)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    warnings = [ln for ln in err.splitlines() if "SHOAL_PROT" in ln]
    assert warnings == ["shoal serve: warning: environment variable SHOAL_PROT is not a setting "
                        "and is ignored; did you mean SHOAL_PORT?"], err
    assert proc.returncode == 0


# ---- one data directory, one broker (issue 43 point 4) ----------------------------------------
def test_a_second_broker_on_a_data_directory_stops_and_leaves_the_first_alone(tmp_path):
    """A second ``shoal serve`` on a running one's data directory, and a ``shoal node`` on one
    of its nodes' directories, each stop with one line naming the directory and the pid that
    holds it; the first keeps its ``ipc://`` sockets and serves on."""
    import pika

    from tests.conftest import start_cluster, stop_cluster
    data = tmp_path / "data"
    first = start_cluster(data, 1)
    try:
        sockets = sorted(p.name for p in (data / "run").iterdir())
        line = one_line(serve(data, "--port", "0"))
        assert line == (f"shoal serve: data directory {data.resolve()} is in use by another "
                        f"Shoal (pid {first.launcher.pid}); stop it first, or choose another "
                        f"with --data-dir or SHOAL_DATA_DIR")
        node0 = first.node("node-0")
        result = subprocess.run([*SHOAL, "node", "--node-id", "node-0", "--bind",
                                 "tcp://127.0.0.1:0", "--data-dir", str(data / "node-0")],
                                env=QUIET, capture_output=True, text=True, timeout=60)
        assert one_line(result).startswith(
            f"shoal node: data directory {(data / 'node-0').resolve()} is in use by another "
            f"Shoal (pid {node0.pid})")
        assert sorted(p.name for p in (data / "run").iterdir()) == sockets
        conn = pika.BlockingConnection(pika.URLParameters(first.url))
        ch = conn.channel()
        ch.queue_declare("after-the-second", durable=True)
        ch.basic_publish("", "after-the-second", b"still here")
        assert ch.basic_get("after-the-second", auto_ack=True)[2] == b"still here"
        conn.close()
    finally:
        stop_cluster(first)
    # the lock went with the first broker: the directory serves again
    again = start_cluster(data, 1)
    stop_cluster(again)
