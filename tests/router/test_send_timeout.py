"""A client that reads none of what it is sent for SEND_TIMEOUT_S is dropped, as RabbitMQ's
sockets do (Ranch's send_timeout); one that reads slowly is not (router/frontend/client.py
``_send_timed_out``, checked on the heartbeat clock while writing is paused)."""
from types import SimpleNamespace

from shoal.router.frontend.client import SEND_TIMEOUT_S, ClientConnection


class Transport:
    def __init__(self, size: int) -> None:
        self.size = size

    def get_write_buffer_size(self) -> int:
        return self.size


def test_a_client_that_reads_nothing_times_out_and_one_that_reads_slowly_does_not():
    conn = SimpleNamespace(transport=Transport(1_000_000), _stalled=(100.0, 1_000_000))
    timed_out = ClientConnection._send_timed_out
    assert not timed_out(conn, 100.0 + SEND_TIMEOUT_S - 1)
    assert timed_out(conn, 100.0 + SEND_TIMEOUT_S)
    conn.transport.size = 999_000                   # it read a little: a new wait starts
    assert not timed_out(conn, 100.0 + SEND_TIMEOUT_S + 5)
    assert conn._stalled == (100.0 + SEND_TIMEOUT_S + 5, 999_000)
    assert not timed_out(conn, 100.0 + 2 * SEND_TIMEOUT_S)
    assert timed_out(conn, 100.0 + 2 * SEND_TIMEOUT_S + 5)
