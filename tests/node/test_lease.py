"""Delivery leases, the node's side (node/lease.py; docs/consumers.md, "Delivery leases"):
when an empty plain queue's consumers are offered to their router, how the router takes the
offer, what revokes the lease, and what the node does with the router's records."""
from __future__ import annotations

import itertools

import pytest
from node_helpers import Net, bodies

from shoal.node import lease
from shoal.node.lease import HOLD_OFF_MS
from shoal.shared.wire import OUTCOME_ACK, OUTCOME_REQUEUE, T


@pytest.fixture(autouse=True)
def offer_ids(monkeypatch):
    """Each test's offers are numbered from 1 (the node numbers them from 1 per process)."""
    monkeypatch.setattr(lease, "_offers", itertools.count(1))


def lent(leases=True):
    net = Net(leases=leases)
    r = net.router("r1")
    r.declare("q")
    cid = r.consume("q")
    return net, r, cid


def grants(msgs):
    return [m for m in msgs if m[0] == T.LEASE_GRANT]


def lend(r, cid, credit=5):
    """Credit for ``cid``: the node offers the lease, the router takes it. Returns the
    offer's id."""
    (grant,) = r.credit(cid, credit)
    assert grant[:2] == [T.LEASE_GRANT, [cid]]
    r.send(T.LEASE_TAKE, [cid], grant[2])
    assert r.take() == [[T.LEASE_TAKEN, cid, grant[2]]]
    return grant[2]


def offered_to_two():
    """A queue with two consumers on router r1, each given credit: offered to both (offer
    1). Returns the net, the router and the two consumer ids."""
    net = Net(leases=True)
    r = net.router("r1")
    r.declare("q")
    a = r.consume("q")
    b = r.consume("q")
    assert grants(r.credit(a, 5) + r.credit(b, 5)) == [[T.LEASE_GRANT, [a, b], 1]]
    return net, r, a, b


def record(r, cid, did, body, hdr=b"hdr"):
    r.send(T.LEASED, cid, did, "ex", "rk", hdr, body, None)


def test_an_empty_queue_is_offered_when_its_only_consumer_gets_credit_and_lent_when_taken():
    net, r, cid = lent()
    assert r.take() == []
    assert r.credit(cid, 5) == [[T.LEASE_GRANT, [cid], 1]]
    q = net.shard.queues[("/", "q")]
    assert q.lease is None                        # an offer: the node still delivers
    assert r.credit(cid, 5) == []                 # offered once
    r.send(T.LEASE_TAKE, [cid], 1)
    assert r.take() == [[T.LEASE_TAKEN, cid, 1]]
    assert q.lease is not None
    r.send(T.LEASE_TAKE, [cid], 1)                # not offered (any more): still answered
    assert r.take() == [[T.LEASE_REVOKE, cid, 1]]
    assert q.lease is not None                    # (the lease is the router's to end)


def test_publishes_sent_before_the_take_are_delivered_by_the_node_and_the_lease_still_starts():
    """The router's PUBLISHes that crossed the offer reach the node before its TAKE: the node
    delivers them, as without a lease, and lends the queue once it is empty again."""
    net, r, cid = lent()
    assert r.credit(cid, 5) == [[T.LEASE_GRANT, [cid], 1]]
    r.publish("q", b"crossed")
    assert bodies(r.take()) == [b"crossed"]
    r.send(T.LEASE_TAKE, [cid], 1)
    assert r.take() == [[T.LEASE_TAKEN, cid, 1]]


def test_a_take_is_refused_when_the_rule_no_longer_holds():
    net, r, cid = lent()
    assert r.credit(cid, 1) == [[T.LEASE_GRANT, [cid], 1]]
    r.publish("q", b"m1")                         # uses the consumer's last credit
    r.publish("q", b"m2")                         # and waits: the queue is not empty
    assert bodies(r.take()) == [b"m1"]
    r.send(T.LEASE_TAKE, [cid], 1)
    assert r.take() == [[T.LEASE_REVOKE, cid, 1]]
    assert net.shard.queues[("/", "q")].lease is None
    r.send(T.LEASE_END, cid, 1)                   # the router's answer: nothing more happens
    assert r.take() == []


def test_a_declined_offer_is_not_made_again_for_a_while():
    net, r, cid = lent()
    assert r.credit(cid, 5) == [[T.LEASE_GRANT, [cid], 1]]
    r.send(T.LEASE_END, cid, 1)
    assert r.credit(cid, 1) == []
    net.now += HOLD_OFF_MS
    assert r.credit(cid, 1) == [[T.LEASE_GRANT, [cid], 2]]


def test_records_become_acquired_entries_settled_like_deliveries():
    net, r, cid = lent()
    lend(r, cid)
    record(r, cid, -1, b"m1")
    record(r, cid, -2, b"m2")
    assert r.take() == []                         # nothing to deliver: the router did
    assert r.declare("q", passive=True)[4] == ["q", 0, 1]
    peer = net.shard.peers[b"r1"]
    assert sorted(peer.unsettled) == [-2, -1]
    assert peer.consumers[cid].credit == 3
    r.send(T.SETTLE, OUTCOME_ACK, [-1, -2])
    assert peer.unsettled == {}
    q = net.shard.queues[("/", "q")]
    assert q.stats == [2, 2, 2]                   # published, delivered, acked


def test_deliveries_acked_before_their_records_left_are_counted_and_stored_nowhere():
    """LEASE_ACKED (router/links/records.py): what the management API counts is as if their
    LEASEDs and SETTLE had come; the consumer's credit is taken; nothing is stored."""
    net, r, cid = lent()
    lend(r, cid)
    record(r, cid, -1, b"m1")                     # one record that still came
    r.send(T.LEASE_ACKED, cid, 3)
    assert r.take() == []
    peer = net.shard.peers[b"r1"]
    assert sorted(peer.unsettled) == [-1]
    assert peer.consumers[cid].credit == 1
    assert r.declare("q", passive=True)[4] == ["q", 0, 1]
    r.send(T.SETTLE, OUTCOME_ACK, [-1])
    q = net.shard.queues[("/", "q")]
    assert q.stats == [4, 4, 4]
    assert r.declare("q", passive=True)[4] == ["q", 0, 1]
    # a consumer gone, a bad count: nothing counted
    r.send(T.LEASE_ACKED, 99, 2)
    r.send(T.LEASE_ACKED, cid, 0)
    r.send(T.LEASE_ACKED, cid, "x")               # malformed: dropped before its handler
    assert q.stats == [4, 4, 4] and r.take() == []


def test_another_routers_publish_revokes_and_waits_for_lease_end():
    net, r, cid = lent()
    oid = lend(r, cid)
    record(r, cid, -1, b"m1")
    other = net.router("r2")
    other.publish("q", b"m2")
    assert r.take() == [[T.LEASE_REVOKE, cid, oid]]   # no DELIVER while the lease is out
    other.publish("q", b"m3")
    assert r.take() == []                         # revoked once
    record(r, cid, -2, b"m1b")                    # a record already on its way
    r.send(T.LEASE_END, cid, oid)
    assert bodies(r.take()) == [b"m2", b"m3"]
    assert sorted(net.shard.peers[b"r1"].unsettled)[:2] == [-2, -1]


def test_a_second_consumer_revokes():
    net, r, cid = lent()
    oid = lend(r, cid)
    r.consume("q")
    assert r.pending == [[T.LEASE_REVOKE, cid, oid]]  # sent with CONSUME's reply


def test_a_requeued_leased_delivery_revokes_and_comes_back_redelivered():
    net, r, cid = lent()
    oid = lend(r, cid)
    record(r, cid, -1, b"m1")
    r.send(T.SETTLE, OUTCOME_REQUEUE, [-1])
    assert r.take() == [[T.LEASE_REVOKE, cid, oid]]
    r.send(T.LEASE_END, cid, oid)
    (d,) = [m for m in r.take() if m[0] == T.DELIVER]
    assert d[1] == cid and d[3] is True and d[7] == b"m1"


def test_no_new_lease_for_a_while_after_one_ends():
    net, r, cid = lent()
    oid = lend(r, cid)
    r.send(T.LEASE_END, cid, oid)
    assert r.credit(cid, 1) == []                 # held off
    net.now += HOLD_OFF_MS
    assert r.credit(cid, 1) == [[T.LEASE_GRANT, [cid], oid + 1]]


def test_a_lease_returned_for_want_of_credit_is_lent_again_once_the_queue_is_empty():
    """LEASE_END with ``soon`` (its consumers had no credit): the publish behind it is
    delivered by the node, and the queue is offered again as soon as it is empty, with no
    hold-off."""
    net, r, cid = lent()
    oid = lend(r, cid, credit=1)
    record(r, cid, -1, b"a")                      # the lease's one credit is spent
    r.send(T.LEASE_END, cid, oid, True)
    r.publish("q", b"b")                          # waits at the node: no credit
    assert r.take() == []
    out = r.credit(cid, 1)                        # the ack's credit: b is delivered...
    assert [m[0] for m in out] == [T.DELIVER]
    r.send(T.SETTLE, OUTCOME_ACK, [-1, out[0][2]])
    assert r.credit(cid, 1) == [[T.LEASE_GRANT, [cid], oid + 1]]     # ...then lent again


def test_a_queues_consumers_on_one_router_are_lent_together():
    net, r, a, b = offered_to_two()
    r.send(T.LEASE_TAKE, [a, b], 1)
    assert r.take() == [[T.LEASE_TAKEN, a, 1]]
    record(r, a, -1, b"m1")
    record(r, b, -2, b"m2")
    peer = net.shard.peers[b"r1"]
    assert (peer.consumers[a].credit, peer.consumers[b].credit) == (4, 4)
    assert sorted(peer.unsettled) == [-2, -1]
    # one of them leaves: that lease ends, and the other is lent alone (a router that had
    # sent PUBLISHes meanwhile declines: the grant's count)
    r.request(T.CANCEL, a)
    assert grants(r.pending) == [[T.LEASE_GRANT, [b], 2]]
    r.send(T.LEASE_END, b, 2)                     # declined: the node serves it
    assert net.shard.queues[("/", "q")].lease is None
    other = net.router("r2")
    other.publish("q", b"m3")
    assert [(m[1], m[7]) for m in r.take() if m[0] == T.DELIVER] == [(b, b"m3")]


def test_no_lease_for_consumers_on_two_routers_or_of_two_priorities_or_without_credit():
    net = Net(leases=True)
    r, r2 = net.router("r1"), net.router("r2")
    r.declare("q")
    a = r.consume("q")
    b = r2.consume("q")
    assert grants(r.credit(a, 5) + r2.credit(b, 5)) == []
    r.declare("p")
    a = r.consume("p")
    b = r.consume("p", args={"x-priority": 5})
    assert grants(r.credit(a, 5) + r.credit(b, 5)) == []
    r.declare("empty")
    a = r.consume("empty")
    assert grants(r.credit(a, 0)) == []


def test_no_lease_for_a_non_plain_queue_or_a_filter():
    net = Net(leases=True)
    r = net.router("r1")
    for args in ({"x-message-ttl": 1000}, {"x-max-priority": 5}, {"x-max-length": 10},
                 {"x-single-active-consumer": True}):
        name = f"q{len(str(args))}-{next(iter(args))}"
        r.declare(name, args=args)
        c = r.consume(name)
        assert grants(r.credit(c, 5)) == [], args
    r.declare("selective")
    c = r.consume("selective", args={"x-filter-jms-selector": "color = 'red'"})
    assert grants(r.credit(c, 5)) == []


def test_the_setting_turns_leases_off():
    net, r, cid = lent(leases=False)
    assert r.credit(cid, 5) == []
    r.publish("q", b"m1")
    assert bodies(r.take()) == [b"m1"]


def test_cancel_ends_the_lease_and_the_next_consumer_can_have_one():
    net, r, cid = lent()
    oid = lend(r, cid)
    r.request(T.CANCEL, cid)
    assert net.shard.queues[("/", "q")].lease is None
    c2 = r.consume("q")
    net.now += HOLD_OFF_MS
    assert r.credit(c2, 5) == [[T.LEASE_GRANT, [c2], oid + 1]]


def test_a_lost_router_releases_its_leased_deliveries():
    net, r, cid = lent()
    lend(r, cid)
    record(r, cid, -1, b"m1")
    r.send(T.GOODBYE)
    other = net.router("r2")
    c2 = other.consume("q")
    assert bodies(other.credit(c2, 5)) == [b"m1"]


def test_no_ack_records_are_done_at_once_and_bad_records_are_dropped():
    net = Net(leases=True)
    r = net.router("r1")
    r.declare("q")
    cid = r.consume("q", no_ack=True)
    lend(r, cid)
    record(r, cid, -1, b"m1")
    assert net.shard.peers[b"r1"].unsettled == {}
    assert r.declare("q", passive=True)[4] == ["q", 0, 1]
    record(r, 99, -2, b"nobody")                  # unknown consumer
    r.send(T.LEASED, cid, -3, "ex")               # malformed
    r.send(T.LEASE_END, 99, 1)                    # unknown
    assert r.take() == []
    assert r.declare("q", passive=True)[4] == ["q", 0, 1]


def test_a_record_with_a_publish_id_is_answered_as_a_publish_and_a_dropped_one_too():
    net, r, cid = lent()
    lend(r, cid)
    r.send(T.LEASED, cid, -1, "ex", "rk", b"hdr", b"m1", None, 41)
    assert r.take() == [[T.PUBLISH_RESULT, 41, 0, 1]]
    assert r.declare("q", passive=True)[4] == ["q", 0, 1]
    # its consumer gone by the time the record comes: the publisher still gets its answer
    r.send(T.LEASED, 99, -2, "ex", "rk", b"hdr", b"m2", None, 42)
    assert r.take() == [[T.PUBLISH_RESULT, 42, 0, 0]]


def test_an_answer_to_an_older_offer_is_never_taken_for_one_to_a_newer():
    """Found by tests/router_glue/test_lease_schedules.py: the router
    declined an older offer (LEASE_END naming consumer a) and took a newer one naming a too.
    Matched by consumer, the node read the decline as the newer offer's and ignored the TAKE
    (the router held its publishes for good), or started the newer offer's lease on the older
    TAKE and ended it on the router's later decline (a message delivered twice). Offers carry
    ids now, and a TAKE of no standing offer is refused, never left unanswered."""
    net, r, a, b = offered_to_two()
    r.request(T.CANCEL, b)                        # that offer goes; a new one, of [a]
    assert grants(r.pending) == [[T.LEASE_GRANT, [a], 2]]
    r.send(T.LEASE_END, a, 1)                     # the router declines the first...
    r.send(T.LEASE_TAKE, [a], 2)                  # ...and takes the second
    assert r.take() == [[T.LEASE_TAKEN, a, 2]]
    r.send(T.LEASE_TAKE, [a, b], 1)               # a take of an offer no longer standing
    assert r.take() == [[T.LEASE_REVOKE, a, 1]]
    r.send(T.LEASE_END, a, 1)                     # its answer: the lease stands
    assert net.shard.queues[("/", "q")].lease is not None
