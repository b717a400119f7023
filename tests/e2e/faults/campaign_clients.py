"""The fault campaign's clients (tests/e2e/faults/campaign.py): pika publishers and consumers
that record everything into a :class:`history.History` and reconnect, to either router, after
any error.

- :class:`Publisher`: one message at a time with publisher confirms, persistent, mandatory,
  numbered ``(publisher, seq)`` in the headers ``p``/``n`` and the message id. The outcome of
  each is confirmed (ack), nacked, returned (unroutable) or unknown (the connection was lost
  first); a message that was not confirmed is never sent again under its id.
- :class:`Consumer`: the one consumer of a queue (manual ack, modest prefetch); it declares the
  queue at each (re)connection, so a classic queue whose node was wiped comes back. A
  stream's consumer reads from ``first``, records each delivery's ``x-stream-offset`` and
  subscribes again after a failure at the offset after its last one (as an application
  that tracks its offset does).
- :class:`Watchdog`: a confirm that does not come within :data:`CONFIRM_TIMEOUT` s has its
  connection cut by the client (recorded as a note: a liveness finding), so nothing waits
  forever.
- :func:`drain`: a fresh consumer that takes a queue until it is empty.
"""
from __future__ import annotations

import collections
import logging
import random
import socket
import threading
import time

import pika
import pika.exceptions

from .history import History, Publish
from .netns import AMQP_PORT

HOME_AFTER = 2.0            #: s a publisher stays on the other router before it moves back
HEARTBEAT = 2               #: s, client connections (a cut link is noticed within a few)
PREFETCH = 20
CONFIRM_TIMEOUT = 30.0      #: s without a confirm before the watchdog cuts the connection
ERRORS = (pika.exceptions.AMQPError, OSError)
logging.getLogger("pika").setLevel(logging.CRITICAL)   # every fault makes pika log errors


def params(host: str) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(host, AMQP_PORT, "/", pika.PlainCredentials("guest", "guest"),
                                     heartbeat=HEARTBEAT, connection_attempts=1,
                                     socket_timeout=3, stack_timeout=8,
                                     blocked_connection_timeout=15)


def close(conn) -> None:
    """Close ``conn`` if it is open, ignoring errors."""
    try:
        if conn is not None and conn.is_open:
            conn.close()
    except Exception:  # noqa: BLE001 - a broken connection may fail in any way on close
        pass


def cut_socket(conn) -> bool:
    """Shut a pika connection's socket from another thread: its blocked call then fails."""
    try:
        conn._impl._transport._sock.shutdown(socket.SHUT_RDWR)
        return True
    except (AttributeError, OSError):
        return False


class Client(threading.Thread):
    """What publishers and consumers share: the routers to try in turn (``routers[0]`` is
    this client's home router, tried first), a stop event, errors counted by kind."""

    def __init__(self, name: str, hist: History, routers: list[str]) -> None:
        super().__init__(name=name, daemon=True)
        self.hist, self.routers = hist, routers
        self.stop = threading.Event()
        self.errors: collections.Counter[str] = collections.Counter()
        self._next = 0
        self.home_since: float | None = None    #: None: connected to home (or not at all)

    def connect(self) -> pika.BlockingConnection:
        """Connect to the next router in turn (after a failure: the other one first)."""
        i = self._next % len(self.routers)
        self._next = i + 1
        conn = pika.BlockingConnection(params(self.routers[i]))
        self.home_since = None if i == 0 else time.monotonic()
        return conn

    def away_too_long(self) -> bool:
        """Connected to the other router for :data:`HOME_AFTER` s: time to go back home (so that
        after a router's fault the load spreads over both routers again)."""
        if self.home_since is None or time.monotonic() - self.home_since < HOME_AFTER:
            return False
        self._next, self.home_since = 0, None
        return True

    def failed(self, exc: BaseException) -> None:
        self.errors[f"{type(exc).__name__}: {str(exc)[:70]}"] += 1
        self.stop.wait(0.2)


class Publisher(Client):
    """Publishes numbered messages to random queues, one confirm at a time, at most ``rate``
    per second."""

    def __init__(self, pub: str, hist: History, routers: list[str], queues: list[str],
                 rate: float, seed: int) -> None:
        super().__init__(pub, hist, routers)
        self.pub, self.queues, self.rate = pub, queues, rate
        self.rnd = random.Random(seed)
        self.inflight: tuple[pika.BlockingConnection, Publish] | None = None

    def run(self) -> None:
        conn = ch = None
        seq = 0
        while not self.stop.is_set():
            if ch is not None and self.away_too_long():
                close(conn)
                conn = ch = None
            if ch is None:
                try:
                    conn = self.connect()
                    ch = conn.channel()
                    ch.confirm_delivery()
                except Exception as exc:  # noqa: BLE001 - any failure: reconnect
                    close(conn)
                    conn = ch = None
                    self.failed(exc)
                    continue
            began = time.monotonic()
            queue = self.rnd.choice(self.queues)
            p = self.hist.publish(self.pub, seq, queue)
            props = pika.BasicProperties(delivery_mode=2, message_id=p.id,
                                         headers={"p": self.pub, "n": seq})
            seq += 1
            self.inflight = (conn, p)
            try:
                ch.basic_publish("", queue, p.id.encode(), props, mandatory=True)
                self.hist.outcome(p, "confirmed")
            except pika.exceptions.UnroutableError:
                self.hist.outcome(p, "returned")
            except pika.exceptions.NackError:
                self.hist.outcome(p, "nacked")
            except Exception as exc:  # noqa: BLE001 - connection lost or broken: unknown
                self.hist.outcome(p, "unknown")
                close(conn)
                conn = ch = None
                self.failed(exc)
            finally:
                self.inflight = None
            rest = 1.0 / self.rate - (time.monotonic() - began)
            if rest > 0:
                self.stop.wait(rest)
        close(conn)


class Consumer(Client):
    """The one consumer of ``queue``: records each delivery, then acks it."""

    def __init__(self, hist: History, routers: list[str], queue: str, arguments: dict) -> None:
        """``routers``: home first (the consumer stays where it is until an error)."""
        super().__init__(f"consumer-{queue}", hist, routers)
        self.queue, self.arguments = queue, arguments
        self.resubscribe = threading.Event()    #: set: close and subscribe again
        self.router = ""                        #: the router it is connected to now
        #: a stream's: where it reads from next (its last delivery's offset + 1)
        self.offset: list = ["first"] if is_stream(arguments) else []

    def run(self) -> None:
        while not self.stop.is_set():
            conn = None
            try:
                self.resubscribe.clear()
                conn = self.connect()
                self.router = self.routers[(self._next - 1) % len(self.routers)]
                consume(conn, self.hist, self.queue, self.arguments,
                        lambda cancelled: self.stop.is_set() or bool(cancelled)
                        or self.resubscribe.is_set(), offset=self.offset)
            except Exception as exc:  # noqa: BLE001 - any failure: reconnect
                self.failed(exc)
            finally:
                self.router = ""
                close(conn)


def is_stream(arguments: dict) -> bool:
    return arguments.get("x-queue-type") == "stream"


def consume(conn, hist: History, queue: str, arguments: dict, done,
            prefetch: int = PREFETCH, offset: list | None = None) -> None:
    """Declare ``queue`` and consume from it on ``conn``, recording and acking each message,
    until ``done(cancelled)`` is true (``cancelled``: the broker's basic.cancel frames). A
    stream's consumer starts at ``offset[0]`` and keeps there the offset after its last
    delivery."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    ch.queue_declare(queue, durable=True, arguments=arguments)
    cancelled: list = []
    ch.add_on_cancel_callback(cancelled.append)

    def on_message(ch, method, props, body):
        headers = props.headers or {}
        pub, seq = headers.get("p"), headers.get("n")
        if not isinstance(pub, str) or not isinstance(seq, int):
            pub, seq = f"?{body[:40]!r}", -1
        at = headers.get("x-stream-offset") if offset else None
        hist.deliver(queue, pub, seq, bool(method.redelivered), at)
        if offset and isinstance(at, int):
            offset[0] = at + 1
        ch.basic_ack(method.delivery_tag)
    ch.basic_consume(queue, on_message, arguments={"x-stream-offset": offset[0]}
                     if offset else None)
    while not done(cancelled):
        conn.process_data_events(time_limit=0.2)


class Watchdog(threading.Thread):
    """Cuts the connection of a publish that has waited :data:`CONFIRM_TIMEOUT` s."""

    def __init__(self, hist: History, publishers: list[Publisher]) -> None:
        super().__init__(name="watchdog", daemon=True)
        self.hist, self.publishers = hist, publishers
        self.stop = threading.Event()
        self.cuts = 0

    def run(self) -> None:
        while not self.stop.wait(1.0):
            for pub in self.publishers:
                inflight = pub.inflight
                if inflight is None:
                    continue
                conn, p = inflight
                if p.t1 is None and time.monotonic() - p.t0 > CONFIRM_TIMEOUT \
                        and cut_socket(conn):
                    self.cuts += 1
                    self.hist.note(f"no confirm for {p.id} to {p.queue} within "
                                   f"{CONFIRM_TIMEOUT:.0f} s (sent {self.hist.context(p.t0)}): "
                                   f"the client cut its connection")


def drain(hist: History, routers: list[str], queue: str, arguments: dict,
          timeout: float = 60.0, idle: float = 2.0, offset: list | None = None) -> bool:
    """Consume ``queue`` with a fresh consumer until it is empty (nothing arrived for ``idle``
    s and a passive declare counts 0 messages; a stream, read from ``offset[0]``: until its
    consumer is past the last of the messages a passive declare counts, offsets being dense
    from 0). Returns False if it was not within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    i = 0
    while time.monotonic() < deadline:
        conn = None
        try:
            conn = pika.BlockingConnection(params(routers[i % len(routers)]))
            i += 1
            check = conn.channel()
            state = {"last": len(hist.deliveries[queue]), "since": time.monotonic(),
                     "empty": False}

            def done(cancelled) -> bool:
                if cancelled:
                    raise pika.exceptions.ConsumerCancelled(cancelled)
                n = len(hist.deliveries[queue])
                if n != state["last"]:
                    state["last"], state["since"] = n, time.monotonic()
                elif time.monotonic() - state["since"] > idle:
                    count = check.queue_declare(queue, passive=True).method.message_count
                    if offset:
                        count = 0 if isinstance(offset[0], int) and offset[0] >= count \
                            else count
                    if count == 0:
                        state["empty"] = True
                        return True
                    state["since"] = time.monotonic()
                if time.monotonic() > deadline:
                    return True
                return False
            consume(conn, hist, queue, arguments, done, prefetch=200, offset=offset)
            if state["empty"]:
                return True
        except Exception:  # noqa: BLE001 - a router or node still coming back: try again
            time.sleep(0.5)
        finally:
            close(conn)
    return False
