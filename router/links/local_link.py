"""The router's link to a node hosted in its own process and event loop (``shoal serve
--embed-node``, an ``inproc://`` endpoint): :class:`LocalLink`.

The protocol is :class:`~shoal.router.links.node_link.NodeLink`'s (HELLO, heartbeats, GOODBYE,
credit, batches of ``shared.wire`` messages, design.md section 4); only the transport differs:
each batch is handed to the node in memory through ``attach`` (the node side is
``shoal.node.server.NodeServer.attach_local``; the router never imports it), not through
ZeroMQ. A node that holds :data:`shoal.node.server.LOCAL_HWM` unread frames refuses a batch,
and the link pauses publishers as for a full ZeroMQ pipe. Errors are NodeLink's: a request to
a node that is down fails with :class:`~shoal.router.links.node_link.NodeDown` (soft 404).
"""
from __future__ import annotations

import time
from typing import Callable

import zmq

from shoal.shared import wire

from shoal.router.links.node_link import NodeLink


#: ``attach(identity, deliver) -> send``: connects a LocalLink to a node hosted in this
#: process (``shoal.node.server.NodeServer.attach_local``; the router never imports it).
#: Both callables take a batch as ``shared.wire.handover`` makes it.
Attach = Callable[[bytes, Callable[[list], None]], Callable[[list], bool]]


class LocalLink(NodeLink):
    """The link to a node hosted in this process and event loop (an ``inproc://`` endpoint,
    ``shoal serve --embed-node``).

    The protocol and batches are NodeLink's; only the transport differs: each batch is handed
    to the node in memory (``attach``) instead of through ZeroMQ, which at 5,000 msg/s saves
    about a quarter of the CPU per message (docs/performance-log.md, session 4). The hot path's
    messages are handed over as they are, every other message as a msgpack copy
    (``shared.wire.handover``, session 6). A node in
    the same process cannot die apart from it, so there is no monitor; heartbeats and the
    silence timeout still run. A node that holds :data:`shoal.node.server.LOCAL_HWM` unread
    frames refuses more, and the link pauses publishers as for a full ZeroMQ pipe.
    """

    def __init__(self, attach: Attach, *args, **kwargs) -> None:
        """``attach`` first, then NodeLink's arguments without ``ctx``."""
        self._attach = attach
        super().__init__(None, *args, **kwargs)

    def _open(self, ctx: zmq.Context | None, endpoint: str) -> None:
        self._node_send = self._attach(f"local-{self.router_id}".encode(), self._receive)

    def _watch(self, on: bool) -> None:
        """No socket to watch: frames arrive through ``_receive``."""

    def _close_transport(self) -> None:
        """Nothing to close: after stop, ``_receive`` drops what the node still sends."""

    def _send_now(self, batch: list[list]) -> bool:
        if not self._node_send(wire.handover(batch)):
            return False
        self._last_send = time.monotonic()
        return True

    def _receive(self, batch: list) -> None:
        # Called at the end of the node's turn: handle the batch in a callback of its own, so
        # that a router bug surfaces as it would from a socket read (logged by the loop) and
        # never ends the node's turn.
        self._running_loop().call_soon(self._receive_now, batch)

    def _receive_now(self, batch: list) -> None:
        if not self._closed:
            wire.received(batch)
            self._handle_batch(batch)
            wire.received(batch)

    def _drain(self) -> None:
        """Nothing to read: frames arrive through ``_receive``."""
