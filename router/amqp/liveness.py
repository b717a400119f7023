"""Time on one connection (spec 0-9-1 section 4.2.7 "Heartbeat Frames"; RabbitMQ's handshake
and close timeouts): when to send a heartbeat and when to give up on the client.

:class:`Liveness` is held by :class:`~.connection.AMQPConnection`; its ``tick`` hands it the
clock and whether anything was received or sent since the last tick, and acts on the verdict.
"""
from __future__ import annotations

from shoal.shared.errors import CONNECTION_FORCED

from shoal.router.amqp.states import ConnectionState

#: :meth:`Liveness.check`'s verdict: send a heartbeat frame now.
HEARTBEAT = "heartbeat"


class Liveness:
    """Deadlines of one connection. ``handshake_timeout`` and ``close_timeout`` (seconds): how
    long the client may take to finish the handshake and to answer our ``connection.close``."""

    __slots__ = ("handshake_timeout", "close_timeout", "last_received", "last_sent",
                 "started_at", "closing_since")

    def __init__(self, handshake_timeout: float, close_timeout: float) -> None:
        self.handshake_timeout = handshake_timeout
        self.close_timeout = close_timeout
        self.last_received: float | None = None
        self.last_sent: float | None = None
        self.started_at: float | None = None
        self.closing_since: float | None = None

    def check(self, now: float, state: ConnectionState, received: bool, sent: bool,
              heartbeat: int, close_reason: tuple[int, str]) -> str | tuple[int, str] | None:
        """The verdict at ``now`` (monotonic seconds) for a connection in ``state`` (not
        CLOSED) that ``received``/``sent`` something since the last check, with the negotiated
        ``heartbeat`` (seconds, 0: none): None (nothing to do), :data:`HEARTBEAT` (nothing was
        sent for ``heartbeat / 2`` seconds, RabbitMQ's rate), or ``(reply_code, reply_text)``
        to drop the client: 320 for ``2 * heartbeat`` seconds of silence ("missed
        heartbeats"), a handshake not done within ``handshake_timeout``, or ``close_reason``
        when our ``connection.close`` went unanswered for ``close_timeout``."""
        if self.last_received is None or received:
            self.last_received = now
        if self.last_sent is None or sent:
            self.last_sent = now
        if self.started_at is None:
            self.started_at = now
        if state == ConnectionState.CLOSING:
            if self.closing_since is None:
                self.closing_since = now
            elif now - self.closing_since >= self.close_timeout:
                return close_reason
            return None
        if state < ConnectionState.OPEN and now - self.started_at >= self.handshake_timeout:
            return (CONNECTION_FORCED, "CONNECTION_FORCED - handshake timeout")
        if heartbeat > 0 and state >= ConnectionState.AWAIT_OPEN:
            if now - self.last_received >= 2 * heartbeat:
                return (CONNECTION_FORCED, f"CONNECTION_FORCED - missed heartbeats from "
                                           f"client, timeout: {heartbeat}s")
            if now - self.last_sent >= heartbeat / 2:
                self.last_sent = now
                return HEARTBEAT
        return None
