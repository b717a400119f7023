"""The sans-IO Shard: wire messages in, wire messages out (no sockets, no clocks)."""
from __future__ import annotations

from node_helpers import Net, bodies

from shoal.node.peers import EARLY_BATCH, Peers
from shoal.shared.errors import (ACCESS_REFUSED, COMMAND_INVALID, NOT_FOUND,
                                 PRECONDITION_FAILED, RESOURCE_LOCKED, SYNTAX_ERROR)
from shoal.shared.settings import Settings
from shoal.shared.wire import (DEST_QUEUE, EV_BINDING_ADDED, EV_BINDING_REMOVED,
                               EV_EXCHANGE_ADDED, EV_EXCHANGE_REMOVED, EV_QUEUE_REMOVED,
                               OUTCOME_ACK, OUTCOME_REJECT, OUTCOME_REQUEUE, WIRE_VERSION, T)


def events(msgs):
    return [(m[1], m[2]) for m in msgs if m[0] == T.TOPOLOGY_EVENT]


# --- link -----------------------------------------------------------------------------

def test_hello_ok_and_unknown_peer_gets_goodbye(net: Net):
    r = net.router("r1")
    stranger = net.router("r2", hello=False)
    stranger.send(T.QUEUE_PURGE, 1, "/", "q", None)
    assert stranger.take() == [[T.GOODBYE]]
    stranger.send(T.GOODBYE)                    # no GOODBYE ping-pong
    assert stranger.take() == []
    assert r.declare("q")[2] == 0


def test_hello_with_wrong_version_or_node_is_answered_but_not_registered(net: Net):
    r = net.router("r1", hello=False)
    r.send(T.HELLO, WIRE_VERSION + 1, "r1", "node-0")
    assert r.take()[0][0] == T.HELLO_OK
    r.send(T.HELLO, WIRE_VERSION, "r1", "node-7")
    assert r.take()[0][0] == T.HELLO_OK
    r.send(T.HEARTBEAT)
    assert r.take() == [[T.GOODBYE]]


def test_heartbeats_and_router_expiry(net: Net):
    r = net.router("r1")
    net.shard.tick(0)
    net.pump()
    assert r.take() == [[T.HEARTBEAT]]
    net.shard.tick(50)
    net.pump()
    assert r.take() == []
    net.now = 250
    r.send(T.HEARTBEAT)                         # keeps it alive
    net.shard.tick(400)
    assert b"r1" in net.shard.peers
    net.shard.tick(600)
    assert b"r1" not in net.shard.peers


def test_malformed_messages_are_dropped(net: Net):
    r = net.router("r1")
    r.send(T.CREDIT, "x", 1, False)               # wrong type
    r.send(T.SETTLE, 1)                           # wrong count
    r.send(999, 1, 2)                             # unknown tag
    r.send("bogus")
    assert r.take() == []
    r.send(T.QUEUE_DECLARE, 7, "/", "q")          # request: answered with SYNTAX_ERROR
    assert r.take() == [[T.REPLY, 7, SYNTAX_ERROR, "malformed QUEUE_DECLARE message", None]]
    assert r.declare("q")[2] == 0


# --- queue declare / delete / purge -------------------------------------------------

def test_declare_passive_and_counts(net: Net):
    r = net.router()
    assert r.declare("q", passive=True)[2:4] == [NOT_FOUND, "no queue 'q' in vhost '/'"]
    assert r.declare("q")[4] == ["q", 0, 0]
    r.publish("q", b"a")
    r.publish("q", b"b")
    r.consume("q")
    assert r.declare("q", passive=True)[4] == ["q", 2, 1]


def test_declare_inequivalent(net: Net):
    r = net.router()
    r.declare("q1")
    rep = r.declare("q1", durable=True)
    assert rep[2:4] == [PRECONDITION_FAILED, "inequivalent arg 'durable' for queue 'q1' in "
                        "vhost '/': received 'true' but current is 'false'"]
    rep = r.declare("q1", args={"x-max-length": 10})
    assert rep[2] == PRECONDITION_FAILED and "'x-max-length'" in rep[3]
    assert r.declare("q1", args={"other": 1})[2] == 0      # non x- arguments are not compared
    assert r.declare("q1", args={"x-custom": 1})[2] == 0   # nor an application's own x- one


def test_declare_compares_values_by_type_class_as_rabbitmq(net: Net):
    """rabbit_misc assert_args_equivalence: integer types are one class, floats another, so
    x-message-ttl 10.0 is not 10 (the Java client's PerQueueTTL
    ``queueReDeclareSemanticNonEquivalence``); a bool is not 1."""
    r = net.router()
    r.declare("q", args={"x-message-ttl": 10, "x-single-active-consumer": True})
    assert r.declare("q", args={"x-message-ttl": 10, "x-single-active-consumer": True}
                     )[2] == 0
    rep = r.declare("q", args={"x-message-ttl": 10.0, "x-single-active-consumer": True})
    assert rep[2:4] == [PRECONDITION_FAILED, "inequivalent arg 'x-message-ttl' for queue 'q' "
                        "in vhost '/': received '10.0' but current is '10'"]
    assert r.declare("q", args={"x-message-ttl": 10, "x-single-active-consumer": 1}
                     )[2] == PRECONDITION_FAILED


def test_exclusive_queue_is_locked_to_its_owner(net: Net):
    r = net.router()
    r.declare("q1", exclusive=True, owner="r1/c1")
    locked = ("cannot obtain exclusive access to locked queue 'q1' in vhost '/'. It could be "
              "originally declared on another connection or the exclusive property value does "
              "not match that of the original declaration.")
    assert r.declare("q1", exclusive=True, owner="r1/c2")[2:4] == [RESOURCE_LOCKED, locked]
    # RabbitMQ 3.10's strict check: the owner redeclaring it non-exclusive is 405 as well
    assert r.declare("q1", exclusive=False, owner="r1/c1")[2:4] == [RESOURCE_LOCKED, locked]
    assert r.declare("q1", passive=True, owner="r1/c2")[2] == RESOURCE_LOCKED
    assert r.request(T.QUEUE_PURGE, "/", "q1", "r1/c2")[2] == RESOURCE_LOCKED
    assert r.request(T.GET, "/", "q1", False, "r1/c2")[2] == RESOURCE_LOCKED
    assert r.declare("q1", exclusive=True, owner="r1/c1")[2] == 0
    r.send(T.CONNECTION_CLOSED, "r1/c1")
    assert events(r.take()) == [(EV_QUEUE_REMOVED, ["/", "q1"])]
    assert r.declare("q1", passive=True)[2] == NOT_FOUND


def test_delete_if_unused_if_empty_and_idempotent(net: Net):
    r = net.router()
    assert r.ok(T.QUEUE_DELETE, "/", "nope", False, False, None) == [0]
    r.declare("q1")
    r.publish("q1", b"a")
    assert r.request(T.QUEUE_DELETE, "/", "q1", False, True, None)[2:4] == [
        PRECONDITION_FAILED, "queue 'q1' in vhost '/' is not empty"]
    r.consume("q1")
    assert r.request(T.QUEUE_DELETE, "/", "q1", True, False, None)[2:4] == [
        PRECONDITION_FAILED, "queue 'q1' in vhost '/' in use"]


def test_delete_cancels_consumers_and_events_come_before_reply(net: Net):
    r1, r2 = net.router("r1"), net.router("r2")
    r1.declare("q1")
    r1.publish("q1", b"a")
    cid = r2.consume("q1")
    reply = r1.request(T.QUEUE_DELETE, "/", "q1", False, False, None)
    assert reply[2:] == [0, "", [1]]
    assert events(r1.before_reply) == [(EV_QUEUE_REMOVED, ["/", "q1"])]
    msgs = r2.take()
    assert [T.CONSUMER_CANCELLED, cid, "queue deleted"] in msgs
    assert (EV_QUEUE_REMOVED, ["/", "q1"]) in events(msgs)


def test_purge(net: Net):
    r = net.router()
    assert r.request(T.QUEUE_PURGE, "/", "q1", None)[2] == NOT_FOUND
    r.declare("q1")
    for b in (b"a", b"b", b"c"):
        r.publish("q1", b)
    got = r.ok(T.GET, "/", "q1", False, None)
    assert r.ok(T.QUEUE_PURGE, "/", "q1", None) == [2]
    r.send(T.SETTLE, OUTCOME_REQUEUE, [got[0]])
    assert r.declare("q1", passive=True)[4] == ["q1", 1, 0]


# --- publish / consume / credit / settle ----------------------------------------------

def test_publish_result_counts_existing_queues(net: Net):
    r = net.router()
    r.declare("a")
    r.declare("b")
    r.send(T.PUBLISH, 42, "/", ["a", "missing", "b"], "ex", "rk", b"h", b"body", None)
    assert r.take() == [[T.PUBLISH_RESULT, 42, 0, 2]]
    r.send(T.PUBLISH, 0, "/", ["a"], "ex", "rk", b"h", b"body", None)
    assert r.take() == []


def test_deliver_with_credit_never_exceeds_it(net: Net):
    r = net.router()
    r.declare("q")
    cid = r.consume("q")
    for i in range(5):
        r.publish("q", b"m%d" % i)
    assert r.take() == []                                  # credit 0
    msgs = r.credit(cid, 2)
    assert msgs == [[T.DELIVER, cid, 1, False, "ex", "rk", b"hdr", b"m0"],
                    [T.DELIVER, cid, 2, False, "ex", "rk", b"hdr", b"m1"]]
    r.publish("q", b"m5")
    assert r.take() == []
    assert bodies(r.credit(cid, 10)) == [b"m2", b"m3", b"m4", b"m5"]
    r.publish("q", b"m6")
    assert bodies(r.take()) == [b"m6"]


def test_ack_requeue_reject(net: Net):
    r = net.router()
    r.declare("q")
    cid = r.consume("q")
    for i in range(3):
        r.publish("q", b"m%d" % i)
    ids = [m[2] for m in r.credit(cid, 3)]
    r.send(T.SETTLE, OUTCOME_ACK, [ids[0], 12345])       # unknown id ignored
    r.send(T.SETTLE, OUTCOME_REJECT, [ids[2]])
    r.send(T.SETTLE, OUTCOME_REQUEUE, [ids[1]])
    msgs = r.credit(cid, 5)
    assert [(m[2], m[3], m[7]) for m in msgs] == [(ids[1], True, b"m1")]
    r.send(T.SETTLE, OUTCOME_ACK, [ids[1]])
    assert r.declare("q", passive=True)[4] == ["q", 0, 1]


def test_requeue_keeps_order_and_sets_redelivered(net: Net):
    r = net.router()
    r.declare("q")
    cid = r.consume("q")
    for i in range(4):
        r.publish("q", b"m%d" % i)
    ids = [m[2] for m in r.credit(cid, 3)]                # m0 m1 m2 acquired, m3 waits
    r.send(T.SETTLE, OUTCOME_REQUEUE, [ids[2], ids[0]])
    msgs = r.credit(cid, 3)
    assert [(m[7], m[3]) for m in msgs] == [(b"m0", True), (b"m2", True), (b"m3", False)]


def test_cancel_keeps_unacked_and_they_can_be_settled(net: Net):
    r = net.router()
    r.declare("q")
    cid = r.consume("q")
    r.publish("q", b"a")
    (d,) = r.credit(cid, 1)
    assert r.ok(T.CANCEL, cid) is None
    assert r.ok(T.CANCEL, 999) is None                     # unknown consumer: success
    assert r.declare("q", passive=True)[4] == ["q", 0, 0]  # still acquired
    r.send(T.SETTLE, OUTCOME_REQUEUE, [d[2]])
    assert r.declare("q", passive=True)[4] == ["q", 1, 0]


def test_auto_delete_queue_goes_with_last_consumer(net: Net):
    r = net.router()
    r.declare("q", auto_delete=True)
    c1, c2 = r.consume("q"), r.consume("q")
    r.ok(T.CANCEL, c1)
    assert events(r.before_reply) == []
    r.ok(T.CANCEL, c2)
    assert events(r.before_reply) == [(EV_QUEUE_REMOVED, ["/", "q"])]


def test_exclusive_consumer(net: Net):
    r = net.router()
    r.declare("q")
    r.consume("q", exclusive=True)
    text = "queue 'q' in vhost '/' in exclusive use"
    assert r.request(T.CONSUME, 50, "/", "q", "t", False, False, {}, "r1/c1")[2:4] == [
        ACCESS_REFUSED, text]
    r.declare("q2")
    r.consume("q2")
    assert r.request(T.CONSUME, 51, "/", "q2", "t", False, True, {}, "r1/c1")[2] == ACCESS_REFUSED
    assert r.request(T.CONSUME, 52, "/", "nope", "t", False, True, {}, "r1/c1")[2] == NOT_FOUND


def test_consume_answers_how_many_messages_are_available_for_a_fair_start(net: Net):
    """A multi-queue consumer pulls at once from every queue that has messages (seed 002
    DG5): the CONSUME reply says how many are available, acquired ones not counted."""
    r = net.router()
    r.declare("q")
    assert r.ok(T.CONSUME, 60, "/", "q", "t60", False, False, {}, "r1/c1") == 0
    for i in range(3):
        r.publish("q", b"m%d" % i)
    r.take()
    r.credit(60, 1)                           # one of the three acquired by consumer 60
    assert r.ok(T.CONSUME, 61, "/", "q", "t61", False, False, {}, "r1/c1") == 2


def test_drain_returns_unused_credit(net: Net):
    r = net.router()
    r.declare("q")
    cid = r.consume("q")
    r.publish("q", b"a")
    msgs = r.credit(cid, 5, drain=True)
    assert bodies(msgs) == [b"a"]
    assert msgs[-1] == [T.CREDIT_DRAINED, cid, 4]
    r.publish("q", b"b")
    assert r.take() == []                                  # credit is 0 after drain


def test_work_sent_once_until_next_credit(net: Net):
    r = net.router()
    r.declare("q")
    cid = r.consume("q")
    assert r.credit(cid, 0) == []                          # register interest, queue empty
    r.publish("q", b"a")
    assert r.take() == [[T.WORK, cid]]
    r.publish("q", b"b")
    assert r.take() == []                                  # no spurious wake-ups
    assert r.credit(cid, 0) == [[T.WORK, cid]]             # messages wait: told at once
    assert bodies(r.credit(cid, 1)) == [b"a"]


def test_get(net: Net):
    r = net.router()
    assert r.request(T.GET, "/", "q", False, None)[2] == NOT_FOUND
    r.declare("q")
    assert r.ok(T.GET, "/", "q", False, None) is None
    r.publish("q", b"a")
    r.publish("q", b"b")
    got = r.ok(T.GET, "/", "q", False, None)
    assert got[1:] == [False, "ex", "rk", b"hdr", b"a", 1]
    got2 = r.ok(T.GET, "/", "q", True, None)               # no_ack: settled at once
    assert got2[5:] == [b"b", 0]
    r.send(T.SETTLE, OUTCOME_REQUEUE, [got[0], got2[0]])
    again = r.ok(T.GET, "/", "q", False, None)
    assert again[0] == got[0] and again[1] is True and again[6] == 0


def test_router_goodbye_releases_deliveries_and_drops_its_exclusive_queues(net: Net):
    r1, r2 = net.router("r1"), net.router("r2")
    r1.declare("q")
    r1.declare("excl", exclusive=True, owner="r1/c9")
    c1 = r1.consume("q")
    c2 = r2.consume("q")
    for i in range(3):
        r1.publish("q", b"m%d" % i)
    assert bodies(r1.credit(c1, 2)) == [b"m0", b"m1"]
    r1.send(T.GOODBYE)
    msgs = r2.take()
    assert (EV_QUEUE_REMOVED, ["/", "excl"]) in events(msgs)
    got = r2.credit(c2, 10)
    assert [(m[7], m[3]) for m in got] == [(b"m0", True), (b"m1", True), (b"m2", False)]
    assert r2.declare("q", passive=True)[4] == ["q", 0, 1]


def test_router_expiry_releases_deliveries(net: Net):
    r1, r2 = net.router("r1"), net.router("r2")
    r1.declare("q")
    c1 = r1.consume("q")
    r1.publish("q", b"m0")
    assert bodies(r1.credit(c1, 1)) == [b"m0"]
    c2 = r2.consume("q")
    r2.credit(c2, 5)
    net.now = 1000
    r2.send(T.HEARTBEAT)
    net.shard.tick(1000)
    net.pump()
    assert [(m[7], m[3]) for m in r2.take() if m[0] == T.DELIVER] == [(b"m0", True)]


def test_rehello_resets_peer(net: Net):
    r = net.router("r1")
    r.declare("q")
    cid = r.consume("q")
    r.publish("q", b"m0")
    r.credit(cid, 1)
    net.router("r1")                                     # HELLO again (router restarted)
    assert r.declare("q", passive=True)[4] == ["q", 1, 0]


# --- exchanges and bindings -----------------------------------------------------------

def test_exchange_declare_and_events_before_reply(net: Net):
    r1, r2 = net.router("r1"), net.router("r2")
    args = ("/", "x", "direct", False, True, False, False, {})
    assert r1.request(T.EXCHANGE_DECLARE, "/", "x", "direct", True, False, False, False,
                      {})[2:4] == [NOT_FOUND, "no exchange 'x' in vhost '/'"]
    r1.ok(T.EXCHANGE_DECLARE, *args)
    added = (EV_EXCHANGE_ADDED, ["/", "x", "direct", True, False, False, {}])
    assert events(r1.before_reply) == [added]
    assert events(r2.take()) == [added]
    r1.ok(T.EXCHANGE_DECLARE, *args)
    assert events(r1.before_reply) == []                  # no change, no event
    rep = r1.request(T.EXCHANGE_DECLARE, "/", "x", "fanout", False, True, False, False, {})
    assert rep[2:4] == [PRECONDITION_FAILED, "inequivalent arg 'type' for exchange 'x' in "
                        "vhost '/': received 'fanout' but current is 'direct'"]
    # flags arrive as wire ints; the text shows them as RabbitMQ does
    rep = r1.request(T.EXCHANGE_DECLARE, "/", "x", "direct", False, 0, False, False, {})
    assert rep[2:4] == [PRECONDITION_FAILED, "inequivalent arg 'durable' for exchange 'x' in "
                        "vhost '/': received 'false' but current is 'true'"]
    r1.ok(T.EXCHANGE_DECLARE, "/", "amq.direct", "direct", True, True, False, False, {})


def test_bind_unbind_idempotent_and_snapshot(net: Net):
    r = net.router()
    bind = ("/", "x", DEST_QUEUE, "q", "k", {"a": 1})
    assert r.request(T.BIND, *bind)[2:4] == [NOT_FOUND, "no exchange 'x' in vhost '/'"]
    r.ok(T.EXCHANGE_DECLARE, "/", "x", "direct", False, False, False, False, {})
    r.ok(T.BIND, *bind)
    assert events(r.before_reply) == [(EV_BINDING_ADDED, list(bind))]
    r.ok(T.BIND, *bind)
    assert events(r.before_reply) == []
    r.ok(T.BIND, "/", "amq.fanout", DEST_QUEUE, "q", "", {})
    snap = r.ok(T.TOPOLOGY_SNAPSHOT)
    assert snap[2:] == [[], []]     # no queues (bindings need none), no other nodes known
    assert snap[:2] == [[["/", "x", "direct", False, False, False, {}]],
                    [list(bind), ["/", "amq.fanout", DEST_QUEUE, "q", "", {}]]]
    r.ok(T.UNBIND, *bind)
    assert events(r.before_reply) == [(EV_BINDING_REMOVED, list(bind))]
    r.ok(T.UNBIND, *bind)
    assert events(r.before_reply) == []


def test_exchange_delete_if_unused_and_bindings_removed_first(net: Net):
    r = net.router()
    assert r.ok(T.EXCHANGE_DELETE, "/", "missing", False) is None
    r.ok(T.EXCHANGE_DECLARE, "/", "x", "topic", False, False, False, False, {})
    r.ok(T.BIND, "/", "x", DEST_QUEUE, "q", "a.#", {})
    assert r.request(T.EXCHANGE_DELETE, "/", "x", True)[2:4] == [
        PRECONDITION_FAILED, "exchange 'x' in vhost '/' in use"]
    r.ok(T.EXCHANGE_DELETE, "/", "x", False)
    assert [e for e, _ in events(r.before_reply)] == [EV_BINDING_REMOVED, EV_EXCHANGE_REMOVED]


def test_auto_delete_exchange_and_unbind_destination(net: Net):
    r = net.router()
    r.ok(T.EXCHANGE_DECLARE, "/", "ad", "fanout", False, False, True, False, {})
    r.ok(T.BIND, "/", "ad", DEST_QUEUE, "q1", "", {})
    r.ok(T.BIND, "/", "ad", DEST_QUEUE, "q2", "", {})
    r.send(T.UNBIND_DESTINATION, "/", DEST_QUEUE, "q1")
    assert [e for e, _ in events(r.take())] == [EV_BINDING_REMOVED]
    r.ok(T.UNBIND, "/", "ad", DEST_QUEUE, "q2", "", {})
    assert [e for e, _ in events(r.before_reply)] == [EV_BINDING_REMOVED, EV_EXCHANGE_REMOVED]


def test_deleting_queue_drops_local_bindings_to_it(net: Net):
    r = net.router()
    r.declare("q")
    r.ok(T.BIND, "/", "amq.direct", DEST_QUEUE, "q", "q", {})
    r.ok(T.QUEUE_DELETE, "/", "q", False, False, None)
    assert [e for e, _ in events(r.before_reply)] == [EV_BINDING_REMOVED, EV_QUEUE_REMOVED]
    assert r.ok(T.TOPOLOGY_SNAPSHOT) == [[], [], [], []]


def test_a_routers_outbox_is_offered_at_early_batch_and_taken_in_order():
    """Peers.on_full runs when one router's outbox reaches EARLY_BATCH (node/peers.py): the
    node server sends that part at once; what follows waits for the turn's end, in order."""
    peers = Peers("node-0", "inc", Settings(), lambda state: None)
    sent: list[list] = []
    peers.on_full = lambda identity: sent.append(peers.take_box(identity))
    for i in range(2 * EARLY_BATCH + 1):
        peers.send(b"r1", [i])
    peers.send(b"r2", ["other"])
    rest = peers.take_outbox()
    assert sent == [[[i] for i in range(EARLY_BATCH)],
                    [[i] for i in range(EARLY_BATCH, 2 * EARLY_BATCH)]]
    assert rest == {b"r1": [[2 * EARLY_BATCH]], b"r2": [["other"]]}


def test_a_consumer_registered_again_on_its_queue_is_the_same_consumer(net: Net):
    """A quorum queue's consumer follows its leader (router/quorum.py), so one router may send
    the same consumer's CONSUME again (issue 48: it was answered 503 "consumer id 1 already
    in use", which closed the client's connection): it stays one consumer, its credit back
    to 0 as the router's count of it is, and what it holds acquired stays acquired. The same
    consumer id on another queue is still refused."""
    r = net.router()
    r.declare("q")
    r.publish("q", b"m0")
    r.take()
    cid = r.consume("q")
    assert bodies(r.credit(cid, 3)) == [b"m0"]          # 2 credits left
    # one consumer, and m0 still acquired by it (0 available)
    assert r.ok(T.CONSUME, cid, "/", "q", f"ctag{cid}", False, False, {}, "r1/c1") == 0
    assert r.ok(T.QUEUE_DECLARE, "/", "q", True, False, False, False, {}, "r1/c1")[2] == 1
    r.publish("q", b"m1")
    r.publish("q", b"m2")
    assert bodies(r.take()) == []                       # its credit is 0 now
    assert bodies(r.credit(cid, 1)) == [b"m1"]
    r.declare("q2")
    reply = r.request(T.CONSUME, cid, "/", "q2", "t", False, False, {}, "r1/c1")
    assert reply[2:4] == [COMMAND_INVALID, f"consumer id {cid} already in use"]
