"""A sans-IO AMQP 1.0 server connection (OASIS AMQP 1.0 part 2 "Transport", part 5 "SASL").

``receive_data(bytes)`` returns events; ``data_to_send()`` the bytes to write. The engine keeps
the connection's state: the header exchange and SASL, open and close, the idle timeout, and
frames parsed and handed to their sessions (session.py: windows, links, credit, transfers).
What a link means (a queue to consume, an exchange to publish to) is the broker's business
(router/frontend/amqp10_client.py): it answers :class:`~.session.LinkAttached` with
``Session.accept_link`` or ``Session.refuse_link``.

Protocol errors close the connection with the spec's error conditions:
``amqp:decode-error``, ``amqp:connection:framing-error``, ``amqp:invalid-field``,
``amqp:not-allowed``, ``amqp:resource-limit-exceeded`` (idle timeout); a session's or a link's
own errors end or detach only that (session.py).
"""
from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Any

from shoal.router.amqp10 import sasl
from shoal.router.amqp10.codec import DecodeError
from shoal.router.amqp10.frames import (
    EMPTY_FRAME, FRAME_SASL, HEADER_AMQP, HEADER_SASL, MIN_MAX_FRAME_SIZE, Attach, Begin, Close,
    Detach, Disposition, End, Flow, Open, Performative, SaslInit, Transfer, error, frame,
    parse_body)
from shoal.router.amqp10.session import (  # the session's events, re-exported
    MAX_WINDOW, CreditChanged, DeliveriesSettled, Ignore, Link, LinkAttached, LinkDetached,
    MessageReceived, ProtocolError, Session, SessionEnded)

__all__ = ["Engine", "ConnectionOpened", "ConnectionClosed", "CreditChanged",
           "DeliveriesSettled", "Link", "LinkAttached", "LinkDetached", "MessageReceived",
           "Session", "SessionEnded"]

_HEAD = struct.Struct(">IBBH").unpack_from
MAX_FRAME_SIZE = 131072         #: ours (RabbitMQ's frame_max default)
CHANNEL_MAX = 2047              #: sessions per connection (RabbitMQ's channel_max default)


@dataclass(slots=True)
class ConnectionOpened:
    hostname: str | None
    container_id: str
    user: str


@dataclass(slots=True)
class ConnectionClosed:
    error: Any


class Engine:
    """One client connection's AMQP 1.0 protocol state (server side).

    ``login(mechanism, response, hostname)`` -> user or None decides SASL logins;
    ``mechanisms`` are offered in that order. ``idle_timeout_ms``: ours (0 = none).
    """

    def __init__(self, login: sasl.Login, mechanisms: list[str], idle_timeout_ms: int = 60000,
                 max_frame_size: int = MAX_FRAME_SIZE, max_message_size: int = 0,
                 anonymous_user: str | None = None,
                 admit_session: Any = None, handshake_timeout_s: float = 10.0) -> None:
        """``admit_session()`` -> None, or why a new session is refused (a channel limit:
        the session is begun, then ended with amqp:resource-limit-exceeded).
        ``handshake_timeout_s``: from the engine's start to the client's open (RabbitMQ's
        handshake_timeout); a client that takes longer is disconnected."""
        self._handshake_deadline = time.monotonic() + handshake_timeout_s
        self._login, self._mechanisms = login, mechanisms
        self._admit_session = admit_session
        self._anonymous_user = anonymous_user
        self._in = bytearray()
        self._out = bytearray()
        self._events: list = []
        #: header, sasl, amqp-header, open, deciding (the broker looks at the open), opened
        self._state = "header"
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
        return self.resume()

    def resume(self) -> list:
        """Parse what is buffered; returns the events. After ConnectionOpened nothing more
        is parsed until the broker called :meth:`open` or :meth:`close`: then call this."""
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
        if self.closed:
            return []
        if self._state not in ("opened", "deciding"):
            if now > self._handshake_deadline:      # SASL or open never came
                self.closed = True      # no frame can carry an error before the open
                self._events.append(ConnectionClosed(None))
                return self._take_events()
            return []
        if self._state != "opened":
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
            while not self.closed and self._state != "deciding":
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
        if self._state != "opened" or (self.close_sent and t is not Close):
            return              # after our close only the client's close counts (part 2.4.3)
        try:
            if t is Transfer:
                self._session(channel).on_transfer(perf, buf, payload_at, end)
            elif t is Disposition:
                self._session(channel).on_disposition(perf)
            elif t is Flow:
                self._session(channel).on_flow(perf)
            elif t is Attach:
                self._session(channel).on_attach(perf)
            elif t is Detach:
                self._session(channel).on_detach(perf)
            elif t is Begin:
                self._on_begin(channel, perf)
            elif t is End:
                self._on_end(channel)
            elif t is Close:
                self._on_close(perf)
            else:
                raise ProtocolError("amqp:not-allowed", f"unexpected {perf.label} frame")
        except Ignore:      # answered by ending its session
            pass

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
        self._state = "deciding"        # the broker answers: open() or close()
        self._events.append(ConnectionOpened(self.hostname, o.container_id, self.user or ""))

    def open(self, container_id: str, properties: dict | None = None,
             capabilities: list[str] | None = None) -> None:
        """Answer the client's open (call after ConnectionOpened, unless refusing)."""
        self._state = "opened"
        self.send(0, Open(container_id, None, self.max_frame_size, self.remote_channel_max,
                           self.idle_timeout_ms or None, None, None, capabilities, None,
                           properties))

    def close(self, condition: str | None = None, text: str = "") -> None:
        """Close the connection, with an error (``amqp:unauthorized-access`` ...) or none.
        A close before our open is preceded by one, as part 2.4.1 requires."""
        if self.close_sent:
            return
        if self._state in ("header", "sasl", "amqp-header"):
            self.closed = True          # no AMQP frame may be sent before the open (part 2.4)
            self.close_sent = True
            return
        if self._state in ("open", "deciding", "opened") and not self._open_sent:
            self.open("shoal")          # part 2.4.1: an open must precede the close
        self.send(0, Close(error(condition, text) if condition else None))
        self.close_sent = True

    _open_sent = False

    def _on_close(self, c: Close) -> None:
        if not self.close_sent:
            self.send(0, Close())
            self.close_sent = True
        self.closed = True
        self._events.append(ConnectionClosed(c.error))

    def _fail(self, exc: ProtocolError) -> None:
        """A protocol error: close (with an open first if none was sent), then stop."""
        if self._state in ("header", "amqp-header", "sasl"):
            self.closed = True
            self._events.append(ConnectionClosed(None))
            return
        self.close(exc.condition, exc.text)
        self.closed = True
        self._events.append(ConnectionClosed(error(exc.condition, exc.text)))

    # ---- what sessions use (session.py's Host) -----------------------------------------------
    def send(self, channel: int, perf: Performative, payload: bytes = b"") -> None:
        """Queue a frame; nothing follows our close (part 2.4.3)."""
        if self.close_sent:
            return
        if type(perf) is Open:
            self._open_sent = True
        self._out += frame(channel, perf, payload)

    def write(self, data: bytes) -> None:
        if not self.close_sent:
            self._out += data

    def emit(self, event: Any) -> None:
        self._events.append(event)

    # ---- sessions ----------------------------------------------------------------------------
    def _session(self, channel: int) -> Session:
        s = self.sessions.get(channel)
        if s is None:
            raise ProtocolError("amqp:not-allowed", f"no session on channel {channel}")
        if s.ended:             # we ended it: frames until the client's end are void
            raise Ignore
        return s

    def _on_begin(self, channel: int, b: Begin) -> None:
        if b.remote_channel is not None:
            raise ProtocolError("amqp:not-allowed", "begin answering a session we never began")
        if channel in self.sessions or channel > self.remote_channel_max:
            raise ProtocolError("amqp:connection:framing-error",
                                f"channel {channel} is in use or above channel-max")
        refusal = self._admit_session() if self._admit_session is not None else None
        self.sessions[channel] = Session(self, channel, b)
        self.sessions[channel].begin(refusal)

    def _on_end(self, channel: int) -> None:
        s = self.sessions.pop(channel, None)
        if s is None:
            raise ProtocolError("amqp:not-allowed", f"no session on channel {channel}")
        s.on_end()
