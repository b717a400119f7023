"""One client TCP connection: moves bytes between the socket and the sans-IO AMQPConnection.

asyncio only moves bytes here (design.md section 7); the protocol lives in
:mod:`shoal.router.amqp.connection` and the broker logic in :mod:`shoal.router.frontend.channel`.
"""
from __future__ import annotations

import asyncio
import logging
import time

from pamqp import commands as C

from shoal.shared.errors import INTERNAL_ERROR, AMQPError
from shoal.shared.wire import T

from shoal.router.amqp import events as E
from shoal.router.access.users import VhostAccess
from shoal.router.amqp.connection import AMQPConnection
from shoal.router.frontend.admission import is_loopback, refuse_channel, refuse_connection
from shoal.router.frontend.amqp10_client import AMQP10Connection
from shoal.router.frontend.send_timeout import SendClock
from shoal.router.frontend.tls import peer_identity
from shoal.router.broker import Broker
from shoal.router.frontend.channel import Channel

log = logging.getLogger("shoal.router.frontend.client")

#: Bytes read from a client socket at a time: sized to about READ_MESSAGES of the client's
#: publishes (between READ_MIN and READ_MAX), READ_START until it has published. A read that
#: fills the buffer ends the client's reading for this event-loop turn (a quiet client's reads
#: are far smaller and never pay for that): a flooding publisher then gets one read per turn,
#: and deliveries, acks and other clients are served in between (uvloop would otherwise read
#: up to 32 x 256 KB in a row). Counting messages rather than bytes keeps the loop's turns
#: short under many small publishes (so consumers' credit comes back in time and queues do not
#: grow under overload) without slowing large messages down.
READ_MESSAGES = 16
READ_MIN = 4 * 1024
READ_MAX = 64 * 1024
READ_START = 16 * 1024
#: seconds a client may take to close its socket after our close-ok (RabbitMQ's
#: ``CLOSING_TIMEOUT``, rabbit_reader)
CLOSE_LINGER_S = 1.0


class ClientConnection(asyncio.BufferedProtocol):
    """The asyncio side of one AMQP client connection."""

    def __init__(self, broker: Broker, tls: bool = False) -> None:
        """``tls``: accepted on the amqps listener (a verified client certificate then
        offers EXTERNAL)."""
        self.broker = broker
        self.tls = tls
        s = broker.settings
        self.owner = broker.new_connection_id()
        self.vhost = "/"
        self.access: VhostAccess | None = None   #: the user's permissions in vhost (open)
        self._counted: tuple[str, str] | None = None  #: (user, vhost) in broker.limits
        self.channels: dict[int, Channel] = {}
        self.exclusive_queues: set[str] = set()
        self.capabilities: dict = {}
        self.client_properties: dict = {}
        self.name = ""
        self.transport: asyncio.Transport | None = None
        self.amqp: AMQPConnection | None = None
        self._settings = s
        self._done = False
        self._linger: asyncio.TimerHandle | None = None   #: see _await_client_close
        self.publisher = False  #: has published: paused while a node link is congested
        self._congestion_paused = False  #: reading paused by set_reading(False)
        self._alarm_paused = False  #: a publisher not read while the broker is blocked
        self._turn_paused = False        #: reading paused until the next loop turn
        #: the event loop, looked up once (connection_made): on Python 3.11 each
        #: asyncio.get_running_loop() is a getpid system call
        self._loop: asyncio.AbstractEventLoop | None = None
        self._send_clock = SendClock()  #: what we wrote and the client did not read
        # READ_START bytes per connection; READ_MAX only for publishers of large messages
        # (thousands of idle or small-message connections must stay cheap).
        self._rbuf = memoryview(bytearray(READ_START))
        self._rview = self._rbuf    # what get_buffer hands out: its length is the read size
        self._head = b""        #: the protocol header's first octets, until it picks a codec
        self._sniffing = True   #: the protocol header has not been read yet
        self._published = 0     #: publishes completed (counted in _handle)
        self._unmeasured = 0    #: bytes read since the last read that completed a publish

    # ---- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self._loop = asyncio.get_running_loop()
        s = self._settings
        peer = transport.get_extra_info("peername")
        local = transport.get_extra_info("sockname")
        self.peer = tuple(peer[:2]) if isinstance(peer, tuple) else ("?", 0)
        self.local = tuple(local[:2]) if isinstance(local, tuple) else ("?", 0)
        #: RabbitMQ's connection name (the management API's, router/live.py)
        self.name = f"{self.peer[0]}:{self.peer[1]} -> {self.local[0]}:{self.local[1]}"
        self.connected_at = int(time.time() * 1000)
        users, loopback = self.broker.users, is_loopback(peer)
        where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "?"
        identity = peer_identity(transport.get_extra_info("ssl_object"),
                                 s.ssl_cert_login_from) if self.tls else None
        self.amqp = AMQPConnection(
            authenticate=lambda user, password: users.authenticate(user, password, where,
                                                                   loopback),
            vhosts=users.vhosts, frame_max=s.frame_max, channel_max=s.channel_max,
            heartbeat=s.heartbeat, max_message_size=s.max_message_size,
            peer_is_loopback=loopback, loopback_users=(),   # checked by users.authenticate
            admit=lambda user, vhost: refuse_connection(self.broker, user, vhost),
            admit_channel=lambda: refuse_channel(self.broker, self.amqp.user),
            handshake_timeout=s.handshake_timeout / 1000, external_identity=identity)
        transport.set_write_buffer_limits(high=s.max_output_buffer,
                                          low=s.max_output_buffer // 4)
        self.broker.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self._sniffing and not self._sniff(data):
            return
        try:
            self._handle(self.amqp.receive_data(data))
        except Exception:
            # A bug must cost one connection, never the router: 541 and close it.
            log.exception("internal error on connection %s", self.owner)
            self.fail(0, AMQPError(INTERNAL_ERROR, "internal error", soft=False))
        self.flush()

    def _sniff(self, data: bytes) -> bool:
        """The protocol header picks the codec (as RabbitMQ and Qpid Broker-J do): AMQP 1.0's
        (``AMQP`` 0|2|3 1 0 0; AMQP 0-10's ``AMQP 1 1 0 10`` is not) hands this socket to an AMQP10Connection
        (router/frontend/amqp10_client.py). Returns whether ``data`` is still ours."""
        head = self._head + data
        if len(head) < 8 and head[:4] == b"AMQP"[:len(head[:4])]:
            self._head = head           # too short to tell: wait for more
            return False
        self._sniffing = False
        self._head = b""
        if head[:4] == b"AMQP" and head[4] in (0, 2, 3) and head[5:8] == b"\x01\x00\x00":
            self._done = True
            self.broker.connections.discard(self)
            conn = AMQP10Connection(self.broker, self.transport, self.tls, self.owner)
            self.transport.set_protocol(conn)
            conn.data_received(head)
            return False
        if len(head) > len(data):       # the octets held back go to the 0-9-1 codec
            self.data_received(head)
            return False
        return True

    # asyncio.BufferedProtocol: the socket is read into our buffer, len(_rview) at most.
    def get_buffer(self, sizehint: int) -> memoryview:
        return self._rview

    def buffer_updated(self, nbytes: int) -> None:
        full = nbytes >= len(self._rview)
        before = self._published
        self.data_received(self._rbuf[:nbytes].tobytes())
        self._unmeasured += nbytes
        published = self._published - before
        if published:
            size = self._unmeasured * READ_MESSAGES // published
            self._unmeasured = 0
            size = READ_MIN if size < READ_MIN else READ_MAX if size > READ_MAX else size
            if size != len(self._rview):
                if size > len(self._rbuf):
                    self._rbuf = memoryview(bytearray(READ_MAX))
                self._rview = self._rbuf[:size]
        if full and not self._turn_paused and self.transport is not None \
                and not self.transport.is_closing():
            self._turn_paused = True
            self.transport.pause_reading()
            self._loop.call_soon(self._end_turn_pause)

    def _end_turn_pause(self) -> None:
        self._turn_paused = False
        self._resume_reading()

    def _resume_reading(self) -> None:
        """Read the socket again unless a turn, congestion or alarm pause still holds."""
        if not (self._turn_paused or self._congestion_paused or self._alarm_paused) and \
                self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def eof_received(self) -> bool:
        self._handle(self.amqp.receive_data(b""))
        self.flush()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._linger is not None:
            self._linger.cancel()
        self._teardown()

    def set_reading(self, on: bool) -> None:
        """Resume or pause reading from the client socket (node back-pressure)."""
        self._congestion_paused = not on
        if on:
            self._resume_reading()
        elif self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def pause_writing(self) -> None:
        for ch in self.channels.values():
            ch.pool.paused = True

    def resume_writing(self) -> None:
        for ch in self.channels.values():
            ch.pool.paused = False
            self.broker.replenish_channel(ch)

    # ---- events ------------------------------------------------------------------------------
    def _handle(self, events: list) -> None:
        for ev in events:
            t = type(ev)
            if t is E.AcksReceived:     # a run of basic.ack on one channel: one batch
                ch = self.channels.get(ev.channel)
                if ch is not None:
                    ch.handle_acks(ev.acks)
                continue
            if t is E.MessagePublished:
                self._published += 1
                ch = self.channels.get(ev.channel)
                if ch is not None:
                    ch.handle_publish(ev)
                if not self.publisher:
                    self.publisher = True
                    if self.broker.congested:
                        self.set_reading(False)
                if self.broker.blocked_reason is not None and not self._alarm_paused:
                    self._block(self.broker.blocked_reason)
            elif t is E.MethodReceived:
                ch = self.channels.get(ev.channel)
                if ch is not None:
                    ch.handle_method(ev.method)
            elif t is E.ChannelOpened:
                self.channels[ev.channel] = Channel(self, ev.channel, self.broker)
            elif t is E.ChannelClosed:
                ch = self.channels.pop(ev.channel, None)
                if ch is not None:
                    ch.close()
            elif t is E.ChannelCloseRequested:    # the last of its read: answered, read on
                gone, more = self.amqp.answer_client_close(ev.channel)
                ch = self.channels.pop(ev.channel, None) if gone else None
                if ch is not None:
                    ch.close()
                self._handle(more)
            elif t is E.ConnectionOpened:
                self.vhost = ev.vhost
                self.access = self.broker.users.vhost_access(ev.user, ev.vhost)
                self.broker.limits.connection_opened(ev.user, ev.vhost)
                self._counted = (ev.user, ev.vhost)
                self.broker.report_soon.set()
                props = ev.client_properties
                self.client_properties = props if isinstance(props, dict) else {}
                caps = self.client_properties.get("capabilities") or {}
                self.capabilities = caps if isinstance(caps, dict) else {}
            elif t is E.ConnectionClosed or (t is E.ConnectionCloseRequested
                                             and self.amqp.answer_connection_close()):
                self._teardown()

    @property
    def blocked(self) -> bool:
        """Blocked by a resource alarm (connection.blocked sent, not read)."""
        return self._alarm_paused

    def _block(self, reason: str) -> None:
        """A publish while the broker is blocked (a node's resource alarm or unwritable
        journal): as RabbitMQ, ``connection.blocked`` (reason) to a client that announced the
        capability, and its socket is no longer read (its consumers' deliveries still go
        out; its heartbeat monitor rests meanwhile, as RabbitMQ's)."""
        self._alarm_paused = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self._send_blocked(C.Connection.Blocked(reason[:255]))

    def unblock(self) -> None:
        """The broker is no longer blocked: ``connection.unblocked`` and read again, if this
        connection was blocked."""
        if self._alarm_paused:
            self._alarm_paused = False
            self._send_blocked(C.Connection.Unblocked())
            self._resume_reading()

    def _send_blocked(self, method) -> None:
        if self.amqp is not None and self.capabilities.get("connection.blocked"):
            self.amqp.send_method(0, method)
            self.broker.mark_dirty(self)

    def fail(self, channel: int, err: AMQPError) -> None:
        """Turn a broker error into channel.close / connection.close (the one converter)."""
        if self.amqp is not None and not self.amqp.is_closed:
            self.amqp.fail(channel, err)
            self.broker.mark_dirty(self)

    def flush(self) -> None:
        if self.transport is None or self.amqp is None:
            return
        for ch in self.channels.values():
            if ch._confirmed:
                ch.flush_confirms()
        data = self.amqp.data_to_send()
        if data and not self.transport.is_closing():
            self.transport.write(data)
            self._send_clock.written += len(data)
        if self.amqp.is_closed:
            self._teardown()
            if not self.transport.is_closing() and self._linger is None:
                if self.amqp.linger_on_close:
                    self._await_client_close()
                else:
                    self.transport.close()

    def _await_client_close(self) -> None:
        """After the close-ok of a client's connection.close, leave the socket to the client
        for up to :data:`CLOSE_LINGER_S`, as RabbitMQ does (``rabbit_reader``'s closing
        timeout, 1 s): what it still sends (amqplib writes its connection.close ahead of
        channel frames it had buffered) is read and dropped, so its writes do not meet a
        reset (EPIPE) when we close first."""
        self._linger = asyncio.get_running_loop().call_later(CLOSE_LINGER_S,
                                                             self.transport.close)
        self.transport.resume_reading()     # whatever paused it: only dropped now

    def tick(self, now: float) -> float | None:
        """The heartbeat clock at ``now``; returns the seconds to its next tick this connection
        needs (half the negotiated heartbeat), or None."""
        if self.amqp is None or self._done:
            return None
        if self._alarm_paused or self._congestion_paused:
            self.amqp.mark_received()     # our pause, not the client's silence
        if self._send_clock.reset_if_timed_out(self.transport, now,
                                               self._settings.send_timeout, self.owner):
            return None
        self._handle(self.amqp.tick(now))
        self.flush()
        return self.amqp.heartbeat / 2 if self.amqp.heartbeat else None

    def shutdown(self, code: int, text: str) -> None:
        """Broker shutdown: connection.close ``code`` (320) to the client."""
        if self.amqp is not None and not self.amqp.is_closed:
            self.amqp.close(code, text)
            self.flush()

    def _teardown(self) -> None:
        if self._done:
            return
        self._done = True
        for ch in list(self.channels.values()):
            ch.close()
        if self._counted is not None:
            self.broker.limits.connection_closed(*self._counted)
        self.channels.clear()
        for link in self.broker.links.values():
            if link.up:
                link.send([T.CONNECTION_CLOSED, self.owner])
        self.broker.connections.discard(self)
        self.broker.report_soon.set()


#: the heartbeat clock's longest and shortest period (s)
TICK_S, MIN_TICK_S = 1.0, 0.1


async def heartbeat_loop(broker: Broker) -> None:
    """Drive every connection's heartbeat clock: once a second, or as often as the connection
    needing it most asks (half its heartbeat or idle time-out, at least :data:`MIN_TICK_S`).
    RabbitMQ sends a heartbeat after half the heartbeat's silence (rabbit_heartbeat); a client
    that drops a connection after one heartbeat without a read (@cloudamqp/amqp-client)
    needs them that often, which a 1 s clock misses for a heartbeat of 1 s."""
    period = TICK_S
    while True:
        await asyncio.sleep(period)
        now = time.monotonic()
        wanted: list[float | None] = []
        for client in list(broker.connections):
            try:
                wanted.append(client.tick(now))
            except Exception:  # one bad connection must not stop the clock for the others
                log.exception("heartbeat tick failed")
        period = tick_period(wanted)


def tick_period(wanted: list[float | None]) -> float:
    """The heartbeat clock's next period (s): the shortest the connections asked for (None:
    no need), within :data:`MIN_TICK_S` .. :data:`TICK_S`."""
    return max(MIN_TICK_S, min([TICK_S, *(w for w in wanted if w is not None)]))
