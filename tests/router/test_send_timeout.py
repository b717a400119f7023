"""A client that reads none of what it is sent for ``send_timeout`` is reset, as RabbitMQ's
sockets are (Ranch's send_timeout, linger 0); one that reads slowly is not
(router/frontend/send_timeout.py ``SendClock``, asked on the heartbeat clock)."""
import socket
import struct

from shoal.router.frontend.send_timeout import SendClock, kernel_unread, reset

LIMIT = 30.0


class Transport:
    """A transport's write buffer (``waiting``) over a kernel that holds ``unread`` octets
    for the client (no socket: :func:`kernel_unread` reads 0 unless ``sock`` is set)."""

    def __init__(self, waiting: int, sock=None) -> None:
        self.waiting, self.sock, self.aborted = waiting, sock, False

    def get_write_buffer_size(self) -> int:
        return self.waiting

    def get_extra_info(self, name):
        return self.sock if name == "socket" else None

    def abort(self):
        self.aborted = True


def test_a_client_that_reads_nothing_times_out_and_one_that_reads_slowly_does_not():
    clock, t = SendClock(), Transport(1_000_000)
    clock.written = 5_000_000
    assert not clock.timed_out(t, 100.0, LIMIT)                 # the wait starts
    assert not clock.timed_out(t, 100.0 + LIMIT - 1, LIMIT)
    assert clock.timed_out(t, 100.0 + LIMIT, LIMIT)
    t.waiting = 999_000                                         # the kernel took a little
    assert not clock.timed_out(t, 100.0 + LIMIT + 5, LIMIT)
    assert not clock.timed_out(t, 100.0 + 2 * LIMIT, LIMIT)
    assert clock.timed_out(t, 100.0 + 2 * LIMIT + 5, LIMIT)


def test_more_written_and_nothing_taken_is_no_progress():
    clock, t = SendClock(), Transport(1_000)
    clock.written = 2_000
    assert not clock.timed_out(t, 0.0, LIMIT)
    clock.written += 500                    # a heartbeat, a delivery: the buffer only grows
    t.waiting += 500
    assert clock.timed_out(t, LIMIT, LIMIT)


def test_a_buffer_that_drains_stops_the_clock():
    clock, t = SendClock(), Transport(1_000)
    clock.written = 1_000
    assert not clock.timed_out(t, 0.0, LIMIT)
    t.waiting = 0
    assert not clock.timed_out(t, 20.0, LIMIT)          # all taken: no wait
    clock.written += 1_000
    t.waiting = 1_000
    assert not clock.timed_out(t, 25.0, LIMIT)          # a new wait from here
    assert not clock.timed_out(t, 25.0 + LIMIT - 1, LIMIT)
    assert clock.timed_out(t, 25.0 + LIMIT, LIMIT)


def test_a_read_the_kernel_sees_restarts_the_clock():
    """The client reads a little: the kernel's queue for it shrinks, though it takes nothing
    more from our buffer yet (it waits for room for about half its send buffer)."""
    a, b = socket.socketpair()
    try:
        a.setblocking(False)
        sent = 0
        try:
            while True:
                sent += a.send(b"x" * 65536)
        except BlockingIOError:
            pass
        t = Transport(4096, a)
        before = kernel_unread(t)
        assert before > 0
        clock = SendClock()
        clock.written = sent + 4096
        assert not clock.timed_out(t, 0.0, LIMIT)
        b.recv(65536)
        assert kernel_unread(t) < before
        assert not clock.timed_out(t, LIMIT, LIMIT)         # the read restarted it
        assert clock.timed_out(t, 2 * LIMIT, LIMIT)
    finally:
        a.close()
        b.close()


def test_reset_sets_linger_zero_then_aborts():
    a, b = socket.socketpair()
    try:
        t = Transport(0, a)
        reset(t)
        assert t.aborted
        assert struct.unpack("ii", a.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, 8)) == (1, 0)
    finally:
        a.close()
        b.close()
    t = Transport(0)            # no socket (a test transport): aborted all the same
    reset(t)
    assert t.aborted
    assert kernel_unread(t) == 0


def test_reset_if_timed_out_resets_only_past_the_setting():
    clock, t = SendClock(), Transport(1_000)
    clock.written = 1_000
    assert not clock.reset_if_timed_out(t, 0.0, 1500, "c1")
    assert not clock.reset_if_timed_out(t, 1.4, 1500, "c1") and not t.aborted
    assert clock.reset_if_timed_out(t, 1.5, 1500, "c1") and t.aborted
