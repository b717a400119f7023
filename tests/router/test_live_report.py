"""The router's report of its live objects travels in packed slices (router/live.py): built
with the event loop let run between slices, kept by the nodes as bytes, and unpacked into the
same rows as the whole report."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace as NS

from shoal.router import live


def _broker(n: int) -> NS:
    conns = []
    for i in range(n):
        pool = NS(targets={1: NS(tag=f"ctag-{i}", queues=[f"q{i}", f"r{i}"], vhost="/",
                                 no_ack=False)}, prefetch_count=10, global_prefetch=0)
        ch = NS(number=1, pool=pool, unacked={}, confirm=False, tx=None)
        conns.append(NS(amqp=NS(user="guest"), name=f"127.0.0.1:{1000 + i} -> 127.0.0.1:5672",
                        vhost="/", blocked=False, channels={1: ch}, tls=False,
                        peer=("127.0.0.1", 1000 + i), local=("127.0.0.1", 5672),
                        connected_at=1, client_properties={"product": b"pika"}))
    return NS(connections=conns, router_id="router-0", stats=dict.fromkeys(live.STATS, 3))


def test_the_packed_report_unpacks_into_the_whole_reports_rows():
    broker = _broker(2 * live.REPORT_SLICE + 7)
    turns = []

    async def main():
        async def count_turns():
            while True:
                turns.append(1)
                await asyncio.sleep(0)
        counter = asyncio.ensure_future(count_turns())
        packed = await live.packed_report(broker)
        counter.cancel()
        return packed
    packed = asyncio.run(main())
    assert len(packed["slices"]) == 3 and all(isinstance(s, bytes) for s in packed["slices"])
    assert len(turns) >= 3                  # the loop ran between the slices
    whole = live.report(broker)
    assert live.unpacked(packed) == whole
    assert len(whole["consumers"]) == 2 * len(broker.connections)
    assert whole["connections"][0]["client_properties"] == {"product": "pika"}


def test_a_report_without_slices_is_used_as_it_is_and_a_bad_slice_is_left_out():
    old = {"connections": [{"name": "c"}], "channels": [], "consumers": [], "stats": {}}
    assert live.unpacked(old) is old
    rep = live.unpacked({"slices": [b"\xc1", live.msgpack.packb({"connections": [{"name": "d"}]})],
                         "stats": {"routed": 1}})
    assert rep["connections"] == [{"name": "d"}] and rep["stats"] == {"routed": 1}
