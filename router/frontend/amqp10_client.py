"""One AMQP 1.0 client connection: moves bytes between the socket and the sans-IO engine
(router/amqp10/engine.py) and turns its events into the broker's (docs/amqp10.md).

It is reached through the AMQP 0-9-1 listener: :class:`~.client.ClientConnection` reads the
8-octet protocol header and, for AMQP 1.0's (``AMQP 3 1 0 0`` SASL, or ``AMQP 0 1 0 0``),
hands the socket to an :class:`AMQP10Connection` (as RabbitMQ and Qpid Broker-J choose the
codec by the header). Logins, virtual hosts, permissions and limits are 0-9-1's
(router/access/): SASL PLAIN and, on amqps with a verified client certificate, EXTERNAL;
ANONYMOUS logs in as the setting ``anonymous_login_user`` when it is set (RabbitMQ 4's name;
off by default). The open's hostname ``vhost:NAME`` selects virtual host NAME, as RabbitMQ's.
"""
from __future__ import annotations

import asyncio
import logging
import platform
import time
from typing import Any

from shoal.shared.wire import T

from shoal.router.amqp.handshake import shoal_version
from shoal.router.amqp10 import sasl
from shoal.router.amqp10.codec import Symbol
from shoal.router.amqp10.engine import (ConnectionClosed, ConnectionOpened, CreditChanged,
                                        DeliveriesSettled, Engine, LinkAttached, LinkDetached,
                                        MessageReceived, SessionEnded)
from shoal.router.amqp10.frames import ROLE_SENDER
from shoal.router.broker import Broker
from shoal.router.frontend.admission import is_loopback, refuse_channel, refuse_connection
from shoal.router.frontend.amqp10_links import LinkChannel, PublishLink, condition
from shoal.router.frontend.amqp10_management import Half
from shoal.router.frontend.send_timeout import SendClock
from shoal.router.frontend.tls import peer_identity

log = logging.getLogger("shoal.router.frontend.amqp10")

PRODUCT = "Shoal"
CLOSE_WAIT_S = 2.0      #: how long a client may take to answer our close (seconds)


#: what the open announces when ``amqp10_announce_rabbitmq`` is on: RabbitMQ's AMQP 1.0
#: clients (rabbitmq-amqp-python-client, the Java and .NET ones) refuse any server that does
#: not say it is RabbitMQ 4 or later.
RABBITMQ_IDENTITY = {"product": "RabbitMQ", "version": "4.2.0"}


def open_properties(settings: Any) -> dict:
    """The open's ``properties`` (part 2.7.1): who the server is (docs/amqp10.md)."""
    own = shoal_version()
    props = dict(RABBITMQ_IDENTITY) if settings.amqp10_announce_rabbitmq else \
        {"product": PRODUCT, "version": own}
    props.update({"platform": f"Python {platform.python_version()}", "shoal-version": own})
    return {Symbol(k): v for k, v in props.items()}


class AMQP10Connection(asyncio.Protocol):
    """The asyncio side of one AMQP 1.0 client connection (a BrokerClient: router/session.py).
    """
    protocol = "AMQP 1-0"          #: as RabbitMQ's management API names it

    def __init__(self, broker: Broker, transport: asyncio.Transport, tls: bool,
                 owner: str) -> None:
        self.broker = broker
        self.tls = tls
        self.owner = owner
        self.transport: asyncio.Transport | None = transport
        s = broker.settings
        self.vhost = "/"
        self.access = None
        self.channels: dict[int, LinkChannel] = {}
        self.exclusive_queues: set[str] = set()
        self.capabilities = {"consumer_cancel_notify": True}
        self.client_properties: dict = {}
        self.publisher = False
        self.auth_mechanism = ""
        self._counted: tuple[str, str] | None = None
        self._done = False
        self._close_timer: asyncio.TimerHandle | None = None
        self._send_clock = SendClock()  #: what we wrote and the client did not read
        peer = transport.get_extra_info("peername")
        local = transport.get_extra_info("sockname")
        self.peer = tuple(peer[:2]) if isinstance(peer, tuple) else ("?", 0)
        self.local = tuple(local[:2]) if isinstance(local, tuple) else ("?", 0)
        self.name = f"{self.peer[0]}:{self.peer[1]} -> {self.local[0]}:{self.local[1]}"
        self.connected_at = int(time.time() * 1000)
        self._loopback = is_loopback(self.peer)
        self._identity = peer_identity(transport.get_extra_info("ssl_object"),
                                       s.ssl_cert_login_from) if tls else None
        mechanisms = ["PLAIN"]
        if self._identity is not None:
            mechanisms.insert(0, "EXTERNAL")
        anonymous = s.anonymous_login_user or None
        if anonymous:
            mechanisms.append("ANONYMOUS")
        self.engine = Engine(self._login, mechanisms, idle_timeout_ms=s.heartbeat * 1000,
                             max_message_size=s.max_message_size, anonymous_user=anonymous,
                             admit_session=lambda: refuse_channel(broker, self.engine.user),
                             handshake_timeout_s=s.handshake_timeout / 1000)
        self.amqp = self.engine     #: what live.py and access_sync.py read (user, is_closed)
        broker.connections.add(self)

    # ---- login -------------------------------------------------------------------------------
    def _login(self, mechanism: str, response: bytes, hostname: str | None) -> str | None:
        users = self.broker.users
        where = f"{self.peer[0]}:{self.peer[1]}"
        self.auth_mechanism = mechanism
        if mechanism == "PLAIN":
            creds = sasl.plain_credentials(response)
            if creds is not None and users.authenticate(creds[0], creds[1], where,
                                                        self._loopback):
                return creds[0]
            return None
        if mechanism == "EXTERNAL" and self._identity is not None:
            return self._identity if users.authenticate(self._identity, None, where,
                                                        self._loopback) else None
        if mechanism == "ANONYMOUS":
            return self.broker.settings.anonymous_login_user or None
        return None

    # ---- asyncio.Protocol --------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        try:
            self._handle(self.engine.receive_data(data))
        except Exception:   # noqa: BLE001 - a bug costs this connection, never the router
            log.exception("internal error on AMQP 1.0 connection %s", self.owner)
            self.engine.close("amqp:internal-error", "internal error; see the broker log")
            self.engine.closed = True
        self.flush()

    def eof_received(self) -> bool:
        self._handle(self.engine.receive_data(b""))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._teardown()

    def pause_writing(self) -> None:
        for ch in self.channels.values():
            ch.pool.paused = True

    def resume_writing(self) -> None:
        for ch in self.channels.values():
            ch.pool.paused = False
            self.broker.replenish_channel(ch)

    def set_reading(self, on: bool) -> None:
        """Node back-pressure: stop reading the socket (publishers' credit is not topped up
        meanwhile either)."""
        t = self.transport
        if t is not None and not t.is_closing():
            t.resume_reading() if on else t.pause_reading()
        if on:
            self.unblock()

    def unblock(self) -> None:
        """The broker takes publishes again (no node congested or blocked): top up the
        publishing links' credit, which was held back meanwhile."""
        for ch in self.channels.values():
            ch.top_up_publishers()
        self.broker.mark_dirty(self)

    # ---- events ------------------------------------------------------------------------------
    def _handle(self, events: list) -> None:
        for ev in events:
            t = type(ev)
            if t is MessageReceived:
                ch = self.channels.get(ev.link.session.channel)
                ctx = ev.link.context
                if ch is not None and isinstance(ctx, Half) and ctx.requests:
                    ch.management.request(ev.link, ev.payload)
                elif ch is not None and isinstance(ctx, PublishLink):
                    if not self.publisher:
                        self.publisher = True
                        if self.broker.congested:
                            self.set_reading(False)
                    ch.publish_message(ev.link, ev.delivery_id, ev.settled, ev.payload)
            elif t is DeliveriesSettled:
                ch = self.channels.get(ev.link.session.channel)
                if ch is not None:
                    ch.settle_deliveries(ev.deliveries, ev.state)
            elif t is CreditChanged:
                ch = self.channels.get(ev.link.session.channel)
                if ch is not None:
                    ch.credit_changed(ev.link)
            elif t is LinkAttached:
                self._attach(ev.link)
            elif t is LinkDetached:
                ch = self.channels.get(ev.link.session.channel)
                if ch is not None:
                    ch.link_detached(ev.link)
            elif t is SessionEnded:
                ch = self.channels.pop(ev.session.channel, None)
                if ch is not None:
                    ch.close()
            elif t is ConnectionOpened:
                self._opened(ev)
                self._handle(self.engine.resume())     # what the client sent after its open
            elif t is ConnectionClosed:
                self._teardown()

    def _opened(self, ev: ConnectionOpened) -> None:
        """The client's open: its virtual host (``vhost:NAME``), the limits and the user's
        permissions there, as connection.open's (530 there; amqp:unauthorized-access or
        amqp:not-found here)."""
        host = ev.hostname or ""
        vhost = host[len("vhost:"):] if host.startswith("vhost:") else "/"
        user = ev.user
        b = self.broker
        if vhost not in b.users.vhosts:
            self.engine.close("amqp:not-found", f"vhost '{vhost}' not found")
            return
        refusal = refuse_connection(b, user, vhost)
        if refusal is not None:
            self.engine.close("amqp:unauthorized-access", refusal)
            return
        self.vhost = vhost
        self.access = b.users.vhost_access(user, vhost)
        b.limits.connection_opened(user, vhost)
        self._counted = (user, vhost)
        self.client_properties = {"container_id": ev.container_id}
        b.report_soon.set()
        self.engine.open(f"shoal-{b.router_id}", properties=open_properties(b.settings))

    def _attach(self, link: Any) -> None:
        s = link.session
        ch = self.channels.get(s.channel)
        if ch is None:
            ch = self.channels[s.channel] = LinkChannel(self, s.channel, self.broker, s)
        coro = ch.attach_receiver(link) if link.role == ROLE_SENDER else ch.attach_sender(link)
        asyncio.ensure_future(self._guard(coro, link))

    async def _guard(self, coro, link: Any) -> None:
        try:
            await coro
        except Exception:   # noqa: BLE001 - a task must never die unseen
            log.exception("internal error attaching link %r on connection %s", link.name,
                          self.owner)
            if not link.detached:
                link.session.detach(link, "amqp:internal-error", "internal error; see the "
                                                                "broker log")
        self.flush()

    # ---- output ------------------------------------------------------------------------------
    def fail(self, channel: int, err: Any) -> None:
        """A channel-level error outside a link's own handling: end the connection with the
        error's condition."""
        self.engine.close(condition(err), err.reply_text)
        self.broker.mark_dirty(self)

    def flush(self) -> None:
        if self.transport is None:
            return
        for ch in self.channels.values():
            if ch.dirty:
                ch.flush_confirms()
        data = self.engine.data_to_send()
        if data and not self.transport.is_closing():
            self.transport.write(data)
            self._send_clock.written += len(data)
        if self.engine.closed:
            self._teardown()
            if not self.transport.is_closing():
                self.transport.close()
        elif self.engine.close_sent and self._close_timer is None:
            # the client has CLOSE_WAIT_S to answer our close; then the socket is closed
            self._close_timer = asyncio.get_running_loop().call_later(
                CLOSE_WAIT_S, self._close_now)

    def _close_now(self) -> None:
        self.engine.closed = True
        self.flush()

    def tick(self, now: float) -> float | None:
        """The idle clock at ``now``; returns the seconds to its next tick this connection
        needs (half the peer's idle time-out), or None."""
        if self._done:
            return None
        if self.transport is not None and self._send_clock.reset_if_timed_out(
                self.transport, now, self.broker.settings.send_timeout, self.owner):
            return None
        self._handle(self.engine.tick(now))
        self.flush()
        return self.engine.remote_idle_timeout_ms / 2000 or None

    def shutdown(self, code: int, text: str) -> None:
        """Broker shutdown or a forced close: close with amqp:connection:forced."""
        self.engine.close("amqp:connection:forced", text)
        self.engine.closed = True
        self.flush()

    @property
    def blocked(self) -> bool:
        """Publishing links get no credit while the broker is blocked (resource alarm) or
        a node's link congested: AMQP 1.0's back-pressure (RabbitMQ 4 does the same)."""
        return self.broker.blocked_reason is not None

    def _teardown(self) -> None:
        if self._done:
            return
        self._done = True
        if self._close_timer is not None:
            self._close_timer.cancel()
        for ch in list(self.channels.values()):
            ch.close()
        self.channels.clear()
        if self._counted is not None:
            self.broker.limits.connection_closed(*self._counted)
        for link in self.broker.links.values():
            if link.up:
                link.send([T.CONNECTION_CLOSED, self.owner])
        self.broker.connections.discard(self)
        self.broker.report_soon.set()
