"""The node process: asyncio (uvloop when available) + one ZeroMQ ROUTER socket (design.md 4).

Each loop turn drains every readable message, feeds the :class:`~shoal.node.shard.Shard`, then
flushes its outbox with ONE ZeroMQ send per router (a batch, shared.wire.encode_batch). The
socket's FD is edge-triggered (ZMQ_EVENTS), so after every send and before sleeping the loop
re-reads ``zmq.EVENTS`` instead of trusting the FD alone.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time

import zmq

from shoal.shared.settings import Settings
from shoal.shared.wire import decode_batch, encode_batch

from .shard import Shard

log = logging.getLogger("shoal.node")

#: Messages read per loop turn before flushing (bounds latency under a flood).
MAX_READ_PER_TURN = 64  # batches; then tick and flush, so heartbeats flow under load


def feed_frame(shard: Shard, peer: bytes, frame: bytes, now_ms: float) -> int:
    """Decode one ZeroMQ frame from ``peer`` and hand each wire message to ``shard``.

    This is the node's one broad catch: an undecodable frame or a message that makes a handler
    fail is logged and dropped; the node never crashes on input. Returns messages handled.
    """
    try:
        batch = decode_batch(frame)
    except ValueError as exc:
        log.warning("dropping frame from %r: %s", peer, exc)
        return 0
    n = 0
    for msg in batch:
        try:
            shard.handle(peer, msg, now_ms)
            n += 1
        except Exception:  # noqa: BLE001 - the one place that keeps the node alive
            log.exception("dropping wire message from %r that failed", peer)
    return n


def _now_ms() -> float:
    return time.monotonic() * 1000.0


class NodeServer:
    """Runs a Shard behind a bound ROUTER socket until :meth:`stop` is called."""

    def __init__(self, settings: Settings, shard: Shard | None = None) -> None:
        self.settings = settings
        self.shard = shard or Shard(settings.node_id, None, settings)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        # Bounded (batches): a router that outruns this node gets EAGAIN and pauses its
        # publishers instead of growing this queue without limit.
        self.sock.setsockopt(zmq.RCVHWM, 256)
        self._stopping = False
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.endpoint = settings.node_bind

    def bind(self) -> str:
        self.sock.bind(self.settings.node_bind)
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT) or self.settings.node_bind
        log.info("shoal node %s listening on %s", self.shard.node_id, self.endpoint)
        return self.endpoint

    def stop(self) -> None:
        """Ask the loop to say GOODBYE, flush and return (safe from signal handlers and threads)."""
        self._stopping = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:       # loop closed meanwhile: nothing to wake
                pass

    def _drain(self) -> int:
        sock = self.sock
        shard = self.shard
        n = 0
        while n < MAX_READ_PER_TURN:
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                break
            n += 1
            if len(parts) != 2:
                log.warning("dropping ZeroMQ message with %d parts", len(parts))
                continue
            feed_frame(shard, parts[0], parts[1], _now_ms())
        return n

    def _flush(self) -> None:
        out = self.shard.take_outbox()
        for peer, msgs in out.items():
            try:
                self.sock.send_multipart([peer, encode_batch(msgs)], zmq.NOBLOCK, copy=False)
            except zmq.ZMQError as exc:
                log.warning("cannot send %d messages to %r: %s", len(msgs), peer, exc)
            except TypeError as exc:
                log.error("cannot encode batch for %r: %s", peer, exc)

    def _readable(self) -> bool:
        return bool(self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN)

    async def serve(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        self._wake = wake = asyncio.Event()
        fd = self.sock.getsockopt(zmq.FD)
        loop.add_reader(fd, wake.set)
        tick_s = self.settings.link_heartbeat_ms / 1000.0 / 2
        try:
            while not self._stopping:
                self._drain()
                self.shard.tick(_now_ms())
                self._flush()
                if self._readable():
                    await asyncio.sleep(0)     # let other callbacks run, then drain again
                    continue
                wake.clear()
                if self._readable() or self._stopping:
                    continue
                timeout = tick_s
                due = self.shard.timers.next_due()
                if due is not None:          # wake for the next TTL / schedule / timeout
                    timeout = min(tick_s, max(0.0, (due - _now_ms()) / 1000.0))
                try:
                    await asyncio.wait_for(wake.wait(), timeout)
                except asyncio.TimeoutError:
                    pass
            self.shard.goodbye_all()
            self._flush()
        finally:
            loop.remove_reader(fd)

    def close(self) -> None:
        self.sock.close(linger=1000)
        self.ctx.term()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_node(settings: Settings, server: NodeServer | None = None) -> int:
    """Run a node until SIGINT/SIGTERM (or ``server.stop()``); blocking. Returns exit code 0.

    On stop it sends GOODBYE to every known router, flushes and closes the socket. Signal
    handlers are only installed when called from the main thread. Raises zmq.ZMQError when
    ``settings.node_bind`` cannot be bound.
    """
    server = server or NodeServer(settings)
    loop = _new_loop()
    try:
        server.bind()
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
