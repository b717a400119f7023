"""A connection's channels: each one's protocol state and the assembly of published content
(spec 2.3.5.2 "Content Framing": method frame, content header frame, body frames), and the
table of them with their lifecycle (channel.open, close, close-ok and flow, spec 1.5, 2.2.3).
"""
from __future__ import annotations

from typing import Callable

from pamqp import commands

from shoal.shared.errors import (CHANNEL_ERROR, COMMAND_INVALID, FRAME_ERROR, NOT_ALLOWED,
                                 NOT_IMPLEMENTED, PRECONDITION_FAILED, UNEXPECTED_FRAME,
                                 AMQPError, hard_error, soft_error)

from shoal.router.amqp import fastpath
from shoal.router.amqp.events import (ChannelClosed, ChannelCloseRequested, ChannelOpened,
                                      MessagePublished, MethodReceived)
from shoal.router.amqp.framing import channel_open_ok, decode_method, method_frame
from shoal.router.amqp.methods import (BASIC_CANCEL_OK, CHANNEL_CLOSE, CHANNEL_CLOSE_OK,
                                       CHANNEL_FLOW, CHANNEL_FLOW_OK, CHANNEL_OPEN,
                                       CLIENT_CHANNEL_METHODS, close_frame, name, with_ids)
from shoal.router.amqp.properties import check_properties
from shoal.router.amqp.states import CHANNEL_NEXT, ChannelInput, ChannelState, channel_next

_PUBLISH = fastpath.BASIC_PUBLISH
_CI = ChannelInput
OPEN, AWAIT_HEADER, AWAIT_BODY, CLOSING = (ChannelState.OPEN, ChannelState.AWAIT_HEADER,
                                           ChannelState.AWAIT_BODY, ChannelState.CLOSING)
# Hot transitions, resolved once from the table in states.py.
AFTER_PUBLISH = CHANNEL_NEXT[OPEN][ChannelInput.PUBLISH]
AFTER_HEADER = CHANNEL_NEXT[AWAIT_HEADER][ChannelInput.HEADER]
AFTER_EMPTY_HEADER = CHANNEL_NEXT[AWAIT_HEADER][ChannelInput.HEADER_EMPTY]
AFTER_BODY = CHANNEL_NEXT[AWAIT_BODY][ChannelInput.BODY]
AFTER_LAST_BODY = CHANNEL_NEXT[AWAIT_BODY][ChannelInput.BODY_LAST]


class Channel:
    """An open channel: ``state`` (:class:`ChannelState`), the ``channel.flow`` flag, and the
    ``basic.publish`` being assembled (its fields, header payload, body parts, octets left)."""
    __slots__ = ("state", "flow_active", "exchange", "routing_key", "mandatory", "immediate",
                 "header", "body", "remaining", "client_closing")

    def __init__(self) -> None:
        self.state = OPEN
        self.flow_active = True
        self.exchange = self.routing_key = ""
        self.mandatory = self.immediate = False
        self.header = b""
        self.body: list | None = None
        self.remaining = 0
        #: the client's channel.close waits on earlier frames (ChannelCloseRequested)
        self.client_closing = False

    def content_header(self, ch: int, buf: bytes, start: int, fend: int,
                       max_message_size: int) -> MessagePublished | None:
        """The content header ``buf[start:fend]`` (state AWAIT_HEADER). Returns the complete
        message when ``body_size`` is 0. Raises 501 FRAME_ERROR (short header, or a property
        list that does not parse: properties.check_properties), 505 (class not 60), soft 406
        PRECONDITION_FAILED when ``body_size > max_message_size`` (octets)."""
        class_id, body_size = fastpath.parse_content_header(buf, start, fend)
        if class_id != fastpath.BASIC_CLASS:
            raise with_ids(hard_error(UNEXPECTED_FRAME, f"content header for class "
                                                        f"{class_id}, expected 60 (basic)"),
                           _PUBLISH)
        check_properties(buf, start, fend)
        if body_size > max_message_size:
            raise with_ids(soft_error(PRECONDITION_FAILED, f"message size {body_size} is "
                                      f"larger than configured max size {max_message_size}"),
                           _PUBLISH)
        if body_size == 0:
            self.state = AFTER_EMPTY_HEADER
            return MessagePublished(ch, self.exchange, self.routing_key, self.mandatory,
                                    self.immediate, buf[start:fend], b"")
        self.state = AFTER_HEADER
        self.header = buf[start:fend]
        self.remaining = body_size
        self.body = None
        return None

    def body_frame(self, ch: int, buf: bytes, start: int, fend: int) -> MessagePublished | None:
        """A body frame ``buf[start:fend]`` (state AWAIT_BODY). Returns the message once the
        body is complete. Raises 501 FRAME_ERROR when the body exceeds ``body_size``."""
        remaining = self.remaining - (fend - start)
        if remaining < 0:
            raise with_ids(hard_error(FRAME_ERROR, f"content body on channel {ch} is larger "
                                                   f"than the body size in its header"),
                           _PUBLISH)
        parts = self.body
        if remaining:
            if parts is None:
                self.body = [buf[start:fend]]
            else:
                parts.append(buf[start:fend])
            self.remaining = remaining
            self.state = AFTER_BODY
            return None
        if parts is None:
            body = buf[start:fend]
        else:
            parts.append(buf[start:fend])
            body = b"".join(parts)
        self.state = AFTER_LAST_BODY
        self.body = None
        self.remaining = 0
        header, self.header = self.header, b""
        return MessagePublished(ch, self.exchange, self.routing_key, self.mandatory,
                                self.immediate, header, body)

    def abandon_content(self) -> None:
        """Forget a partly received message (the channel is closing)."""
        self.header = b""
        self.body = None
        self.remaining = 0


class ChannelTable:
    """The channels of one connection: ``channels`` (number -> :class:`Channel`, the dict the
    connection's hot path reads) and every channel-level frame of an OPEN connection that the
    hot path does not take (:meth:`method`).

    ``write(bytes)``: the connection's output. ``channel_max``: how many channels may be open
    at once (0: no limit; the connection sets the negotiated value after ``tune-ok``).
    ``admit_channel() -> str | None``: None admits a ``channel.open``, a string is the 530
    reason (a user's channel limit).
    """

    __slots__ = ("channels", "channel_max", "_write", "_admit_channel")

    def __init__(self, write: Callable[[bytes], None], channel_max: int,
                 admit_channel: Callable[[], str | None] | None = None) -> None:
        self.channels: dict[int, Channel] = {}
        self.channel_max = channel_max
        self._write = write
        self._admit_channel = admit_channel

    def method(self, ch: int, chan: Channel | None, mid: int, buf: bytes, start: int,
               fend: int, events: list) -> None:
        """A method frame ``buf[start:fend]`` (method id ``mid``) on channel ``ch`` != 0 of an
        OPEN connection. Appends ChannelOpened, ChannelClosed or MethodReceived to ``events``.
        Raises 504 CHANNEL_ERROR (not open, already open), 530 NOT_ALLOWED (channel_max, the
        channel limit), 505 UNEXPECTED_FRAME (a method while content is expected), 540
        NOT_IMPLEMENTED (``channel.flow active=false``, as RabbitMQ 3.10), 503 COMMAND_INVALID
        (a method only servers send); each hard, as RabbitMQ raises them."""
        channels = self.channels
        if chan is None:
            if mid != CHANNEL_OPEN:
                raise hard_error(CHANNEL_ERROR, f"expected 'channel.open' on channel {ch}, "
                                                f"got {name(mid)}")
            if self.channel_max and len(channels) >= self.channel_max:
                # channel_max counts open channels; any number 1-65535 may be used (RabbitMQ)
                raise hard_error(NOT_ALLOWED, f"number of channels opened "
                                              f"({len(channels)}) has reached the "
                                              f"negotiated channel_max ({self.channel_max})")
            refusal = self._admit_channel() if self._admit_channel is not None else None
            if refusal is not None:
                raise hard_error(NOT_ALLOWED, refusal)
            channels[ch] = Channel()
            self._write(channel_open_ok(ch))
            events.append(ChannelOpened(ch))
            return
        cstate = chan.state
        if cstate == CLOSING:  # spec 2.2.3: discard all but close / close-ok
            if mid == CHANNEL_CLOSE:
                channel_next(ch, cstate, _CI.CLIENT_CLOSE)
                self._write(method_frame(ch, commands.Channel.CloseOk()))
            elif mid == CHANNEL_CLOSE_OK:
                channel_next(ch, cstate, _CI.CLOSE_OK)
                del channels[ch]
                events.append(ChannelClosed(ch))
            return
        if mid == CHANNEL_CLOSE:
            channel_next(ch, cstate, _CI.CLIENT_CLOSE)  # 505 while content is expected
            if any(getattr(e, "channel", None) == ch for e in events):
                # frames of this channel read before the close are not judged yet: answer
                # once they are, so that an error of theirs comes first (answer_client_close)
                chan.state = CLOSING
                chan.client_closing = True
                events.append(ChannelCloseRequested(ch))
                return
            del channels[ch]
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

    def answer_client_close(self, ch: int) -> bool:
        """Answer a client's ``channel.close`` held back by :meth:`method`
        (ChannelCloseRequested): ``close-ok``. Returns True when the channel is gone now;
        False when our own ``channel.close`` went out ahead of it (:meth:`server_close`),
        which the client answers with ``close-ok`` (then ChannelClosed), as RabbitMQ."""
        chan = self.channels.get(ch)
        if chan is None:
            return True
        self._write(method_frame(ch, commands.Channel.CloseOk()))
        if chan.client_closing:
            del self.channels[ch]
            return True
        return False

    def server_close(self, ch: int, error: AMQPError) -> None:
        """Close channel ``ch`` for the soft ``error`` (spec 1.5.2.5 ``channel.close`` with
        its reply code and text and the failing method's ids): it goes CLOSING, forgets a
        partly received message and discards input until the client's ``close-ok``. On a
        channel whose client's close waits (ChannelCloseRequested) the ``channel.close``
        goes out ahead of its answer. Nothing happens when the channel is not open or
        already closing otherwise."""
        chan = self.channels.get(ch)
        if chan is None:
            return
        if chan.state != CLOSING:
            chan.state = channel_next(ch, chan.state, _CI.SERVER_CLOSE)
            chan.abandon_content()
        elif chan.client_closing:
            chan.client_closing = False
        else:
            return
        self._write(close_frame(ch, CHANNEL_CLOSE, error.reply_code, error.reply_text,
                                error.class_id, error.method_id))
