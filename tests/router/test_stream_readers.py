"""A replicated stream's consumer as the router registers it (router/quorum.py ``read_node``),
sans-IO, on test_quorum_consumers.py's model links: every member serves consumers (node/streams
/readers.py), a member keeps its consumers when the leader changes, and a node whose link is
lost forgets this router's consumers.

Whatever the order of elections, lost and restored links, CONSUMEs and their answers, the
router never has two CONSUMEs of the consumer on their way at once, the client's basic.consume
succeeds, and once things settle the consumer is registered at one member only, the one the
router sends its credit to, which holds exactly the credit the router counts for it. With
every link up it reads from a member that does not lead.
"""
from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings, strategies as st

from shoal.router import quorum
from shoal.router.links.node_link import NodeDown
from shoal.shared.wire import T

from tests.router import test_quorum_consumers as model
from tests.router.test_quorum_consumers import NODES, PREFETCH, QUEUE, VHOST


class Link(model.Link):
    """As the model's, and it can be lost: what waited on it is lost with it, and a request
    sent while it is down fails at once with NodeDown (router/links/node_link.py)."""

    def send(self, msg: list, urgent: bool = False) -> None:
        if self.up:
            super().send(msg, urgent)

    def request(self, msg: list) -> asyncio.Future:
        if self.up:
            return super().request(msg)
        fut = asyncio.get_running_loop().create_future()
        fut.set_exception(NodeDown(self.node_id))
        return fut

    def lose(self) -> None:
        self.up = False
        for _, fut in self.inbox:
            if fut is not None and not fut.done():
                fut.set_exception(NodeDown(self.node_id))
        for item in self.outbox:
            if item[0] == "reply" and not item[1].done():
                item[1].set_exception(NodeDown(self.node_id))
        self.inbox.clear()
        self.outbox.clear()


class Member(model.Node):
    """A stream's member: it serves consumers whether it leads or not, and keeps them when
    the leader changes; it forgets this router's consumers when their link is lost."""

    def take(self) -> None:
        msg, fut = self.link.inbox[0]
        if msg[0] == T.CONSUME:
            self.link.inbox.popleft()
            self.credit[msg[1]] = 0
            self._answer(fut, 0)
            return
        super().take()

    def step_down(self) -> None:
        self.leading = False


class World(model.World):
    def __init__(self) -> None:
        super().__init__()
        b = self.broker
        b.links = {n: Link(n) for n in NODES}
        for link in b.links.values():
            link.sent_consume = b._sent_consume
        self.nodes = {n: Member(n, b.links[n]) for n in NODES}

    def announce(self, node: Member) -> None:
        """A stream's announcement; none over a lost link (``restore`` sends it)."""
        if node.link.up:
            node.link.outbox.append(("leader", [VHOST, QUEUE, node.node_id, self.term, NODES,
                                                NODES, "stream"]))

    def lose(self, i: int) -> None:
        """The link to node ``i`` is lost (router/node_events.py ``node_down``)."""
        node = self.nodes[NODES[i]]
        if not node.link.up:
            return
        node.link.lose()
        node.credit.clear()
        quorum.node_down(self.broker, node.node_id)
        quorum.readers_lost(self.broker, node.node_id)

    def restore(self, i: int) -> None:
        """The link is back (HELLO): a leader announces itself to the router."""
        node = self.nodes[NODES[i]]
        if node.link.up:
            return
        node.link.up = True
        if node.leading:
            self.announce(node)


async def run(ops: list[tuple[str, int]], start_at: int) -> World:
    w = World()
    w.elect(0)                      # the stream is declared: it has a leader, announced
    w.deliver(0)
    for k, (op, i) in enumerate(ops):
        if k == start_at:
            w.task = asyncio.ensure_future(w.start_consume())
        if op in ("elect", "take", "deliver", "lose", "restore"):
            getattr(w, op)(i)
        elif op == "replenish" and w.task is not None and w.task.done():
            w.broker.replenish(w.ch, w.t)
        await asyncio.sleep(0)
    if w.task is None:
        w.task = asyncio.ensure_future(w.start_consume())
    for i in range(len(NODES)):
        w.restore(i)
    await model.settle(w)
    return w


def check(w: World) -> None:
    assert w.broker.most_in_flight == 1
    assert w.task.done() and w.task.exception() is None, w.task.exception()
    holders = [n.node_id for n in w.nodes.values() if 1 in n.credit]
    assert holders == [w.c.node_id]
    assert w.nodes[w.c.node_id].credit[1] == w.c.granted == PREFETCH


OPS = st.lists(st.tuples(st.sampled_from(["elect", "take", "take", "deliver", "deliver",
                                          "replenish", "lose", "restore"]),
                         st.integers(0, len(NODES) - 1)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(ops=OPS, start_at=st.integers(0, 10))
def test_a_stream_consumer_is_registered_once_at_one_member_whatever_the_order(ops, start_at):
    check(asyncio.run(run(ops, start_at)))


def test_a_stream_consumer_reads_from_a_member_that_does_not_lead():
    w = asyncio.run(run([], 0))
    check(w)
    assert not w.nodes[w.c.node_id].leading


@pytest.mark.parametrize("ops", [
    # the lead moves twice while the consumer registers (once to its member): it stays
    [("elect", 1), ("take", 1), ("elect", 2), ("deliver", 1), ("deliver", 2)],
    # its member's link is lost while its CONSUME is on its way, and comes back
    [("take", 1), ("lose", 1), ("restore", 1)],
    # its member's link is lost after it registered there: it moves to another member
    [("deliver", 0), ("take", 2), ("deliver", 2), ("deliver", 2), ("lose", 2)],
    # only the leader is left: it reads there, and stays when the others are back
    [("take", 1), ("take", 2), ("lose", 1), ("lose", 2), ("elect", 0), ("restore", 2)],
])
def test_a_stream_consumer_stays_registered_once_through_leader_changes_and_lost_links(ops):
    check(asyncio.run(run(ops, 0)))


def test_a_consumer_whose_member_is_lost_moves_to_another_and_stays_after_it_is_back():
    async def go() -> World:
        w = await run([], 0)
        first = w.c.node_id
        w.lose(NODES.index(first))
        for _ in range(200):
            for i in range(len(NODES)):
                w.take(i)
                w.deliver(i)
            await asyncio.sleep(0.002)
            if not w.c.registering:
                break
        assert w.c.node_id not in (first, None)
        w.restore(NODES.index(first))
        for _ in range(50):         # its credit reaches the member it moved to
            for i in range(len(NODES)):
                w.take(i)
                w.deliver(i)
            await asyncio.sleep(0)
        return w
    w = asyncio.run(go())
    check(w)
