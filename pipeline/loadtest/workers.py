"""Producer and consumer processes of ``shoal loadtest`` (one asyncio/uvloop loop each).

Each worker connects (``client.connect``), declares its queues, reports ``READY`` on the
report queue and waits for the parent's ``go`` event; second 0 starts at ``start_ns`` (shared
value). It then reports, once per second of wall clock since ``start_ns``, a ``SECOND`` tuple
with its counters per queue, and at the end a ``DONE`` tuple (producers: exact totals per queue;
consumers: receive counts per producer, one byte per seq). Failures are reported as ``ERROR``
with a one-line reason, never raised into the parent.

Queue assignment (both roles): with Q queues and W workers, worker ``w`` uses the queues
``q`` with ``q % W == w`` when Q >= W, else the single queue ``w % Q``. A producer publishes
round-robin over its queues through the default exchange; ``seq`` counts over all of them.

With ``--exchange`` (``Config.exchange``) every worker declares the exchange and binds its
queues (:func:`binding_keys`), and a producer publishes to the exchange round-robin over the
routing keys that reach its queues (:func:`routes`): ``direct`` and ``topic`` route each
message to one queue (binding ``j`` of ``--bindings`` goes to queue ``j % Q``), ``fanout`` to
every queue of the run, so each message is expected ``copies(cfg)`` times.
"""
from __future__ import annotations

import asyncio
import time
from array import array
from dataclasses import dataclass, field

from . import frames as F
from .client import (CHANNEL, AMQPUrl, BrokerClosed, bind_queue, connect, declare_exchange,
                     declare_queue)
from .schema import BODY_HEADER, ROLE_CONSUMER, ROLE_PRODUCER

READY, SECOND, DONE, ERROR = "ready", "second", "done", "error"
CONFIRM_DRAIN_S = 10.0      #: how long a producer waits for outstanding confirms at the end
ACK_FLUSH_S = 0.02          #: a consumer acks what it holds at least this often (s)
CLOSE_S = 30.0              #: how long a worker waits for connection.close-ok at the end: the
#: broker answers it after every publish written before it (no-confirm loads leave a backlog
#: in the sockets), so giving up earlier would drop publishes the tool counted as sent
TICK_S = 0.001              #: rate-limited producers wake this often (s)
MAX_BATCH = 256             #: messages per socket write


@dataclass
class Config:
    """Everything a worker needs (picklable; built by the CLI from the flags)."""

    url: str
    queues: list[str]
    size: int = 100
    rate: float = 0.0
    time_s: float = 10.0
    confirm: int = 0
    qos: int = 0
    multi_ack_every: int = 0
    persistent: bool = False
    durable: bool = False
    mandatory: bool = False
    queue_args: dict = field(default_factory=dict)
    sample_every: int = 100
    run_token: int = 0
    producers: int = 1
    consumers: int = 1
    exchange: str = ""          #: publish through this exchange ("" = the default exchange)
    exchange_type: str = "direct"   #: direct, topic or fanout (with ``exchange``)
    bindings: int = 0           #: direct/topic: binding keys over the queues (0 = one each)


def copies(cfg: Config) -> int:
    """How many deliveries each published message should make: the number of queues through
    a fanout exchange, else 1."""
    return len(cfg.queues) if cfg.exchange and cfg.exchange_type == "fanout" else 1


def _keys(cfg: Config) -> int:
    return cfg.bindings or len(cfg.queues)


def binding_keys(cfg: Config, q: int) -> list[str]:
    """The binding keys of queue ``q`` to ``cfg.exchange``: ``""`` for fanout; else binding
    ``j`` (0 <= j < ``bindings``) for each ``j % Q == q``, ``kJ`` for direct and ``kJ.*``
    for topic (a pattern: the topic exchange matches it word by word)."""
    if cfg.exchange_type == "fanout":
        return [""]
    suffix = ".*" if cfg.exchange_type == "topic" else ""
    return [f"k{j}{suffix}" for j in range(q, _keys(cfg), len(cfg.queues))]


def routes(cfg: Config, qidx: list[int]) -> list[tuple[str, int]]:
    """A producer's publishes, round-robin: ``(routing key, index in qidx of the queue it
    reaches)``. The default exchange: each queue's name. Fanout: one key reaching all (the
    message counts under the first of its queues). Direct and topic: every binding key of
    its queues (topic: ``kJ.x``, matched by the pattern ``kJ.*``)."""
    if not cfg.exchange:
        return [(cfg.queues[q], i) for i, q in enumerate(qidx)]
    if cfg.exchange_type == "fanout":
        return [("", 0)]
    suffix = ".x" if cfg.exchange_type == "topic" else ""
    nq = len(cfg.queues)
    local = {q: i for i, q in enumerate(qidx)}
    return [(f"k{j}{suffix}", local[j % nq]) for j in range(_keys(cfg)) if j % nq in local]


def assigned(queues: int, workers: int, w: int) -> list[int]:
    """Indices of the queues worker ``w`` of ``workers`` uses (see module docstring)."""
    if queues >= workers:
        return [q for q in range(queues) if q % workers == w]
    return [w % queues]


def run_worker(role: str, index: int, cfg: Config, reports, go, start_ns, stop) -> None:
    """Process entry point: run one producer or consumer until done, report, exit."""
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run
    worker = (Producer if role == ROLE_PRODUCER else Consumer)(index, cfg, reports)
    try:
        runner(worker.main(go, start_ns, stop))
    except (TimeoutError, BrokerClosed, OSError, ValueError) as exc:
        reports.put((ERROR, role, index, f"{type(exc).__name__}: {exc}" if not isinstance(
            exc, BrokerClosed) else str(exc)))
    except KeyboardInterrupt:
        pass


async def _wait_event(event, poll: float = 0.01) -> None:
    while not event.is_set():
        await asyncio.sleep(poll)


class _Worker:
    role = ""

    def __init__(self, index: int, cfg: Config, reports) -> None:
        self.index = index
        self.cfg = cfg
        self.reports = reports
        self.url = AMQPUrl.parse(cfg.url)
        workers = cfg.producers if self.role == ROLE_PRODUCER else cfg.consumers
        self.qidx = assigned(len(cfg.queues), workers, index)
        self.names = [cfg.queues[q] for q in self.qidx]
        self.client = None
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
        await self.client.close(CLOSE_S)

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


class Producer(_Worker):
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

    def snapshot(self):
        rows = []
        for qi, w in enumerate(self.window):
            if any(w):
                rows.append((self.qidx[qi], (w[0], w[1], w[2], w[3], 0, 0, 0), None))
                self.window[qi] = [0, 0, 0, 0]
        return rows, None

    def totals(self):
        return [(self.qidx[qi], tuple(t)) for qi, t in enumerate(self.total)]


class Consumer(_Worker):
    """Consumes its queues with ``--qos`` prefetch, acks with ``multiple`` every
    ``--multi-ack-every`` messages (each message when 0 or 1), parses deliveries with struct."""

    role = ROLE_CONSUMER

    async def setup(self) -> None:
        await super().setup()
        from pamqp import commands
        c = self.cfg
        if c.qos:
            await self.client.rpc(commands.Basic.Qos(prefetch_count=c.qos),
                                  commands.Basic.QosOk)
        every = max(1, c.multi_ack_every)
        if c.qos:
            every = min(every, c.qos)
        self.ack_every = every
        n = len(self.names)
        self.window = [[0, 0, 0] for _ in range(n)]     # received, redelivered, foreign
        self.lat = [array("q") for _ in range(n)]       # latencies this second (µs)
        self.samples: list[tuple] = []
        self.counts: dict[int, bytearray] = {}
        self.by_tag: dict[bytes, int] = {}
        self.state = 0          # 0: want method, 1: want header, 2: want body
        self.cur = None         # (local queue, delivery_tag, redelivered)
        self.remaining = 0
        self.stamped = False
        self.first = None
        self.pending = 0
        self.last_tag = 0
        self.acks = bytearray()
        self.client.fast = self.on_frame
        for i, name in enumerate(self.names):
            tag = f"loadtest-c{self.index}-{i}"
            self.by_tag[tag.encode()] = i
            await self.client.rpc(commands.Basic.Consume(queue=name, consumer_tag=tag),
                                  commands.Basic.ConsumeOk)

    def on_frame(self, ftype: int, buf, start: int, end: int) -> None:
        if ftype == F.FRAME_METHOD:
            if F.CLASS_METHOD.unpack_from(buf, start) != F.BASIC_DELIVER:
                return
            ctag, dtag, redelivered, _, _ = F.parse_deliver(buf, start + 4)
            self.cur = (self.by_tag.get(ctag, 0), dtag, redelivered)
            self.state = 1
        elif ftype == F.FRAME_HEADER and self.state == 1:
            self.remaining = F.parse_header_body_size(buf, start)
            self.stamped = False
            if self.remaining == 0:
                self._done(None)
            else:
                self.state = 2
        elif ftype == F.FRAME_BODY and self.state == 2:
            size = end - start
            stamp = None
            if not self.stamped:
                self.stamped = True
                if size >= BODY_HEADER.size:
                    stamp = BODY_HEADER.unpack_from(buf, start)
                self.first = stamp
            self.remaining -= size
            if self.remaining <= 0:
                self._done(self.first)

    def _done(self, stamp) -> None:
        self.state = 0
        qi, dtag, redelivered = self.cur
        w = self.window[qi]
        if stamp is not None and stamp[0] == self.cfg.run_token:
            now = time.time_ns()
            _, producer, sent_ns, seq = stamp
            w[0] += 1
            if redelivered:
                w[1] += 1
            lat = (now - sent_ns) // 1000
            self.lat[qi].append(lat)
            arr = self.counts.get(producer)
            if arr is None:
                arr = self.counts[producer] = bytearray(1 << 16)
            if seq >= len(arr):
                arr.extend(bytes(max(seq + 1, 2 * len(arr)) - len(arr)))
            v = arr[seq]
            if v < 255:
                arr[seq] = v + 1
            if seq % self.cfg.sample_every == 0:
                self.samples.append((producer, seq, self.names[qi], self.index, sent_ns, now,
                                     lat, redelivered))
        else:
            w[2] += 1
        self.last_tag = dtag
        if self.ack_every <= 1:
            self.acks += F.encode_ack(CHANNEL, dtag, False)
        else:
            self.pending += 1
            if self.pending >= self.ack_every:
                self.flush_acks()
        if self.acks and len(self.acks) > 4096:
            self._write_acks()

    def flush_acks(self) -> None:
        if self.pending:
            self.acks += F.encode_ack(CHANNEL, self.last_tag, True)
            self.pending = 0

    def _write_acks(self) -> None:
        if self.acks and not self.client.closed:
            self.client.transport.write(bytes(self.acks))
        self.acks.clear()

    async def run(self, stop) -> None:
        self.client.on_batch_end = self._write_acks
        tick = 0
        while not stop.is_set():
            if self.client.closed:
                raise BrokerClosed(self.client.closed)
            await asyncio.sleep(ACK_FLUSH_S / 2)
            tick += 1
            if tick % 2 == 0:
                self.flush_acks()
            self._write_acks()
        self.flush_acks()
        self._write_acks()

    def snapshot(self):
        rows = []
        lats = array("q")
        for qi, w in enumerate(self.window):
            lat = self.lat[qi]
            if any(w) or lat:
                p50 = p99 = mx = None
                if lat:
                    s = sorted(lat)
                    p50, p99, mx = s[len(s) // 2], s[min(len(s) - 1, int(len(s) * 0.99))], s[-1]
                    lats.extend(lat)
                rows.append((self.qidx[qi], (0, 0, 0, 0, w[0], w[1], w[2]), (p50, p99, mx)))
                self.window[qi] = [0, 0, 0]
                self.lat[qi] = array("q")
        samples, self.samples = self.samples, []
        return rows, (lats.tobytes(), samples)

    def totals(self):
        return {p: bytes(a) for p, a in self.counts.items()}
