"""The node's side of the same-host link: a Unix stream socket (``unix://PATH``, issue 20).

The node's event loop accepts the routers' connections and reads them itself, instead of a
ZeroMQ ROUTER socket whose I/O thread would wake first (docs/performance.md). Each connection
is one router: it gets an identity (``unix-N``) that plays the part of a ZeroMQ routing id, and
its frames (:mod:`shoal.shared.stream`) are queued for the server's next turn.

Bounds, as the ZeroMQ socket's receive high-water mark gave them: a connection whose frames
fill :data:`INBOX_FRAMES` stops being read until the node's turn takes them, so a router that
outruns the node sees its own write buffer fill and pauses its publishers.

The socket file is made readable and writable by its owner only (mode 0600): on one host the
file's permissions are the link's access control, as CURVE keys are between pods.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
from typing import Callable

from shoal.shared import stream

log = logging.getLogger("shoal.node")

#: Frames queued from all connections before reading pauses (the node takes them all each turn).
INBOX_FRAMES = 64


class _Connection(asyncio.Protocol):
    def __init__(self, listener: "UnixListener", identity: bytes) -> None:
        self.listener = listener
        self.identity = identity
        self.reader = stream.FrameReader()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.listener._conns[self.identity] = self

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
        except ValueError as exc:
            log.warning("closing link connection %r: %s", self.identity, exc)
            self.transport.abort()
            return
        if frames:
            self.listener._received(self, frames)

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener._lost(self)


class UnixListener:
    """Routers' connections on ``path``.

    ``wake()`` is called when frames arrive (the server schedules a turn);
    ``lost(identity)`` when a router's connection closes (the server forgets that router at
    once: a Unix socket says whose connection it was, which ZeroMQ's monitor does not).
    ``prefix`` starts each connection's identity: ``unix-`` for routers, ``peer:unix-`` on the
    endpoint the other nodes reach (``peer_bind``; node/replication/links.py
    ``UnixPeerLinks``), whose batches the node's turn takes first, as it does those of
    ZeroMQ's ``peer:`` identities.
    """

    def __init__(self, path: str, wake: Callable[[], None],
                 lost: Callable[[bytes], None], prefix: bytes = b"unix-") -> None:
        self.path = path
        self._prefix = prefix
        self._wake, self._on_lost = wake, lost
        self._sock: socket.socket | None = None
        self._server: asyncio.AbstractServer | None = None
        self._conns: dict[bytes, _Connection] = {}
        self._paused: list[_Connection] = []
        self._inbox: list[tuple[bytes, bytes]] = []
        self._next_id = 0
        self._closed = False
        self._bound = False     # the socket file is ours to remove

    def bind(self) -> None:
        """Bind and listen on the path, replacing a stale socket file a dead node left (never
        another kind of file). Raises OSError (path unusable, or a live node answers there)."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            st = None
        if st is not None:
            if not stat.S_ISSOCK(st.st_mode):
                raise OSError(f"{self.path} exists and is not a socket")
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                try:
                    probe.connect(self.path)
                except OSError:
                    os.unlink(self.path)        # stale: nobody listens there
                else:
                    raise OSError(f"another process already listens on {self.path}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.path)
            os.chmod(self.path, 0o600)
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._bound = True

    async def start(self) -> None:
        """Accept connections in the running event loop (after :meth:`bind`)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._accept, sock=self._sock)

    def _accept(self) -> _Connection:
        self._next_id += 1
        return _Connection(self, b"%s%d" % (self._prefix, self._next_id))

    def has(self, identity: bytes) -> bool:
        """Whether router ``identity`` is linked through this listener."""
        return identity in self._conns

    def send(self, identity: bytes, messages: list[list]) -> bool:
        """Write a batch of wire messages to the router ``identity`` if it is one of this
        listener's connections; returns whether it is (False: not ours, send it another way).
        A batch for a connection that is closing is dropped, as ZeroMQ drops one for a peer
        that is gone. The node's sends are not bounded here, as its ZeroMQ socket's were not
        (SNDHWM 0): the routers read whatever comes, and their deliveries are bounded by
        credit."""
        conn = self._conns.get(identity)
        if conn is None:
            return False
        stream.write_batch(conn.transport, messages)     # dropped when closing
        return True

    def take(self) -> list[tuple[bytes, bytes]]:
        """The frames received since the last call, ``(identity, batch bytes)`` in arrival
        order; reading resumes on connections paused for a full inbox."""
        frames, self._inbox = self._inbox, []
        if self._paused:
            for conn in self._paused:
                if not conn.transport.is_closing():
                    conn.transport.resume_reading()
            self._paused.clear()
        return frames

    def _received(self, conn: _Connection, frames: list[bytes]) -> None:
        identity = conn.identity
        inbox = self._inbox
        inbox.extend((identity, f) for f in frames)
        if len(inbox) >= INBOX_FRAMES and conn not in self._paused:
            conn.transport.pause_reading()
            self._paused.append(conn)
        self._wake()

    def _lost(self, conn: _Connection) -> None:
        if self._conns.pop(conn.identity, None) is None:
            return
        if conn in self._paused:
            self._paused.remove(conn)
        self._on_lost(conn.identity)

    def close(self) -> None:
        """Stop accepting, close every connection (what is written still goes) and remove the
        socket file if this listener bound it (never a live node's that refused the bind).
        Later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.close()
            self._server = None
        elif self._sock is not None:
            self._sock.close()
        self._sock = None
        for conn in list(self._conns.values()):
            conn.transport.close()
        if self._bound:
            try:
                os.unlink(self.path)
            except OSError:
                pass
