"""UnixLink (router/links/unix_link.py) to a NodeServer on a ``unix://`` endpoint (node/unix_listener.py).

Both sides run in one event loop here, each on its own end of a real Unix socket: the
handshake and a request, back-pressure when the node falls behind (nothing dropped), a node
that goes away and comes back on the same path, a router whose connection closes being
forgotten by the node at once, and a large grant of credit coming back in early batches.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import stat

import pytest

from shoal.node.peers import EARLY_BATCH
from shoal.node.server import NodeServer
from shoal.router.links.unix_link import UnixLink
from shoal.shared import wire
from shoal.shared.settings import Settings
from shoal.shared.wire import T

from link_flood import DECLARE, PASSIVE, check_paused_and_lossless, flood


def _node(tmp_path, endpoint: str) -> NodeServer:
    settings = dataclasses.replace(Settings(), node_id="node-0", node_bind=endpoint,
                                   data_dir=str(tmp_path))
    server = NodeServer(settings)
    server.bind()
    return server


async def _up(endpoint: str, events: list) -> UnixLink:
    """A started UnixLink to ``endpoint``, once its node said HELLO_OK (bounded)."""
    link = UnixLink(None, "node-0", endpoint, "r1", 500, 10000,
                    on_message=lambda l, m: None,
                    on_up=lambda l, restarted: events.append(("up", restarted)),
                    on_down=lambda l: events.append("down"),
                    on_congestion=lambda l, on: events.append(("congested", on)))
    link.start()
    await asyncio.wait_for(link.ready.wait(), 5)
    return link


@pytest.fixture
def endpoint(tmp_path):
    return f"unix://{tmp_path}/n.sock"


def test_handshake_and_a_request_over_a_private_socket(tmp_path, endpoint):
    server = _node(tmp_path, endpoint)
    events: list = []

    async def go():
        serving = asyncio.ensure_future(server.serve())
        link = await _up(endpoint, events)
        reply = await asyncio.wait_for(link.request(DECLARE), 5)
        await link.stop()
        server.stop()
        await serving
        return reply

    try:
        mode = stat.S_IMODE(os.stat(f"{tmp_path}/n.sock").st_mode)
        assert mode == 0o600                       # the owner's only
        assert asyncio.run(go()) == ["q1", 0, 0]
        assert events == [("up", False)]
    finally:
        server.close()
    assert not os.path.exists(f"{tmp_path}/n.sock")


def test_a_node_that_falls_behind_pauses_publishers_and_loses_nothing(tmp_path, endpoint):
    server = _node(tmp_path, endpoint)
    events: list = []
    n = 400                                  # 400 x 16 KiB: more than the link may buffer

    async def go():
        serving = asyncio.ensure_future(server.serve())
        link = await _up(endpoint, events)
        paused, reply = await flood(link, n, size=16384, flush_every=16)
        await link.stop()
        server.stop()
        await serving
        return paused, reply

    try:
        check_paused_and_lossless(*asyncio.run(go()), events, n)
    finally:
        server.close()


def test_a_node_that_goes_away_is_down_at_once_and_found_again(tmp_path, endpoint):
    events: list = []

    async def go():
        first = _node(tmp_path, endpoint)
        serving = asyncio.ensure_future(first.serve())
        link = await _up(endpoint, events)
        first._unix.close()          # the process died: its connections close, no GOODBYE
        for _ in range(200):
            if not link.up:
                break
            await asyncio.sleep(0.01)
        down = not link.up
        first.stop()
        await serving
        first.close()
        second = _node(tmp_path, endpoint)     # a restart binds the same path again
        serving = asyncio.ensure_future(second.serve())
        await asyncio.wait_for(link.ready.wait(), 5)
        reply = await asyncio.wait_for(link.request(DECLARE), 5)
        await link.stop()
        second.stop()
        await serving
        second.close()
        return down, reply

    down, reply = asyncio.run(go())
    assert down                          # well before link_heartbeat_timeout (5 s)
    assert reply == ["q1", 0, 0]
    assert events == [("up", False), "down", ("up", True)]


def test_a_router_whose_connection_closes_is_forgotten_at_once(tmp_path, endpoint):
    server = _node(tmp_path, endpoint)

    async def go():
        serving = asyncio.ensure_future(server.serve())
        link = await _up(endpoint, [])
        before = set(server.shard.links.by_identity)
        link._conn.transport.abort()     # the router died: no GOODBYE
        for _ in range(200):
            if not before & set(server.shard.links.by_identity):
                break
            await asyncio.sleep(0.01)
        gone = not before & set(server.shard.links.by_identity)
        await link.stop()
        server.stop()
        await serving
        return before, gone

    try:
        before, gone = asyncio.run(go())
        assert len(before) == 1
        assert gone                      # not after 2 heartbeats of silence: at once
    finally:
        server.close()


def test_a_live_nodes_path_is_not_taken_a_stale_one_is(tmp_path, endpoint):
    server = _node(tmp_path, endpoint)
    try:
        second = NodeServer(dataclasses.replace(Settings(), node_id="node-1",
                                                node_bind=endpoint, data_dir=str(tmp_path)))
        with pytest.raises(OSError, match="already listens"):
            second.bind()
        second.close()
        assert os.path.exists(f"{tmp_path}/n.sock")   # the live node's file is left alone
    finally:
        server.close()
    import socket
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(f"{tmp_path}/n.sock")     # a socket file nobody listens on (a killed node's)
    stale.close()
    _node(tmp_path, endpoint).close()


def test_credit_on_a_backlog_comes_back_in_early_batches_in_queue_order(tmp_path, endpoint):
    """300 messages wait and the consumer is granted 300 credit in one go: the node sends the
    deliveries in batches of at most EARLY_BATCH while it makes them (node/peers.py), so the
    router can forward the first while the node makes the rest: ``on_read`` runs after each
    read, once its batches are handled. Every message arrives once,
    in queue order, and the ack of all of them empties the queue."""
    server = _node(tmp_path, endpoint)
    events: list = []
    got: list = []
    per_batch: list[int] = []
    reads: list[int] = []    # messages handled when each read's on_read ran
    n = 300

    async def go():
        serving = asyncio.ensure_future(server.serve())
        link = await _up(endpoint, events)
        link._on_message = lambda l, m: got.append(m) if m[0] == T.DELIVER else None
        link._on_read = lambda: reads.append(len(got))
        handle = link._handle_batch

        def counting(batch):
            per_batch.append(sum(1 for m in batch if m[0] == T.DELIVER))
            handle(batch)
        link._handle_batch = counting
        await link.request(DECLARE)
        for i in range(n):
            link.send([T.PUBLISH, 0, "/", ["q1"], "", "q1", b"", b"%03d" % i, None])
        await link.request([T.CONSUME, 7, "/", "q1", "ctag", False, False, {}, None])
        link.send([T.CREDIT, 7, n, False], urgent=True)
        for _ in range(500):
            if len(got) >= n:
                break
            await asyncio.sleep(0.01)
        link.send([T.SETTLE, wire.OUTCOME_ACK, [m[2] for m in got]], urgent=True)
        count = (await link.request(PASSIVE))[1:]
        await link.stop()
        server.stop()
        await serving
        return count

    try:
        ready_and_consumers = asyncio.run(go())
    finally:
        server.close()
    delivered = [m for m in got if m[0] == T.DELIVER]
    assert [m[7] for m in delivered] == [b"%03d" % i for i in range(n)]
    assert max(per_batch) <= EARLY_BATCH
    assert sum(1 for k in per_batch if k) >= n // EARLY_BATCH
    # The router hears after each read, with its batches handled (it writes to clients then).
    assert n in reads and reads == sorted(reads)
    assert ready_and_consumers == [0, 1]
