"""Every received frame that the inline hot path of :class:`~.connection.AMQPConnection` does
not take: the connection class on channel 0 (negotiation start-ok/tune-ok/open and close,
spec 1.4 and 4.10), channel open/close/flow (spec 1.5, 2.2.3), ``basic.publish`` in a state
that does not expect it, the other channel methods (passed on as MethodReceived), heartbeats
and misplaced content frames (spec 4.2.3-4.2.7), and the errors each of these raises.

:class:`ControlFrames` is a mixin of AMQPConnection: these methods work on the connection's
own state (declared below, set in ``AMQPConnection.__init__``); their errors reach the one
converter, :meth:`AMQPConnection.fail <.connection.AMQPConnection.fail>` (design.md section 7).
"""
from __future__ import annotations

from typing import Callable, Container

from pamqp import commands

from shoal.shared.errors import (CHANNEL_ERROR, COMMAND_INVALID, FRAME_ERROR, NOT_ALLOWED,
                                 NOT_IMPLEMENTED, UNEXPECTED_FRAME, AMQPError, hard_error)

from shoal.router.amqp import fastpath
from shoal.router.amqp.channel import CLOSING as _CLOSING, Channel
from shoal.router.amqp.events import (ChannelClosed, ChannelOpened, ConnectionClosed, ConnectionOpened,
                     MethodReceived)
from shoal.router.amqp.framing import (FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD, FRAME_MIN_SIZE,
                      FRAME_OVERHEAD, decode_method, method_frame)
from shoal.router.amqp.handshake import negotiate, refused, sasl_credentials
from shoal.router.amqp.methods import (BASIC_CANCEL_OK, CHANNEL_CLOSE, CHANNEL_CLOSE_OK, CHANNEL_FLOW,
                      CHANNEL_FLOW_OK, CHANNEL_OPEN, CLIENT_CHANNEL_METHODS, CONNECTION_CLASS,
                      CONNECTION_CLOSE, CONNECTION_CLOSE_OK, CONNECTION_OPEN,
                      CONNECTION_START_OK, CONNECTION_TUNE_OK, CONNECTION_UPDATE_SECRET, name,
                      require_known, with_ids)
from shoal.router.amqp.states import ChannelInput, ConnectionInput, ConnectionState, channel_next, connection_next

_PUBLISH = fastpath.BASIC_PUBLISH
_unpack_mid = fastpath.unpack_method_id
_CONNECTION_INPUTS = {CONNECTION_START_OK: ConnectionInput.START_OK,
                      CONNECTION_TUNE_OK: ConnectionInput.TUNE_OK,
                      CONNECTION_OPEN: ConnectionInput.OPEN,
                      CONNECTION_CLOSE: ConnectionInput.CLIENT_CLOSE,
                      CONNECTION_CLOSE_OK: ConnectionInput.CLOSE_OK}
_CI = ChannelInput
_CONN_OPEN, _CONN_CLOSING = ConnectionState.OPEN, ConnectionState.CLOSING


class ControlFrames:
    """The frames AMQPConnection's hot path does not take (see the module docstring)."""

    # The connection's state these methods use (AMQPConnection.__init__ sets it).
    frame_max: int
    channel_max: int
    heartbeat: int
    client_properties: dict
    capabilities: dict
    user: str | None
    vhost: str | None
    _authenticate: Callable[[str, str | None], bool]
    _vhosts: Container[str]
    _admit: Callable[[str, str], str | None] | None
    _admit_channel: Callable[[], str | None] | None
    _external_identity: str | None
    _offer: tuple[int, int, int]
    _peer_is_loopback: bool
    _loopback_users: frozenset[str]
    _state: ConnectionState
    _channels: dict[int, Channel]
    _close_reason: tuple[int, str]
    _max_payload: int
    _write: Callable[[bytes], None]
    _discard_input: Callable[[], None]

    # ------------------------------------------------------------------ frames
    def _frame(self, frame_type: int, ch: int, chan: Channel | None, buf: bytes, start: int,
               fend: int, events: list) -> None:
        """Every frame the inline path in ``AMQPConnection._frames`` does not take."""
        if frame_type == FRAME_METHOD:
            if fend - start < 4:
                raise hard_error(FRAME_ERROR, "method frame shorter than 4 octets")
            mid = _unpack_mid(buf, start)[0]
            try:
                self._method(ch, chan, mid, buf, start, fend, events)
            except AMQPError as err:
                if not err.class_id:
                    with_ids(err, mid)
                raise
        elif frame_type == FRAME_HEARTBEAT:
            if ch != 0:  # spec 4.2.7: heartbeats belong to channel 0 (505, as RabbitMQ)
                raise hard_error(UNEXPECTED_FRAME, f"heartbeat frame on channel {ch}")
        elif self._state == _CONN_CLOSING:
            return  # spec 2.2.4: discard all but close / close-ok
        elif self._state != _CONN_OPEN:
            raise hard_error(UNEXPECTED_FRAME, "content frame before connection.open")
        elif ch == 0:
            raise hard_error(UNEXPECTED_FRAME, "content frame on channel 0")
        elif chan is None:
            raise hard_error(CHANNEL_ERROR, f"channel {ch} is not open")
        else:  # on a CLOSING channel: discarded (spec 2.2.3); otherwise 505
            channel_next(ch, chan.state, _CI.HEADER if frame_type == FRAME_HEADER
                         else _CI.BODY)

    # ------------------------------------------------------------------ methods
    def _method(self, ch: int, chan: Channel | None, mid: int, buf: bytes, start: int,
                fend: int, events: list) -> None:
        state = self._state
        if state == _CONN_CLOSING:  # spec 2.2.4: discard all but close / close-ok
            if ch == 0 and mid in (CONNECTION_CLOSE, CONNECTION_CLOSE_OK):
                self._connection_method(mid, buf, start, fend, events)
            return
        if ch == 0:
            if mid == CHANNEL_OPEN:
                raise hard_error(CHANNEL_ERROR, "channel.open on channel 0")
            if mid >> 16 != CONNECTION_CLASS:
                require_known(mid)   # RabbitMQ: a channel method on channel 0 is 504
                raise hard_error(CHANNEL_ERROR, f"{name(mid)} on channel 0")
            self._connection_method(mid, buf, start, fend, events)
            return
        require_known(mid)
        if mid >> 16 == CONNECTION_CLASS:
            raise hard_error(COMMAND_INVALID, f"{name(mid)} on channel {ch}, expected 0")
        if state != _CONN_OPEN:
            raise hard_error(COMMAND_INVALID, f"{name(mid)} before connection.open")
        if chan is None:
            if mid != CHANNEL_OPEN:
                raise hard_error(CHANNEL_ERROR, f"expected 'channel.open' on channel {ch}, "
                                                f"got {name(mid)}")
            if self.channel_max and len(self._channels) >= self.channel_max:
                # channel_max counts open channels; any number 1-65535 may be used (RabbitMQ)
                raise hard_error(NOT_ALLOWED, f"number of channels opened "
                                              f"({len(self._channels)}) has reached the "
                                              f"negotiated channel_max ({self.channel_max})")
            refusal = self._admit_channel() if self._admit_channel is not None else None
            if refusal is not None:
                raise hard_error(NOT_ALLOWED, refusal)
            self._channels[ch] = Channel()
            self._write(method_frame(ch, commands.Channel.OpenOk()))
            events.append(ChannelOpened(ch))
            return
        cstate = chan.state
        if cstate == _CLOSING:  # spec 2.2.3: discard all but close / close-ok
            if mid == CHANNEL_CLOSE:
                channel_next(ch, cstate, _CI.CLIENT_CLOSE)
                self._write(method_frame(ch, commands.Channel.CloseOk()))
            elif mid == CHANNEL_CLOSE_OK:
                channel_next(ch, cstate, _CI.CLOSE_OK)
                del self._channels[ch]
                events.append(ChannelClosed(ch))
            return
        if mid == CHANNEL_CLOSE:
            channel_next(ch, cstate, _CI.CLIENT_CLOSE)  # 505 while content is expected
            del self._channels[ch]
            self._write(method_frame(ch, commands.Channel.CloseOk()))
            events.append(ChannelClosed(ch))
            return
        if mid == CHANNEL_CLOSE_OK:
            channel_next(ch, cstate, _CI.CLOSE_OK)  # raises: we sent no channel.close
        if mid == _PUBLISH:  # the hot path takes the OPEN case; here: 505 mid-content
            chan.state = channel_next(ch, cstate, _CI.PUBLISH)
            (chan.exchange, chan.routing_key, chan.mandatory,
             chan.immediate) = fastpath.parse_publish(buf, start, fend)
            return
        chan.state = channel_next(ch, cstate, _CI.METHOD)  # 505 while content is expected
        if mid == CHANNEL_OPEN:
            raise hard_error(CHANNEL_ERROR, f"channel {ch} is already open")
        method = decode_method(mid, buf[start + 4:fend])
        if mid in CLIENT_CHANNEL_METHODS:
            events.append(MethodReceived(ch, method))
        elif mid == CHANNEL_FLOW:
            if not method.active:   # RabbitMQ 3.10: consumers use basic.qos instead
                raise hard_error(NOT_IMPLEMENTED, "active=false")
            chan.flow_active = True
            self._write(method_frame(ch, commands.Channel.FlowOk(True)))
        elif mid in (CHANNEL_FLOW_OK, BASIC_CANCEL_OK):
            pass  # answers to our channel.flow / basic.cancel: nothing to do
        else:
            raise hard_error(COMMAND_INVALID, f"{name(mid)} is not sent by clients")

    def _connection_method(self, mid: int, buf: bytes, start: int, fend: int,
                           events: list) -> None:
        """Connection class methods on channel 0 (spec 1.4, 4.10)."""
        event = _CONNECTION_INPUTS.get(mid)
        if event is None:
            if mid == CONNECTION_UPDATE_SECRET:
                self._update_secret(decode_method(mid, buf[start + 4:fend]))
                return
            require_known(mid)
            raise hard_error(COMMAND_INVALID, f"{name(mid)} is not sent by clients")
        nxt = connection_next(self._state, event)  # 503 when out of order
        method = decode_method(mid, buf[start + 4:fend])
        if event == ConnectionInput.START_OK:
            self._start_ok(method)
        elif event == ConnectionInput.TUNE_OK:
            self._tune_ok(method)
        elif event == ConnectionInput.OPEN:
            vhost = method.virtual_host
            # 530 with RabbitMQ's wording (rabbit_reader / rabbit_access_control)
            if vhost not in self._vhosts:
                raise hard_error(NOT_ALLOWED, f"vhost {vhost} not found")
            refusal = self._admit(self.user, vhost) if self._admit is not None else None
            if refusal is not None:
                raise hard_error(NOT_ALLOWED, refusal)
            self.vhost = vhost
            self._write(method_frame(0, commands.Connection.OpenOk()))
            events.append(ConnectionOpened(vhost, self.user, self.client_properties))
        elif event == ConnectionInput.CLIENT_CLOSE:
            self._write(method_frame(0, commands.Connection.CloseOk()))
            if self._state != _CONN_CLOSING:
                self._close_reason = (200, f"client closed connection: {method.reply_code} "
                                           f"{method.reply_text}")
            self._state = nxt
            self._discard_input()
            events.append(ConnectionClosed(*self._close_reason))
            return
        else:  # CLOSE_OK after our connection.close
            self._state = nxt
            self._discard_input()
            events.append(ConnectionClosed(*self._close_reason))
            return
        self._state = nxt

    def _start_ok(self, method: commands.Connection.StartOk) -> None:
        props = method.client_properties
        self.client_properties = props if isinstance(props, dict) else {}
        caps = self.client_properties.get("capabilities")
        self.capabilities = caps if isinstance(caps, dict) else {}
        mechanism = method.mechanism if isinstance(method.mechanism, str) else "?"
        if mechanism == "EXTERNAL":
            # SASL EXTERNAL (RFC 4422 appendix A): the verified TLS client certificate names
            # the user, who must exist; authenticate(user, None) checks only that.
            if self._external_identity is None:
                raise refused(mechanism)
            user, password = self._external_identity, None
        else:
            user, password = sasl_credentials(mechanism, method.response or b"")
        if not self._authenticate(user, password):
            raise refused(mechanism)
        if user in self._loopback_users and not self._peer_is_loopback:
            raise refused(mechanism)
        self.user = user
        frame_max, channel_max, heartbeat = self._offer
        self._write(method_frame(0, commands.Connection.Tune(channel_max, frame_max,
                                                             heartbeat)))

    def _update_secret(self, method: commands.Connection.UpdateSecret) -> None:
        """``connection.update-secret`` (RabbitMQ's extension to 0-9-1, used by OAuth 2 clients
        to refresh a token): the user logged in on this connection authenticates again with
        ``new_secret``; ``update-secret-ok`` when it is accepted. Raises 503 COMMAND_INVALID
        before ``connection.open``, 530 NOT_ALLOWED (hard) when the new secret is refused,
        with RabbitMQ's wording (rabbit_reader ``handle_method0``)."""
        if self._state != _CONN_OPEN:
            raise hard_error(COMMAND_INVALID, "connection.update-secret before connection.open")
        secret = method.new_secret
        try:
            password = secret if isinstance(secret, str) else bytes(secret).decode("utf-8")
        except UnicodeDecodeError:
            password = None
        if password is None or self.user is None or not self._authenticate(self.user, password):
            raise hard_error(NOT_ALLOWED, "New secret was refused by one of the backends")
        self._write(method_frame(0, commands.Connection.UpdateSecretOk()))

    def _tune_ok(self, method: commands.Connection.TuneOk) -> None:
        frame_max, channel_max, _ = self._offer
        self.channel_max = negotiate(channel_max, method.channel_max, "channel_max")
        self.frame_max = negotiate(frame_max, method.frame_max, "frame_max", FRAME_MIN_SIZE)
        self.heartbeat = method.heartbeat
        self._max_payload = self.frame_max - FRAME_OVERHEAD
