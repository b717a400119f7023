"""A sans-IO AMQP 1.0 server connection (OASIS AMQP 1.0 part 2 "Transport", part 5 "SASL").

``receive_data(bytes)`` returns events; ``data_to_send()`` the bytes to write. The engine keeps
the protocol's state: the header exchange and SASL, open and close, sessions and their
windows (part 2.5.6), links and their credit (part 2.6.7), transfers split over frames in both
directions, settlement. What a link means (a queue to consume, an exchange to publish to) is
the broker's business (router/frontend/amqp10_client.py): it answers :class:`LinkAttached`
with :meth:`Engine.accept_link` or :meth:`Engine.refuse_link`.

Protocol errors close the connection (or end the session, detach the link) with the spec's
error conditions: ``amqp:decode-error``, ``amqp:connection:framing-error``,
``amqp:invalid-field``, ``amqp:not-allowed``, ``amqp:session:unattached-handle``,
``amqp:session:window-violation``, ``amqp:link:transfer-limit-exceeded``,
``amqp:link:message-size-exceeded``, ``amqp:resource-limit-exceeded`` (idle timeout).
"""
from __future__ import annotations

import struct
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from shoal.router.amqp10 import sasl
from shoal.router.amqp10.codec import DecodeError
from shoal.router.amqp10.frames import (
    EMPTY_FRAME, FRAME_AMQP, FRAME_SASL, HEADER_AMQP, HEADER_SASL, MIN_MAX_FRAME_SIZE,
    RCV_FIRST, ROLE_RECEIVER, ROLE_SENDER, SND_SETTLED, SND_UNSETTLED, Accepted, Attach, Begin,
    Close, Detach, Disposition, End, Flow, Open, Performative, SaslInit, Transfer, error, frame,
    parse_body, transfer_frame)

_HEAD = struct.Struct(">IBBH").unpack_from
MAX_FRAME_SIZE = 131072         #: ours (RabbitMQ's frame_max default)
CHANNEL_MAX = 2047              #: sessions per connection (RabbitMQ's channel_max default)
HANDLE_MAX = 1023               #: links per session
INCOMING_WINDOW = 4096          #: transfers a client may send before we widen the window
MAX_WINDOW = (1 << 32) - 1


@dataclass(slots=True)
class ConnectionOpened:
    hostname: str | None
    container_id: str
    user: str


@dataclass(slots=True)
class LinkAttached:
    """The client attached ``link``: answer with accept_link or refuse_link."""
    link: "Link"


@dataclass(slots=True)
class MessageReceived:
    """A whole message on a link the client sends on (its transfers joined)."""
    link: "Link"
    delivery_id: int
    settled: bool
    payload: bytes


@dataclass(slots=True)
class CreditChanged:
    """The client's flow changed the credit of a link we send on (``link.credit``,
    ``link.drain``)."""
    link: "Link"


@dataclass(slots=True)
class DeliveriesSettled:
    """The client settled deliveries we sent: ``(delivery_id, token)`` pairs, one outcome."""
    link: "Link"
    deliveries: list
    state: Any


@dataclass(slots=True)
class LinkDetached:
    link: "Link"
    error: Any


@dataclass(slots=True)
class SessionEnded:
    session: "Session"


@dataclass(slots=True)
class ConnectionClosed:
    error: Any


class ProtocolError(Exception):
    """A peer's protocol violation: ``condition`` and text for the close/end/detach."""

    def __init__(self, condition: str, text: str, scope: str = "connection") -> None:
        super().__init__(text)
        self.condition, self.text, self.scope = condition, text, scope


class Link:
    """One attached link. ``role`` is OURS: ROLE_SENDER when the client receives."""
    __slots__ = ("session", "name", "handle", "remote_handle", "role", "attach", "source",
                 "target", "properties", "settled_mode", "delivery_count", "credit", "drain",
                 "partial", "partial_id", "partial_settled", "unsettled", "context",
                 "detached", "max_message_size", "accepted")

    def __init__(self, session: "Session", attach: Attach, handle: int) -> None:
        self.session = session
        self.name = attach.name
        self.remote_handle = attach.handle
        self.handle = handle
        self.role = not attach.role      # their sender -> our receiver
        self.attach = attach
        self.source, self.target = attach.source, attach.target
        self.properties = attach.properties if isinstance(attach.properties, dict) else {}
        #: deliveries go pre-settled (the client asked for snd-settle-mode settled)
        self.settled_mode = attach.snd_settle_mode == SND_SETTLED
        self.delivery_count = 0 if self.role == ROLE_SENDER else \
            (attach.initial_delivery_count or 0)
        self.credit = 0
        self.drain = False
        self.partial: bytearray | None = None
        self.partial_id = 0
        self.partial_settled = False
        self.unsettled: dict[int, Any] = {}   #: our deliveries not settled: id -> token
        self.context: Any = None              #: the broker's object for this link
        self.detached = False
        self.accepted = False
        self.max_message_size = 0


class Session:
    __slots__ = ("channel", "remote_channel", "next_outgoing_id", "next_incoming_id",
                 "incoming_window", "remote_incoming_window", "remote_outgoing_window",
                 "links", "by_handle", "pending", "next_delivery_id", "sent", "context",
                 "ended")

    def __init__(self, channel: int, remote_channel: int, begin: Begin) -> None:
        self.channel, self.remote_channel = channel, remote_channel
        self.next_outgoing_id = 0
        self.next_incoming_id = begin.next_outgoing_id or 0
        self.incoming_window = INCOMING_WINDOW
        self.remote_incoming_window = begin.incoming_window or 0
        self.remote_outgoing_window = begin.outgoing_window or 0
        self.links: dict[int, Link] = {}      #: by the client's handle
        self.by_handle: dict[int, Link] = {}  #: by our handle
        self.pending: deque[tuple[Link, Transfer, bytes]] = deque()  #: waiting for window
        self.next_delivery_id = 0
        self.sent: dict[int, Link] = {}       #: our unsettled delivery id -> link
        self.context: Any = None
        self.ended = False


class Engine:
    """One client connection's AMQP 1.0 protocol state (server side).

    ``login(mechanism, response, hostname)`` -> user or None decides SASL logins;
    ``mechanisms`` are offered in that order. ``idle_timeout_ms``: ours (0 = none).
    """

    def __init__(self, login: sasl.Login, mechanisms: list[str], idle_timeout_ms: int = 60000,
                 max_frame_size: int = MAX_FRAME_SIZE, max_message_size: int = 0,
                 anonymous_user: str | None = None,
                 admit_session: Any = None) -> None:
        """``admit_session()`` -> None, or why a new session is refused (a channel limit:
        the session is begun, then ended with amqp:resource-limit-exceeded)."""
        self._login, self._mechanisms = login, mechanisms
        self._admit_session = admit_session
        self._anonymous_user = anonymous_user
        self._in = bytearray()
        self._out = bytearray()
        self._events: list = []
        self._state = "header"          # header, sasl, amqp-header, open, opened, closed
        self.user: str | None = None
        self.max_frame_size = max_frame_size
        self.remote_max_frame_size = MIN_MAX_FRAME_SIZE
        self.remote_channel_max = 0
        self.max_message_size = max_message_size
        self.idle_timeout_ms = idle_timeout_ms
        self.remote_idle_timeout_ms = 0
        self.sessions: dict[int, Session] = {}      #: by the client's channel
        self.hostname: str | None = None
        self.closed = False
        self.close_sent = False
        self._last_recv = self._last_send = time.monotonic()

    @property
    def is_closed(self) -> bool:
        return self.closed

    @property
    def open_channels(self) -> int:
        """Sessions, counted as channels for the user's channel limit (RabbitMQ 4 does)."""
        return len(self.sessions)

    # ---- bytes in, bytes out -----------------------------------------------------------------
    def receive_data(self, data: bytes) -> list:
        """Feed octets from the socket (``b""`` at EOF); returns the events they make."""
        self._last_recv = time.monotonic()
        if self.closed:
            return []
        if not data:
            self.closed = True
            self._events.append(ConnectionClosed(None))
            return self._take_events()
        self._in += data
        try:
            self._parse()
        except ProtocolError as exc:
            self._fail(exc)
        except DecodeError as exc:
            self._fail(ProtocolError("amqp:decode-error", str(exc)))
        return self._take_events()

    def data_to_send(self) -> bytes:
        if not self._out:
            return b""
        out = bytes(self._out)
        self._out.clear()
        self._last_send = time.monotonic()
        return out

    def _take_events(self) -> list:
        ev, self._events = self._events, []
        return ev

    def tick(self, now: float) -> list:
        """The heartbeat clock (part 2.4.5): an empty frame when we said nothing for half the
        client's idle timeout; close with amqp:resource-limit-exceeded when the client said
        nothing for twice ours."""
        if self.closed or self._state != "opened":
            return []
        if self.idle_timeout_ms and now - self._last_recv > 2 * self.idle_timeout_ms / 1000:
            self._fail(ProtocolError("amqp:resource-limit-exceeded",
                                     "local-idle-timeout expired"))
            return self._take_events()
        if self.remote_idle_timeout_ms and \
                now - self._last_send > self.remote_idle_timeout_ms / 2000 and not self._out:
            self._out += EMPTY_FRAME
        return []

    # ---- parsing -----------------------------------------------------------------------------
    def _parse(self) -> None:
        buf = self._in
        pos = 0
        try:
            while not self.closed:
                if self._state in ("header", "amqp-header"):
                    if len(buf) - pos < 8:
                        break
                    self._header(bytes(buf[pos:pos + 8]))
                    pos += 8
                    continue
                if len(buf) - pos < 8:
                    break
                size, doff, kind, channel = _HEAD(buf, pos)
                limit = self.max_frame_size if self._state != "sasl" else MIN_MAX_FRAME_SIZE
                if size < 8 or doff < 2 or doff * 4 > size:
                    raise ProtocolError("amqp:connection:framing-error",
                                        f"malformed frame header (size {size}, doff {doff})")
                if size > limit:
                    raise ProtocolError("amqp:connection:framing-error",
                                        f"frame of {size} octets exceeds max-frame-size {limit}")
                if len(buf) - pos < size:
                    break
                start, end = pos + doff * 4, pos + size
                pos = end
                if start == end:            # an empty frame: the peer's heartbeat
                    continue
                if (kind == FRAME_SASL) != (self._state == "sasl") or kind > FRAME_SASL:
                    raise ProtocolError("amqp:connection:framing-error",
                                        f"unexpected frame type {kind}")
                perf, payload_at = parse_body(buf, start, end)
                self._frame(channel, perf, buf, payload_at, end)
        finally:
            del buf[:pos]

    def _header(self, head: bytes) -> None:
        if self._state == "header" and head == HEADER_SASL:
            self._out += HEADER_SASL
            self._out += sasl.mechanisms_frame(self._mechanisms)
            self._state = "sasl"
        elif head == HEADER_AMQP and (self._state == "amqp-header" or
                                      self._anonymous_user is not None):
            if self._state == "header":             # no SASL layer: the anonymous user
                self.user = self._anonymous_user
            self._out += HEADER_AMQP
            self._state = "open"
        else:           # part 2.2: answer with the header we support, then close
            self._out += HEADER_SASL
            self.closed = True
            self._events.append(ConnectionClosed(None))

    def _frame(self, channel: int, perf: Performative, buf, payload_at: int, end: int) -> None:
        t = type(perf)
        if self._state == "sasl":
            if t is not SaslInit:
                raise ProtocolError("amqp:not-allowed", f"unexpected SASL frame {perf.label}")
            user, code = sasl.handle_init(perf, self._mechanisms, self._login)
            self._out += sasl.outcome_frame(code)
            if code != sasl.OK:
                self.closed = True
                self._events.append(ConnectionClosed(None))
                return
            self.user = user
            self._state = "amqp-header"
            return
        if self._state == "open":
            if t is not Open:
                raise ProtocolError("amqp:not-allowed", f"expected open, got {perf.label}")
            self._on_open(perf)
            return
        if self._state != "opened":
            return
        try:
            self._dispatch(t, channel, perf, buf, payload_at, end)
        except _Ignore:     # answered by ending its session
            pass

    def _dispatch(self, t: type, channel: int, perf: Performative, buf, payload_at: int,
                  end: int) -> None:
        if t is Transfer:
            self._on_transfer(channel, perf, buf, payload_at, end)
        elif t is Disposition:
            self._on_disposition(channel, perf)
        elif t is Flow:
            self._on_flow(channel, perf)
        elif t is Attach:
            self._on_attach(channel, perf)
        elif t is Detach:
            self._on_detach(channel, perf)
        elif t is Begin:
            self._on_begin(channel, perf)
        elif t is End:
            self._on_end(channel, perf)
        elif t is Close:
            self._on_close(perf)
        else:
            raise ProtocolError("amqp:not-allowed", f"unexpected {perf.label} frame")

    # ---- connection --------------------------------------------------------------------------
    def _on_open(self, o: Open) -> None:
        if not isinstance(o.container_id, str):
            raise ProtocolError("amqp:invalid-field", "open without a container-id")
        mfs = o.max_frame_size if isinstance(o.max_frame_size, int) else MAX_WINDOW
        if mfs < MIN_MAX_FRAME_SIZE:
            raise ProtocolError("amqp:invalid-field",
                                f"max-frame-size {mfs} is below {MIN_MAX_FRAME_SIZE}")
        self.remote_max_frame_size = min(mfs, self.max_frame_size)
        cm = o.channel_max if isinstance(o.channel_max, int) else 65535
        self.remote_channel_max = min(cm, CHANNEL_MAX)
        self.remote_idle_timeout_ms = o.idle_time_out if isinstance(o.idle_time_out, int) else 0
        self.hostname = o.hostname if isinstance(o.hostname, str) else None
        self._state = "opened"
        self._events.append(ConnectionOpened(self.hostname, o.container_id, self.user or ""))

    def open(self, container_id: str, properties: dict | None = None,
             capabilities: list[str] | None = None) -> None:
        """Answer the client's open (call after ConnectionOpened, unless refusing)."""
        self._send(0, Open(container_id, None, self.max_frame_size, self.remote_channel_max,
                           self.idle_timeout_ms or None, None, None, capabilities, None,
                           properties))

    def close(self, condition: str | None = None, text: str = "") -> None:
        """Close the connection, with an error (``amqp:unauthorized-access`` ...) or none.
        A close before our open is preceded by one, as part 2.4.1 requires."""
        if self.close_sent:
            return
        if self._state == "opened" and not self._open_sent:
            self.open("shoal")
        self._send(0, Close(error(condition, text) if condition else None))
        self.close_sent = True

    _open_sent = False

    def _on_close(self, c: Close) -> None:
        if not self.close_sent:
            self._send(0, Close())
            self.close_sent = True
        self.closed = True
        self._events.append(ConnectionClosed(c.error))

    def _fail(self, exc: ProtocolError) -> None:
        """A protocol error: close (with an open first if none was sent), then stop."""
        if self._state in ("header", "amqp-header", "sasl"):
            self.closed = True
            self._events.append(ConnectionClosed(None))
            return
        if self._state == "open":           # part 2.4.1: an open must precede the close
            self._state = "opened"
            self.open("shoal")
        self.close(exc.condition, exc.text)
        self.closed = True
        self._events.append(ConnectionClosed(error(exc.condition, exc.text)))

    def _send(self, channel: int, perf: Performative, payload: bytes = b"") -> None:
        if type(perf) is Open:
            self._open_sent = True
        self._out += frame(channel, perf, payload)

    # ---- sessions ----------------------------------------------------------------------------
    def _session(self, channel: int) -> Session:
        s = self.sessions.get(channel)
        if s is None:
            raise ProtocolError("amqp:not-allowed", f"no session on channel {channel}")
        if s.ended:             # we ended it: frames until the client's end are void
            raise _Ignore
        return s

    def _on_begin(self, channel: int, b: Begin) -> None:
        if b.remote_channel is not None:
            raise ProtocolError("amqp:not-allowed", "begin answering a session we never began")
        if channel in self.sessions or channel > self.remote_channel_max:
            raise ProtocolError("amqp:connection:framing-error",
                                f"channel {channel} is in use or above channel-max")
        refusal = self._admit_session() if self._admit_session is not None else None
        s = self.sessions[channel] = Session(channel, channel, b)
        self._send(channel, Begin(channel, s.next_outgoing_id, s.incoming_window, MAX_WINDOW,
                                  HANDLE_MAX))
        if refusal is not None:
            s.ended = True
            self._send(channel, End(error("amqp:resource-limit-exceeded", refusal)))

    def _on_end(self, channel: int, e: End) -> None:
        s = self.sessions.pop(channel, None)
        if s is None:
            raise ProtocolError("amqp:not-allowed", f"no session on channel {channel}")
        if not s.ended:         # the client ends it: answer
            self._end_session(s, None)
            self._send(channel, End())

    def _end_session(self, s: Session, err: Any) -> None:
        s.ended = True
        for link in list(s.links.values()):
            if not link.detached:
                link.detached = True
                self._events.append(LinkDetached(link, err))
        self._events.append(SessionEnded(s))

    def end_session(self, s: Session, condition: str, text: str) -> None:
        """End session ``s`` with an error (``amqp:session:unattached-handle`` ...)."""
        if s.ended:
            return
        self._end_session(s, None)
        self._send(s.channel, End(error(condition, text)))

    # ---- links -------------------------------------------------------------------------------
    def _link(self, s: Session, handle: Any) -> Link:
        link = s.links.get(handle) if type(handle) is int else None
        if link is None:
            self.end_session(s, "amqp:session:unattached-handle", f"no link on handle {handle}")
            raise _Ignore
        return link

    def _on_attach(self, channel: int, a: Attach) -> None:
        s = self._session(channel)
        if type(a.handle) is not int or not isinstance(a.name, str) or \
                not isinstance(a.role, bool):
            raise ProtocolError("amqp:invalid-field", "attach without a name, handle or role")
        if a.handle in s.links:
            self.end_session(s, "amqp:session:handle-in-use", f"handle {a.handle} is in use")
            return
        if a.handle > HANDLE_MAX:
            self.end_session(s, "amqp:session:handle-in-use",
                             f"handle {a.handle} is above handle-max {HANDLE_MAX}")
            return
        link = Link(s, a, a.handle)
        s.links[a.handle] = link
        s.by_handle[link.handle] = link
        self._events.append(LinkAttached(link))

    def accept_link(self, link: Link, source: Any = None, target: Any = None,
                    credit: int = 0) -> None:
        """Answer the client's attach; ``source``/``target`` as we hold them (a dynamic
        node's address filled in). A link the client sends on gets ``credit`` at once."""
        a = link.attach
        link.accepted = True
        if link.role == ROLE_SENDER:
            self._send(link.session.channel, Attach(
                link.name, link.handle, ROLE_SENDER,
                SND_SETTLED if link.settled_mode else SND_UNSETTLED, RCV_FIRST,
                source if source is not None else a.source,
                target if target is not None else a.target,
                None, None, 0, self.max_message_size or None))
        else:
            self._send(link.session.channel, Attach(
                link.name, link.handle, ROLE_RECEIVER, a.snd_settle_mode, RCV_FIRST,
                source if source is not None else a.source,
                target if target is not None else a.target, None, None, None,
                self.max_message_size or None))
            if credit:
                self.give_credit(link, credit)

    def refuse_link(self, link: Link, condition: str, text: str) -> None:
        """Refuse the client's attach (part 2.6.3: an attach with no source or target, then
        a detach with the error)."""
        role = ROLE_SENDER if link.role == ROLE_SENDER else ROLE_RECEIVER
        self._send(link.session.channel, Attach(link.name, link.handle, role, None, None,
                                                None if role == ROLE_SENDER else link.source,
                                                None if role == ROLE_RECEIVER else link.target))
        self.detach(link, condition, text)

    def detach(self, link: Link, condition: str | None = None, text: str = "") -> None:
        """Detach (close) ``link`` from our side, with an error or none."""
        s = link.session
        if s.ended or link.handle not in s.by_handle:
            return
        self._send(s.channel, Detach(link.handle, True,
                                     error(condition, text) if condition else None))
        s.by_handle.pop(link.handle, None)
        if not link.detached:
            link.detached = True
            self._events.append(LinkDetached(link, None))

    def _on_detach(self, channel: int, d: Detach) -> None:
        s = self._session(channel)
        link = self._link(s, d.handle)
        del s.links[link.remote_handle]
        if link.handle in s.by_handle:       # the client detached first: answer
            del s.by_handle[link.handle]
            self._send(channel, Detach(link.handle, True))
        if not link.detached:
            link.detached = True
            self._events.append(LinkDetached(link, d.error))

    # ---- flow --------------------------------------------------------------------------------
    def _on_flow(self, channel: int, f: Flow) -> None:
        s = self._session(channel)
        if type(f.next_incoming_id) is int and type(f.incoming_window) is int:
            s.remote_incoming_window = f.next_incoming_id + f.incoming_window - s.next_outgoing_id
        elif type(f.incoming_window) is int:
            s.remote_incoming_window = f.incoming_window - s.next_outgoing_id
        if type(f.outgoing_window) is int:
            s.remote_outgoing_window = f.outgoing_window
        if f.handle is None:
            if f.echo:
                self._session_flow(s)
            self._send_pending(s)
            return
        link = self._link(s, f.handle)
        if link.role == ROLE_SENDER:
            count = f.delivery_count if type(f.delivery_count) is int else 0
            credit = f.link_credit if type(f.link_credit) is int else 0
            link.credit = max(0, count + credit - link.delivery_count)   # part 2.6.7
            link.drain = bool(f.drain)
            self._send_pending(s)
            self._events.append(CreditChanged(link))
        if f.echo:
            self._link_flow(link)

    def _session_flow(self, s: Session) -> None:
        self._send(s.channel, Flow(s.next_incoming_id, s.incoming_window, s.next_outgoing_id,
                                   MAX_WINDOW))

    def _link_flow(self, link: Link, drain: bool = False) -> None:
        """Our flow for ``link``. Behind transfers still waiting for the client's session
        window it waits too: its delivery-count counts them (part 2.6.7)."""
        s = link.session
        flow = Flow(s.next_incoming_id, s.incoming_window, s.next_outgoing_id, MAX_WINDOW,
                    link.handle, link.delivery_count, link.credit, None, drain or link.drain)
        if s.pending:
            s.pending.append((link, flow, b""))
        else:
            self._send(s.channel, flow)

    def give_credit(self, link: Link, credit: int) -> None:
        """Let the client send ``credit`` more transfers on ``link`` (ours a receiver)."""
        link.credit = credit
        s = link.session
        s.incoming_window = INCOMING_WINDOW
        self._link_flow(link)

    def drained(self, link: Link) -> None:
        """We have nothing more for a draining link: use up its credit (part 2.6.7)."""
        link.delivery_count = (link.delivery_count + link.credit) & 0xFFFFFFFF
        link.credit = 0
        self._link_flow(link, drain=True)
        link.drain = False

    # ---- transfers in ------------------------------------------------------------------------
    def _on_transfer(self, channel: int, t: Transfer, buf, payload_at: int, end: int) -> None:
        s = self._session(channel)
        link = self._link(s, t.handle)
        if s.incoming_window <= 0:
            self.end_session(s, "amqp:session:window-violation",
                             "transfer beyond the session's incoming window")
            return
        s.incoming_window -= 1
        s.next_incoming_id = (s.next_incoming_id + 1) & 0xFFFFFFFF
        if link.role == ROLE_SENDER:
            raise ProtocolError("amqp:not-allowed", "transfer on a link the client receives on")
        if t.aborted:
            link.partial = None
            return
        if link.partial is None:
            if link.credit <= 0:
                self.detach(link, "amqp:link:transfer-limit-exceeded",
                            "transfer without link credit")
                return
            if type(t.delivery_id) is not int:
                raise ProtocolError("amqp:invalid-field", "first transfer without a delivery-id")
            link.credit -= 1
            link.delivery_count = (link.delivery_count + 1) & 0xFFFFFFFF
            link.partial_id = t.delivery_id
            link.partial_settled = bool(t.settled)
            link.partial = bytearray()
        elif t.settled:
            link.partial_settled = True
        link.partial += buf[payload_at:end]
        if self.max_message_size and len(link.partial) > self.max_message_size:
            link.partial = None
            self.detach(link, "amqp:link:message-size-exceeded",
                        f"message larger than max-message-size {self.max_message_size}")
            return
        if t.more:
            return
        payload, link.partial = bytes(link.partial), None
        if s.incoming_window < INCOMING_WINDOW // 2:
            s.incoming_window = INCOMING_WINDOW
            self._session_flow(s)
        self._events.append(MessageReceived(link, link.partial_id, link.partial_settled, payload))

    def settle_received(self, link: Link, delivery_ids: list[int], state: Performative) -> None:
        """Settle client transfers with ``state`` (accepted, released, rejected): one
        disposition per run of consecutive ids."""
        s = link.session
        if s.ended or not delivery_ids:
            return
        ids = sorted(delivery_ids)
        first = last = ids[0]
        for i in ids[1:]:
            if i == last + 1:
                last = i
                continue
            self._send(s.channel, Disposition(ROLE_RECEIVER, first, last, True, state))
            first = last = i
        self._send(s.channel, Disposition(ROLE_RECEIVER, first, last, True, state))

    # ---- transfers out -----------------------------------------------------------------------
    def send_message(self, link: Link, payload: bytes, token: Any = None) -> int:
        """Send one message on ``link`` (ours a sender), split to the client's max-frame-size;
        ``token`` comes back in DeliveriesSettled. Uses one credit. Returns its delivery id."""
        s = link.session
        did = s.next_delivery_id
        s.next_delivery_id = (did + 1) & 0xFFFFFFFF
        link.credit -= 1
        link.delivery_count = (link.delivery_count + 1) & 0xFFFFFFFF
        settled = link.settled_mode
        if not settled:
            link.unsettled[did] = token
            s.sent[did] = link
        room = self.remote_max_frame_size - 64      # frame header and transfer performative
        tag = did.to_bytes(4, "big")
        if len(payload) <= room:
            if s.pending or s.remote_incoming_window <= 0:
                s.pending.append((link, Transfer(link.handle, did, tag, 0, settled), payload))
            else:
                s.remote_incoming_window -= 1
                s.next_outgoing_id = (s.next_outgoing_id + 1) & 0xFFFFFFFF
                self._out += transfer_frame(s.channel, link.handle, did, tag, settled, False,
                                            payload)
            return did
        first = True
        for at in range(0, len(payload), room):
            chunk = payload[at:at + room]
            more = at + room < len(payload)
            t = Transfer(link.handle, did, tag, 0, settled, more) if first else \
                Transfer(link.handle, None, None, None, None, more)
            first = False
            self._queue(s, link, t, chunk)
        return did

    def _queue(self, s: Session, link: Link, t: Transfer, payload: bytes) -> None:
        if s.pending or s.remote_incoming_window <= 0:
            s.pending.append((link, t, payload))
            return
        s.remote_incoming_window -= 1
        s.next_outgoing_id = (s.next_outgoing_id + 1) & 0xFFFFFFFF
        self._send(s.channel, t, payload)

    def _send_pending(self, s: Session) -> None:
        while s.pending and (s.remote_incoming_window > 0 or type(s.pending[0][1]) is Flow):
            link, t, payload = s.pending.popleft()
            if link.detached:
                continue
            if type(t) is Flow:
                self._send(s.channel, t)
                continue
            s.remote_incoming_window -= 1
            s.next_outgoing_id = (s.next_outgoing_id + 1) & 0xFFFFFFFF
            self._send(s.channel, t, payload)

    def _on_disposition(self, channel: int, d: Disposition) -> None:
        s = self._session(channel)
        if type(d.first) is not int:
            raise ProtocolError("amqp:invalid-field", "disposition without first")
        last = d.last if type(d.last) is int else d.first
        if d.role != ROLE_RECEIVER:    # the client settling its own transfers: nothing held
            return
        if last - d.first > 1 << 20:
            raise ProtocolError("amqp:invalid-field", "disposition range too large")
        state = d.state
        by_link: dict[Link, list] = {}
        if state is None and not d.settled:
            return
        for did in range(d.first, last + 1):
            link = s.sent.pop(did, None) if (d.settled or state is not None) else None
            if link is None:
                continue
            by_link.setdefault(link, []).append((did, link.unsettled.pop(did, None)))
        for link, pairs in by_link.items():
            if not d.settled:        # the client waits for us to settle (rcv-settle-mode)
                self.settle_received_out(link, [p[0] for p in pairs], state)
            self._events.append(DeliveriesSettled(link, pairs, state or Accepted()))

    def settle_received_out(self, link: Link, ids: list[int], state: Any) -> None:
        s = link.session
        for did in ids:
            self._send(s.channel, Disposition(ROLE_SENDER, did, did, True, state))


class _Ignore(Exception):
    """Internal: the frame was answered by ending its session; skip the rest of it."""

