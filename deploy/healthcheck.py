"""Docker HEALTHCHECK of the Shoal image: exit 0 when the container's Shoal process accepts TCP.

Finds the ``shoal router|node|serve`` process in /proc, loads its settings exactly as it did
(``--config`` file < ``SHOAL_*`` environment < flags, via shoal.shared.settings) and connects:
a router or ``serve`` on its AMQP port, a node on its ZeroMQ ``tcp://`` endpoint (an ``ipc://``
or ``unix://`` endpoint must exist as a socket file). Exit 1 with one line on stderr otherwise. Other commands
(``loadtest``) are healthy while they run.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys

from shoal.shared.errors import ConfigError
from shoal.shared.settings import load_settings

ROLES = ("router", "node", "serve")
CONNECT_TIMEOUT_S = 2.0


def find_shoal() -> tuple[str, list[str], dict[str, str]] | None:
    """``(role, args after the role, environment)`` of the first Shoal process, or None."""
    for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(e.decode(errors="replace").split("=", 1)
                           for e in f.read().split(b"\0") if b"=" in e)
        except OSError:
            continue
        for i, arg in enumerate(argv[:3]):
            if os.path.basename(arg) == "shoal" and i + 1 < len(argv) and argv[i + 1] in ROLES:
                return argv[i + 1], argv[i + 2:], env
    return None


def target(role: str, args: list[str], env: dict[str, str]) -> tuple[str, int] | str | None:
    """Address to probe: ``(host, port)``, an ipc socket path, or None (nothing to probe)."""
    p = argparse.ArgumentParser(add_help=False)
    for flag in ("--config", "--host", "--port", "--bind"):
        p.add_argument(flag)
    known, _ = p.parse_known_args(args)
    settings = load_settings(known.config, env=env, overrides={
        "host": known.host, "port": known.port, "node_bind": known.bind})
    if role == "node":
        scheme, _, rest = settings.node_bind.partition("://")
        if scheme in ("ipc", "unix"):
            return rest
        host, _, port = rest.rpartition(":")
    else:
        host, port = settings.host, str(settings.port)
    if port in ("0", "*"):
        return None
    host = host.strip("[]")
    if host in ("0.0.0.0", "*", "", "::"):
        host = "127.0.0.1"
    return host, int(port)


def main() -> int:
    found = find_shoal()
    if found is None:
        print("healthcheck: no shoal router/node process found", file=sys.stderr)
        return 1
    role, args, env = found
    try:
        addr = target(role, args, env)
    except ConfigError as exc:
        print(f"healthcheck: {exc}", file=sys.stderr)
        return 1
    if addr is None:
        return 0
    if isinstance(addr, str):
        if os.path.exists(addr):
            return 0
        print(f"healthcheck: {role} socket {addr} does not exist", file=sys.stderr)
        return 1
    try:
        socket.create_connection(addr, timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        print(f"healthcheck: {role} not accepting on {addr[0]}:{addr[1]}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
