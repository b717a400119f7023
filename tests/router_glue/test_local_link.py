"""LocalLink (router/links/local_link.py) to a NodeServer hosted in the same event loop (``--embed-node``).

The router's link and a real node share one loop, as in the router process: the handshake,
a request and its REPLY travel in memory, and a node that has not yet read LOCAL_HWM frames
refuses more, so the link pauses the publishers and resumes them once the node caught up.
"""
from __future__ import annotations

import asyncio
import dataclasses

import zmq

from shoal.node.server import LOCAL_HWM, NodeServer
from shoal.router.links.local_link import LocalLink
from shoal.router.links.node_link import MAX_BATCH
from shoal.shared.settings import Settings
from shoal.shared.wire import T

from link_flood import check_paused_and_lossless, flood


def _hosted(ctx: zmq.Context) -> NodeServer:
    # The raw link below plays the router and does not answer LEASE_GRANT (node/lease.py).
    settings = dataclasses.replace(Settings(), node_id="node-0", node_bind="inproc://node-0",
                                   delivery_leases=False)
    server = NodeServer(settings, ctx=ctx)
    server.bind()
    return server


async def _up(server: NodeServer, events: list) -> LocalLink:
    link = LocalLink(server.attach_local, "node-0", "inproc://node-0", "r1", 500, 10000,
                     on_message=lambda l, m: None, on_up=lambda l, r: events.append("up"),
                     on_down=lambda l: events.append("down"),
                     on_congestion=lambda l, on: events.append(("congested", on)))
    link.start()
    await asyncio.wait_for(link.ready.wait(), 5)
    return link


def test_handshake_and_a_request_travel_in_memory():
    ctx = zmq.Context()
    server = _hosted(ctx)
    events: list = []

    async def go():
        serving = asyncio.ensure_future(server.serve())
        link = await _up(server, events)
        reply = await asyncio.wait_for(link.request(
            [T.QUEUE_DECLARE, "/", "q1", False, False, False, False, {}, None]), 5)
        await link.stop()
        server.stop()
        await serving
        return reply

    try:
        assert server.group_commit.inline          # no router in its loop yet
        assert asyncio.run(go()) == ["q1", 0, 0]
        assert events == ["up"]
        # --embed-node: the journal commits on its thread, never holding up the router's
        # clients on the disk (node/durability/group_commit.py)
        assert not server.group_commit.inline
    finally:
        server.close()
        ctx.term()


def test_a_node_that_falls_behind_pauses_publishers_and_loses_nothing():
    ctx = zmq.Context()
    server = _hosted(ctx)
    events: list = []
    n = (LOCAL_HWM + 4) * MAX_BATCH      # more than the node may hold unread

    async def go():
        serving = asyncio.ensure_future(server.serve())
        link = await _up(server, events)
        paused, reply = await flood(link, n)
        await link.stop()
        server.stop()
        await serving
        return paused, reply

    try:
        check_paused_and_lossless(*asyncio.run(go()), events, n)
    finally:
        server.close()
        ctx.term()


def test_a_hosted_node_that_fails_stops_the_router_with_exit_1(tmp_path):
    """A bug that ends node-0's loop must not leave a router serving a dead queue shard: the
    router stops (exit 1) and the launcher restarts both."""
    from shoal.node.process import hosted_node
    from shoal.router.server import serve

    settings = dataclasses.replace(Settings(), port=0, data_dir=str(tmp_path),
                                   node_endpoints=["node-0=inproc://node-0"])
    made = []

    def host_node(s, node_id, endpoint, ctx):
        node = hosted_node(s, node_id, endpoint, ctx)
        made.append(node)

        def broken_tick(now_ms):
            raise RuntimeError("injected bug")
        asyncio.get_running_loop().call_later(0.5, setattr, node.shard, "tick", broken_tick)
        return node

    code = asyncio.run(asyncio.wait_for(serve(settings, host_node), 20))
    assert code == 1
    assert made and made[0].journal is None      # closed on the way out


def test_hot_messages_cross_as_objects_and_pass_the_wire_check(monkeypatch):
    """PUBLISH, CREDIT, DELIVER and SETTLE cross in memory (shared/wire.handover) under
    SHOAL_WIRE_CHECK: the consumer gets the published bytes, the ack empties the queue."""
    from shoal.shared import wire
    monkeypatch.setattr(wire, "CHECK", True)
    ctx = zmq.Context()
    server = _hosted(ctx)
    events: list = []
    got: list = []

    async def go():
        serving = asyncio.ensure_future(server.serve())
        link = await _up(server, events)
        link._on_message = lambda l, m: got.append(m) if m[0] == wire.TAG_DELIVER else None
        await link.request([T.QUEUE_DECLARE, "/", "q1", False, False, False, False, {}, None])
        await link.request([T.CONSUME, 7, "/", "q1", "ctag", False, False, {}, None])
        body = b"payload"
        link.send([wire.TAG_PUBLISH, 0, "/", ["q1"], "", "q1", b"\x00\x3c", body, None])
        link.send([wire.TAG_CREDIT, 7, 1, False], urgent=True)
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.01)
        deliver = got[0]
        link.send_lazy([wire.TAG_SETTLE, wire.OUTCOME_ACK, [deliver[2]]])
        await asyncio.sleep(0.05)
        count = (await link.request([T.QUEUE_DECLARE, "/", "q1", True, False, False, False,
                                     {}, None]))[1]
        await link.stop()
        server.stop()
        await serving
        return deliver, body, count

    try:
        deliver, body, count = asyncio.run(go())
        assert deliver[0] == wire.TAG_DELIVER and deliver[7] == body
        assert deliver[7] is body                 # the very bytes: no copy on the way
        assert count == 0                         # acked: nothing left ready or unacked
    finally:
        server.close()
        ctx.term()
