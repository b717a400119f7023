"""The consumer process of ``shoal loadtest``: :class:`Consumer` consumes its queues over
``--connections`` connections (:class:`ConsumerLink`, one channel each, its share of the
queues), counts what arrives per producer and seq, and acks.

Deliveries are parsed with struct from the frames as they are read (``client.fast``); each
link keeps its own parse state and acks, the counters are the process's.
"""
from __future__ import annotations

import asyncio
import time
from array import array

from pamqp import commands

from . import frames as F
from .client import CHANNEL, AMQPClient, BrokerClosed, connect
from .schema import BODY_HEADER, ROLE_CONSUMER
from .workers import ACK_FLUSH_S, CLOSE_S, Worker

#: connections a consumer opens at once (--connections): a burst of hundreds of connects
#: overflows a broker's listen backlog (RabbitMQ's is 128), and the SYNs dropped wait for the
#: kernel's retries (1, 3, 7 s ...) past the connect timeout
CONNECT_AT_ONCE = 8


class ConsumerLink:
    """One connection of a consumer: its consumers (one per queue, on channel ``CHANNEL``),
    the frame parse state and the acks it owes."""

    def __init__(self, owner: "Consumer", client: AMQPClient) -> None:
        self.owner = owner
        self.client = client
        self.state = 0          # 0: want method, 1: want header, 2: want body
        self.cur = None         # (local queue, delivery_tag, redelivered)
        self.remaining = 0
        self.stamped = False
        self.first = None
        self.pending = 0
        self.last_tag = 0
        self.acks = bytearray()
        client.fast = self.on_frame
        client.on_batch_end = self.write_acks

    async def start(self, queues: list[int], qos: int) -> None:
        """basic.qos, then a basic.consume on each of ``queues`` (indexes into the owner's)."""
        o = self.owner
        if qos:
            await self.client.rpc(commands.Basic.Qos(prefetch_count=qos), commands.Basic.QosOk)
        for i in queues:
            tag = f"loadtest-c{o.index}-{i}"
            o.by_tag[tag.encode()] = i
            await self.client.rpc(commands.Basic.Consume(queue=o.names[i], consumer_tag=tag),
                                  commands.Basic.ConsumeOk)

    def on_frame(self, ftype: int, buf, start: int, end: int) -> None:
        if ftype == F.FRAME_METHOD:
            if F.CLASS_METHOD.unpack_from(buf, start) != F.BASIC_DELIVER:
                return
            ctag, dtag, redelivered, _, _ = F.parse_deliver(buf, start + 4)
            self.cur = (self.owner.by_tag.get(ctag, 0), dtag, redelivered)
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
        self.owner.count(qi, redelivered, stamp)
        self.last_tag = dtag
        every = self.owner.ack_every
        if every <= 1:
            self.acks += F.encode_ack(CHANNEL, dtag, False)
        else:
            self.pending += 1
            if self.pending >= every:
                self.flush_acks()
        if self.acks and len(self.acks) > 4096:
            self.write_acks()

    def flush_acks(self) -> None:
        if self.pending:
            self.acks += F.encode_ack(CHANNEL, self.last_tag, True)
            self.pending = 0

    def write_acks(self) -> None:
        if self.acks and not self.client.closed:
            self.client.transport.write(bytes(self.acks))
        self.acks.clear()


class Consumer(Worker):
    """Consumes its queues with ``--qos`` prefetch (per connection), acks with ``multiple``
    every ``--multi-ack-every`` messages (each message when 0 or 1). With ``--connections``
    N, local queue ``i`` is consumed on connection ``i % N``."""

    role = ROLE_CONSUMER

    async def setup(self) -> None:
        await super().setup()
        c = self.cfg
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
        conns = max(1, min(c.connections, n))
        gate = asyncio.Semaphore(CONNECT_AT_ONCE)

        async def one() -> AMQPClient:
            async with gate:
                return await connect(self.url)
        clients = [self.client] + list(await asyncio.gather(*(one() for _ in range(conns - 1))))
        self.links = [ConsumerLink(self, client) for client in clients]
        await asyncio.gather(*(link.start(list(range(k, n, conns)), c.qos)
                               for k, link in enumerate(self.links)))

    def count(self, qi: int, redelivered: bool, stamp) -> None:
        """One delivery on local queue ``qi``: this run's (``stamp``: the body's header) or
        foreign."""
        w = self.window[qi]
        if stamp is None or stamp[0] != self.cfg.run_token:
            w[2] += 1
            return
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

    async def run(self, stop) -> None:
        tick = 0
        while not stop.is_set():
            for link in self.links:
                if link.client.closed:
                    raise BrokerClosed(link.client.closed)
            await asyncio.sleep(ACK_FLUSH_S / 2)
            tick += 1
            for link in self.links:
                if tick % 2 == 0:
                    link.flush_acks()
                link.write_acks()
        for link in self.links:
            link.flush_acks()
            link.write_acks()

    async def close(self) -> None:
        await asyncio.gather(*(link.client.close(CLOSE_S) for link in self.links))

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
