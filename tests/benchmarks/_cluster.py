"""What the benchmark scripts share: start a local Shoal cluster on a free port."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

PACKAGES = ("node", "router", "shared", "cli", "deploy", "pipeline")


def cli_module(src: str | os.PathLike | None = None) -> str:
    """The module that runs the ``shoal`` command in source tree ``src`` (default: the
    installed one): ``shoal.cli``, or ``shoal.shared.cli`` in trees from before the layout of
    docs/architecture.md, so that A/B runs against older commits keep working."""
    if src and not (Path(src) / "cli").is_dir():
        return "shoal.shared.cli"
    return "shoal.cli"


def start_cluster(data_dir: str, nodes: int, env: dict[str, str] | None = None
                  ) -> tuple[subprocess.Popen, int]:
    """``shoal serve --port 0 --nodes N`` with extra environment ``env`` (e.g. a stats file);
    returns the launcher process and the AMQP port from its ready line. Exits the script
    with a message when the cluster does not start."""
    proc = subprocess.Popen([sys.executable, "-m", "shoal.cli", "serve", "--port", "0",
                             "--nodes", str(nodes), "--data-dir", data_dir,
                             "--log-level", "warning"],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    line = proc.stdout.readline()
    m = re.search(r":(\d+) \(", line)
    if not m:
        proc.kill()
        raise SystemExit(f"cluster did not start: {line!r}")
    return proc, int(m.group(1))


def stop_serve(proc: subprocess.Popen | None, timeout_s: float = 30.0) -> None:
    """SIGTERM a ``shoal serve`` started with ``start_new_session``; SIGKILL its whole process
    group when it has not stopped within ``timeout_s``."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def name_on(node_id: str, node_count: int, template: str) -> str:
    """The first ``template.format(k)`` (k = 0, 1, ...) that placement over node-0 ..
    node-<node_count - 1> puts on ``node_id`` (vhost "/"). A name holding ``%d`` (a load-test
    queue pattern) is checked as its queue 1."""
    from shoal.shared.placement import owner
    ids = [f"node-{i}" for i in range(node_count)]
    k = 0
    while owner("/", template.format(k).replace("%d", "1"), ids) != node_id:
        k += 1
    return template.format(k)


TICKS = os.sysconf("SC_CLK_TCK")


def port_open(port: int) -> bool:
    """Whether something listens on 127.0.0.1:``port``."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def cpu_seconds(pids: list[int]) -> float:
    """Sum of utime+stime (s) of ``pids`` (/proc/PID/stat fields 14 and 15)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / TICKS


def rss_bytes(pids: list[int]) -> int:
    """Resident memory (VmRSS, bytes) of these processes together; gone ones count 0."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return total
