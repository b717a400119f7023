"""The sans-IO AMQP 0-9-1 server connection (design.md section 7, modelled on h11).

:class:`AMQPConnection` is a plain object: the transport feeds it received bytes with
:meth:`~AMQPConnection.receive_data` and gets back events (:mod:`.events`); whatever the
connection wants to send accumulates until :meth:`~AMQPConnection.data_to_send`. Time enters
only through :meth:`~AMQPConnection.tick`. No sockets, no asyncio.

It handles by itself: the protocol header, connection negotiation (start/start-ok, tune/tune-ok,
open/open-ok, spec 4.10), SASL PLAIN/AMQPLAIN, heartbeats (spec 4.2.7), channel open/close/flow
(spec 2.2.3, 1.5), content assembly of ``basic.publish`` (spec 2.3.5.2) and every frame-level
error. Errors become ``channel.close`` / ``connection.close`` in exactly one place,
:meth:`AMQPConnection.fail`. The connection holds the input side with its inline hot path
(basic.publish, basic.ack, content), the dispatch of every other frame, errors and close, time
and output; it hands the login's decisions to :class:`~.login.Login` (start-ok, tune-ok, open,
update-secret), the channels' lifecycle to :class:`~.channel.ChannelTable` and the placement
rules of the frames it does not take inline (which frame may arrive where) to
:mod:`.frame_rules`.
"""
from __future__ import annotations

from typing import Callable, Container, Iterable

from pamqp import commands

from shoal.shared.errors import (ACCESS_REFUSED, COMMAND_INVALID, CONNECTION_FORCED, FRAME_ERROR,
                                 AMQPError, hard_error)

from shoal.router.amqp import fastpath
from shoal.router.amqp.channel import (AFTER_PUBLISH, AWAIT_BODY as _AWAIT_BODY,
                                       AWAIT_HEADER as _AWAIT_HEADER, CLOSING as _CLOSING,
                                       OPEN as _OPEN, Channel, ChannelTable)
from shoal.router.amqp.events import (AcksReceived, ChannelCloseRequested, ConnectionClosed,
                                      ConnectionCloseRequested, ConnectionOpened)
from shoal.router.amqp.frame_rules import (CHANNEL as TO_CHANNEL, CONNECTION as TO_CONNECTION,
                                           check_other_frame, frame_end_error, frame_error,
                                           method_id, route_method)
from shoal.router.amqp.framing import (FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_METHOD,
                                       FRAME_MIN_SIZE, FRAME_TYPES, HEARTBEAT_FRAME,
                                       ACCEPTED_HEADERS, PROTOCOL_HEADER, decode_method,
                                       method_frame,
                                       frame_limit, payload_limit, unpack_frame_header)
from shoal.router.amqp.handshake import LOCALES, server_properties as default_server_properties
from shoal.router.amqp.liveness import HEARTBEAT, Liveness
from shoal.router.amqp.login import Login
from shoal.router.amqp.methods import (CONNECTION_CLOSE, CONNECTION_CLOSE_OK, CONNECTION_OPEN,
                                       CONNECTION_START_OK, CONNECTION_TUNE_OK,
                                       CONNECTION_UPDATE_SECRET, close_frame, name,
                                       require_known, with_ids)
from shoal.router.amqp.states import ConnectionInput, ConnectionState, connection_next

_PUBLISH, _ACK = fastpath.BASIC_PUBLISH, fastpath.BASIC_ACK
_unpack_mid = fastpath.unpack_method_id
_parse_publish, _parse_ack = fastpath.parse_publish, fastpath.parse_ack
_CONN_OPEN, _CONN_CLOSING, _CONN_CLOSED = (ConnectionState.OPEN, ConnectionState.CLOSING,
                                           ConnectionState.CLOSED)
_CONNECTION_INPUTS = {CONNECTION_START_OK: ConnectionInput.START_OK,
                      CONNECTION_TUNE_OK: ConnectionInput.TUNE_OK,
                      CONNECTION_OPEN: ConnectionInput.OPEN,
                      CONNECTION_CLOSE: ConnectionInput.CLIENT_CLOSE,
                      CONNECTION_CLOSE_OK: ConnectionInput.CLOSE_OK}


class AMQPConnection:
    """The server side of one AMQP 0-9-1 connection, without I/O.

    ``authenticate(username, password) -> bool``; ``vhosts``: the virtual hosts that exist;
    ``admit(username, vhost) -> str | None``: None admits the user to the vhost, a string is
    the reason connection.open fails with 530 (no permissions there, a connection limit;
    default: every user in every vhost). ``admit_channel() -> str | None``: the same for
    channel.open (a user's channel limit).
    ``external_identity``: the user a verified TLS client certificate names; when given,
    ``connection.start`` offers the EXTERNAL mechanism too, and an EXTERNAL login is
    ``authenticate(external_identity, None)``.
    ``frame_max`` (octets, whole frame), ``channel_max``, ``heartbeat`` (seconds): offered in
    ``connection.tune``; after ``tune-ok`` the attributes of the same names hold the
    negotiated values. ``max_message_size``: octets; larger publishes close the channel with
    406. ``loopback_users`` may only log in when ``peer_is_loopback`` (RabbitMQ's rule).
    ``handshake_timeout``/``close_timeout`` (seconds, via :meth:`tick`): how long the client
    may take to finish the handshake / to answer our ``connection.close``.
    ``check_secret(user, secret) -> bool``: a backend that checks ``connection.update-secret``
    (a token backend); None (password users) accepts it unchecked, as RabbitMQ 3.10 does
    (:class:`~.login.Login`).
    """

    def __init__(self, authenticate: Callable[[str, str | None], bool],
                 vhosts: Container[str] = ("/",), server_properties: dict | None = None,
                 frame_max: int = 131072, channel_max: int = 2047, heartbeat: int = 60,
                 max_message_size: int = 128 * 1024 * 1024, peer_is_loopback: bool = True,
                 loopback_users: Iterable[str] = ("guest",), *,
                 handshake_timeout: float = 10.0, close_timeout: float = 30.0,
                 admit: Callable[[str, str], str | None] | None = None,
                 admit_channel: Callable[[], str | None] | None = None,
                 external_identity: str | None = None,
                 check_secret: Callable[[str, str], bool] | None = None) -> None:
        self._login = Login(authenticate, vhosts, (frame_max, channel_max, heartbeat),
                            admit=admit, external_identity=external_identity,
                            peer_is_loopback=peer_is_loopback,
                            loopback_users=frozenset(loopback_users), check_secret=check_secret)
        self._server_properties = default_server_properties(server_properties)
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = heartbeat
        self.max_message_size = max_message_size
        self._liveness = Liveness(handshake_timeout, close_timeout)

        self._state = ConnectionState.AWAIT_PROTOCOL_HEADER
        self._table = ChannelTable(self._write, channel_max, admit_channel)
        self._channels: dict[int, Channel] = self._table.channels
        self._close_reason = (CONNECTION_FORCED, "CONNECTION_FORCED - connection closed")
        #: the client's connection.close held back for the frames before it (reply code, text)
        self._close_asked: tuple[int, str] | None = None
        #: input read behind a client's channel.close held back (ChannelCloseRequested): it
        #: is parsed once that close is answered, as if it had come in a later read
        self._held: list[bytes] | None = None
        # input: unparsed bytes wait in _chunks until _need octets are there (a partial frame)
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._need = len(PROTOCOL_HEADER)
        self._max_payload = payload_limit(FRAME_MIN_SIZE)  # until tune-ok (spec 4.2.3)
        # output
        self._out: list[bytes] = []
        self.pending_output = 0
        # time (tick): activity flags since the last tick, and when things last happened
        self._received = False
        self._sent = False
        self._deferred: list = []  # events of a close() before the protocol header

    # ------------------------------------------------------------------ properties
    @property
    def user(self) -> str | None:
        """The user logged in (None before ``start-ok``)."""
        return self._login.user

    @property
    def vhost(self) -> str | None:
        """The virtual host opened (None before ``connection.open``)."""
        return self._login.vhost

    @property
    def client_properties(self) -> dict:
        """The client's ``client-properties`` table from ``start-ok``."""
        return self._login.client_properties

    @property
    def capabilities(self) -> dict:
        """The ``capabilities`` table inside the client's properties."""
        return self._login.capabilities

    @property
    def state(self) -> ConnectionState:
        return self._state

    @property
    def is_closed(self) -> bool:
        """True once ConnectionClosed was emitted: the transport flushes and closes."""
        return self._state == _CONN_CLOSED

    #: the client's connection.close ended it (we sent close-ok), or a framing error after
    #: which we sent connection.close and stopped reading: the socket is left to the client
    #: for a moment (router/frontend/client.py), as RabbitMQ does, so that what it is still
    #: writing does not reset the connection before it has read our close
    linger_on_close = False

    @property
    def closing(self) -> bool:
        """True while we wait for the client's ``connection.close-ok``."""
        return self._state == _CONN_CLOSING

    @property
    def open_channels(self) -> int:
        """Channels opened and not yet closed (a server-closed one counts until close-ok)."""
        return len(self._channels)

    def channel_is_open(self, channel: int) -> bool:
        """True if ``channel`` is open and not closing (it may be mid-publish)."""
        chan = self._channels.get(channel)
        return chan is not None and chan.state != _CLOSING and self._state == _CONN_OPEN

    def channel_flow_active(self, channel: int) -> bool:
        """The last ``channel.flow`` ``active`` flag of ``channel`` (True if never sent)."""
        chan = self._channels.get(channel)
        return chan is not None and chan.flow_active

    # ------------------------------------------------------------------ input
    def receive_data(self, data: bytes) -> list:
        """Feed received octets; returns the events they complete (possibly none).

        ``b""`` means EOF: returns ``[ConnectionClosed]`` unless already closed. Never raises
        for bad input: errors become ``channel.close`` / ``connection.close`` (see
        :meth:`fail`); while closing, input other than ``close``/``close-ok`` is discarded.
        """
        if self._deferred:
            events, self._deferred = self._deferred, []
            return events + self.receive_data(data)
        if self._state == _CONN_CLOSED or self._close_asked is not None:
            return []
        if self._held is not None:
            self._held.append(data)
            return []
        if not data:
            return self._drop(*self._eof_reason())
        self._received = True
        if type(data) is not bytes:  # memoryview/bytearray: events must carry bytes
            data = bytes(data)
        if self._state == ConnectionState.AWAIT_PROTOCOL_HEADER:
            return self._protocol_header(data)
        if self._chunks:
            self._chunks.append(data)
            self._buffered += len(data)
            if self._buffered < self._need:
                return []
            buf = b"".join(self._chunks)
            self._chunks = []
            self._buffered = 0
        elif len(data) < self._need:
            self._chunks.append(data)
            self._buffered = len(data)
            return []
        else:
            buf = data
        events: list = []
        self._frames(buf, 0, events)
        return events

    def _protocol_header(self, data: bytes) -> list:
        """Spec 4.2.2: the 8-octet protocol header, possibly in pieces: 0-9-1's, or 0-9's
        (framing.ACCEPTED_HEADERS). On a mismatch (as soon as the prefix differs from both)
        answer with our header and close."""
        got = b"".join(self._chunks) + data if self._chunks else data
        size = len(PROTOCOL_HEADER)
        head = got[:size]
        if not any(head == h[:len(head)] for h in ACCEPTED_HEADERS):
            self._write(PROTOCOL_HEADER)
            return self._drop(FRAME_ERROR, "FRAME_ERROR - bad protocol header "
                                           f"{got[:size]!r}, expected AMQP 0-9-1")
        if len(got) < size:
            self._chunks, self._buffered = [got], len(got)
            return []
        self._chunks, self._buffered = [], 0
        self._state = connection_next(self._state, ConnectionInput.PROTOCOL_HEADER)
        self._need = 7
        self._write(method_frame(0, commands.Connection.Start(
            0, 9, self._server_properties, self._login.mechanisms, LOCALES)))
        events: list = []
        if len(got) > size:
            self._frames(got, size, events)
        return events

    def _frames(self, buf: bytes, pos: int, events: list) -> None:
        """Split ``buf[pos:]`` into frames (spec 4.2.3) and handle each; keep the tail.

        The frame size is checked against frame_max from the 7 header octets, before the
        payload is buffered. basic.publish, basic.ack, a content header and a single
        completing body frame on an OPEN connection are handled inline (design.md section 4);
        everything else goes through :meth:`_frame`.
        """
        end = len(buf)
        channels = self._channels
        append = events.append
        max_payload = self._max_payload
        is_open = self._state == _CONN_OPEN
        while True:
            if end - pos < 7:
                need = 7
                break
            frame_type, ch, size = unpack_frame_header(buf, pos)
            if size > max_payload or frame_type not in FRAME_TYPES:
                self._fatal(frame_error(frame_type, ch, size, frame_limit(max_payload)),
                            events)
                return
            fend = pos + 7 + size
            if fend >= end:
                need = fend + 1 - pos
                break
            if buf[fend] != FRAME_END:
                self._fatal(frame_end_error(buf[fend]), events)
                return
            start = pos + 7
            pos = fend + 1
            chan = channels.get(ch)
            try:
                if is_open and chan is not None:
                    state = chan.state
                    if frame_type == FRAME_METHOD:
                        if state == _OPEN and size >= 4:
                            mid = _unpack_mid(buf, start)[0]
                            if mid == _PUBLISH:
                                (chan.exchange, chan.routing_key, chan.mandatory,
                                 chan.immediate) = _parse_publish(buf, start, fend)
                                chan.state = AFTER_PUBLISH
                                continue
                            if mid == _ACK:
                                last = events[-1] if events else None
                                if type(last) is AcksReceived and last.channel == ch:
                                    last.acks.append(_parse_ack(buf, start, fend))
                                else:
                                    append(AcksReceived(ch, [_parse_ack(buf, start, fend)]))
                                continue
                    elif frame_type == FRAME_HEADER:
                        if state == _AWAIT_HEADER:
                            message = chan.content_header(ch, buf, start, fend,
                                                          self.max_message_size)
                            if message is not None:
                                append(message)
                            continue
                    elif frame_type == FRAME_BODY:
                        if state == _AWAIT_BODY:
                            message = chan.body_frame(ch, buf, start, fend)
                            if message is not None:
                                append(message)
                            continue
                self._frame(frame_type, ch, chan, buf, start, fend, events)
            except AMQPError as err:
                self._fail(ch, err, events)
            if self._close_asked is not None:       # the client's close: nothing after it
                return
            if self._state != _CONN_OPEN:
                if self._state == _CONN_CLOSED:
                    return
                is_open = False
            elif events and type(events[-1]) is ChannelCloseRequested:
                self._held = [buf[pos:]] if pos < end else []   # read on once it is answered
                return
            else:   # connection.open may have arrived in this same buffer (found by fuzzing)
                is_open = True
            max_payload = self._max_payload
        if pos < end:
            self._chunks = [buf[pos:]]
            self._buffered = end - pos
        self._need = need

    # ------------------------------------------------------------------ other frames
    def _frame(self, frame_type: int, ch: int, chan: Channel | None, buf: bytes, start: int,
               fend: int, events: list) -> None:
        """Every frame the inline path in :meth:`_frames` does not take, placed by
        :mod:`.frame_rules`: methods of the connection class here, channel methods in
        :class:`~.channel.ChannelTable`; heartbeats and misplaced content frames are only
        checked. Raises AMQPError for :meth:`fail`."""
        if frame_type != FRAME_METHOD:
            check_other_frame(frame_type, ch, chan, self._state)
            return
        mid = method_id(buf, start, fend)
        try:
            to = route_method(ch, mid, self._state)
            if to == TO_CONNECTION:
                self._connection_method(mid, buf, start, fend, events)
            elif to == TO_CHANNEL:
                self._table.method(ch, chan, mid, buf, start, fend, events)
        except AMQPError as err:
            if not err.class_id:
                with_ids(err, mid)
            raise

    def _connection_method(self, mid: int, buf: bytes, start: int, fend: int,
                           events: list) -> None:
        """Connection class methods on channel 0 (spec 1.4, 4.10): the state machine of
        :mod:`.states` orders them (503 when out of order), :class:`~.login.Login` decides."""
        login = self._login
        event = _CONNECTION_INPUTS.get(mid)
        if event is None:
            if mid == CONNECTION_UPDATE_SECRET:
                login.update_secret(decode_method(mid, buf[start + 4:fend]),
                                    self._state == _CONN_OPEN)
                self._write(method_frame(0, commands.Connection.UpdateSecretOk()))
                return
            require_known(mid)
            raise hard_error(COMMAND_INVALID, f"{name(mid)} is not sent by clients")
        nxt = connection_next(self._state, event)  # 503 when out of order
        method = decode_method(mid, buf[start + 4:fend])
        if event == ConnectionInput.START_OK:
            try:
                self._write(method_frame(0, login.start_ok(method)))
            except AMQPError as err:     # a refused login: see Login.refusal_is_closed
                if err.reply_code != ACCESS_REFUSED or login.refusal_is_closed:
                    raise
                events.extend(self._drop(err.reply_code, err.reply_text))
                return
        elif event == ConnectionInput.TUNE_OK:
            self.channel_max, self.frame_max, self.heartbeat = login.tune_ok(method)
            self._table.channel_max = self.channel_max
            self._max_payload = payload_limit(self.frame_max)
        elif event == ConnectionInput.OPEN:
            login.open(method.virtual_host)
            self._write(method_frame(0, commands.Connection.OpenOk()))
            events.append(ConnectionOpened(login.vhost, login.user, login.client_properties))
        else:   # the client's close, or its close-ok after ours
            if event == ConnectionInput.CLIENT_CLOSE:
                asked = (method.reply_code, method.reply_text)
                if self._state == _CONN_OPEN and any(getattr(e, "channel", 0) for e in events):
                    # channel frames read before it are not judged yet: answer once they
                    # are (answer_connection_close), so that an error of theirs comes first
                    self._close_asked = asked
                    self._discard_input()
                    events.append(ConnectionCloseRequested(*asked))
                else:
                    events.extend(self._close_ok(asked))
                return
            self._state = nxt
            self._discard_input()
            events.append(ConnectionClosed(*self._close_reason))
            return
        self._state = nxt

    # ------------------------------------------------------------------ errors and close
    def answer_connection_close(self) -> list:
        """ConnectionCloseRequested, once the frames before it were handled: ``close-ok``
        (spec 1.4.2.8) and the connection is over. Returns the events: one ConnectionClosed
        (none when it was over already)."""
        asked, self._close_asked = self._close_asked, None
        if asked is None or self._state == _CONN_CLOSED:
            return []
        return self._close_ok(asked)

    def _close_ok(self, asked: tuple[int, str]) -> list:
        """Answer the client's ``connection.close`` (reply code, text ``asked``) with
        ``close-ok`` (spec 1.4.2.8); the connection is over: one ConnectionClosed."""
        self._write(method_frame(0, commands.Connection.CloseOk()))
        self.linger_on_close = True
        if self._state != _CONN_CLOSING:
            self._close_reason = (200, f"client closed connection: {asked[0]} {asked[1]}")
        self._state = connection_next(self._state, ConnectionInput.CLIENT_CLOSE)
        self._discard_input()
        return [ConnectionClosed(*self._close_reason)]

    def answer_client_close(self, channel: int) -> tuple[bool, list]:
        """ChannelCloseRequested, once the frames before it were handled: ``close-ok``.
        Returns whether the channel is gone now (ChannelTable.answer_client_close), and the
        events of what was read behind the close, parsed now, as a later read would have
        been (so a client's next frames are taken in the same order however its writes were
        cut: a channel opened again after its close-ok, say)."""
        gone = True if self._state in (_CONN_CLOSING, _CONN_CLOSED) else \
            self._table.answer_client_close(channel)
        held, self._held = self._held, None
        events: list = []
        for data in held or ():
            events += self.receive_data(data)
        return gone, events

    def fail(self, channel: int, error: AMQPError) -> None:
        """THE one converter of errors into closes (design.md section 7).

        ``error.soft`` and ``channel`` != 0: ``channel.close`` (spec 1.5.2.5) with the error's
        reply code/text/class/method; the channel goes CLOSING and discards input until the
        client's ``close-ok`` (then ChannelClosed). A soft error on a channel that is not open
        or already closing is dropped. Otherwise (hard): ``connection.close`` (spec 1.4.2.7);
        the connection goes CLOSING and ConnectionClosed follows the client's ``close-ok``
        (or ``close_timeout``). No-op once the connection is closing or closed.
        """
        self._fail(channel, error, None)

    def _fail(self, channel: int, error: AMQPError, events: list | None) -> None:
        if self._state in (_CONN_CLOSING, _CONN_CLOSED):
            return
        if error.soft and channel:
            self._table.server_close(channel, error)
            return
        self._server_close(error.reply_code, error.reply_text, error.class_id,
                           error.method_id, events)

    def close(self, reply_code: int = CONNECTION_FORCED,
              reply_text: str = "CONNECTION_FORCED - broker shutdown") -> None:
        """Server-initiated ``connection.close`` (spec 1.4.2.7), e.g. at shutdown;
        ``reply_text`` is sent as given. ConnectionClosed follows the client's close-ok (or
        ``close_timeout``); before the protocol header arrived it comes from the next
        receive_data/tick call. No-op once closing or closed."""
        if self._state not in (_CONN_CLOSING, _CONN_CLOSED):
            self._server_close(reply_code, reply_text, 0, 0, None)

    def _server_close(self, reply_code: int, reply_text: str, class_id: int, method_id: int,
                      events: list | None) -> None:
        if self._state == ConnectionState.AWAIT_PROTOCOL_HEADER:  # nothing to talk to yet
            dropped = self._drop(reply_code, reply_text)
            if events is None:
                self._deferred.extend(dropped)
            else:
                events.extend(dropped)
            return
        self._write(close_frame(0, CONNECTION_CLOSE, reply_code, reply_text, class_id,
                                 method_id))
        self._close_reason = (reply_code, reply_text)
        self._state = connection_next(self._state, ConnectionInput.SERVER_CLOSE)

    def _fatal(self, error: AMQPError, events: list) -> None:
        """Framing is broken (spec 4.2.3): send ``connection.close`` unless already closing,
        then drop at once, since input after this cannot be split into frames."""
        if self._state != _CONN_CLOSING:
            self._write(close_frame(0, CONNECTION_CLOSE, error.reply_code, error.reply_text,
                                     error.class_id, error.method_id))
            self._close_reason = (error.reply_code, error.reply_text)
        self.linger_on_close = True        # linger: see linger_on_close
        events.extend(self._drop(*self._close_reason))

    def _drop(self, reply_code: int, reply_text: str) -> list:
        """Go CLOSED now; the one ConnectionClosed event."""
        if self._state == _CONN_CLOSED:
            return []
        self._state = connection_next(self._state, ConnectionInput.DROP)
        self._discard_input()
        self._channels.clear()
        return [ConnectionClosed(reply_code, reply_text)]

    def _eof_reason(self) -> tuple[int, str]:
        if self._state == _CONN_CLOSING:
            return self._close_reason
        return (CONNECTION_FORCED, "CONNECTION_FORCED - client unexpectedly closed TCP "
                                   "connection")

    def _discard_input(self) -> None:
        self._chunks = []
        self._buffered = 0

    # ------------------------------------------------------------------ time
    def mark_received(self) -> None:
        """Count the client as heard from: the server stopped reading it (flow control, a
        blocked broker), so its silence is not a missed heartbeat."""
        self._received = True

    def tick(self, now: float) -> list:
        """Drive timers; ``now`` is monotonic seconds. Call it about once a second.

        Sends a heartbeat frame when nothing was sent for ``heartbeat / 2`` seconds
        (RabbitMQ's rate, spec 4.2.7); drops a client from which nothing was received for
        ``2 * heartbeat`` seconds (ConnectionClosed 320 "missed heartbeats"), a handshake not
        done within ``handshake_timeout`` and a ``connection.close`` not answered within
        ``close_timeout``. Returns the events (at most one ConnectionClosed).
        """
        if self._deferred:
            events, self._deferred = self._deferred, []
            return events
        state = self._state
        if state == _CONN_CLOSED:
            return []
        received, sent = self._received, self._sent
        self._received = self._sent = False
        verdict = self._liveness.check(now, state, received, sent, self.heartbeat,
                                       self._close_reason)
        if verdict is None:
            return []
        if verdict == HEARTBEAT:
            self._write(HEARTBEAT_FRAME)
            self._sent = False
            return []
        return self._drop(*verdict)

    # ------------------------------------------------------------------ output
    def _write(self, data: bytes) -> None:
        self._out.append(data)
        self.pending_output += len(data)
        self._sent = True

    def data_to_send(self) -> bytes:
        """All bytes produced so far, draining the buffer (``pending_output`` drops to 0)."""
        out = self._out
        if not out:
            return b""
        data = out[0] if len(out) == 1 else b"".join(out)
        self._out = []
        self.pending_output = 0
        return data

    def send_method(self, channel: int, method) -> None:
        """Send a pamqp method object on ``channel`` (0 for connection.blocked/unblocked).
        Dropped silently when the channel (or the connection) is closing or closed."""
        if channel == 0:
            if self._state != _CONN_OPEN:
                return
        elif not self.channel_is_open(channel):
            return
        self._write(method_frame(channel, method))

    def send_deliver(self, channel: int, consumer_tag: str, delivery_tag: int,
                     redelivered: bool, exchange: str, routing_key: str, header: bytes,
                     body: bytes) -> None:
        """``basic.deliver`` + content header (``header``: payload as published) + body
        frames split at the negotiated frame_max. Dropped on a closing/closed channel."""
        chan = self._channels.get(channel)
        if chan is None or chan.state == _CLOSING or self._state != _CONN_OPEN:
            return
        data = fastpath.deliver(channel, consumer_tag, delivery_tag, redelivered, exchange,
                                routing_key, header, body, self.frame_max)
        self._out.append(data)
        self.pending_output += len(data)
        self._sent = True

    def send_get_ok(self, channel: int, delivery_tag: int, redelivered: bool, exchange: str,
                    routing_key: str, message_count: int, header: bytes, body: bytes) -> None:
        """``basic.get-ok`` + content frames. Dropped on a closing/closed channel."""
        if self.channel_is_open(channel):
            self._write(fastpath.get_ok(channel, delivery_tag, redelivered, exchange,
                                        routing_key, message_count, header, body,
                                        self.frame_max))

    def send_return(self, channel: int, reply_code: int, reply_text: str, exchange: str,
                    routing_key: str, header: bytes, body: bytes) -> None:
        """``basic.return`` (e.g. 312 NO_ROUTE) + content frames."""
        if self.channel_is_open(channel):
            self._write(fastpath.basic_return(channel, reply_code, reply_text, exchange,
                                              routing_key, header, body, self.frame_max))

    def send_confirm(self, channel: int, delivery_tag: int, multiple: bool,
                     ack: bool) -> None:
        """Publisher confirm: ``basic.ack`` (``ack``) or ``basic.nack``."""
        if self.channel_is_open(channel):
            self._write(fastpath.confirm(channel, delivery_tag, multiple, ack))
