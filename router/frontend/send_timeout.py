"""Dropping a client that reads nothing of what it is sent, as RabbitMQ's sockets do.

RabbitMQ's listeners (Ranch) send with ``send_timeout`` 30 s and ``send_timeout_close``, and
close with ``linger {true, 0}``: a send that waits 30 s for a client that does not read
(its TCP window is full) closes the socket with a reset, the client's next write or read fails
at once, and its unacknowledged deliveries go back to their queues. (RabbitMQ's setting:
``tcp_listen_options.send_timeout``; Shoal's: ``send_timeout``, ms.) Without it such a client
keeps its connection, and the messages it holds, for as long as it does not read; the RabbitMQ
Java client's NoAutoRecoveryWhenTcpWindowIsFullTest waits for the reset to recover.

Shoal's writes do not wait: what the kernel does not take stays in the transport's buffer.
So the clock (:class:`SendClock`) runs while that buffer holds anything, and restarts whenever
the client has read some: the kernel took more of the buffer, or holds less of what it took
(``TIOCOUTQ``: sent octets the client has not acknowledged, and unsent ones). A client that
reads slowly is not dropped; one whose window stays shut for ``send_timeout`` is. (RabbitMQ's
test is coarser: a send completes only once the kernel has room for more, about half its send
buffer, so there a client must read that much within 30 s.)
"""
from __future__ import annotations

import fcntl
import logging
import socket
import struct
import termios
from typing import Any

log = logging.getLogger("shoal.router.frontend.send_timeout")

#: SO_LINGER on, 0 s: close() resets the connection and drops what the kernel still holds
_LINGER_RESET = struct.pack("ii", 1, 0)


class SendClock:
    """One connection's send clock. The connection adds each write's length to ``written``
    (octets handed to its transport) and asks :meth:`timed_out` on its heartbeat clock."""

    __slots__ = ("written", "_since", "_taken", "_unread")

    def __init__(self) -> None:
        self.written = 0        #: octets handed to the transport, in all
        self._since = 0.0       #: when the client last read some (s, monotonic)
        self._taken = -1        #: octets the kernel had taken from us then (-1: no wait)
        self._unread = 0        #: octets the kernel held for the client then

    def timed_out(self, transport: Any, now: float, limit_s: float) -> bool:
        """Whether what waits in ``transport``'s write buffer has waited ``limit_s`` seconds
        with the client reading nothing: the kernel took none of the buffer, and of the
        octets it holds for the client (:func:`kernel_unread`) the client acknowledged none
        (``now``: s, monotonic). Never raises."""
        waiting = transport.get_write_buffer_size()
        if not waiting:
            self._taken = -1
            return False
        unread = kernel_unread(transport)
        taken = self.written - waiting
        if taken != self._taken or unread < self._unread:   # a first wait, or a read
            self._since, self._taken, self._unread = now, taken, unread
            return False
        self._unread = unread
        return now - self._since >= limit_s

    def reset_if_timed_out(self, transport: Any, now: float, send_timeout_ms: int,
                           who: str) -> bool:
        """:meth:`timed_out` for ``send_timeout_ms`` (the setting); if so, log it for
        connection ``who`` and :func:`reset` ``transport``. Returns whether it did."""
        if not self.timed_out(transport, now, send_timeout_ms / 1000):
            return False
        log.warning("closing connection %s: it read nothing of what it was sent for %d ms "
                    "(send_timeout)", who, send_timeout_ms)
        reset(transport)
        return True


def kernel_unread(transport: Any) -> int:
    """Octets the kernel holds for ``transport``'s peer, sent and not acknowledged or not yet
    sent (Linux ``TIOCOUTQ``, ``SIOCOUTQ`` for TCP); 0 when it cannot tell."""
    sock = transport.get_extra_info("socket")
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (AttributeError, OSError, ValueError):
        return 0
    return struct.unpack("i", raw)[0]


def reset(transport: Any) -> None:
    """Close ``transport`` at once with a TCP reset (RabbitMQ's ``linger {true, 0}``): what
    waits in its buffer and in the kernel is dropped, and the client learns of it on its
    next read or write rather than when its full window opens."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        except (OSError, ValueError):   # closed already, or not a TCP socket
            pass
    transport.abort()
