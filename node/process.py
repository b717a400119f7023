"""Running a node (design.md section 1): as a process of its own (:func:`run_node`, behind
``shoal node`` / ``python -m shoal.node``) or inside a router's event loop (:func:`hosted_node`,
for ``shoal serve --embed-node``). Both open the journal and rebuild the shard before the node
serves; node/server.py's :class:`~shoal.node.server.NodeServer` does the serving.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import threading
from pathlib import Path

import zmq

from shoal.shared.datadir import DataDirLocked
from shoal.shared.errors import StartupError
from shoal.shared.settings import Settings

from shoal.node.durability.journal import JournalCorrupt, JournalUnavailable
from shoal.node.server import NodeServer

log = logging.getLogger("shoal.node")


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def hosted_node(settings: Settings, node_id: str, endpoint: str,
                ctx: zmq.Context) -> NodeServer:
    """A node to run inside another process's event loop (the router's, for an ``inproc://``
    endpoint): its journal in ``<settings.data_dir>/<node_id>/journal`` is opened and the shard
    rebuilt, and its ROUTER socket is bound to ``endpoint`` in ``ctx`` and, when
    ``settings.embed_bind`` is set, to that endpoint too (other routers' links; ``shoal
    serve --embed-node --routers R``). The caller awaits
    :meth:`NodeServer.serve` and later calls :meth:`NodeServer.stop` and
    :meth:`NodeServer.close` (which leaves ``ctx`` to its owner).

    Raises StartupError: exit code 3 when the journal is corrupt or cannot be written, 1 when
    the endpoint cannot be bound, 2 when another process holds the node's data directory
    (the node CLI's codes).
    """
    node_settings = dataclasses.replace(
        settings, node_id=node_id, node_bind=endpoint,
        data_dir=str(Path(settings.data_dir).expanduser() / node_id))
    server = NodeServer(node_settings, ctx=ctx)
    try:
        server.open_journal()
    except (JournalCorrupt, JournalUnavailable) as exc:
        server.sock.close(linger=0)
        raise StartupError(f"cannot open the journal of {node_id}: {exc}", 3) from None
    except DataDirLocked as exc:
        server.sock.close(linger=0)
        raise StartupError(str(exc), 2) from None
    try:
        server.bind(also=settings.embed_bind)
    except (zmq.ZMQError, OSError) as exc:
        server.close()
        bind = " and ".join(e for e in (endpoint, settings.embed_bind) if e)
        raise StartupError(f"cannot bind {bind} for {node_id}: {exc}", 1) from None
    return server


class BindFailed(OSError):
    """``node_bind`` (or a peer endpoint) could not be bound; its cause is chained."""


def run_node(settings: Settings, server: NodeServer | None = None) -> int:
    """Run a node until SIGINT/SIGTERM (or ``server.stop()``); blocking. Returns exit code 0.

    First it opens the journal in ``<settings.data_dir>/journal`` and rebuilds the shard.
    On stop it commits the journal, sends GOODBYE to every known router, flushes and closes
    the socket and the journal. Signal handlers are only installed when called from the main
    thread. Raises BindFailed (an OSError) when ``settings.node_bind`` cannot be bound,
    JournalCorrupt / JournalUnavailable when the journal cannot be opened; any other error
    after that propagates with its traceback.
    """
    server = server or NodeServer(settings)
    if server.journal is None:
        server.open_journal()     # raises JournalCorrupt / JournalUnavailable (cli: exit 3)
    loop = _new_loop()
    try:
        try:
            server.bind()
        except (zmq.ZMQError, OSError) as exc:
            raise BindFailed(exc.errno, str(exc)) from exc
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, server.stop)
        loop.run_until_complete(server.serve())
    finally:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        loop.close()
        server.close()
    log.info("shoal node %s stopped", server.shard.node_id)
    return 0
