"""The router's side of the same-host link: a Unix stream socket (``unix://PATH``).

On one host, a ZeroMQ hop wakes four threads per direction (each side's ZeroMQ I/O thread
besides its Python thread); at 5,000 msg/s those wake-ups, not Shoal's code, are most of a
message's CPU (docs/performance.md, issue 20). Here the router's own event loop reads and writes
the node's socket: one wake-up per batch on each side.

The protocol is :class:`~shoal.router.links.node_link.NodeLink`'s (HELLO, heartbeats, GOODBYE, credit,
batches); only the transport differs, framed by :mod:`shoal.shared.stream`. What ZeroMQ did for
the link is done here:

- *connecting and reconnecting*: the socket is dialled until the node's path answers, and
  again after it closes (a node restart), every :data:`RECONNECT_S` to :data:`RECONNECT_MAX_S`;
- *a dead node*: the connection closing (EOF) marks the node down at once, as ZeroMQ's socket
  monitor did; a hung node still meets ``link_heartbeat_timeout``;
- *back-pressure*: ZeroMQ's high-water mark becomes a bound on bytes written but not yet taken
  by the kernel (:data:`WRITE_LIMIT`); past it a batch is refused and the link pauses the
  publishers, exactly as on a full ZeroMQ pipe.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

import zmq

from shoal.shared import stream

from shoal.router.links.local_link import Attach, LocalLink
from shoal.router.links.node_link import NodeLink

log = logging.getLogger("shoal.router.links.node_link")

#: Bytes waiting in the transport (not yet in the kernel's socket buffer) above which batches
#: are refused and publishers paused: with the kernel's buffer, about the 16 batches that
#: ZeroMQ's high-water mark allowed (router.link.LINK_HWM).
WRITE_LIMIT = 1 << 20
#: Seconds between attempts to reach a node's socket, doubling up to RECONNECT_MAX_S.
RECONNECT_S = 0.05
RECONNECT_MAX_S = 1.0


class _Connection(asyncio.Protocol):
    """Feeds one connection's frames to its link."""

    def __init__(self, link: "UnixLink") -> None:
        self.link = link
        self.reader = stream.FrameReader()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.link._connected(self)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
        except ValueError as exc:
            log.error("closing the link to node %s: %s", self.link.node_id, exc)
            self.transport.abort()
            return
        link = self.link
        for frame in frames:
            if link._conn is not self:
                break
            batch = link._decode(frame)
            if batch is not None:
                link._handle_batch(batch)
        link._on_read()

    def connection_lost(self, exc: Exception | None) -> None:
        self.link._lost(self)


class UnixLink(NodeLink):
    """The link to a node on this host over ``unix://PATH``, read by the router's event loop
    (no ZeroMQ socket, context or I/O thread). Arguments are NodeLink's; ``ctx`` is unused."""

    def _open(self, ctx, endpoint: str) -> None:
        self._path = stream.scheme_path(endpoint)
        self._conn: _Connection | None = None
        self._dialler: asyncio.Task | None = None

    def _watch(self, on: bool) -> None:
        """Start dialling the node (``on``), or stop: cancel the dialler, drop the socket."""
        if on:
            self._dial()
            return
        if self._dialler is not None:
            self._dialler.cancel()
            self._dialler = None
        conn, self._conn = self._conn, None
        if conn is not None and conn.transport is not None:
            conn.transport.close()    # writes what is buffered (GOODBYE), then closes

    def _close_transport(self) -> None:
        """Nothing left: _watch(False) closed the socket."""

    def _drain(self) -> None:
        """Nothing to poll: frames arrive through the connection's ``data_received``."""

    def _dial(self) -> None:
        if self._dialler is None and not self._closed:
            self._dialler = asyncio.ensure_future(self._dial_loop())

    async def _dial_loop(self) -> None:
        try:
            await stream.dial(self._path, lambda: _Connection(self),
                              lambda: not self._closed and self._conn is None,
                              RECONNECT_S, RECONNECT_MAX_S, f"node {self.node_id}")
        finally:
            self._dialler = None

    def _connected(self, conn: _Connection) -> None:
        if self._closed:
            conn.transport.close()
            return
        self._conn = conn
        self._hello()

    def _lost(self, conn: _Connection) -> None:
        if conn is not self._conn:
            return
        self._conn = None
        if self._closed:
            return
        if self.up:
            log.warning("node %s disconnected", self.node_id)
            self._go_down()
        self._running_loop().call_later(RECONNECT_S, self._dial)

    def _send_now(self, batch: list[list]) -> bool:
        """Write one batch; False when it could not be (no connection, or WRITE_LIMIT bytes
        already wait: the node is not keeping up)."""
        conn = self._conn
        if conn is None or not stream.write_batch(conn.transport, batch, WRITE_LIMIT):
            return False
        self._last_send = time.monotonic()
        return True


def open_link(ctx: zmq.Context, attach: Attach | None, args: tuple,
              secure: Callable[[zmq.Socket, str], None]) -> NodeLink:
    """The link to one node, by where it is: :class:`LocalLink` for a node hosted in this
    process (``attach``), :class:`UnixLink` for a ``unix://`` endpoint, else the ZeroMQ
    :class:`NodeLink` (``secure`` sets CURVE on its socket). ``args``: NodeLink's arguments
    from ``node_id`` on, the endpoint second."""
    if attach is not None:
        return LocalLink(attach, *args)
    if stream.scheme_path(args[1]) is not None:
        return UnixLink(None, *args)
    return NodeLink(ctx, *args, secure=secure)
