"""A request about a quorum queue during a failover (router/quorum.py ``queue_request``),
sans-IO: a basic.get, purge or declare that reaches the router while the queue's leader's
node is down waits for the next leader and is answered there, as RabbitMQ's quorum queue
client sends a command again to the new leader. It was answered 404 "node 'node-0' is down or
unreachable" at once, which closed the client's channel (CI, stop 50)."""
from __future__ import annotations

import asyncio

import pytest

from shoal.router import quorum
from shoal.router.links.node_link import NodeDown
from shoal.shared.wire import T

VHOST, QUEUE = "/", "qq-1"


class Link:
    def __init__(self, node_id: str, up: bool) -> None:
        self.node_id, self.up = node_id, up
        self.incarnation = "the node's" if up else "before it went down"
        self.asked: list[list] = []

    def request(self, msg: list) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.asked.append(msg)
        if self.up:
            fut.set_result(["answered by", self.node_id])
        else:
            fut.set_exception(NodeDown(self.node_id))
        return fut


class Broker:
    """What ``queue_request`` reads of the router's broker."""

    def __init__(self) -> None:
        self.quorum = quorum.QuorumLeaders()
        self.links = {"node-0": Link("node-0", up=False), "node-1": Link("node-1", up=True)}
        self.home = "node-0"
        self.quorum.leaders[(VHOST, QUEUE)] = ["node-0", 1, ["node-0", "node-1"], []]

    def queue_link(self, vhost: str, name: str) -> Link:
        return self.links[self.home]

    def set_queue_node(self, vhost: str, name: str, node: str) -> None:
        self.home = node


def test_a_request_waits_for_the_next_leader_when_the_leaders_node_is_down():
    async def run():
        b = Broker()
        ask = asyncio.ensure_future(quorum.queue_request(b, VHOST, QUEUE, [T.GET, VHOST, QUEUE]))
        await asyncio.sleep(0.01)
        assert not ask.done()                       # waits; no 404 to the client
        b.links["node-0"].asked.clear()
        # the new leader is announced (TOPOLOGY_EVENT EV_QUEUE_LEADER)
        b.quorum.leaders[(VHOST, QUEUE)] = ["node-1", 2, ["node-0", "node-1"], []]
        b.set_queue_node(VHOST, QUEUE, "node-1")
        b.quorum._wake((VHOST, QUEUE))
        return await asyncio.wait_for(ask, 5)

    assert asyncio.run(run()) == ("node-1", ["answered by", "node-1"])


def test_no_leader_within_the_wait_gives_the_node_down_error(monkeypatch):
    monkeypatch.setattr(quorum, "LEADER_WAIT_S", 0.05)

    async def run():
        await quorum.queue_request(Broker(), VHOST, QUEUE, [T.GET, VHOST, QUEUE])

    with pytest.raises(NodeDown) as err:
        asyncio.run(run())
    assert err.value.reply_code == 404


class StartingBroker(Broker):
    """A router just started: it has not reached node-0 yet (``incarnation`` None), and
    knows nothing of the queue's type (no leader announced)."""

    def __init__(self, reached: bool) -> None:
        super().__init__()
        self.quorum.leaders.clear()
        self.links["node-0"].incarnation = "earlier" if reached else None
        self.waited: list[str] = []

    async def await_unseen(self, node: str) -> None:
        self.waited.append(node)
        self.links[node].up = True          # it says HELLO_OK


def test_a_node_not_reached_yet_since_the_router_started_is_waited_for_once():
    """A request right after the router started, to a queue on a node it has not reached
    yet, waits for that node (as a declare does) instead of RabbitMQ's "home node is down"
    404; after a whole cluster's restart that 404 hit quorum queues too (test_quorum)."""
    b = StartingBroker(reached=False)
    got = asyncio.run(quorum.queue_request(b, VHOST, QUEUE, [T.GET, VHOST, QUEUE]))
    assert got == ("node-0", ["answered by", "node-0"]) and b.waited == ["node-0"]


def test_a_node_that_was_reached_and_is_down_is_a_404_at_once():
    b = StartingBroker(reached=True)
    with pytest.raises(Exception) as err:
        asyncio.run(quorum.queue_request(b, VHOST, QUEUE, [T.GET, VHOST, QUEUE]))
    assert err.value.reply_code == 404 and "home node 'node-0'" in err.value.reply_text
    assert b.waited == []
