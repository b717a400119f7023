"""A node's links to the other nodes on one host (node/replication/links.py ``UnixPeerLinks``),
against the listener a node binds on its ``peer_bind`` (node/unix_listener.py), in one event
loop: batches arrive whole and in order under a ``peer:`` identity, a peer that is not there
yet or has gone loses what is sent meanwhile (Raft resends), its going is reported once, and
the link comes back by itself when the peer listens again. ``open_peer_links`` picks the
transport from the endpoints, and a mix of the two is refused.
"""
from __future__ import annotations

import asyncio

import pytest
import zmq

from shoal.node.replication import links as links_mod
from shoal.node.replication.links import PeerLinks, UnixPeerLinks, open_peer_links
from shoal.node.unix_listener import UnixListener
from shoal.shared import wire
from shoal.shared.settings import ConfigError, Settings, load_settings


async def _until(cond, limit_s: float = 10.0) -> None:
    """Wait until ``cond()`` (a bound, not a timing: the loop runs the dialler meanwhile)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    while not cond():
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.01)


def _listener(path: str) -> UnixListener:
    lst = UnixListener(path, lambda: None, lambda _identity: None, prefix=b"peer:unix-")
    lst.bind()
    return lst


def _drain(lst: UnixListener, got: list) -> None:
    for identity, frame in lst.take():
        got.append((identity, wire.decode_batch(frame)))


def test_batches_arrive_whole_in_order_under_a_peer_identity(tmp_path, monkeypatch):
    monkeypatch.setattr(links_mod, "UNIX_RECONNECT_S", 0.01)
    path = str(tmp_path / "node-1-peer.sock")

    async def scenario():
        got: list = []
        lst = _listener(path)
        await lst.start()
        links = UnixPeerLinks("node-0", [("node-0", "unix:///nowhere"),
                                         ("node-1", f"unix://{path}")])
        assert links.nodes == ["node-1"]
        await _until(lambda: "node-1" in links._conns)
        big = b"x" * 200_000            # a chunk's worth: sent as two buffers
        links.queue("node-1", [int(wire.T.PEER_HELLO), 1, "node-0"])
        links.queue("node-2", ["not a peer: not queued"])
        links.broadcast([int(wire.T.RAFT), big])
        links.flush()
        links.queue("node-1", [int(wire.T.RAFT), 2])
        links.flush()
        await _until(lambda: (_drain(lst, got), len(got) == 2)[1])
        assert [g[0].startswith(b"peer:unix-") for g in got] == [True, True]
        assert got[0][1] == [[int(wire.T.PEER_HELLO), 1, "node-0"], [int(wire.T.RAFT), big]]
        assert got[1][1] == [[int(wire.T.RAFT), 2]]
        assert (links.sent, links.dropped) == (2, 0)
        links.close()
        lst.close()
    asyncio.run(scenario())


def test_a_peer_not_there_loses_sends_then_is_reached_and_its_going_is_reported(
        tmp_path, monkeypatch):
    monkeypatch.setattr(links_mod, "UNIX_RECONNECT_S", 0.01)
    monkeypatch.setattr(links_mod, "UNIX_RECONNECT_MAX_S", 0.02)
    path = str(tmp_path / "node-1-peer.sock")

    async def scenario():
        lost: list[str] = []
        links = UnixPeerLinks("node-0", [("node-1", f"unix://{path}")])
        links.watch(None, lost.append)
        assert links.fds() == []
        links.queue("node-1", [int(wire.T.RAFT), 1])
        links.flush()                                   # nobody listens: dropped
        assert (links.sent, links.dropped) == (0, 1)
        got: list = []
        lst = _listener(path)                      # the peer starts
        await lst.start()
        await _until(lambda: "node-1" in links._conns)
        assert lost == []                               # never reached: nothing lost
        lst.close()                                     # the peer dies
        await _until(lambda: lost == ["node-1"])
        links.queue("node-1", [int(wire.T.RAFT), 2])
        links.flush()
        assert links.dropped == 2
        lst = _listener(path)                      # and comes back
        await lst.start()
        await _until(lambda: "node-1" in links._conns)
        links.queue("node-1", [int(wire.T.RAFT), 3])
        links.flush()
        await _until(lambda: (_drain(lst, got), got)[1])
        assert got[0][1] == [[int(wire.T.RAFT), 3]]
        assert lost == ["node-1"]
        links.close()
        lst.close()
    asyncio.run(scenario())


def test_the_transport_follows_the_endpoints_and_a_mix_is_refused(tmp_path):
    ctx = zmq.Context()
    try:
        settings = Settings()
        zmq_links = open_peer_links(ctx, "node-0", [("node-1", "tcp://127.0.0.1:1")], settings)
        assert isinstance(zmq_links, PeerLinks)
        zmq_links.close()

        async def unix():
            links = open_peer_links(ctx, "node-0", [("node-1", f"unix://{tmp_path}/p.sock")],
                                    settings)
            assert isinstance(links, UnixPeerLinks)
            links.close()
        asyncio.run(unix())
        with pytest.raises(ValueError, match="every endpoint unix://, or none"):
            open_peer_links(ctx, "node-0", [("node-1", "unix:///a"),
                                            ("node-2", "tcp://127.0.0.1:1")], settings)
    finally:
        ctx.term()
    with pytest.raises(ConfigError, match="'peers': every endpoint unix://"):
        load_settings(env={"SHOAL_PEERS": "node-1=unix:///a,node-2=tcp://127.0.0.1:1"})
