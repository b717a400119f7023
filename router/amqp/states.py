"""Connection and channel states of the AMQP 0-9-1 core, with every transition in one table.

h11-style (design.md section 7, "transitions in one place"): a state changes only through
:func:`connection_next` / :func:`channel_next`, which look the ``(state, input)`` pair up in the
tables below and raise :class:`~shoal.shared.errors.AMQPError` for a pair that is not listed.
The tables are dicts for reading; they are compiled into tuples indexed by the integer values
so the hot path (publish, content header, body) pays one tuple index per transition.

Connection (spec 0-9-1 section 2.2.4 "Connection Class" and 4.10 "Connection Negotiation")::

    AWAIT_PROTOCOL_HEADER --header--> AWAIT_START_OK --start-ok--> AWAIT_TUNE_OK
        --tune-ok--> AWAIT_OPEN --open--> OPEN
    any live state --server close (we sent connection.close)--> CLOSING --close-ok--> CLOSED
    any live state --client close (we answer close-ok)--> CLOSED
    any state --drop (EOF, missed heartbeats, broken framing, timeouts)--> CLOSED

Channel (spec 2.2.3 "Channel Class", 2.3.5.2 "Content Framing")::

    (absent) --channel.open--> OPEN --basic.publish--> AWAIT_HEADER
        --header, body_size > 0--> AWAIT_BODY --last body frame--> OPEN
        --header, body_size == 0--> OPEN
    OPEN/AWAIT_* --server channel.close--> CLOSING --close-ok--> CLOSED
    CLOSING --client channel.close (crossing closes: we answer close-ok)--> CLOSING
    OPEN --client channel.close--> CLOSED
    CLOSING --anything else--> CLOSING (discarded, spec 2.2.3: "after sending channel.close,
        the peer discards frames until it receives close-ok")
"""
from __future__ import annotations

from enum import IntEnum

from shoal.shared.errors import (CHANNEL_ERROR, COMMAND_INVALID, UNEXPECTED_FRAME,
                                 hard_error)


class ConnectionState(IntEnum):
    AWAIT_PROTOCOL_HEADER = 0
    AWAIT_START_OK = 1
    AWAIT_TUNE_OK = 2
    AWAIT_OPEN = 3
    OPEN = 4
    CLOSING = 5   #: we sent connection.close; waiting for close-ok
    CLOSED = 6


class ConnectionInput(IntEnum):
    PROTOCOL_HEADER = 0
    START_OK = 1
    TUNE_OK = 2
    OPEN = 3
    CLIENT_CLOSE = 4  #: connection.close received (we answer close-ok)
    CLOSE_OK = 5      #: connection.close-ok received
    SERVER_CLOSE = 6  #: we send connection.close
    DROP = 7          #: transport gone / fatal framing error / timeout


class ChannelState(IntEnum):
    OPEN = 0
    AWAIT_HEADER = 1  #: basic.publish received, content header expected
    AWAIT_BODY = 2    #: content header received, body frames expected
    CLOSING = 3       #: we sent channel.close; waiting for close-ok
    CLOSED = 4


class ChannelInput(IntEnum):
    METHOD = 0         #: any synchronous/asynchronous method other than those below
    PUBLISH = 1        #: basic.publish (content follows)
    HEADER = 2         #: content header announcing a body (body_size > 0)
    HEADER_EMPTY = 3   #: content header with body_size == 0 (content complete)
    BODY = 4           #: a body frame that does not complete the content
    BODY_LAST = 5      #: the body frame completing the content
    CLIENT_CLOSE = 6   #: channel.close received
    CLOSE_OK = 7       #: channel.close-ok received
    SERVER_CLOSE = 8   #: we send channel.close


_C, _CI = ConnectionState, ConnectionInput
_LIVE = (_C.AWAIT_START_OK, _C.AWAIT_TUNE_OK, _C.AWAIT_OPEN, _C.OPEN)

CONNECTION_TRANSITIONS: dict[ConnectionState, dict[ConnectionInput, ConnectionState]] = {
    _C.AWAIT_PROTOCOL_HEADER: {_CI.PROTOCOL_HEADER: _C.AWAIT_START_OK, _CI.DROP: _C.CLOSED},
    _C.AWAIT_START_OK: {_CI.START_OK: _C.AWAIT_TUNE_OK},
    _C.AWAIT_TUNE_OK: {_CI.TUNE_OK: _C.AWAIT_OPEN},
    _C.AWAIT_OPEN: {_CI.OPEN: _C.OPEN},
    _C.OPEN: {},
    _C.CLOSING: {_CI.CLOSE_OK: _C.CLOSED, _CI.CLIENT_CLOSE: _C.CLOSED, _CI.DROP: _C.CLOSED},
    _C.CLOSED: {},
}
for _state in _LIVE:
    CONNECTION_TRANSITIONS[_state].update({_CI.CLIENT_CLOSE: _C.CLOSED,
                                           _CI.SERVER_CLOSE: _C.CLOSING,
                                           _CI.DROP: _C.CLOSED})

_H, _HI = ChannelState, ChannelInput
CHANNEL_TRANSITIONS: dict[ChannelState, dict[ChannelInput, ChannelState]] = {
    _H.OPEN: {_HI.METHOD: _H.OPEN, _HI.PUBLISH: _H.AWAIT_HEADER,
              _HI.CLIENT_CLOSE: _H.CLOSED, _HI.SERVER_CLOSE: _H.CLOSING},
    _H.AWAIT_HEADER: {_HI.HEADER: _H.AWAIT_BODY, _HI.HEADER_EMPTY: _H.OPEN,
                      _HI.SERVER_CLOSE: _H.CLOSING},
    _H.AWAIT_BODY: {_HI.BODY: _H.AWAIT_BODY, _HI.BODY_LAST: _H.OPEN,
                    _HI.SERVER_CLOSE: _H.CLOSING},
    _H.CLOSING: {**{i: _H.CLOSING for i in ChannelInput}, _HI.CLOSE_OK: _H.CLOSED},
    _H.CLOSED: {},
}


def _compile(table: dict, n_inputs: int) -> tuple:
    return tuple(tuple(table[state].get(i) for i in range(n_inputs))
                 for state in sorted(table))


#: ``CHANNEL_NEXT[state][input]`` -> next state or None (not allowed); for the hot path.
CHANNEL_NEXT = _compile(CHANNEL_TRANSITIONS, len(ChannelInput))
CONNECTION_NEXT = _compile(CONNECTION_TRANSITIONS, len(ConnectionInput))

_CONTENT_INPUTS = frozenset({_HI.HEADER, _HI.HEADER_EMPTY, _HI.BODY, _HI.BODY_LAST})


def connection_next(state: ConnectionState, event: ConnectionInput) -> ConnectionState:
    """The state after ``event`` in ``state``.

    Raises AMQPError 503 COMMAND_INVALID (hard) for a method out of order (spec 4.10:
    start-ok, tune-ok, open in this order, each once).
    """
    nxt = CONNECTION_NEXT[state][event]
    if nxt is None:
        raise hard_error(COMMAND_INVALID, f"{_describe(event)} not allowed in connection "
                                          f"state {state.name}")
    return nxt


def channel_next(channel: int, state: ChannelState, event: ChannelInput) -> ChannelState:
    """The state of channel ``channel`` after ``event`` in ``state``.

    Raises AMQPError (hard): 505 UNEXPECTED_FRAME for a method while content is expected or
    content when none is (spec 2.3.5.2); 504 CHANNEL_ERROR for a close-ok we did not ask for;
    503 COMMAND_INVALID otherwise.
    """
    nxt = CHANNEL_NEXT[state][event]
    if nxt is not None:
        return nxt
    if state in (_H.AWAIT_HEADER, _H.AWAIT_BODY):
        want = "content header" if state == _H.AWAIT_HEADER else "content body"
        raise hard_error(UNEXPECTED_FRAME, f"expected {want} on channel {channel}, "
                                           f"got {_describe(event)}")
    if event in _CONTENT_INPUTS:
        raise hard_error(UNEXPECTED_FRAME, f"unexpected {_describe(event)} on channel "
                                           f"{channel}: no content expected")
    if event == _HI.CLOSE_OK:
        raise hard_error(CHANNEL_ERROR, f"unexpected channel.close-ok on channel {channel}")
    raise hard_error(COMMAND_INVALID, f"{_describe(event)} not allowed on channel {channel} "
                                      f"in state {state.name}")


def _describe(event: IntEnum) -> str:
    return event.name.lower().replace("_", " ")
