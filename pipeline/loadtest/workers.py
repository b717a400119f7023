"""The worker processes of ``shoal loadtest`` (one asyncio/uvloop loop each): the common
:class:`Worker` and the :class:`Producer` (the consumer is consumer.py's; what each does,
plan.py's).

Each worker connects (``client.connect``), declares its queues (and with ``--exchange`` the
exchange and its queues' bindings), reports ``READY`` on the report queue and waits for the
parent's ``go`` event; second 0 starts at ``start_ns`` (shared value). It then reports, once per
second of wall clock since ``start_ns``, a ``SECOND`` tuple with its counters per queue, and at
the end a ``DONE`` tuple (producers: exact totals per queue; consumers: receive counts per
producer, one byte per seq). Failures are reported as ``ERROR`` with a one-line reason, never
raised into the parent (entry.py).
"""
from __future__ import annotations

import asyncio
import time

from . import frames as F
from .client import (CHANNEL, AMQPClient, AMQPUrl, BrokerClosed, bind_queue, connect,
                     declare_exchange, declare_queue)
from .plan import Config, assigned, binding_keys, routes
from .schema import BODY_HEADER, ROLE_PRODUCER

READY, SECOND, DONE, ERROR = "ready", "second", "done", "error"
CONFIRM_DRAIN_S = 10.0      #: how long a producer waits for outstanding confirms at the end
ACK_FLUSH_S = 0.02          #: a consumer acks what it holds at least this often (s)
CLOSE_S = 30.0              #: how long a worker waits for connection.close-ok at the end: the
#: broker answers it after every publish written before it (no-confirm loads leave a backlog
#: in the sockets), so giving up earlier would drop publishes the tool counted as sent
FLUSH_S = 5.0               #: how long a producer waits at the end for the publishes still in
#: its transport's buffer to reach the kernel before it drops them uncounted (_flush_or_drop)
TICK_S = 0.001              #: rate-limited producers wake this often (s)
MAX_BATCH = 256             #: messages per socket write


async def _wait_event(event, poll: float = 0.01) -> None:
    while not event.is_set():
        await asyncio.sleep(poll)


class Worker:
    role = ""

    def __init__(self, index: int, cfg: Config, reports) -> None:
        self.index = index
        self.cfg = cfg
        self.reports = reports
        self.url = AMQPUrl.parse(cfg.url)
        workers = cfg.producers if self.role == ROLE_PRODUCER else cfg.consumers
        self.qidx = assigned(len(cfg.queues), workers, index)
        self.names = [cfg.queues[q] for q in self.qidx]
        self.client: AMQPClient | None = None
        self.start_ns = 0
        self.second = 0

    async def setup(self) -> None:
        self.client = await connect(self.url)
        c = self.cfg
        durable = c.durable or c.persistent
        if c.exchange:
            await declare_exchange(self.client, c.exchange, c.exchange_type, durable)
        for q, name in zip(self.qidx, self.names):
            await declare_queue(self.client, name, durable, c.queue_args)
            if c.exchange:
                for key in binding_keys(c, q):
                    await bind_queue(self.client, name, c.exchange, key)

    async def close(self) -> None:
        """Close the worker's connection(s), each waiting up to CLOSE_S for close-ok."""
        await self.client.close(CLOSE_S)

    async def main(self, go, start_ns, stop) -> None:
        await self.setup()
        self.reports.put((READY, self.role, self.index, self.client.server))
        await _wait_event(go)
        self.start_ns = start_ns.value
        delay = (self.start_ns - time.time_ns()) / 1e9
        if delay > 0:
            await asyncio.sleep(delay)
        ticker = asyncio.ensure_future(self._ticker())
        try:
            await self.run(stop)
        finally:
            ticker.cancel()
        self.report_second(final=True)
        self.reports.put((DONE, self.role, self.index, self.totals()))
        await self.close()

    async def _ticker(self) -> None:
        while True:
            due = self.start_ns + (self.second + 1) * 1_000_000_000
            while (left := due - time.time_ns()) > 0:   # timers may fire a little early
                await asyncio.sleep(left / 1e9)
            self.report_second()

    def report_second(self, final: bool = False) -> None:
        rows, extra = self.snapshot()
        self.reports.put((SECOND, self.role, self.index, self.second, rows, extra, final))
        self.second += 1


def unsent_tail(buffered: int, seq: int, sizes: list[int]) -> int:
    """How many of publishes ``0 .. seq-1`` have not left a write buffer that holds the last
    ``buffered`` bytes written; publish ``k`` is ``sizes[k % len(sizes)]`` bytes. A publish
    partly in the buffer counts as unsent: the broker never gets it whole."""
    n, k = 0, seq - 1
    while buffered > 0 and k >= 0:
        buffered -= sizes[k % len(sizes)]
        n += 1
        k -= 1
    return n


class Producer(Worker):
    """Publishes pre-encoded messages (``frames.PublishTemplate``), honouring ``--rate`` and
    ``--confirm`` (max unconfirmed), in batches of at most ``MAX_BATCH`` per write."""

    role = ROLE_PRODUCER

    async def setup(self) -> None:
        await super().setup()
        c = self.cfg
        if c.confirm:
            from pamqp import commands
            await self.client.rpc(commands.Confirm.Select(), commands.Confirm.SelectOk)
        fm = self.client.frame_max
        self.routes = routes(c, self.qidx)
        self.templates = [F.PublishTemplate(CHANNEL, c.exchange, key, c.size, c.persistent,
                                            c.mandatory, fm) for key, _ in self.routes]
        n = len(self.names)
        # per local queue: sent, confirmed, nacked, returned (since the last report)
        self.window = [[0, 0, 0, 0] for _ in range(n)]
        self.total = [[0, 0, 0, 0] for _ in range(n)]
        self.by_name = {key.encode(): qi for key, qi in self.routes}   # basic.return's key
        self.unconfirmed: dict[int, int] = {}   # delivery tag -> local queue index
        self.low_tag = 1
        self.tag = 0
        self.confirm_wait = asyncio.Event()
        self.client.fast = self.on_frame

    def _count(self, qi: int, col: int) -> None:
        self.window[qi][col] += 1
        self.total[qi][col] += 1

    def on_frame(self, ftype: int, buf, start: int, end: int) -> None:
        if ftype != F.FRAME_METHOD:
            return  # content of a basic.return: nothing to read
        cm = F.CLASS_METHOD.unpack_from(buf, start)
        if cm == F.BASIC_RETURN:
            _, _, _, rk = F.parse_return(buf, start + 4)
            self._count(self.by_name.get(rk, 0), 3)
            return
        col = 1 if cm == F.BASIC_ACK else 2
        tag, multiple = F.parse_ack(buf, start + 4)
        pop = self.unconfirmed.pop
        if multiple:
            for t in range(self.low_tag, tag + 1):
                qi = pop(t, None)
                if qi is not None:
                    self._count(qi, col)
            self.low_tag = max(self.low_tag, tag + 1)
        else:
            qi = pop(tag, None)
            if qi is not None:
                self._count(qi, col)
        self.confirm_wait.set()

    async def run(self, stop) -> None:
        c = self.cfg
        client = self.client
        transport = client.transport
        end_ns = self.start_ns + int(c.time_s * 1e9)
        pres = [t.pre for t in self.templates]
        posts = [t.post for t in self.templates]
        route_q = [qi for _, qi in self.routes]
        nr = len(pres)
        pack = BODY_HEADER.pack
        token, me = c.run_token, self.index
        now_ns = time.time_ns
        seq = 0
        confirm = c.confirm
        unconfirmed = self.unconfirmed
        window, total = self.window, self.total
        while not stop.is_set():
            now = now_ns()
            if now >= end_ns:
                break
            if client.closed:
                raise BrokerClosed(client.closed)
            if c.rate > 0:
                n = int(c.rate * (now - self.start_ns) / 1e9) + 1 - seq
                if n <= 0:
                    await asyncio.sleep(max(TICK_S, (seq / c.rate) - (now - self.start_ns)
                                            / 1e9))
                    continue
                n = min(n, MAX_BATCH)
            else:
                n = MAX_BATCH
            if confirm:
                room = confirm - len(unconfirmed)
                if room <= 0:
                    self.confirm_wait.clear()
                    try:
                        await asyncio.wait_for(self.confirm_wait.wait(), 0.1)
                    except TimeoutError:
                        pass
                    continue
                n = min(n, room)
            if not client.can_write.is_set():
                # the broker stopped reading (RabbitMQ's flow control, a full socket): wait,
                # but never past the end of the sending window
                try:
                    await asyncio.wait_for(client.can_write.wait(), (end_ns - now) / 1e9)
                except TimeoutError:
                    pass
                continue
            parts = []
            append = parts.append
            for _ in range(n):
                r = seq % nr
                qi = route_q[r]
                append(pres[r])
                append(pack(token, me, now_ns(), seq))
                append(posts[r])
                w = window[qi]
                w[0] += 1
                total[qi][0] += 1
                seq += 1
                if confirm:
                    self.tag += 1
                    unconfirmed[self.tag] = qi
            transport.write(b"".join(parts))
            await asyncio.sleep(0)
        # wait (bounded) for the outstanding confirms
        deadline = time.monotonic() + CONFIRM_DRAIN_S
        while confirm and unconfirmed and time.monotonic() < deadline and not client.closed:
            self.confirm_wait.clear()
            try:
                await asyncio.wait_for(self.confirm_wait.wait(), 0.1)
            except TimeoutError:
                pass
        sizes = [len(pre) + BODY_HEADER.size + len(post) for pre, post in zip(pres, posts)]
        await self._flush_or_drop(seq, sizes, route_q)

    async def _flush_or_drop(self, seq: int, sizes: list[int], route_q: list[int]) -> None:
        """Wait up to ``FLUSH_S`` for this producer's publishes to leave its transport's
        buffer (a broker that reads slowly, or applies flow control, holds them there); then
        drop what is left with the connection (``abort``) and take those publishes off the
        totals, so that ``sent`` counts what was handed to the kernel. Without this, a
        flooding load against a throttled broker counted the buffer's publishes (up to the
        transport's high-water mark, about 64 KiB a producer) as sent, and the process
        exited with them unsent: they read as lost (performance-log.md, "What the scaling
        bench called lost").
        ``seq``: publishes written; ``sizes``: bytes of a publish by route (``seq % len``);
        ``route_q``: the local queue index of each route."""
        transport = self.client.transport
        deadline = time.monotonic() + FLUSH_S
        while (transport is not None and not transport.is_closing()
               and transport.get_write_buffer_size() and time.monotonic() < deadline):
            await asyncio.sleep(0.01)
        if transport is None or transport.is_closing():
            return
        unsent = unsent_tail(transport.get_write_buffer_size(), seq, sizes)
        if not unsent:
            return
        transport.abort()
        for s in range(seq - unsent, seq):
            qi = route_q[s % len(route_q)]
            self.total[qi][0] -= 1
            if self.window[qi][0]:
                self.window[qi][0] -= 1

    def snapshot(self):
        rows = []
        for qi, w in enumerate(self.window):
            if any(w):
                rows.append((self.qidx[qi], (w[0], w[1], w[2], w[3], 0, 0, 0), None))
                self.window[qi] = [0, 0, 0, 0]
        return rows, None

    def totals(self):
        return [(self.qidx[qi], tuple(t)) for qi, t in enumerate(self.total)]
