"""Peak memory for one large message: how many copies of its body each process holds.

Starts ``shoal serve --nodes 1 --routers 1`` (and with ``--embed`` the ``--embed-node``
layout), publishes ONE message of ``--mib`` MiB (default 100) with publisher confirms, reads it
back with ``basic.get`` and acks it, and prints each process's peak resident memory
(``VmHWM`` of /proc/PID/status) above its resident memory before the publish, in MiB and in
multiples of the body size, and its resident memory once the message is acked. A process that holds the body once on its way shows about 1x;
each extra copy alive at the same time adds about 1x.

    python tests/benchmarks/large_message.py [--mib 100] [--embed] [--persistent]

The peak is reset before the publish (``echo 5 > /proc/PID/clear_refs``), so start-up does not
count. Figures go to docs/performance.md ("Large messages"). Memory, not time: no ratio to a
baseline is needed, but the machine should have a few GiB free.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cluster import stop_serve  # noqa: E402

MIB = 1024 * 1024


def _status(pid: int, key: str) -> int:
    """``key`` (VmRSS, VmHWM) of /proc/PID/status in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def _start(data_dir: str, embed: bool, size: int):
    import subprocess
    import re
    cmd = [sys.executable, "-m", "shoal.cli", "serve", "--port", "0", "--nodes", "1",
           "--routers", "1", "--data-dir", data_dir, "--log-level", "warning",
           "--max-message-size", str(max(size, 128 * MIB))]
    if embed:
        cmd.append("--embed-node")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    line = proc.stdout.readline()
    m = re.search(r":(\d+) \(", line)
    if not m:
        proc.kill()
        raise SystemExit(f"cluster did not start: {line!r}")
    info = json.loads((Path(data_dir) / "cluster.json").read_text())
    pids = {r["id"]: r["pid"] for r in info.get("routers", [])}
    if not pids:
        pids["router-0"] = info["router"]["pid"]
    for n in info["nodes"]:
        if not n.get("embedded"):
            pids[n["id"]] = n["pid"]
    return proc, int(m.group(1)), pids


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=100, help="body size in MiB (default 100)")
    ap.add_argument("--embed", action="store_true", help="--embed-node layout")
    ap.add_argument("--persistent", action="store_true", help="delivery_mode 2, durable queue")
    args = ap.parse_args()
    size = args.mib * MIB
    body = os.urandom(1024) * (size // 1024)
    with tempfile.TemporaryDirectory() as data_dir:
        proc, port, pids = _start(data_dir, args.embed, size)
        try:
            conn = pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", port, blocked_connection_timeout=120))
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("large", durable=args.persistent)
            time.sleep(0.5)
            before = {k: _status(p, "VmRSS") for k, p in pids.items()}
            for p in pids.values():
                _reset_peak(p)
            ch.basic_publish("", "large", body,
                             pika.BasicProperties(delivery_mode=2 if args.persistent else 1))
            method, _, got = ch.basic_get("large")
            assert got == body, "body changed on its way"
            ch.basic_ack(method.delivery_tag)
            conn.close()
            time.sleep(0.5)
            peak = {k: _status(p, "VmHWM") for k, p in pids.items()}
            after = {k: _status(p, "VmRSS") for k, p in pids.items()}
        finally:
            stop_serve(proc)
    layout = "--embed-node" if args.embed else "default layout"
    print(f"one {args.mib} MiB message ({'persistent' if args.persistent else 'transient'}, "
          f"{layout}): peak resident memory above the level before the publish")
    print(f"{'process':<10} {'before MiB':>10} {'peak MiB':>9} {'growth MiB':>10} "
          f"{'x body':>7} {'after MiB':>9}")
    for k in pids:
        growth = peak[k] - before[k]
        print(f"{k:<10} {before[k] / MIB:>10.1f} {peak[k] / MIB:>9.1f} {growth / MIB:>10.1f} "
              f"{growth / size:>7.2f} {after[k] / MIB:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
