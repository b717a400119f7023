"""The router process: accept AMQP clients, link to the nodes, shut down cleanly.

``run_router(settings)`` blocks until SIGINT/SIGTERM; then every client gets
``connection.close`` 320 CONNECTION_FORCED, the nodes get GOODBYE, and it returns 0.
When it accepts connections it prints ``shoal router ready on HOST:PORT`` to stdout (the local
launcher reads it to learn the port chosen for ``--port 0``).
"""
from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import socket

from shoal.shared.errors import CONNECTION_FORCED
from shoal.shared.settings import Settings

from .broker import Broker
from .client import ClientConnection, heartbeat_loop

log = logging.getLogger("shoal.router")


async def serve(settings: Settings) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    broker = Broker(settings)
    try:
        await broker.start()
    except TimeoutError as exc:
        log.error("%s", exc)
        await broker.stop()
        return 1
    server = await loop.create_server(
        lambda: ClientConnection(broker), settings.host, settings.port,
        reuse_port=hasattr(socket, "SO_REUSEPORT"), backlog=1024)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"shoal router ready on {host}:{port}", flush=True)
    log.info("router %s accepting AMQP 0-9-1 on %s:%s, %d nodes", broker.router_id, host, port,
             len(broker.links))
    ticker = asyncio.ensure_future(heartbeat_loop(broker))
    stats = asyncio.ensure_future(_write_stats(broker, settings.stats_file)) \
        if settings.stats_file else None
    await stop.wait()
    if stats is not None:
        stats.cancel()
    log.info("router stopping: closing %d client connections", len(broker.connections))
    server.close()
    ticker.cancel()
    for client in list(broker.connections):
        client.shutdown(CONNECTION_FORCED, "CONNECTION_FORCED - broker shutdown")
    # Give clients a moment to answer close-ok, bounded.
    for _ in range(20):
        if not broker.connections:
            break
        await asyncio.sleep(0.05)
    for client in list(broker.connections):
        if client.transport is not None:
            client.transport.close()
    await broker.stop()
    return 0


async def _write_stats(broker: Broker, path: str) -> None:
    """Rewrite ``path`` each second with the router's counters (``Broker.stats``) as JSON,
    atomically (write then rename), for benchmarks and monitoring."""
    while True:
        await asyncio.sleep(1.0)
        data = dict(broker.stats, connections=len(broker.connections),
                    nodes_up=sum(l.up for l in broker.links.values()))
        tmp = f"{path}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(data, f)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("cannot write stats file %s: %s", path, exc.strerror)


def run_router(settings: Settings) -> int:
    """Run the router until SIGINT/SIGTERM; returns the process exit code."""
    # Most router objects live as long as a connection or a delivery; fewer young-generation
    # collections cost less CPU per message without growing memory noticeably.
    gc.set_threshold(20_000, 50, 100)
    try:
        import uvloop
        uvloop.install()
    except ImportError:  # uvloop is optional (Windows)
        pass
    return asyncio.run(serve(settings))
