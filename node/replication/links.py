"""A node's links to the other nodes (design.md section 8), carrying batches of wire messages
(shared/wire.py's PEER_HELLO, RAFT, GROUP_CREATE, the streams') encoded with msgpack, one
batch per peer per flush. Two transports, one interface (:func:`open_peer_links` picks):

- :class:`PeerLinks`: one ZeroMQ DEALER socket per peer, connected to that node's ROUTER
  socket (``tcp://`` between hosts, the Helm chart's), CURVE-secured with the node's own key
  pair when the link has keys (shared/linkauth.py);
- :class:`UnixPeerLinks`: on one host (``shoal serve``, whose nodes' ``peer_bind`` is
  ``unix://``), a Unix stream socket per peer, written by the node's event loop and framed
  by shared/stream.py: no ZeroMQ I/O thread to wake per batch (docs/performance.md, "The
  same-host link").

Sends never block: a peer that is down or slow loses messages (ZeroMQ's ``ZMQ_IMMEDIATE`` and
bounded send queue; on a Unix socket, no connection or :data:`UNIX_WRITE_LIMIT` bytes not yet
taken by the kernel), which Raft tolerates. A connection that closes (the peer process died:
the OS closes its sockets) is reported at once through ``on_lost(node_id)``, so that
elections start without waiting out a timeout.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

import zmq

from shoal.shared import stream, wire
from shoal.shared.linkauth import connect_curve

log = logging.getLogger("shoal.node.replication")

#: Batches queued to one peer before sends are dropped.
SEND_HWM = 1000
#: Bytes written to a peer's Unix socket but not yet taken by its kernel buffer above which
#: batches are dropped, as ZeroMQ drops them past SEND_HWM (a stream's catch-up sends whole
#: chunks: room for many).
UNIX_WRITE_LIMIT = 64 << 20
#: Seconds between attempts to reach a peer's Unix socket, doubling up to UNIX_RECONNECT_MAX_S
#: (ZeroMQ's RECONNECT_IVL and RECONNECT_IVL_MAX below).
UNIX_RECONNECT_S = 0.1
UNIX_RECONNECT_MAX_S = 1.0


def open_peer_links(ctx: zmq.Context, node_id: str, peers: list[tuple[str, str]],
                    settings: Any) -> "PeerLinks | UnixPeerLinks":
    """The links to ``peers`` (``[(node_id, endpoint), ...]``): :class:`UnixPeerLinks` when
    every endpoint is ``unix://PATH``, else :class:`PeerLinks` (ZeroMQ in ``ctx``). Raises
    ValueError for a mix of the two (one host's nodes share one transport)."""
    unix = [stream.scheme_path(e) is not None for p, e in peers if p != node_id]
    if unix and all(unix):
        return UnixPeerLinks(node_id, peers)
    if any(unix):
        raise ValueError("peers: every endpoint unix://, or none")
    return PeerLinks(ctx, node_id, peers, settings)


class _Outbox:
    """What both transports share: each peer's messages queued until :meth:`flush` sends
    them as one batch through ``_send(peer, msgs) -> bool`` (False: dropped; TypeError: the
    wire cannot carry them)."""

    def __init__(self) -> None:
        self.out: dict[str, list[list]] = {}
        self.sent = 0
        self.dropped = 0

    @property
    def nodes(self) -> list[str]:
        return list(self._peers())

    def _peers(self):
        raise NotImplementedError

    def _send(self, peer: str, msgs: list[list]) -> bool:
        raise NotImplementedError

    def queue(self, peer: str, msg: list) -> None:
        """Queue ``msg`` for ``peer`` (sent by :meth:`flush`)."""
        if peer in self._peers():
            self.out.setdefault(peer, []).append(msg)

    def broadcast(self, msg: list) -> None:
        for peer in self._peers():
            self.queue(peer, msg)

    def flush(self) -> None:
        """Send each peer its queued messages as one batch (dropped when it cannot take it)."""
        out, self.out = self.out, {}
        for peer, msgs in out.items():
            try:
                sent = self._send(peer, msgs)
            except TypeError as exc:
                log.error("cannot encode batch for node %s: %s", peer, exc)
                continue
            if sent:
                self.sent += 1
            else:
                self.dropped += 1


class PeerLinks(_Outbox):
    """DEALER sockets to ``peers`` (``[(node_id, endpoint), ...]``) in ``ctx``."""

    def __init__(self, ctx: zmq.Context, node_id: str, peers: list[tuple[str, str]],
                 settings: Any) -> None:
        super().__init__()
        self.node_id = node_id
        self.socks: dict[str, zmq.Socket] = {}
        self.monitors: dict[str, zmq.Socket] = {}
        for peer, endpoint in peers:
            if peer == node_id:
                continue
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.IDENTITY, f"peer:{node_id}".encode())
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, SEND_HWM)
            s.setsockopt(zmq.IMMEDIATE, 1)
            s.setsockopt(zmq.RECONNECT_IVL, 100)
            s.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
            if settings.link_curve_secret_key:
                # every node has the nodes' key pair: it is a client of its peers' servers
                settings_client = _ClientKeys(settings)
                connect_curve(s, endpoint, settings_client)
            s.connect(endpoint)
            self.socks[peer] = s
            self.monitors[peer] = s.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    def _peers(self):
        return self.socks

    def _send(self, peer: str, msgs: list[list]) -> bool:
        frame = wire.encode_batch(msgs)
        try:
            self.socks[peer].send(frame, zmq.NOBLOCK, copy=len(frame) < wire.LARGE_FRAME)
            return True
        except zmq.ZMQError:
            return False

    def watch(self, add_reader: Callable, on_lost: Callable[[str], None]) -> None:
        """Call ``on_lost(node_id)`` when a connection to a peer closes (its monitor's FD
        through ``add_reader(fd, callback)``, an event loop's)."""
        for peer, mon in self.monitors.items():
            def ready(peer: str = peer, mon: zmq.Socket = mon) -> None:
                while mon.get(zmq.EVENTS) & zmq.POLLIN:
                    mon.recv_multipart(zmq.NOBLOCK)
                    on_lost(peer)
            add_reader(mon.getsockopt(zmq.FD), ready)
            ready()     # reading ZMQ_EVENTS arms the edge-triggered FD

    def fds(self) -> list[int]:
        return [m.getsockopt(zmq.FD) for m in self.monitors.values()]

    def close(self) -> None:
        for peer, s in self.socks.items():
            try:
                s.disable_monitor()
            except zmq.ZMQError:
                pass
            self.monitors[peer].close(linger=0)
            s.close(linger=0)
        self.socks.clear()


class _ClientKeys:
    """The settings connect_curve reads, for a node connecting to another node: the server
    key is the nodes' own public key (every node has the same pair)."""

    def __init__(self, settings: Any) -> None:
        self.link_curve_server_key = settings.link_curve_public_key
        self.link_curve_public_key = settings.link_curve_public_key
        self.link_curve_secret_key = settings.link_curve_secret_key


class _UnixPeer(asyncio.Protocol):
    """One connection to a peer's ``unix://`` endpoint. Nothing comes back on it (a node
    answers through its own links), so what it reads is discarded."""

    def __init__(self, links: "UnixPeerLinks", peer: str) -> None:
        self.links, self.peer = links, peer
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        self.links._lost(self)


class UnixPeerLinks(_Outbox):
    """Unix stream sockets to ``peers`` (``[(node_id, "unix://PATH"), ...]``), each dialled by
    the running event loop until the peer's listener answers (node/unix_listener.py on its
    ``peer_bind``), and again after it closes. Create it inside the loop (NodeServer.serve)."""

    def __init__(self, node_id: str, peers: list[tuple[str, str]]) -> None:
        super().__init__()
        self.node_id = node_id
        self._paths = {p: stream.scheme_path(e) for p, e in peers if p != node_id}
        self._conns: dict[str, _UnixPeer] = {}
        self._diallers: dict[str, asyncio.Task] = {}
        self._on_lost: Callable[[str], None] | None = None
        self._closed = False
        for peer in self._paths:
            self._dial(peer)

    def _peers(self):
        return self._paths

    def _send(self, peer: str, msgs: list[list]) -> bool:
        conn = self._conns.get(peer)
        return conn is not None and stream.write_batch(conn.transport, msgs, UNIX_WRITE_LIMIT)

    def _dial(self, peer: str) -> None:
        if not self._closed and peer not in self._diallers and peer not in self._conns:
            self._diallers[peer] = asyncio.ensure_future(self._dial_loop(peer))

    async def _dial_loop(self, peer: str) -> None:
        try:
            got = await stream.dial(self._paths[peer], lambda: _UnixPeer(self, peer),
                                    lambda: not self._closed, UNIX_RECONNECT_S,
                                    UNIX_RECONNECT_MAX_S, f"node {peer}")
            if got is not None:
                conn = got[1]
                if self._closed:
                    conn.transport.close()
                else:
                    self._conns[peer] = conn
        finally:
            self._diallers.pop(peer, None)

    def _lost(self, conn: _UnixPeer) -> None:
        if self._conns.get(conn.peer) is not conn:
            return
        del self._conns[conn.peer]
        if self._closed:
            return
        if self._on_lost is not None:
            self._on_lost(conn.peer)
        asyncio.get_running_loop().call_later(UNIX_RECONNECT_S, self._dial, conn.peer)

    def watch(self, add_reader: Callable, on_lost: Callable[[str], None]) -> None:
        """Call ``on_lost(node_id)`` when the connection to a peer closes (``add_reader`` is
        PeerLinks's and unused: the event loop reports the close itself)."""
        self._on_lost = on_lost

    def fds(self) -> list[int]:
        return []

    def close(self) -> None:
        """Stop dialling and close every connection (what is written still goes). Call it in
        the loop that made them (NodeServer.serve's end); later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        for task in self._diallers.values():
            task.cancel()
        self._diallers.clear()
        for conn in self._conns.values():
            if conn.transport is not None:
                conn.transport.close()
        self._conns.clear()
