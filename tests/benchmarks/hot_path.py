"""Python cost of Shoal's hot path in one process: router and node code, no sockets, no ZeroMQ.

    python tests/benchmarks/hot_path.py [--messages 50000] [--burst 5] [--profile] [--idle-ms 1]

A real router (Broker, ClientConnection, Channel, the AMQP codec, NodeLink's batching) and a
real node (Shard) are wired back to back in one process, as ``--embed-node`` wires the router
and node-0: each batch the link sends is handed over (shared/wire.handover) and fed to the
shard (node/server.py ``feed_frames``); the shard's outbox comes back the same way, on the next
loop callback, into ``NodeLink._handle_batch``. ``--frames`` encodes and decodes every batch as
the ZeroMQ link does instead. One publishing and one consuming client
connection (fake transports) run load 1's shape: bursts of ``--burst`` 100-byte publishes to
the default exchange, qos 200, every delivery acked one by one. Prints µs of CPU per message
for the whole cycle (publish in, PUBLISH to the node, DELIVER back, basic.deliver out, ack in,
SETTLE and CREDIT to the node), best of 5 rounds. Deterministic enough to compare code
changes that the noise of a whole-cluster run hides; ``--profile`` prints cProfile's top
functions (``HOT_PATH_TOP`` of them, default 25). ``--idle-ms G`` sleeps G ms after each burst,
as a broker process at 5,000 msg/s idles between bursts (its CPU halts), and prints the CPU of
the bursts' work alone (the sleeps' own CPU left out), for runs of ``--messages`` / 5 messages
(``--idle-ms 0``: the same timing per burst without the sleep, the baseline):
on docs/performance.md's VM the same code costs about 60 % more after an idle millisecond
(session 17). ``--persistent``: the queue durable, the messages persistent (delivery-mode 2)
and published in confirm mode, the shard journaled (a Journal in a temporary folder) with one
commit per turn as the node makes it on its loop (the ENQUEUE, DELIVERY_STATE and SETTLE
records, their framing, one write and one fdatasync; the confirms leave once it is on disk):
issue 46's shape C and the K = 4 confirmed load, without their noise. Not collected by
pytest: a benchmark asserts no speed.
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
import struct
import tempfile
import time
from pathlib import Path

import zmq

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "router"))

from pamqp import commands  # noqa: E402

from amqp_testkit import PROTOCOL_HEADER, m, publish, start_ok_plain  # noqa: E402

from shoal.node.durability.journal import Journal  # noqa: E402
from shoal.node.intake import feed_frames  # noqa: E402
from shoal.node.shard import Shard  # noqa: E402
from shoal.router.broker import Broker  # noqa: E402
from shoal.router.links.node_link import NodeLink  # noqa: E402
from shoal.router.frontend.client import ClientConnection  # noqa: E402
from shoal.shared import wire  # noqa: E402
from shoal.shared.settings import Settings  # noqa: E402
from shoal.shared.wire import T  # noqa: E402

PEER = b"router-1"
#: basic.ack frame on channel 1: frame header, class/method 60/80, delivery tag, bits, end
ACK = struct.Struct(">BHIHHQBB")


class Transport:
    """Enough of an asyncio transport for ClientConnection: keeps what is written."""

    def __init__(self) -> None:
        self.written = 0
        self.chunks: list[bytes] = []

    def get_extra_info(self, name: str, default=None):
        return ("127.0.0.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.written += len(data)
        self.chunks.append(data)

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


class Link(NodeLink):
    """The router's real NodeLink (batching, lazy SETTLE/CREDIT merging, REPLY handling) whose
    batches go straight into the shard instead of a ZeroMQ socket; the shard's answers come
    back on the next loop callback, as from the socket."""

    def __init__(self, ctx: zmq.Context, shard: Shard, broker: Broker, frames: bool) -> None:
        super().__init__(ctx, "node-0", "inproc://hot-path-unused", broker.router_id, 500,
                         10000, broker.on_node_message, lambda *a: None, lambda *a: None)
        self.shard = shard
        self.up = True
        self.moved = 0
        self.frames = frames

    def _send_now(self, batch: list[list]) -> bool:
        self.moved += len(batch)
        now = time.monotonic() * 1000
        if self.frames:
            feed_frames(self.shard, [(PEER, wire.encode_batch(batch))], now)
        else:
            feed_frames(self.shard, [], now, [(PEER, wire.handover(batch))])
        if self.shard.journal_flush():      # the turn's one commit (node/durability/group_commit.py)
            self.shard.durable.journal.commit()
            self.shard.release_durable()
        asyncio.get_running_loop().call_soon(self._from_node)
        return True

    def _from_node(self) -> None:
        for _peer, msgs in self.shard.take_outbox().items():
            self.moved += len(msgs)
            if self.frames:
                self._handle_batch(self._decode(wire.encode_batch(msgs)))
            else:
                self._handle_batch(wire.handover(msgs))


def client(broker: Broker) -> tuple[ClientConnection, Transport]:
    c = ClientConnection(broker)
    t = Transport()
    c.connection_made(t)
    for frame in (PROTOCOL_HEADER, m(start_ok_plain()),
                  m(commands.Connection.TuneOk(2047, 131072, 0)),
                  m(commands.Connection.Open("/")), m(commands.Channel.Open(), 1)):
        c.data_received(frame)
    return c, t


async def settle(link: Link) -> None:
    """Run loop callbacks until nothing moves between router and node."""
    for _ in range(100):
        before = link.moved
        for _ in range(3):
            await asyncio.sleep(0)
        if link.moved == before:
            return


async def run(messages: int, burst: int, profile: bool, frames: bool = False,
              idle_ms: float | None = None, persistent: bool = False) -> None:
    settings = Settings(node_id="node-0", node_endpoints=["node-0=inproc://none"])
    broker = Broker(settings)
    shard = Shard("node-0", "inc-1", settings)
    if persistent:
        shard.attach_journal(Journal.open(Path(tempfile.mkdtemp(prefix="hot-path-")) / "j"))
    shard.handle(PEER, [T.HELLO, wire.WIRE_VERSION, broker.router_id, "node-0"], 0.0)
    shard.take_outbox()
    ctx = zmq.Context()
    link = Link(ctx, shard, broker, frames)
    broker.links["node-0"] = link
    prod, _ = client(broker)
    cons, out = client(broker)
    prod.data_received(m(commands.Queue.Declare(queue="hot", durable=persistent), 1)
                       + (m(commands.Confirm.Select(), 1) if persistent else b""))
    await settle(link)
    cons.data_received(m(commands.Basic.Qos(prefetch_count=200), 1)
                       + m(commands.Basic.Consume(queue="hot", consumer_tag="ctag"), 1))
    await settle(link)
    props = commands.Basic.Properties(delivery_mode=2) if persistent else None
    pub = publish(1, b"x" * 100, exchange="", routing_key="hot", props=props) * burst
    acks = iter([ACK.pack(1, 1, 13, 60, 80, tag, 0, 0xCE)
                 for tag in range(1, 2000 + 5 * messages + burst + 1)])

    async def cycle(n: int) -> None:
        # One burst: publishes in, the node delivers, the consumer acks them. The acks'
        # SETTLE and CREDIT wait (lazily) to ride with the next burst's PUBLISH batch.
        for _ in range(n // burst):
            prod.data_received(pub)
            await settle(link)
            out.chunks.clear()
            cons.data_received(b"".join(next(acks) for _ in range(burst)))

    await cycle(2000)                  # warm up
    if idle_ms is not None:
        n, work = messages // 5, 0.0
        for _ in range(n // burst):
            t = time.thread_time()
            await cycle(burst)
            work += time.thread_time() - t
            if idle_ms:
                time.sleep(idle_ms / 1000)
        print(f"{work / n * 1e6:.2f} µs of CPU per message, work only (bursts of {burst}, "
              f"{idle_ms:g} ms idle after each; {n} messages)")
        return
    best = float("inf")
    prof = cProfile.Profile() if profile else None
    for _ in range(5):
        t = time.process_time()
        if prof:
            prof.enable()
        await cycle(messages)
        if prof:
            prof.disable()
        best = min(best, time.process_time() - t)
    delivered = broker.stats["delivered"]
    print(f"{best / messages * 1e6:.2f} µs of CPU per message (publish, deliver, ack; "
          f"bursts of {burst}; {delivered} delivered in all"
          + ("; persistent, confirmed, journaled" if persistent else "") + ")")
    if persistent:
        st = shard.durable.journal.stats()
        print(f"journal: {st.fsyncs} fdatasyncs, durable LSN {st.durable_lsn}, "
              f"{st.live_records} records live")
    if prof:
        top = int(os.environ.get("HOT_PATH_TOP", "25"))
        pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=50000)
    p.add_argument("--burst", type=int, default=5)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--frames", action="store_true",
                   help="encode and decode every batch (the ZeroMQ link's cost)")
    p.add_argument("--idle-ms", type=float, default=None,
                   help="sleep this long after each burst (0: time each burst, no sleep); "
                        "print the bursts' CPU alone")
    p.add_argument("--persistent", action="store_true",
                   help="durable queue, persistent messages, confirms, a journal committed "
                        "once per turn")
    a = p.parse_args()
    try:
        import uvloop
        loop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        loop = asyncio.new_event_loop()
    loop.run_until_complete(run(a.messages, a.burst, a.profile, a.frames, a.idle_ms,
                                a.persistent))


if __name__ == "__main__":
    main()
