"""One router's link to one node over ZeroMQ (design.md section 4).

A DEALER socket connects to the node's ROUTER socket. Outgoing wire messages are queued with
:meth:`NodeLink.send` and leave as ONE ZeroMQ message per event-loop turn (a batch). The link
says HELLO, exchanges heartbeats every ``link_heartbeat_ms`` and declares the node down after
``link_heartbeat_timeout`` (setting, 5 s) of silence, or when the node says GOODBYE. It is the only place a node's
death is noticed; the broker is told through ``on_up`` / ``on_down`` callbacks.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

import zmq

from shoal.shared import wire
from shoal.shared.errors import AMQPError, NOT_FOUND
from shoal.shared.wire import (T, TAG_CREDIT, TAG_GOODBYE, TAG_HEARTBEAT, TAG_HELLO_OK,
                               TAG_REPLY, TAG_SETTLE)

from shoal.router.links.records import LeaseRecords

log = logging.getLogger("shoal.router.links.node_link")

#: Batches queued towards one node (each side) before publishers are paused. Small, so that
#: what waits in the pipes (up to LINK_HWM * MAX_BATCH messages) stays a fraction of a second.
LINK_HWM = 16
#: Seconds that settlements and non-urgent credit may wait to share a batch (see send_lazy).
LAZY_FLUSH_S = 0.001
#: The same while this router holds a delivery lease from the node (router/lease.py): the
#: records of leased deliveries and the settlements wait this long, so that the node wakes
#: once per few bursts rather than once per burst (docs/performance.md, "Why a delivery lease").
LEASE_FLUSH_S = 0.005
#: Wire messages in one batch at most, so a node never swallows a huge backlog in one go
#: (it ticks and heartbeats between batches).
MAX_BATCH = 128

_EVENTS = int(zmq.EVENTS)      # plain ints: no enum arithmetic on every check
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)


class NodeDown(AMQPError):
    """A request could not be answered because its node is down (soft 404, as RabbitMQ
    answers for a queue whose home node is unreachable)."""

    def __init__(self, node_id: str) -> None:
        super().__init__(NOT_FOUND, f"node '{node_id}' is down or unreachable", soft=True)


class NodeLink:
    """The DEALER side of the router<->node link.

    ``on_message(link, msg)`` receives every node message except REPLY / HELLO_OK /
    HEARTBEAT / GOODBYE, which the link handles. ``on_up(link, restarted)`` runs after HELLO_OK
    (``restarted``: the node's incarnation changed); ``on_down(link)`` when it is lost.
    """

    def __init__(self, ctx: zmq.Context, node_id: str, endpoint: str, router_id: str,
                 heartbeat_ms: int, timeout_ms: int,
                 on_message: Callable[["NodeLink", list], None],
                 on_up: Callable[["NodeLink", bool], None],
                 on_down: Callable[["NodeLink"], None],
                 on_congestion: Callable[["NodeLink", bool], None] = lambda link, on: None,
                 on_read: Callable[[], None] = lambda: None,
                 secure: Callable[[zmq.Socket, str], None] | None = None) -> None:
        """``secure(socket, endpoint)``: set the socket's security (CURVE, shared/linkauth.py)
        before it connects. ``on_read()``: the Unix link (router/links/unix_link.py) runs it after
        the batches of each socket read are handled, and the broker writes the deliveries they
        made to the clients then, not at the end of the event-loop turn, so a large grant of
        credit reaches the consumer in the node's early batches (node/peers.py
        ``EARLY_BATCH``) instead of as one block. The ZeroMQ and in-process links do not:
        on ZeroMQ it measured worse near the link's limit (docs/performance-log.md, session 16)."""
        self._secure = secure
        self.node_id = node_id
        self.endpoint = endpoint
        self.router_id = router_id
        self.up = False
        self.incarnation: str | None = None
        self._hb = heartbeat_ms / 1000.0
        self._timeout = timeout_ms / 1000.0
        self._on_message, self._on_up, self._on_down = on_message, on_up, on_down
        self._on_congestion = on_congestion
        self._on_read = on_read
        self.congested = False  #: the node's queue is full: batches wait here
        self._open(ctx, endpoint)
        self._outbox: list[list] = []
        self._urgent: list[list] = []   # SETTLE / CREDIT: leave before queued publishes
        # Lazy SETTLE / CREDIT still in _urgent, to merge into: outcome -> SETTLE message,
        # consumer id -> CREDIT message (one wire message per batch instead of one per ack).
        self._lazy_settle: dict[int, list] = {}
        self._lazy_credit: dict[int, list] = {}
        self._records = LeaseRecords()  # LEASED / LEASE_END: leave before everything else
        self._front = 0                 # unsent records and urgent messages heading _outbox
        self.leases = 0                 #: delivery leases this router holds on the node
        self._flush_scheduled = False
        self._lazy_scheduled = False
        self._drain_scheduled = False
        self._req_seq = 0
        self._pending: dict[int, asyncio.Future] = {}
        self._last_recv = 0.0
        self._last_send = 0.0
        self._tasks: list[asyncio.Task] = []
        self._closed = False
        self.ready = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def queue_depth(self) -> int:
        """Wire messages waiting here for the node (metrics: shoal_link_queue_depth)."""
        return len(self._outbox) + len(self._urgent) + len(self._records)

    # ---- lifecycle ---------------------------------------------------------------------------
    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop, looked up once: on Python 3.11 every asyncio.get_running_loop()
        costs a getpid system call, and the hot path schedules a callback per batch."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _open(self, ctx: zmq.Context, endpoint: str) -> None:
        self._sock = ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.IMMEDIATE, 1)
        # Bounded: when the node falls this far behind, sends fail with EAGAIN and the link
        # pushes back on publishers (design.md section 7, "bound every buffer").
        self._sock.setsockopt(zmq.SNDHWM, LINK_HWM)
        self._sock.setsockopt(zmq.RCVHWM, 0)
        if self._secure is not None:
            self._secure(self._sock, endpoint)
        self._sock.connect(endpoint)
        self._mon = self._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    def start(self) -> None:
        self._watch(True)
        self._tasks = [asyncio.ensure_future(self._timer_loop())]
        self._hello()

    def _watch(self, on: bool) -> None:
        """Start (``on``) or stop reading the socket and its monitor."""
        loop = asyncio.get_running_loop()
        fds = self._sock.getsockopt(zmq.FD), self._mon.getsockopt(zmq.FD)
        if not on:
            for fd in fds:
                loop.remove_reader(fd)
            return
        # ZeroMQ's FD is edge-triggered: readable means "look at ZMQ_EVENTS", so every wake-up
        # (and every send, see _send_now) drains until EVENTS says nothing is left.
        loop.add_reader(fds[0], self._drain)
        loop.add_reader(fds[1], self._on_monitor)
        self._on_monitor()  # reading ZMQ_EVENTS once arms each edge-triggered FD
        self._drain()

    def _close_transport(self) -> None:
        self._mon.close(linger=0)
        self._sock.close(linger=100)

    async def stop(self) -> None:
        """Say GOODBYE (the node drops our consumers at once) and close."""
        if self._closed:
            return
        if self.up:
            self._outbox.append([T.GOODBYE])
            self._flush()
        self._closed = True
        for t in self._tasks:
            t.cancel()
        self._watch(False)
        await asyncio.sleep(0)
        self._close_transport()

    def _hello(self) -> None:
        # Straight to the socket: a HELLO must not wait behind a batch for a dead node.
        self._send_now([[T.HELLO, wire.WIRE_VERSION, self.router_id, self.node_id]])

    # ---- sending -----------------------------------------------------------------------------
    def send(self, msg: list, urgent: bool = False) -> None:
        """Queue one wire message; the batch leaves at the end of this event-loop turn.

        ``urgent`` messages (settlements, credit) go ahead of everything queued, so that
        consumers keep flowing while a node works through a backlog of publishes.
        """
        if urgent:
            if msg[0] == TAG_CREDIT:
                # Later lazy credit for this consumer must not be merged ahead of this one
                # (a drain, or a grant to a starved consumer).
                self._lazy_credit.pop(msg[1], None)
            self._urgent.append(msg)
        else:
            self._outbox.append(msg)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._running_loop().call_soon(self._flush)

    def send_lazy(self, msg: list) -> None:
        """Queue a message that may wait up to LAZY_FLUSH_S for company: settlements, and
        credit for consumers that still hold some. It still goes ahead of queued publishes,
        and leaves at once with any other batch. Saves a send and a node wake-up per ack.

        Successive lazy SETTLEs with one outcome merge into one message, and successive lazy
        CREDITs (never drains) for one consumer into one grant: moving a settlement or a
        standing grant earlier never changes what the node may deliver."""
        tag = msg[0]
        if tag == TAG_SETTLE:
            prev = self._lazy_settle.get(msg[1])
            if prev is not None:
                prev[2].extend(msg[2])
                return
            msg = [tag, msg[1], list(msg[2])]
            self._lazy_settle[msg[1]] = msg
        elif tag == TAG_CREDIT and not msg[3]:
            prev = self._lazy_credit.get(msg[1])
            if prev is not None:
                prev[2] += msg[2]
                return
            msg = list(msg)
            self._lazy_credit[msg[1]] = msg
        self._urgent.append(msg)
        self._lazy_later()

    def send_record(self, msg: list, now: bool = False) -> None:
        """Queue LEASED or LEASE_END (router/lease.py) ahead of everything else, to leave with
        the next batch or after LEASE_FLUSH_S; ``now``: at the end of this turn."""
        self._records.add(msg)
        if now:
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self._running_loop().call_soon(self._flush)
        else:
            self._lazy_later()

    def acked_unsent(self, delivery_id: int) -> int | None:
        """The client acknowledged leased delivery ``delivery_id``: None when its LEASED has
        left (settle it as always); else it is counted in a LEASE_ACKED instead
        (router/links/records.py), no SETTLE must follow, and the result is its publish id
        (0: none), which the caller confirms."""
        return self._records.acked(delivery_id)

    def _lazy_later(self) -> None:
        if not self._flush_scheduled and not self._lazy_scheduled:
            self._lazy_scheduled = True
            self._running_loop().call_later(LEASE_FLUSH_S if self.leases else LAZY_FLUSH_S,
                                            self._lazy_flush)

    def _lazy_flush(self) -> None:
        self._lazy_scheduled = False
        if self._flush_scheduled:
            return
        if self.leases and not self._outbox:    # nothing the node acts on yet: wait
            wait = self._records.hold_for(self._urgent, time.monotonic(), LEASE_FLUSH_S)
            if wait > 0:
                self._lazy_scheduled = True
                self._running_loop().call_later(wait, self._lazy_flush)
                return
        self._flush()

    def request(self, msg_without_req_id: list) -> asyncio.Future:
        """Send ``[tag, req_id, *fields]`` and return a future for the REPLY payload.

        The future raises AMQPError (the node's reply code and text) or NodeDown.
        """
        fut = self._running_loop().create_future()
        if not self.up:
            fut.set_exception(NodeDown(self.node_id))
            return fut
        self._req_seq += 1
        req_id = self._req_seq
        self._pending[req_id] = fut
        self.send([msg_without_req_id[0], req_id, *msg_without_req_id[1:]])
        return fut

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._records or self._urgent:   # in order, behind earlier ones still unsent
            front = self._records.take() + self._urgent
            self._outbox[self._front:self._front] = front
            self._front += len(front)
            self._urgent = []
            self._lazy_settle.clear()
            self._lazy_credit.clear()
        if not self._outbox or self._closed:
            return
        outbox = self._outbox
        sent = 0
        while sent < len(outbox):
            if not self._send_now(outbox[sent:sent + MAX_BATCH]):
                break
            sent += MAX_BATCH
        if sent >= len(outbox):
            outbox.clear()
        else:
            del outbox[:sent]
        self._front = max(0, self._front - sent)
        if outbox and self.up:
            # The node is not keeping up: keep the rest (nothing accepted is dropped), pause
            # the publishers, and try again shortly.
            if not self.congested:
                self.congested = True
                log.info("node %s is not keeping up: pausing publishers", self.node_id)
                self._on_congestion(self, True)
            self._flush_scheduled = True
            self._running_loop().call_later(0.002, self._flush)
        elif self.congested:
            self.congested = False
            self._on_congestion(self, False)

    def _send_now(self, batch: list[list]) -> bool:
        """Send one batch now; False when it could not be queued (node full or down)."""
        try:
            # Copying a small batch is cheaper than tracking a zero-copy frame; a large
            # message's frame goes without a copy.
            frame = wire.encode_batch(batch)
            self._sock.send(frame, _NOBLOCK, copy=len(frame) < wire.LARGE_FRAME)
            self._last_send = time.monotonic()
            return True
        except zmq.Again:
            # Queue full (HWM), or no connected peer (IMMEDIATE) when the node is down.
            return False
        except zmq.ZMQError as exc:
            log.warning("send to node %s failed: %s", self.node_id, exc)
            return False
        finally:
            # The FD is edge-triggered: a send (even a failed one) may consume the edge that
            # announced input, so look for input now rather than wait for one that won't come.
            if not self._closed and self._sock.get(_EVENTS) & _POLLIN \
                    and not self._drain_scheduled:
                self._drain_scheduled = True
                self._running_loop().call_soon(self._drain)

    # ---- receiving ---------------------------------------------------------------------------
    def _drain(self) -> None:
        """Handle every frame already waiting (one wake-up, many batches)."""
        self._drain_scheduled = False
        if self._closed:
            return
        sock = self._sock
        for _ in range(1024):
            try:
                if not sock.get(_EVENTS) & _POLLIN:
                    return
                batch = self._decode(sock.recv(_NOBLOCK))  # the frame is freed here,
            except zmq.Again:                              # before its batch is handled
                return
            except zmq.ZMQError:  # socket closed during shutdown
                return
            if batch is not None:
                self._handle_batch(batch)
        if not self._drain_scheduled:  # more than a turn's worth: yield, then go on
            self._drain_scheduled = True
            self._running_loop().call_soon(self._drain)

    def _decode(self, data: bytes) -> list[list] | None:
        try:
            return wire.decode_batch(data)
        except ValueError as exc:
            log.error("dropping frame from node %s: %s", self.node_id, exc)
            return None

    def _handle_batch(self, batch: list[list]) -> None:
        """Handle the wire messages of one batch from the node, in order."""
        self._last_recv = time.monotonic()
        for msg in batch:
            tag = msg[0]
            if tag == TAG_REPLY:
                fut = self._pending.pop(msg[1], None)
                if fut is not None and not fut.done():
                    code, text, payload = msg[2], msg[3], msg[4]
                    if code == wire.OK:
                        fut.set_result(payload)
                    else:
                        fut.set_exception(AMQPError(code, text))
            elif tag == TAG_HEARTBEAT:
                pass
            elif tag == TAG_HELLO_OK:
                self._hello_ok(msg)
            elif tag == TAG_GOODBYE:
                if self.up:
                    log.warning("node %s said goodbye", self.node_id)
                    self._go_down()
                self._hello()
            elif self.up:
                try:
                    self._on_message(self, msg)
                except Exception:
                    # Never let one bad message stop the link's receive loop.
                    log.exception("error handling %r from node %s", tag, self.node_id)

    def _hello_ok(self, msg: list) -> None:
        version, node_id, incarnation = msg[1], msg[2], msg[3]
        if version != wire.WIRE_VERSION or node_id != self.node_id:
            log.error("node at %s is %r with wire version %s; expected %r with version %s",
                      self.endpoint, node_id, version, self.node_id, wire.WIRE_VERSION)
            return
        restarted = self.incarnation is not None and incarnation != self.incarnation
        if self.up and not restarted:
            return
        if self.up and restarted:
            self._go_down()
        self.incarnation = incarnation
        self.up = True
        log.info("node %s is up at %s", self.node_id, self.endpoint)
        self._on_up(self, restarted)
        self.ready.set()

    def _go_down(self) -> None:
        self.up = False
        self.ready.clear()
        self._outbox.clear()
        self._urgent.clear()
        self._records.clear()
        self.leases = self._front = 0
        self._lazy_settle.clear()
        self._lazy_credit.clear()
        if self.congested:
            self.congested = False
            self._on_congestion(self, False)
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(NodeDown(self.node_id))
        self._on_down(self)

    def _on_monitor(self) -> None:
        """A closed connection (the node process died, a pod went away) is noticed at once
        from ZeroMQ's socket monitor; the silence timeout only catches hung nodes."""
        mon = self._mon
        while not self._closed:
            try:
                if not mon.get(_EVENTS) & _POLLIN:
                    return
                mon.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                return
            if self.up:
                log.warning("node %s disconnected", self.node_id)
                self._go_down()

    async def _timer_loop(self) -> None:
        while True:
            await asyncio.sleep(self._hb)
            now = time.monotonic()
            if self.up and now - self._last_recv > self._timeout:
                self._drain()  # our own loop may have been too busy to read: look first
            if self.up:
                if now - self._last_recv > self._timeout:
                    log.warning("node %s silent for %.1f s: marking it down", self.node_id,
                                now - self._last_recv)
                    self._go_down()
                    self._hello()
                elif now - self._last_send >= self._hb:
                    self.send([T.HEARTBEAT])
            else:
                self._hello()

