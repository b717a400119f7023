"""The router process: accept AMQP clients, link to the nodes, shut down cleanly.

``run_router(settings)`` blocks until SIGINT/SIGTERM; then every client gets
``connection.close`` 320 CONNECTION_FORCED, the nodes get GOODBYE, and it returns 0.
When it accepts connections it prints ``shoal router ready on HOST:PORT`` to stdout, followed by
`` (direct port P)`` when ``direct_port`` asks for a port of its own (the local launcher reads it
to learn the ports chosen for 0). Several routers may listen on one ``port`` (SO_REUSEPORT).

Hosted nodes: a node endpoint ``inproc://NAME`` means the node runs inside this process, in
this event loop (the ``embed_node`` setting of ``shoal serve``). It binds that ZeroMQ
``inproc://`` endpoint of the router's context, but the router's own link to it
(``LocalLink``) hands the link's frames over in memory. The link protocol, the frames and the
node code are the same as for a node process; what goes is the socket hop, the ZeroMQ I/O
threads and ZeroMQ's own per-call cost, which together cost about as much CPU per message as
RabbitMQ's whole broker (docs/performance.md). The router never imports ``shoal.node``: the
entry point passes ``host_node`` in (design.md section 1).
"""
from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import socket
import sys
from typing import Any, Awaitable, Callable

import zmq

from shoal.shared.definitions import Definitions
from shoal.shared.errors import CONNECTION_FORCED, StartupError
from shoal.shared.settings import EXIT_CANNOT_LISTEN, Settings, listen_error

from shoal.router import live
from shoal.router import access_sync
from shoal.router.frontend import tls
from shoal.router.broker import Broker
from shoal.router.frontend.client import ClientConnection, heartbeat_loop
from shoal.router.import_definitions import declare_topology

log = logging.getLogger("shoal.router")


#: ``host_node(settings, node_id, endpoint, ctx)``: opens and binds a node to run in this
#: process (``shoal.node.process.hosted_node``); it has ``serve()``, ``stop()``, ``close()``
#: and ``attach_local`` (the broker's LocalLink hands it frames in memory, not via ZeroMQ).
HostNode = Callable[[Settings, str, str, zmq.Context], Any]
#: ``report(line)``: tells a start-up failure in one line (the router CLI's choice of stream).
Report = Callable[[str], None]


def hosted_endpoints(settings: Settings) -> list[tuple[str, str]]:
    """The ``(node_id, endpoint)`` pairs this router runs itself (``inproc://``)."""
    return [(n, ep) for n, ep in settings.node_map() if ep.startswith("inproc://")]


async def serve(settings: Settings, host_node: HostNode | None = None,
                definitions: Definitions | None = None, report: Report | None = None) -> int:
    """Run the router (and the nodes it hosts) until SIGINT/SIGTERM. Returns the exit code:
    0 clean stop (SIGTERM at any point, start-up included), 1 a hosted node failed, a hosted
    node's StartupError code (3: its journal cannot be opened), or 4 (``EXIT_CANNOT_LISTEN``) when one of its
    ports cannot be bound. A start-up failure is told in one line to ``report`` (default:
    stderr, ``shoal router: ...``)."""
    report = report or _report_stderr
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    ctx = zmq.Context()
    hosted: list[tuple[str, Any, asyncio.Task]] = []
    failed: list[str] = []

    def watch(node_id: str):
        def done(task: asyncio.Task) -> None:
            if not task.cancelled() and task.exception() is not None:
                log.error("hosted node %s failed: %r; stopping the router", node_id,
                          task.exception())
                failed.append(node_id)
                stop.set()
        return done

    try:
        for node_id, endpoint in hosted_endpoints(settings):
            if host_node is None:
                raise StartupError(f"node {node_id} at {endpoint}: inproc:// endpoints are "
                                   "nodes run inside the router; start it with 'shoal router'",
                                   2)
            node = host_node(settings, node_id, endpoint, ctx)
            task = asyncio.ensure_future(node.serve())
            task.add_done_callback(watch(node_id))
            hosted.append((node_id, node, task))
    except StartupError as exc:
        report(str(exc))
        await _stop_hosted(hosted, ctx)
        return exc.exit_code
    broker = Broker(settings, ctx, {node_id: node.attach_local for node_id, node, _ in hosted},
                    definitions)
    broker.on_access = lambda version, doc: access_sync.apply(broker, version, doc)
    # Serve with the nodes that answer within moments (Broker.start), and let SIGTERM stop
    # every step of the start-up at once.
    for step in (broker.start(),
                 access_sync.sync_at_start(broker),     # users and permissions (first node)
                 declare_topology(broker, broker.definitions)):   # load_definitions' topology
        if not await _unless_stopped(step, stop):
            log.info("router stopping during start-up")
            await broker.stop()
            await _stop_hosted(hosted, ctx)
            return 1 if failed else 0
    servers: list[asyncio.AbstractServer] = []
    runners: list[Any] = []

    async def listen(setting: str, port: int, start: Awaitable, flag: str | None = None):
        """``await start``; a port that cannot be bound stops the router with one line."""
        try:
            return await start
        except OSError as exc:
            raise StartupError(listen_error(setting, settings.host, port, exc, flag),
                               EXIT_CANNOT_LISTEN) from None

    reuse = hasattr(socket, "SO_REUSEPORT")     # routers on one host share their ports
    reloader = None
    try:
        servers.append(await listen("port", settings.port, loop.create_server(
            lambda: ClientConnection(broker), settings.host, settings.port, reuse_port=reuse,
            backlog=1024), "--port"))
        host, port = servers[0].sockets[0].getsockname()[:2]
        direct = ""
        if settings.direct_port >= 0:           # this router alone (tests, diagnostics)
            servers.append(await listen("direct_port", settings.direct_port, loop.create_server(
                lambda: ClientConnection(broker), settings.host, settings.direct_port,
                backlog=128), "--direct-port"))
            direct = f" (direct port {servers[1].sockets[0].getsockname()[1]})"
        if settings.tls_port >= 0:              # amqps (router/frontend/tls.py)
            tls_ctx = tls.server_context(settings)
            servers.append(await listen("tls_port", settings.tls_port, loop.create_server(
                lambda: ClientConnection(broker, tls=True), settings.host, settings.tls_port,
                ssl=tls_ctx, ssl_handshake_timeout=10.0, reuse_port=reuse, backlog=1024)))
            log.info("router %s accepting AMQP 0-9-1 and 1.0 over TLS on %s:%s", broker.router_id,
                     settings.host, servers[-1].sockets[0].getsockname()[1])
            reloader = asyncio.ensure_future(tls.reload_loop(tls_ctx, settings))
        if settings.management_port or settings.prometheus_port:
            # aiohttp and prometheus-client only for a router that serves HTTP: their import
            # is about a third of a router's start-up (0.35 s of CPU on this machine)
            from shoal.router.management import metrics
            from shoal.router.management import server as management
        if settings.management_port:
            runners.append(await listen("management_port", settings.management_port,
                                        management.start(broker, settings.host,
                                                         settings.management_port)))
        if settings.prometheus_port:
            runners.append(await listen("prometheus_port", settings.prometheus_port,
                                        management.serve(metrics.make_app(broker), settings.host,
                                                         settings.prometheus_port,
                                                         "Prometheus metrics", "/metrics")))
    except StartupError as exc:
        report(str(exc))
        if reloader is not None:
            reloader.cancel()
        for srv in servers:
            srv.close()
        for runner in runners:
            await runner.cleanup()
        await broker.stop()
        await _stop_hosted(hosted, ctx)
        return exc.exit_code
    print(f"shoal router ready on {host}:{port}{direct}", flush=True)
    log.info("router %s accepting AMQP 0-9-1 and 1.0 on %s:%s, %d nodes", broker.router_id, host, port,
             len(broker.links))
    ticker = asyncio.ensure_future(heartbeat_loop(broker))
    reports = asyncio.ensure_future(live.report_loop(broker))   # for any router's API
    stats = asyncio.ensure_future(_write_stats(broker, settings.stats_file)) \
        if settings.stats_file else None
    await stop.wait()
    for task in (stats, reloader, reports):
        if task is not None:
            task.cancel()
    log.info("router stopping: closing %d client connections", len(broker.connections))
    for srv in servers:
        srv.close()
    for runner in runners:
        await runner.cleanup()
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
    await _stop_hosted(hosted, ctx)
    return 1 if failed else 0


async def _unless_stopped(step: Awaitable, stop: asyncio.Event) -> bool:
    """Run ``step`` unless ``stop`` is set first (SIGTERM): then cancel it, return False."""
    task = asyncio.ensure_future(step)
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([task, stopping], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if task.done():
        task.result()
        return True
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return False


async def _stop_hosted(hosted: list[tuple[str, Any, asyncio.Task]], ctx: zmq.Context) -> None:
    """Stop hosted nodes after the links said GOODBYE: each commits its journal (bounded),
    then closes its socket and journal; then terminate the shared ZeroMQ context."""
    for _node_id, node, task in hosted:
        node.stop()
        _, pending = await asyncio.wait([task], timeout=15)   # a failure was logged already
        if pending:
            log.error("a hosted node did not stop within 15 s")
            task.cancel()
        node.close()
    ctx.term()


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


def _report_stderr(line: str) -> None:
    print(f"shoal router: {line}", flush=True, file=sys.stderr)


def run_router(settings: Settings, host_node: HostNode | None = None,
               definitions: Definitions | None = None, report: Report | None = None) -> int:
    """Run the router until SIGINT/SIGTERM; returns the process exit code (see serve).
    ``definitions``: users, vhosts and permissions (default: from ``settings``); ``report``:
    see :func:`serve`."""
    # Most router objects live as long as a connection or a delivery; fewer young-generation
    # collections cost less CPU per message without growing memory noticeably.
    gc.set_threshold(20_000, 50, 100)
    try:
        import uvloop
        uvloop.install()
    except ImportError:  # uvloop is optional (Windows)
        pass
    return asyncio.run(serve(settings, host_node, definitions, report))
