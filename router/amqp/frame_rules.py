"""Where a frame may arrive: the placement rules for every frame that the connection's inline
hot path does not take (spec 0-9-1 sections 4.2.3-4.2.7 "Frame Details", 2.2.3-2.2.4 on closing
channels and connections, and RabbitMQ 3.10's rabbit_reader for the reply codes).

Pure functions of a frame's type, channel number and method id and the connection's
:class:`~.states.ConnectionState`; :class:`~.connection.AMQPConnection` calls them for each such
frame and dispatches on the answer. Each refusal raises a hard
:class:`~shoal.shared.errors.AMQPError` for the connection's one converter
(``AMQPConnection.fail``):

- 501 FRAME_ERROR: an unknown frame type, a frame larger than the negotiated frame_max (both
  judged from the 7 header octets), a frame end octet other than 0xCE, a method frame shorter
  than its 4-octet class and method ids (spec 4.2.3);
- 505 UNEXPECTED_FRAME: a heartbeat on a channel other than 0 (spec 4.2.7), a content frame
  before ``connection.open`` or on channel 0, content out of order on a channel (spec 4.2.6,
  :func:`~.states.channel_next`);
- 504 CHANNEL_ERROR: ``channel.open`` or another channel method on channel 0, content on a
  channel that is not open;
- 503 COMMAND_INVALID: a connection method on a channel other than 0, a channel method before
  ``connection.open``;
- 540 NOT_IMPLEMENTED: a class/method pair the spec does not define
  (:func:`~.methods.require_known`).
"""
from __future__ import annotations

from shoal.shared.errors import (CHANNEL_ERROR, COMMAND_INVALID, FRAME_ERROR, UNEXPECTED_FRAME,
                                 AMQPError, hard_error)

from shoal.router.amqp import fastpath
from shoal.router.amqp.channel import Channel
from shoal.router.amqp.framing import FRAME_HEADER, FRAME_HEARTBEAT, FRAME_OVERHEAD, FRAME_TYPES
from shoal.router.amqp.methods import (CHANNEL_OPEN, CONNECTION_CLASS, CONNECTION_CLOSE,
                                       CONNECTION_CLOSE_OK, name, require_known)
from shoal.router.amqp.states import ChannelInput, ConnectionState, channel_next

#: :func:`route_method`'s answers: drop the method (a closing connection), hand it to the
#: connection class (channel 0), or to the channel table.
DISCARD, CONNECTION, CHANNEL = 0, 1, 2

_CLOSING, _OPEN = ConnectionState.CLOSING, ConnectionState.OPEN


def frame_error(frame_type: int, ch: int, size: int, frame_max: int) -> AMQPError:
    """501 for a frame header with an unknown type or a payload of ``size`` octets above
    what ``frame_max`` admits (framing.py ``payload_limit``: RabbitMQ's allowance included)."""
    if frame_type not in FRAME_TYPES:
        text = f"unknown frame type {frame_type} on channel {ch}"
    else:
        text = (f"frame size {size + FRAME_OVERHEAD} on channel {ch} is larger than "
                f"frame_max {frame_max}")
    return hard_error(FRAME_ERROR, text)


def frame_end_error(octet: int) -> AMQPError:
    """501 for a frame whose last octet is not the frame end 0xCE."""
    return hard_error(FRAME_ERROR, f"frame end octet is {octet:#04x}, expected 0xce")


def method_id(buf: bytes, start: int, fend: int) -> int:
    """The class and method ids of the method frame ``buf[start:fend]`` as one int (class in
    the high 16 bits); 501 when it is shorter than 4 octets."""
    if fend - start < 4:
        raise hard_error(FRAME_ERROR, "method frame shorter than 4 octets")
    return fastpath.unpack_method_id(buf, start)[0]


def route_method(ch: int, mid: int, state: ConnectionState) -> int:
    """Where method ``mid`` on channel ``ch`` goes in connection ``state``: :data:`DISCARD`
    (a closing connection takes only close / close-ok, spec 2.2.4), :data:`CONNECTION` or
    :data:`CHANNEL`; raises 504, 503 or 540 (see the module) for a misplaced method."""
    if state == _CLOSING:
        return CONNECTION if ch == 0 and mid in (CONNECTION_CLOSE, CONNECTION_CLOSE_OK) \
            else DISCARD
    if ch == 0:
        if mid == CHANNEL_OPEN:
            raise hard_error(CHANNEL_ERROR, "channel.open on channel 0")
        if mid >> 16 != CONNECTION_CLASS:
            require_known(mid)   # RabbitMQ: a channel method on channel 0 is 504
            raise hard_error(CHANNEL_ERROR, f"{name(mid)} on channel 0")
        return CONNECTION
    require_known(mid)
    if mid >> 16 == CONNECTION_CLASS:
        raise hard_error(COMMAND_INVALID, f"{name(mid)} on channel {ch}, expected 0")
    if state != _OPEN:
        raise hard_error(COMMAND_INVALID, f"{name(mid)} before connection.open")
    return CHANNEL


def check_other_frame(frame_type: int, ch: int, chan: Channel | None,
                      state: ConnectionState) -> None:
    """A heartbeat, or a content frame the hot path did not take, on channel ``ch`` (``chan``:
    its :class:`~.channel.Channel`, None if not open): returns when there is nothing to do (a
    heartbeat on channel 0; content on a closing connection or channel, discarded as spec
    2.2.3-2.2.4 say), else raises 505 or 504."""
    if frame_type == FRAME_HEARTBEAT:
        if ch != 0:  # spec 4.2.7: heartbeats belong to channel 0 (505, as RabbitMQ)
            raise hard_error(UNEXPECTED_FRAME, f"heartbeat frame on channel {ch}")
    elif state == _CLOSING:
        return
    elif state != _OPEN:
        raise hard_error(UNEXPECTED_FRAME, "content frame before connection.open")
    elif ch == 0:
        raise hard_error(UNEXPECTED_FRAME, "content frame on channel 0")
    elif chan is None:
        raise hard_error(CHANNEL_ERROR, f"channel {ch} is not open")
    else:  # on a CLOSING channel: discarded (spec 2.2.3); otherwise 505
        channel_next(ch, chan.state, ChannelInput.HEADER if frame_type == FRAME_HEADER
                     else ChannelInput.BODY)
