"""NodeLink batching (router/links/node_link.py): what a node receives when acks and credit are lazy.

A real DEALER link talks to a bound ROUTER socket standing in for the node, so the assertions
are on the wire messages the node would decode.
"""
from __future__ import annotations

import asyncio

import pytest
import zmq

from shoal.router.links.node_link import NodeLink
from shoal.shared import wire
from shoal.shared.wire import T


async def _node_messages(node: zmq.Socket, settle_s: float = 0.05) -> list[list]:
    """Every wire message the stand-in node received within ``settle_s``."""
    await asyncio.sleep(settle_s)
    out = []
    while node.poll(0):
        _, frame = node.recv_multipart()
        out.extend(wire.decode_batch(frame))
    return out


@pytest.fixture
def node_and_link():
    ctx = zmq.Context()
    node = ctx.socket(zmq.ROUTER)
    port = node.bind_to_random_port("tcp://127.0.0.1")
    link = NodeLink(ctx, "node-0", f"tcp://127.0.0.1:{port}", "r1", 1000, 10000,
                    on_message=lambda l, m: None, on_up=lambda l, r: None,
                    on_down=lambda l: None)
    yield node, link
    node.close(linger=0)
    ctx.destroy(linger=0)


def test_lazy_settles_and_credit_reach_the_node_merged(node_and_link):
    node, link = node_and_link

    async def go():
        link.up = True
        for i in range(1, 6):
            link.send_lazy([T.SETTLE, wire.OUTCOME_ACK, [i]])
            link.send_lazy([T.CREDIT, 7, 1, False])
        link.send_lazy([T.SETTLE, wire.OUTCOME_REQUEUE, [9]])
        return await _node_messages(node)

    msgs = asyncio.run(go())
    assert [T.SETTLE, wire.OUTCOME_ACK, [1, 2, 3, 4, 5]] in msgs
    assert [T.SETTLE, wire.OUTCOME_REQUEUE, [9]] in msgs
    assert [m for m in msgs if m[0] == T.CREDIT] == [[T.CREDIT, 7, 5, False]]


def test_lazy_credit_is_not_merged_ahead_of_an_urgent_grant(node_and_link):
    node, link = node_and_link

    async def go():
        link.up = True
        link.send_lazy([T.CREDIT, 7, 1, False])
        link.send([T.CREDIT, 7, 4, True], urgent=True)       # a drain
        link.send_lazy([T.CREDIT, 7, 2, False])               # after the drain, stays after
        link.send_lazy([T.CREDIT, 8, 3, False])
        return await _node_messages(node)

    msgs = [m for m in asyncio.run(go()) if m[0] == T.CREDIT]
    assert msgs == [[T.CREDIT, 7, 1, False], [T.CREDIT, 7, 4, True], [T.CREDIT, 7, 2, False],
                    [T.CREDIT, 8, 3, False]]


def test_lease_records_leave_first_in_order_even_behind_a_backlog(node_and_link):
    """LEASED and LEASE_END (router/lease.py) go ahead of settlements and publishes, and a
    later one never overtakes an earlier one still waiting in a backlog."""
    node, link = node_and_link
    sent: list = []
    accept = [False]

    def send_now(batch):
        if accept[0]:
            sent.extend(batch)
        return accept[0]

    async def go():
        link.up = True
        link._send_now = send_now
        link.send([T.PUBLISH, 0, "/", ["q"], "", "q", b"h", b"p1", None])
        link.send_record([T.LEASED, 1, -1, "", "q", b"h", b"m1", None])
        link._flush()                             # the node is full: nothing leaves
        link.send_lazy([T.SETTLE, wire.OUTCOME_ACK, [-1]])
        link.send_record([T.LEASE_END, 1])
        accept[0] = True
        link._flush()

    asyncio.run(go())
    assert [m[0] for m in sent] == [T.LEASED, T.LEASE_END, T.SETTLE, T.PUBLISH]


def test_acks_before_a_leased_record_leaves_send_one_count_per_consumer_in_its_place(
        node_and_link):
    """router/links/records.py: deliveries acked while their LEASED waits become one
    LEASE_ACKED per consumer, in the place of the first of them acked, and no SETTLE (a
    record's publish id comes back to be confirmed by the router); a record that already
    left is settled as always."""
    node, link = node_and_link
    sent: list = []

    def send_now(batch):
        sent.extend(batch)
        return True

    def leased(cid, did, pid=None):
        rec = [T.LEASED, cid, did, "", "q", b"h", b"m", None]
        link.send_record(rec + [pid] if pid else rec)

    async def go():
        link.up = True
        link._send_now = send_now
        leased(1, -1)
        leased(2, -2)
        leased(1, -3)
        leased(1, -4, pid=9)                      # a confirm the node would answer
        link.send_record([T.LEASE_END, 2, 5])
        leased(1, -5)
        answers = [link.acked_unsent(did) for did in (-3, -5, -2, -4)]
        link._flush()
        return answers + [link.acked_unsent(-1)]  # gone with the batch: settled as always

    assert asyncio.run(go()) == [0, 0, 0, 9, None]
    assert sent == [[T.LEASED, 1, -1, "", "q", b"h", b"m", None],
                    [T.LEASE_ACKED, 2, 1],
                    [T.LEASE_ACKED, 1, 3],
                    [T.LEASE_END, 2, 5]]
