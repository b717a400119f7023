"""One channel's protocol state: lifecycle and the assembly of published content
(spec 2.3.5.2 "Content Framing": method frame, content header frame, body frames)."""
from __future__ import annotations

from shoal.shared.errors import (FRAME_ERROR, PRECONDITION_FAILED, UNEXPECTED_FRAME,
                                 hard_error, soft_error)

from shoal.router.amqp import fastpath
from shoal.router.amqp.events import MessagePublished
from shoal.router.amqp.methods import with_ids
from shoal.router.amqp.properties import check_properties
from shoal.router.amqp.states import CHANNEL_NEXT, ChannelInput, ChannelState

_PUBLISH = fastpath.BASIC_PUBLISH
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
                 "header", "body", "remaining")

    def __init__(self) -> None:
        self.state = OPEN
        self.flow_active = True
        self.exchange = self.routing_key = ""
        self.mandatory = self.immediate = False
        self.header = b""
        self.body: list | None = None
        self.remaining = 0

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
