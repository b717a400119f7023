"""Queue features through the sans-IO Shard (wire in, wire out): dead letters as REPUBLISH
with x-death, reject-publish results, TTL/x-expires/scheduling/consumer timeouts driven by
tick(now_ms), browsers, selectors, no_local, bad consume arguments."""
from __future__ import annotations

from node_helpers import Net, bodies
from pamqp.commands import Basic

from shoal.node.queues.message import encode_header, parse_properties
from shoal.shared.errors import PRECONDITION_FAILED
from shoal.shared.wire import OUTCOME_REJECT, OUTCOME_RELEASE, OUTCOME_REQUEUE, T


def hdr(**props) -> bytes:
    return encode_header(Basic.Properties(**props), 4)


def pub(r, q, body=b"body", header=b"hdr", seq=0, publisher=None):
    r.send(T.PUBLISH, seq, "/", [q], "ex", "rk", header, body, publisher)


def test_reject_dead_letters_with_x_death(net: Net):
    r = net.router()
    assert r.declare("q", args={"x-dead-letter-exchange": "dlx"})[2] == 0
    cid = r.consume("q")
    pub(r, "q", header=hdr(headers={"a": 1}))
    [d] = [m for m in r.credit(cid, 1) if m[0] == T.DELIVER]
    r.send(T.SETTLE, OUTCOME_REJECT, [d[2]])
    [rp] = r.take_kind(T.REPUBLISH)
    assert rp[1:4] == ["/", "dlx", "rk"] and rp[5] == b"body"
    h = parse_properties(rp[4]).headers
    assert h["a"] == 1 and h["x-death"][0]["reason"] == "rejected"
    assert h["x-death"][0]["queue"] == "q" and h["x-death"][0]["count"] == 1


def test_reject_publish_answers_a_failure_code(net: Net):
    r = net.router()
    r.declare("q", args={"x-max-length": 1, "x-overflow": "reject-publish"})
    pub(r, "q", seq=1)
    pub(r, "q", seq=2)
    results = r.take_kind(T.PUBLISH_RESULT)
    assert results[0] == [T.PUBLISH_RESULT, 1, 0, 1]
    assert results[1][2] != 0 and results[1][3] == 0


def test_a_ttl_of_0_goes_to_a_consumer_as_it_arrives_or_expires_at_once(net: Net):
    """RabbitMQ: TTL 0 is "now or never". A basic.get on the same clock reading as the
    publish found the message (its deadline not yet past); it now expires (dead-lettered
    as expired) when no consumer took it as it arrived."""
    net.now = 1000.0                    # a deadline of 0 ms would read as "never expires"
    r = net.router()
    r.declare("q", args={"x-message-ttl": 0, "x-dead-letter-exchange": "dlx"})
    pub(r, "q")
    pub(r, "q", body=b"own ttl", header=hdr(expiration="0"))
    assert r.ok(T.GET, "/", "q", False, None) is None
    assert [parse_properties(m[4]).headers["x-death"][0]["reason"]
            for m in r.pending if m[0] == T.REPUBLISH] == ["expired", "expired"]
    cid = r.consume("q")
    r.credit(cid, 5)
    pub(r, "q", body=b"taken")
    [d] = [m for m in r.take() if m[0] == T.DELIVER]
    assert d[7] == b"taken"
    net.now += 0.5                                      # the requeue comes later
    r.send(T.SETTLE, OUTCOME_REQUEUE, [d[2]])
    assert bodies(r.take()) == []


def test_ttl_expiry_on_tick_dead_letters(net: Net):
    r = net.router()
    r.declare("q", args={"x-message-ttl": 100, "x-dead-letter-exchange": "dlx"})
    pub(r, "q")
    net.shard.tick(50)
    net.pump()
    assert r.take_kind(T.REPUBLISH) == []
    net.shard.tick(200)
    net.pump()
    [rp] = r.take_kind(T.REPUBLISH)
    assert parse_properties(rp[4]).headers["x-death"][0]["reason"] == "expired"
    assert r.declare("q", args={"x-message-ttl": 100, "x-dead-letter-exchange": "dlx"}
                     )[4][1] == 0


def test_next_due_and_scheduled_delivery(net: Net):
    r = net.router()
    r.declare("q")
    cid = r.consume("q")
    r.credit(cid, 5)
    pub(r, "q", body=b"later", header=hdr(headers={"x-delay": 500}))
    pub(r, "q", body=b"now")
    assert bodies(r.take()) == [b"now"]
    assert net.shard.timers.next_due() == 500
    net.shard.tick(500)
    net.pump()
    assert bodies(r.take()) == [b"later"]


def test_x_expires_deletes_unused_queue(net: Net):
    r = net.router()
    r.declare("q", args={"x-expires": 1000})
    net.now = 999
    r.send(T.HEARTBEAT)                       # keeps the router known
    net.shard.tick(999)
    assert ("/", "q") in net.shard.queues
    net.shard.tick(1000)
    net.pump()
    assert ("/", "q") not in net.shard.queues
    assert any(m[0] == T.TOPOLOGY_EVENT for m in r.take())


def test_a_passive_declare_is_a_use_of_a_queue_with_x_expires(net: Net):
    """RabbitMQ's queue ``stat`` restarts the expiry timer: a passive declare keeps an
    unused queue alive as a redeclare does (the Java client's QueueLease
    ``passiveQueueDeclareExtendsLease``; Shoal let the queue expire)."""
    r = net.router()
    r.declare("q", args={"x-expires": 1000})
    net.now = 750
    assert r.declare("q", passive=True)[2] == 0
    net.shard.tick(1500)
    assert ("/", "q") in net.shard.queues
    net.shard.tick(1750)
    assert ("/", "q") not in net.shard.queues


def test_messages_requeued_past_max_length_drop_from_the_head(net: Net):
    """RabbitMQ's requeue_and_run drops from the head while over x-max-length (drop-head):
    the requeued messages, which stand at the head, go (dead-lettered ``maxlen``) and the
    newer ones stay (the Java client's QueueSizeLimit ``requeue``: Shoal kept all four)."""
    r = net.router()
    r.declare("q", args={"x-max-length": 2, "x-dead-letter-exchange": "dlx"})
    pub(r, "q", body=b"a")
    pub(r, "q", body=b"b")
    got = [r.ok(T.GET, "/", "q", False, None) for _ in range(2)]
    pub(r, "q", body=b"c")
    pub(r, "q", body=b"d")
    r.send(T.SETTLE, OUTCOME_REQUEUE, [g[0] for g in got])
    dead = [m for m in r.take() if m[0] == T.REPUBLISH]
    assert [(m[5], parse_properties(m[4]).headers["x-death"][0]["reason"]) for m in dead] == \
        [(b"a", "maxlen"), (b"b", "maxlen")]
    assert [r.ok(T.GET, "/", "q", True, None)[5] for _ in range(2)] == [b"c", b"d"]
    assert r.ok(T.GET, "/", "q", True, None) is None


def test_consumer_timeout_releases_and_forgets_the_delivery(net: Net):
    r = net.router()
    r.declare("q")
    cid = r.consume("q", args={"x-consumer-timeout": 100})
    pub(r, "q")
    [d1] = [m for m in r.credit(cid, 1) if m[0] == T.DELIVER]
    net.shard.tick(101)
    net.pump()
    r.take()
    redelivered = [m for m in r.credit(cid, 1) if m[0] == T.DELIVER]
    assert not d1[3]
    assert redelivered and redelivered[0][3] is True


def test_browser_does_not_acquire_and_auto_close_cancels(net: Net):
    r = net.router()
    r.declare("q")
    pub(r, "q", body=b"1")
    pub(r, "q", body=b"2")
    cid = r.consume("q", args={"x-filter-no-consume": True, "x-filter-auto-close": True})
    msgs = r.credit(cid, 10)
    assert bodies(msgs) == [b"1", b"2"]
    assert [m for m in msgs if m[0] == T.CONSUMER_CANCELLED][0][1] == cid
    assert net.shard.queues[("/", "q")].message_count == 2


def test_selector_and_no_local(net: Net):
    r = net.router()
    r.declare("q")
    cid = r.consume("q", args={"x-filter-jms-selector": "n > 1", "x-no-local": True},
                    owner="r1/c1")
    pub(r, "q", body=b"n1", header=hdr(headers={"n": 1}))
    pub(r, "q", body=b"mine", header=hdr(headers={"n": 5}), publisher="r1/c1")
    pub(r, "q", body=b"n2", header=hdr(headers={"n": 2}), publisher="r1/c2")
    assert bodies(r.credit(cid, 10)) == [b"n2"]


def test_bad_consume_arguments_are_406(net: Net):
    r = net.router()
    r.declare("q")
    for args, text in [({"x-filter-jms-selector": "a ="}, "position"),
                       ({"x-priority": "high"}, "x-priority"),
                       ({"x-consumer-timeout": -1}, "x-consumer-timeout")]:
        reply = r.request(T.CONSUME, 99, "/", "q", "t", False, False, args, "r1/c1")
        assert reply[2] == PRECONDITION_FAILED and text in reply[3]


def test_delivery_limit_sets_x_delivery_count(net: Net):
    r = net.router()
    r.declare("q", args={"x-delivery-limit": 5})
    cid = r.consume("q")
    pub(r, "q")
    [d1] = [m for m in r.credit(cid, 1) if m[0] == T.DELIVER]
    r.send(T.SETTLE, OUTCOME_REQUEUE, [d1[2]])
    [d2] = [m for m in r.credit(cid, 1) if m[0] == T.DELIVER]
    assert parse_properties(d2[6]).headers["x-delivery-count"] == 1


def test_a_release_is_not_counted_toward_the_delivery_limit(net: Net):
    """AMQP 1.0 released (OUTCOME_RELEASE) requeues without counting a delivery attempt;
    modified delivery-failed (OUTCOME_REQUEUE) counts (OASIS AMQP 1.0 part 3.4)."""
    r = net.router()
    r.declare("q", args={"x-delivery-limit": 1, "x-dead-letter-exchange": "dlx"})
    cid = r.consume("q")
    pub(r, "q")
    for _ in range(3):                      # released three times: still deliverable
        [d] = [m for m in r.credit(cid, 1) if m[0] == T.DELIVER]
        r.send(T.SETTLE, OUTCOME_RELEASE, [d[2]])
    assert r.take_kind(T.REPUBLISH) == []
    [d] = [m for m in r.credit(cid, 1) if m[0] == T.DELIVER]
    r.send(T.SETTLE, OUTCOME_REQUEUE, [d[2]])           # one failed attempt: allowed
    [d] = [m for m in r.credit(cid, 1) if m[0] == T.DELIVER]
    r.send(T.SETTLE, OUTCOME_REQUEUE, [d[2]])           # a second: past the limit
    [rp] = r.take_kind(T.REPUBLISH)
    assert parse_properties(rp[4]).headers["x-death"][0]["reason"] == "delivery_limit"
