"""A node's links to the other nodes (design.md section 8): one ZeroMQ DEALER socket per peer,
connected to that node's ROUTER socket (the one the routers reach), CURVE-secured with the
node's own key pair when the link has keys (shared/linkauth.py), carrying batches of wire
messages (shared/wire.py's PEER_HELLO, RAFT, GROUP_CREATE) encoded with msgpack.

Sends never block: a peer that is down or slow loses messages (``ZMQ_IMMEDIATE``, a bounded
send queue), which Raft tolerates. A connection that closes (the peer process died: the OS
closes its sockets) is reported at once through ``on_lost(node_id)`` from the socket monitor,
so that elections start without waiting out a timeout.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import zmq

from shoal.shared import wire
from shoal.shared.linkauth import connect_curve

log = logging.getLogger("shoal.node.replication")

#: Batches queued to one peer before sends are dropped.
SEND_HWM = 1000


class PeerLinks:
    """DEALER sockets to ``peers`` (``[(node_id, endpoint), ...]``) in ``ctx``."""

    def __init__(self, ctx: zmq.Context, node_id: str, peers: list[tuple[str, str]],
                 settings: Any) -> None:
        self.node_id = node_id
        self.socks: dict[str, zmq.Socket] = {}
        self.monitors: dict[str, zmq.Socket] = {}
        self.out: dict[str, list[list]] = {}
        self.sent = 0
        self.dropped = 0
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

    @property
    def nodes(self) -> list[str]:
        return list(self.socks)

    def queue(self, peer: str, msg: list) -> None:
        """Queue ``msg`` for ``peer`` (sent by :meth:`flush`)."""
        if peer in self.socks:
            self.out.setdefault(peer, []).append(msg)

    def broadcast(self, msg: list) -> None:
        for peer in self.socks:
            self.queue(peer, msg)

    def flush(self) -> None:
        """Send each peer its queued messages as one batch (dropped when it cannot take it)."""
        out, self.out = self.out, {}
        for peer, msgs in out.items():
            try:
                frame = wire.encode_batch(msgs)
            except TypeError as exc:
                log.error("cannot encode batch for node %s: %s", peer, exc)
                continue
            try:
                self.socks[peer].send(frame, zmq.NOBLOCK, copy=len(frame) < wire.LARGE_FRAME)
                self.sent += 1
            except zmq.ZMQError:
                self.dropped += 1

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
