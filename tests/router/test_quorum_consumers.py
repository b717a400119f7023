"""A quorum queue's consumer as the router registers it (router/quorum.py), sans-IO: model
nodes, links that hold each message until the test lets it through, and leader elections in
any order against the router's CONSUMEs, MOVED answers and announcements (issue 48).

Credit that reached a node before the consumer's CONSUME was dropped there and counted as
granted by the router, which left the consumer subscribed and stalled (the fault campaign's
liveness notes, issue 43): the model's links let urgent credit overtake unsent requests, as
the real one does, and the model node drops credit for a consumer it does not have.

Whatever the order, the router never has two CONSUMEs of one consumer on their way at once
(both were answered, and the second made the node close the connection with 503 "consumer id
N already in use"), the client's basic.consume succeeds, and once things settle the consumer
is registered at the leader, only there, holding exactly the credit the router counts for it.
The model node treats a consumer registered again as node/messages.py ``on_consume`` does:
the same consumer, its credit back to 0.
"""
from __future__ import annotations

import asyncio
from collections import deque

import pytest
from hypothesis import given, settings, strategies as st

from shoal.router import consumers as credit
from shoal.router import quorum
from shoal.router.consumers import Consumer, ConsumerTarget, CreditPool
from shoal.shared import wire
from shoal.shared.errors import AMQPError, soft_error
from shoal.shared.wire import T

NODES = ["node-0", "node-1", "node-2"]
VHOST, QUEUE = "/", "qq-1"
PREFETCH = 10


class Leaders(quorum.QuorumLeaders):
    """As the router's, with its one-second waits made short (the test drives the order)."""

    async def changed(self, vhost: str, name: str, timeout: float) -> None:
        await super().changed(vhost, name, timeout / 100)


class Link:
    """The router's link to one node: what it sent waits in ``inbox`` until the test lets the
    node take it; what the node answered waits in ``outbox`` (one FIFO each way, as a link)."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.up = True
        self.inbox: deque = deque()     # (message, future or None)
        self.outbox: deque = deque()    # ("reply", future, payload or AMQPError) / ("leader", data)

    def send(self, msg: list, urgent: bool = False) -> None:
        """As router/links/node_link.py's: an urgent message (a starved consumer's credit)
        goes ahead of what waits unsent, requests included."""
        if urgent:
            self.inbox.appendleft((msg, None))
        else:
            self.inbox.append((msg, None))

    def send_lazy(self, msg: list) -> None:
        self.inbox.append((msg, None))

    def request(self, msg: list) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.inbox.append((msg, fut))
        if msg[0] == T.CONSUME:
            self.sent_consume(fut)
        return fut

    def sent_consume(self, fut: asyncio.Future) -> None:
        pass


class Node:
    """A node as the wire contract says, for CONSUME, CANCEL and CREDIT of one quorum queue."""

    def __init__(self, node_id: str, link: Link) -> None:
        self.node_id, self.link = node_id, link
        self.leading = False
        self.term = 0
        self.credit: dict[int, int] = {}    # registered consumer id -> credit

    def take(self) -> None:
        msg, fut = self.link.inbox.popleft()
        tag = msg[0]
        if tag == T.CONSUME:
            cid = msg[1]
            if not self.leading:
                self._answer(fut, soft_error(wire.MOVED, f"not the leader: {self.node_id}"))
            else:
                self.credit[cid] = 0
                self._answer(fut, 0)
        elif tag == T.CANCEL:
            self.credit.pop(msg[2] if fut is None else msg[1], None)
            self._answer(fut, None)
        elif tag == wire.TAG_CREDIT:
            if msg[1] in self.credit:
                self.credit[msg[1]] += msg[2]

    def _answer(self, fut, payload) -> None:
        if fut is not None:
            self.link.outbox.append(("reply", fut, payload))

    def step_down(self) -> None:
        """node/replication/manager.py ``stopped_leading``: its consumers go."""
        self.leading = False
        self.credit.clear()


class Broker:
    """What router/quorum.py uses of router/broker.py's Broker."""

    def __init__(self) -> None:
        self.quorum = Leaders()
        self.links = {n: Link(n) for n in NODES}
        for link in self.links.values():
            link.sent_consume = self._sent_consume
        self.consumers: dict[int, tuple] = {}
        self.publishes: dict = {}
        self.placement: dict = {}
        self.in_flight = 0          # CONSUMEs sent and not answered yet
        self.most_in_flight = 0

    def _sent_consume(self, fut: asyncio.Future) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)

        def answered(_):
            self.in_flight -= 1
        fut.add_done_callback(answered)

    def set_queue_node(self, vhost: str, name: str, node: str) -> None:
        self.placement[(vhost, name)] = node

    def queue_link(self, vhost: str, name: str) -> Link:
        return self.links[self.placement.get((vhost, name), NODES[0])]

    def replenish(self, ch, t) -> None:
        """As router/broker.py's: credit for a starved consumer is sent urgent."""
        for c, msg in credit.credit_messages(ch.pool, t):
            self.links[c.node_id].send(msg, urgent=c.granted <= msg[2])

    def mark_dirty(self, client) -> None:
        pass


class Channel:
    vhost = VHOST
    closed = False
    client = None

    def __init__(self) -> None:
        self.pool = CreditPool(prefetch_count=PREFETCH)
        self.unacked: dict = {}


class World:
    def __init__(self) -> None:
        self.broker = Broker()
        self.nodes = {n: Node(n, self.broker.links[n]) for n in NODES}
        self.term = 0
        self.ch = Channel()
        self.t = ConsumerTarget("ctag", 1, VHOST, False, registered=False)
        self.c = Consumer(1, QUEUE, self.broker.queue_link(VHOST, QUEUE).node_id, self.t)
        self.t.consumers.append(self.c)
        self.ch.pool.targets["ctag"] = self.t
        self.broker.consumers[1] = (self.ch, self.c)
        self.task: asyncio.Task | None = None

    async def start_consume(self) -> None:
        """router/frontend/channel.py ``Channel.consume`` then basic.consume-ok's replenish."""
        self.c.request = [T.CONSUME, 1, VHOST, QUEUE, "ctag", False, False, {}, "owner"]
        node, payload = await quorum.consume(self.broker, VHOST, self.c)
        credit.on_registered(self.t, [payload])
        self.broker.replenish(self.ch, self.t)

    def elect(self, i: int) -> None:
        """Node ``i`` wins a new term; the leader before it stepped down first."""
        self.term += 1
        for n in self.nodes.values():
            if n.leading:
                n.step_down()
        node = self.nodes[NODES[i]]
        node.leading = True
        self.announce(node)

    def announce(self, node: Node) -> None:
        """The leader's EV_QUEUE_LEADER, on its way to the router."""
        node.link.outbox.append(("leader", [VHOST, QUEUE, node.node_id, self.term, NODES,
                                            NODES]))

    def deliver(self, i: int) -> bool:
        """The router reads the next message from node ``i``."""
        link = self.broker.links[NODES[i]]
        if not link.outbox:
            return False
        item = link.outbox.popleft()
        if item[0] == "leader":
            quorum.on_leader(self.broker, item[1])
        elif isinstance(item[2], AMQPError):
            item[1].set_exception(item[2])
        else:
            item[1].set_result(item[2])
        return True

    def take(self, i: int) -> bool:
        node = self.nodes[NODES[i]]
        if not node.link.inbox:
            return False
        node.take()
        return True


async def run(ops: list[tuple[str, int]], start_at: int) -> World:
    w = World()
    for k, (op, i) in enumerate(ops):
        if k == start_at:
            w.task = asyncio.ensure_future(w.start_consume())
        if op == "elect":
            w.elect(i)
        elif op == "take":
            w.take(i)
        elif op == "deliver":
            w.deliver(i)
        elif op == "replenish" and w.task is not None and w.task.done():
            # anything that frees credit (an ack, WORK, the socket draining) asks for more
            w.broker.replenish(w.ch, w.t)
        await asyncio.sleep(0)
    if w.task is None:
        w.task = asyncio.ensure_future(w.start_consume())
    if not any(n.leading for n in w.nodes.values()):
        w.elect(0)
    await settle(w)
    return w


async def settle(w: World) -> None:
    """Until everything sent is taken and answered, and the consumer is registered."""
    for _ in range(2000):
        moved = False
        for i in range(len(NODES)):
            moved |= w.take(i) | w.deliver(i)
        await asyncio.sleep(0 if moved else 0.002)
        if not moved and w.task.done() and not w.c.registering:
            break


def check(w: World) -> None:
    assert w.broker.most_in_flight == 1
    assert w.task.done() and w.task.exception() is None, w.task.exception()
    leader = next(n for n in w.nodes.values() if n.leading)
    assert w.c.node_id == leader.node_id
    assert [n.node_id for n in w.nodes.values() if 1 in n.credit] == [leader.node_id]
    assert leader.credit[1] == w.c.granted == PREFETCH


OPS = st.lists(st.tuples(st.sampled_from(["elect", "take", "take", "deliver", "deliver",
                                          "replenish"]),
                         st.integers(0, len(NODES) - 1)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(ops=OPS, start_at=st.integers(0, 40))
def test_a_quorum_consumer_is_registered_once_at_the_leader_whatever_the_order(ops, start_at):
    check(asyncio.run(run(ops, start_at)))


@pytest.mark.parametrize("ops", [
    # issue 43's liveness notes: credit asked for while the consumer moves to its new leader
    # overtakes the CONSUME there and is dropped, but counted as granted
    # (the consume starts after the first op: a replenish before it is a no-op)
    [("replenish", 0), ("elect", 0), ("deliver", 0), ("take", 0), ("deliver", 0), ("take", 0),
     ("deliver", 0), ("take", 0), ("elect", 1), ("deliver", 1), ("replenish", 0),
     ("take", 1), ("take", 1), ("deliver", 1)],
    # issue 48: the first CONSUME reaches node-0, which does not lead (MOVED); node-1 is
    # announced while the MOVED is on its way, and both the announcement and the retry after
    # MOVED registered the consumer at node-1
    [("elect", 1), ("take", 0), ("deliver", 1), ("deliver", 0), ("take", 1), ("deliver", 1),
     ("take", 1), ("deliver", 1)],
    # the first CONSUME is answered by the leader, whose announcement reaches the router
    # before the answer's coroutine ran
    [("elect", 0), ("take", 0), ("deliver", 0), ("deliver", 0), ("take", 0), ("deliver", 0)],
    # the leader changes twice while the consumer is being moved
    [("elect", 0), ("take", 0), ("deliver", 0), ("deliver", 0), ("elect", 1), ("deliver", 1),
     ("elect", 2), ("take", 1), ("deliver", 2), ("take", 2), ("deliver", 1), ("deliver", 2)],
])
def test_the_orderings_that_registered_a_consumer_twice_or_stalled_it(ops):
    check(asyncio.run(run(ops, 1)))
