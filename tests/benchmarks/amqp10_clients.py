"""The AMQP 1.0 benchmark's clients (tests/benchmarks/amqp10_bench.py): the python-qpid-proton
sender and receiver, each the target of its own process (``multiprocessing``, spawn), each
reporting a dict on the ``out`` queue when it is done.

- ``sender_main``: unsettled transfers of ``BODY`` (a hand-built data section whose first 16
  bytes are the sequence number and the send time, ``STAMP``), paced by a fixed schedule from
  ``t0``; counts the broker's outcomes.
- ``receiver_main``: a credit window topped up after each delivery; accepts and settles each
  message; the latencies of the messages sent in the measured window (``stamp_of``).
"""
from __future__ import annotations

import struct
import time

BODY = b"x" * 100


def percentile(sorted_values: list[int], q: float) -> float | None:
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, max(0, int(round(q * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


# -- clients (each in its own process) ------------------------------------------------------
#: the message: one data section of 100 bytes (no header, no properties), whose first 16
#: bytes carry the sequence number and the send time (``>QQ``); built by hand so that the
#: client's CPU goes to the protocol, not to ``proton.Message`` objects
DATA_SECTION = b"\x00\x53\x75\xa0" + bytes([len(BODY)])
STAMP = struct.Struct(">QQ")


def stamp_of(payload: bytes) -> tuple[int, int] | None:
    """(seq, ts) from a received message: the brokers may add a header or annotations, so
    the data section is looked up from the end."""
    at = payload.rfind(DATA_SECTION)
    if at < 0:
        return None
    return STAMP.unpack_from(payload, at + len(DATA_SECTION))


def _connect(container, url: str):
    return container.connect(url, allowed_mechs="PLAIN", allow_insecure_mechs=True)


def sender_main(url: str, address: str, rate: int, t0_ns: int, warmup_s: float, time_s: float,
                tick_ms: float, ready, out) -> None:
    """The sender process: proton's reactor with a plain handler (no MessagingHandler, no
    Message objects): ``delivery(tag)``, ``send(bytes)``, ``advance()``; counts the broker's
    outcomes and settles them."""
    from proton import Delivery
    from proton.reactor import Container

    total = int(rate * (warmup_s + time_s))
    win_lo, win_hi = t0_ns + int(warmup_s * 1e9), t0_ns + int((warmup_s + time_s) * 1e9)
    interval_ns = 1e9 / rate
    pad = BODY[STAMP.size:]

    class Sender:
        def __init__(self) -> None:
            self.seq = 0
            self.sent_in_window = 0
            self.accepted = self.rejected = self.released = self.other = 0
            self.max_lag_ns = 0
            self.no_credit_ticks = 0
            self.snd = self.conn = None
            self.started = False
            self.error = ""

        def on_reactor_init(self, event):
            self.conn = _connect(event.container, url)
            self.snd = event.container.create_sender(self.conn, target=address)

        def on_link_remote_open(self, event):
            if event.link.is_sender and not self.started:
                self.started = True
                ready.set()
                event.container.schedule(max(0.0, (t0_ns - time.monotonic_ns()) / 1e9), self)

        def on_timer_task(self, event):
            if self.error:
                return
            self.pump()
            if self.seq < total:
                event.container.schedule(tick_ms / 1000, self)
            else:
                event.container.schedule(0.05, _Waiter(self))

        def on_link_flow(self, event):
            if self.started and time.monotonic_ns() >= t0_ns:
                self.pump()

        def pump(self) -> None:
            snd = self.snd
            now = time.monotonic_ns()
            due = min(total, int((now - t0_ns) / interval_ns) + 1)
            if self.seq < due and snd.credit <= 0:
                self.no_credit_ticks += 1
            while self.seq < due and snd.credit > 0:
                ts = time.monotonic_ns()
                lag = ts - (t0_ns + self.seq * interval_ns)
                if lag > self.max_lag_ns:
                    self.max_lag_ns = lag
                snd.delivery(b"%x" % self.seq)
                snd.send(DATA_SECTION + STAMP.pack(self.seq, ts) + pad)
                snd.advance()
                if win_lo <= ts < win_hi:
                    self.sent_in_window += 1
                self.seq += 1

        def on_delivery(self, event):
            d = event.delivery
            if not d.updated:
                return
            state = d.remote_state
            if state == Delivery.ACCEPTED:
                self.accepted += 1
            elif state == Delivery.REJECTED:
                self.rejected += 1
            elif state == Delivery.RELEASED:
                self.released += 1
            else:
                self.other += 1
            d.settle()

        def on_link_remote_close(self, event):
            self.error = self.error or f"link closed: {event.link.remote_condition}"
            event.connection.close()

        def on_connection_remote_close(self, event):
            if event.connection.remote_condition or not event.connection.state & 4:
                # a close we did not start (4 = Endpoint.LOCAL_CLOSED)
                self.error = self.error or \
                    f"connection closed: {event.connection.remote_condition}"
            event.connection.close()

        def on_transport_error(self, event):
            self.error = self.error or f"transport: {event.transport.condition}"

    class _Waiter:
        """After the last send: close once every transfer has an outcome (or after 15 s)."""
        def __init__(self, s: Sender) -> None:
            self.s, self.deadline = s, time.monotonic() + 15

        def on_timer_task(self, event):
            s = self.s
            done = s.accepted + s.rejected + s.released + s.other
            if done >= s.seq or time.monotonic() > self.deadline or s.error:
                s.conn.close()
            else:
                event.container.schedule(0.05, self)

    h = Sender()
    try:
        Container(h).run()
    except Exception as e:  # noqa: BLE001 - reported to the parent
        h.error = h.error or repr(e)
    out.put({"role": "sender", "sent": h.seq, "sent_in_window": h.sent_in_window,
             "accepted": h.accepted, "rejected": h.rejected, "released": h.released,
             "other_outcome": h.other, "max_lag_ms": round(h.max_lag_ns / 1e6, 3),
             "no_credit_ticks": h.no_credit_ticks, "cpu_s": round(time.process_time(), 3),
             "error": h.error})


def receiver_main(url: str, address: str, credit: int, rate: int, warmup_s: float,
                  time_s: float, t0_box, ready, out) -> None:
    """The receiver process: a plain handler that grants ``credit`` and tops it back up after
    each delivery (as proton's own flow controller does), reads each delivery's bytes, accepts
    and settles it."""
    from proton import Delivery
    from proton.reactor import Container

    total = int(rate * (warmup_s + time_s))
    lo, hi = int(rate * warmup_s), total

    class Receiver:
        def __init__(self) -> None:
            self.lat: list[int] = []
            self.by_second: dict[int, list[int]] = {}   #: send second -> latencies
            self.received = 0
            self.seen = bytearray(total)
            self.dups = self.unreadable = 0
            self.conn = self.rcv = None
            self.opened = False
            self.error = ""

        def on_reactor_init(self, event):
            self.conn = _connect(event.container, url)
            self.rcv = event.container.create_receiver(self.conn, source=address)
            self.rcv.flow(credit)
            event.container.schedule(1.0, self)

        def on_link_remote_open(self, event):
            if event.link.is_receiver and not self.opened:
                self.opened = True
                ready.set()

        def on_delivery(self, event):
            d = event.delivery
            if not d.readable or d.partial:
                return
            link = d.link
            data = link.recv(d.pending)
            now = time.monotonic_ns()
            link.advance()      # before settle(): settling the current delivery advances too
            d.update(Delivery.ACCEPTED)
            d.settle()
            if link.credit < credit:
                link.flow(credit - link.credit)
            self.received += 1
            st = stamp_of(data)
            if st is None:
                self.unreadable += 1
                return
            seq, ts = st
            if 0 <= seq < total:
                if self.seen[seq]:
                    self.dups += 1
                self.seen[seq] = 1
            if lo <= seq < hi:
                self.lat.append(now - ts)
                self.by_second.setdefault(seq // rate, []).append(now - ts)

        def on_timer_task(self, event):
            t0 = t0_box.value
            late = t0 and time.monotonic_ns() > t0 + (warmup_s + time_s + 20) * 1e9
            if (t0 and self.received >= total) or late or self.error:
                self.conn.close()
            else:
                event.container.schedule(0.2, self)

        def on_link_remote_close(self, event):
            self.error = self.error or f"link closed: {event.link.remote_condition}"
            event.connection.close()

        def on_connection_remote_close(self, event):
            if event.connection.remote_condition or not event.connection.state & 4:
                # a close we did not start (4 = Endpoint.LOCAL_CLOSED)
                self.error = self.error or \
                    f"connection closed: {event.connection.remote_condition}"
            event.connection.close()

        def on_transport_error(self, event):
            self.error = self.error or f"transport: {event.transport.condition}"

    h = Receiver()
    try:
        Container(h).run()
    except Exception as e:  # noqa: BLE001
        h.error = h.error or repr(e)
    second_p99 = sorted(percentile(sorted(v), 0.99) for v in h.by_second.values())
    out.put({"role": "receiver", "received": h.received, "window_received": sum(h.seen[lo:hi]),
             "dups": h.dups, "unreadable": h.unreadable, "lat_ns": sorted(h.lat),
             "median_second_p99_ns": second_p99[len(second_p99) // 2] if second_p99 else None,
             "cpu_s": round(time.process_time(), 3), "error": h.error})
