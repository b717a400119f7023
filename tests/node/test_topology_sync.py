"""Read-your-writes across routers (issue 19, wire TOPOLOGY_SYNC): a topology request that
changes the topology is answered only once every other router confirmed it applied the change,
so a client's -ok through one router means every router routes by it."""
from __future__ import annotations

from shoal.shared.wire import DEST_QUEUE, EV_QUEUE_ADDED, T

from node_helpers import Net


def bind(r, exchange: str, queue: str, key: str) -> None:
    r.req_id += 1
    r.send(T.BIND, r.req_id, "/", exchange, DEST_QUEUE, queue, key, {})


def replies(msgs: list[list]) -> list[list]:
    return [m for m in msgs if m[0] == T.REPLY]


def changes(msgs: list[list]) -> list[list]:
    """Without EV_QUEUE_ADDED: a new queue is announced to every router, not synced."""
    return [m for m in msgs if m[0] != T.TOPOLOGY_EVENT or m[1] != EV_QUEUE_ADDED]


def test_a_binding_is_answered_after_the_other_router_synced(net: Net):
    a, b = net.router("ra"), net.router("rb", auto_sync=False)
    assert a.declare("q")[2] == 0
    bind(a, "amq.direct", "q", "k")
    assert replies(a.take()) == []                       # held: rb has not synced yet
    to_b = changes(b.take())
    assert [m[0] for m in to_b] == [T.TOPOLOGY_EVENT, T.TOPOLOGY_SYNC]
    b.send(T.TOPOLOGY_SYNCED, to_b[-1][1])
    [reply] = replies(a.take())
    assert reply[1:4] == [a.req_id, 0, ""]


def test_a_router_that_goes_away_is_not_waited_for(net: Net):
    a, b = net.router("ra"), net.router("rb", auto_sync=False)
    a.declare("q")
    bind(a, "amq.direct", "q", "k")
    assert replies(a.take()) == []
    b.send(T.GOODBYE)
    assert len(replies(a.take())) == 1


def test_one_router_or_no_change_needs_no_sync(net: Net):
    a = net.router("ra")
    a.declare("q")
    bind(a, "amq.direct", "q", "k")
    msgs = changes(a.take())
    assert [m[0] for m in msgs] == [T.TOPOLOGY_EVENT, T.REPLY]   # the event comes first
    b = net.router("rb", auto_sync=False)
    assert a.declare("q2")[2] == 0                 # a queue declare is announced, not synced
    assert [m[:2] for m in b.take()] == [[T.TOPOLOGY_EVENT, EV_QUEUE_ADDED]]
    bind(a, "amq.direct", "q", "k")                      # the same binding again: no change
    assert len(replies(a.take())) == 1 and b.take() == []


def test_a_failed_request_is_answered_at_once(net: Net):
    a, b = net.router("ra"), net.router("rb", auto_sync=False)
    bind(a, "no-such-exchange", "q", "k")
    [reply] = replies(a.take())
    assert reply[2] == 404
    assert b.take() == []
