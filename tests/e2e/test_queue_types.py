"""Queue types and declare arguments with real clients (issue 3): priority, sorted and
last-value queues; TTL, x-expires, overflow, dead-lettering, alternate exchanges, delivery
limits, scheduled delivery and bad arguments. Consumer-side rules are in test_q_consumers.py.

Scenarios that only need declare/publish/get run with every client (the ``make_client``
adapters); waits poll until a condition holds (never asserting how long something took).
"""
from __future__ import annotations

import time

import pytest

from .clients import BrokerError, Nacked
from .conftest import QUEUE_TYPE

pytestmark = pytest.mark.e2e


def drain(c, queue: str, limit: int = 100) -> list:
    """basic.get (acking) until the queue is empty; the deliveries."""
    out = []
    for _ in range(limit):
        d = c.get(queue, no_ack=True)
        if d is None:
            break
        out.append(d)
    return out


def wait_until(fn, timeout: float = 10.0):
    """Poll ``fn`` until it returns something truthy; return it (AssertionError after
    ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.05)


# ---- queue types ------------------------------------------------------------------------
@pytest.mark.parametrize("arg", [{"x-max-priority": 10}, {"x-qpid-priorities": 10}])
def test_priority_queue_highest_first_fifo_within(make_client, names, arg):
    c = make_client(confirms=True)
    q = names("prio")
    c.declare_queue(q, arguments=arg)
    for body, prio in [(b"a1", 1), (b"b5", 5), (b"c9", 9), (b"d5", 5), (b"f0", 0)]:
        c.publish("", q, body, {"priority": prio})
    assert [d.body for d in drain(c, q)] == [b"c9", b"b5", b"d5", b"a1", b"f0"]


@pytest.mark.parametrize("arg, order", [
    # RabbitMQ: a message without a priority property ranks as 0 on an x-max-priority queue
    ({"x-max-priority": 9}, [b"p5", b"p3", b"none"]),
    # Qpid (JMS): it ranks as 4, the JMS default, on an x-qpid-priorities queue
    ({"x-qpid-priorities": 10}, [b"p5", b"none", b"p3"]),
])
def test_priority_default_for_a_message_without_one(make_client, names, arg, order):
    c = make_client(confirms=True, kind_="pika")    # aio-pika always sends a priority (0)
    q = names("prio")
    c.declare_queue(q, arguments=arg)
    for body, prio in [(b"p3", 3), (b"none", None), (b"p5", 5)]:
        c.publish("", q, body, {"priority": prio} if prio is not None else None)
    assert [d.body for d in drain(c, q)] == order


def test_priority_above_max_counts_as_max(make_client, names):
    c = make_client(confirms=True)
    q = names("prio")
    c.declare_queue(q, arguments={"x-max-priority": 3})
    for body, prio in [(b"a", 3), (b"b", 200), (b"c", 2)]:
        c.publish("", q, body, {"priority": prio})
    assert [d.body for d in drain(c, q)] == [b"a", b"b", b"c"]


def test_sorted_queue_orders_by_header_and_keyless_last(make_client, names):
    c = make_client(confirms=True)
    q = names("sorted")
    c.declare_queue(q, arguments={"qpid.queue_sort_key": "k"})
    for body, k in [(b"c", "c"), (b"none", None), (b"a", "a"), (b"b", "b"), (b"a2", "a")]:
        c.publish("", q, body, {"headers": {"k": k}} if k else None)
    assert [d.body for d in drain(c, q)] == [b"a", b"a2", b"b", b"c", b"none"]


@pytest.mark.parametrize("arg,key", [({"qpid.last_value_queue_key": "sym"}, "sym"),
                                     ({"qpid.last_value_queue": True}, "qpid.LVQ_key")])
def test_last_value_queue_replaces_by_key(make_client, names, arg, key):
    c = make_client(confirms=True)
    q = names("lvq")
    c.declare_queue(q, arguments=arg)
    c.publish("", q, b"IBM 1", {"headers": {key: "IBM"}})
    c.publish("", q, b"MSFT 1", {"headers": {key: "MSFT"}})
    c.publish("", q, b"no key", None)
    c.publish("", q, b"IBM 2", {"headers": {key: "IBM"}})
    assert c.declare_queue(q, passive=True)[1] == 3
    assert [d.body for d in drain(c, q)] == [b"MSFT 1", b"no key", b"IBM 2"]


def test_last_value_queue_keeps_an_acquired_older_message(make_client, names):
    c = make_client(confirms=True)
    q = names("lvq")
    c.declare_queue(q, arguments={"qpid.last_value_queue_key": "sym"})
    c.publish("", q, b"v1", {"headers": {"sym": "X"}})
    held = c.get(q)                       # acquired, not acked
    assert held.body == b"v1"
    c.publish("", q, b"v2", {"headers": {"sym": "X"}})
    c.reject(held, requeue=True)          # both exist now
    assert sorted(d.body for d in drain(c, q)) == [b"v1", b"v2"]


# ---- bad arguments ------------------------------------------------------------------------
@pytest.mark.parametrize("args,text", [
    ({"x-max-priority": 10, "qpid.queue_sort_key": "k"}, "cannot be both"),
    ({"qpid.last_value_queue_key": "k", "x-qpid-priorities": 5}, "cannot be both"),
    ({"x-max-priority": 0}, "x-max-priority"),
    ({"x-max-priority": 300}, "x-max-priority"),
    ({"x-message-ttl": -1}, "x-message-ttl"),
    ({"x-message-ttl": "soon"}, "x-message-ttl"),
    ({"x-expires": 0}, "x-expires"),
    ({"x-overflow": "explode"}, "x-overflow"),
    ({"x-max-length": -5}, "x-max-length"),
    ({"x-dead-letter-routing-key": "k"}, "needs x-dead-letter-exchange"),
    ({"x-delivery-limit": -1}, "x-delivery-limit"),
    ({"x-consumer-timeout": 0}, "x-consumer-timeout"),
    ({"qpid.shared_msg_group": 1}, "needs qpid.group_header_key"),
    ({"x-single-active-consumer": "maybe"}, "x-single-active-consumer"),
])
def test_bad_queue_arguments_get_406_with_a_clear_text(make_client, names, args, text):
    if QUEUE_TYPE == "quorum" and args == {"x-delivery-limit": -1}:
        pytest.skip("on a quorum queue x-delivery-limit -1 is no limit (RabbitMQ 4; 3.10 "
                    "accepts any value there)")
    c = make_client()
    q = names("bad")
    with pytest.raises(BrokerError) as e:
        c.declare_queue(q, arguments=args)
    assert e.value.code == 406 and not e.value.hard
    assert text in e.value.text
    c.reopen()
    with pytest.raises(BrokerError) as e:          # nothing was created
        c.declare_queue(q, passive=True)
    assert e.value.code == 404


# ---- TTL and x-expires --------------------------------------------------------------------
def test_queue_ttl_expires_messages(make_client, names):
    c = make_client(confirms=True)
    q = names("ttl")
    c.declare_queue(q, arguments={"x-message-ttl": 50})
    c.publish("", q, b"old")
    wait_until(lambda: c.declare_queue(q, passive=True)[1] == 0)
    assert c.get(q) is None
    c.publish("", q, b"young")
    d = c.get(q, no_ack=True)
    assert d is None or d.body == b"young"


def test_a_ttl_of_0_is_delivered_at_once_or_not_at_all(make_client, names):
    """RabbitMQ: a message whose TTL is 0 goes to a consumer that can take it as it arrives,
    else it expires at once: a basic.get right after the publish (no confirm, so the two may
    reach the node together) finds nothing, and a delivery given back expires (the Java
    client's TTLHandling ``zeroTTLDelivery``)."""
    if QUEUE_TYPE == "quorum":
        pytest.skip("a quorum queue's leader expires a TTL of 0 on its timer, 1 ms on "
                    "(docs/queues.md)")
    c = make_client()
    q = names("ttl0")
    c.declare_queue(q, arguments={"x-message-ttl": 0})
    c.publish("", q, b"nobody waits")
    c.publish("", q, b"nor here", {"expiration": "0"})
    assert c.get(q) is None
    consumer = make_client()
    consumer.consume(q)
    c.publish("", q, b"taken")
    d = consumer.wait_for(1)[0]
    assert d.body == b"taken"
    consumer.reject(d, requeue=True)
    assert len(consumer.settle_quietly(1.0)) == 1, "a TTL-0 message given back came again"
    assert c.get(q) is None


def test_expired_message_in_the_middle_is_never_delivered(make_client, names):
    c = make_client(confirms=True)
    q = names("ttl")
    c.declare_queue(q)
    c.publish("", q, b"first")
    c.publish("", q, b"short", {"expiration": "30"})
    c.publish("", q, b"last")
    head = c.get(q)                 # "first" stays acquired: "short" is not at the head
    assert head.body == b"first"
    wait_until(lambda: c.declare_queue(q, passive=True)[1] == 1)
    assert [d.body for d in drain(c, q)] == [b"last"]


def test_queue_with_x_expires_is_deleted_when_unused(make_client, names):
    c = make_client()
    q = names("expires")
    c.declare_queue(q, arguments={"x-expires": 100})

    def gone():
        time.sleep(0.3)     # a passive declare is a use too (RabbitMQ's stat): look seldom
        try:
            c.declare_queue(q, passive=True)
            return False
        except BrokerError as e:
            c.reopen()
            return e.code == 404
    wait_until(gone)


# ---- overflow -------------------------------------------------------------------------------
def test_max_length_drop_head(make_client, names):
    c = make_client(confirms=True)
    q = names("maxlen")
    c.declare_queue(q, arguments={"x-max-length": 2})
    for b in (b"1", b"2", b"3"):
        c.publish("", q, b)
    assert [d.body for d in drain(c, q)] == [b"2", b"3"]


def test_qpid_ring_policy_is_drop_head(make_client, names):
    c = make_client(confirms=True)
    q = names("ring")
    c.declare_queue(q, arguments={"qpid.max_count": 1, "qpid.policy_type": "ring"})
    c.publish("", q, b"1")
    c.publish("", q, b"2")
    assert [d.body for d in drain(c, q)] == [b"2"]


def test_max_length_bytes_drop_head(make_client, names):
    c = make_client(confirms=True)
    q = names("maxbytes")
    c.declare_queue(q, arguments={"x-max-length-bytes": 10})
    for b in (b"aaaa", b"bbbb", b"cccc"):
        c.publish("", q, b)
    assert [d.body for d in drain(c, q)] == [b"bbbb", b"cccc"]


def test_reject_publish_nacks_confirming_publishers(make_client, names):
    c = make_client(confirms=True)
    q = names("reject")
    c.declare_queue(q, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    c.publish("", q, b"1")
    with pytest.raises(Nacked):
        c.publish("", q, b"2")
    assert [d.body for d in drain(c, q)] == [b"1"]
    c.publish("", q, b"3")                  # room again
    assert [d.body for d in drain(c, q)] == [b"3"]


# ---- dead-lettering -------------------------------------------------------------------------
def dlx_pair(c, names, **qargs):
    """A queue whose dead letters go (via a fanout exchange) to a second queue."""
    dlx, q, dlq = names("dlx"), names("src"), names("dlq")
    c.declare_exchange(dlx, "fanout")
    c.declare_queue(dlq)
    c.bind_queue(dlq, dlx)
    c.declare_queue(q, arguments={"x-dead-letter-exchange": dlx, **qargs})
    return q, dlq, dlx


def test_rejected_message_is_dead_lettered_with_x_death(make_client, names):
    c = make_client(confirms=True)
    q, dlq, dlx = dlx_pair(c, names)
    c.publish("", q, b"bad", {"headers": {"app": "x"}})
    c.reject(c.get(q), requeue=False)
    d = wait_until(lambda: c.get(dlq, no_ack=True))
    assert d.body == b"bad"
    h = d.props["headers"]
    assert h["app"] == "x"
    death = h["x-death"][0]
    assert death["reason"] == "rejected" and death["queue"] == q and death["count"] == 1
    assert death["exchange"] == "" and death["routing-keys"] == [q]
    assert h["x-first-death-reason"] == "rejected" and h["x-first-death-queue"] == q


def test_expired_message_is_dead_lettered_with_routing_key(make_client, names):
    c = make_client(confirms=True)
    dlx, q, dlq = names("dlx"), names("src"), names("dlq")
    c.declare_exchange(dlx, "direct")
    c.declare_queue(dlq)
    c.bind_queue(dlq, dlx, "expired-ones")
    c.declare_queue(q, arguments={"x-dead-letter-exchange": dlx, "x-message-ttl": 20,
                                  "x-dead-letter-routing-key": "expired-ones"})
    c.publish("", q, b"late", {"expiration": "10000"})
    d = wait_until(lambda: c.get(dlq, no_ack=True))
    death = d.props["headers"]["x-death"][0]
    assert death["reason"] == "expired" and death["original-expiration"] == "10000"
    assert "expiration" not in d.props          # the copy does not expire again


def test_drop_head_and_reject_publish_dlx_dead_letter_with_maxlen(make_client, names):
    c = make_client(confirms=True)
    q, dlq, _ = dlx_pair(c, names, **{"x-max-length": 1})
    c.publish("", q, b"1")
    c.publish("", q, b"2")
    d = wait_until(lambda: c.get(dlq, no_ack=True))
    assert d.body == b"1" and d.props["headers"]["x-death"][0]["reason"] == "maxlen"
    q2, dlq2, _ = dlx_pair(c, names, **{"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    c.publish("", q2, b"1")
    if QUEUE_TYPE == "quorum":
        # RabbitMQ's quorum queues accept reject-publish-dlx and apply drop-head, logging
        # "Invalid overflow strategy" (rabbit_quorum_queue:overflow/3)
        c.publish("", q2, b"2")
        d = wait_until(lambda: c.get(dlq2, no_ack=True))
        assert d.body == b"1" and d.props["headers"]["x-death"][0]["reason"] == "maxlen"
        return
    with pytest.raises(Nacked):
        c.publish("", q2, b"2")
    d = wait_until(lambda: c.get(dlq2, no_ack=True))
    assert d.body == b"2" and d.props["headers"]["x-death"][0]["reason"] == "maxlen"


def test_alternate_exchange_receives_unroutable_messages(make_client, names):
    c = make_client(confirms=True)
    ae, ex, q, other = names("ae"), names("ex"), names("aeq"), names("q")
    c.declare_exchange(ae, "fanout")
    c.declare_queue(q)
    c.bind_queue(q, ae)
    c.declare_exchange(ex, "direct", arguments={"alternate-exchange": ae})
    c.declare_queue(other)
    c.bind_queue(other, ex, "known")
    c.publish(ex, "known", b"routed")
    c.publish(ex, "unknown", b"lost?")
    assert [d.body for d in drain(c, other)] == [b"routed"]
    assert [d.body for d in drain(c, q)] == [b"lost?"]


def test_delivery_limit_counts_and_dead_letters(make_client, names):
    c = make_client(confirms=True)
    q, dlq, _ = dlx_pair(c, names, **{"x-delivery-limit": 1})
    c.publish("", q, b"poison")
    d1 = c.get(q)
    assert "x-delivery-count" not in d1.props.get("headers", {})
    c.reject(d1, requeue=True)
    d2 = c.get(q)
    assert d2.redelivered and d2.props["headers"]["x-delivery-count"] == 1
    c.reject(d2, requeue=True)             # returned twice > limit 1: dead-lettered
    d = wait_until(lambda: c.get(dlq, no_ack=True))
    assert d.body == b"poison"
    assert d.props["headers"]["x-death"][0]["reason"] == "delivery_limit"
    assert c.get(q) is None


def test_qpid_maximum_delivery_count(make_client, names):
    c = make_client(confirms=True)
    q, dlq, _ = dlx_pair(c, names, **{"x-qpid-maximum-delivery-count": 2})
    c.publish("", q, b"m")
    c.reject(c.get(q), requeue=True)
    c.reject(c.get(q), requeue=True)       # delivered twice: the maximum
    assert wait_until(lambda: c.get(dlq, no_ack=True)).body == b"m"


# ---- scheduled delivery ----------------------------------------------------------------------
def test_x_delay_holds_a_message_in_place(make_client, names):
    c = make_client(confirms=True)
    q = names("delay")
    c.declare_queue(q)
    c.publish("", q, b"later", {"headers": {"x-delay": 300}})
    c.publish("", q, b"now")
    first = c.get(q, no_ack=True)
    assert first.body == b"now"            # held: invisible, not counted
    d = wait_until(lambda: c.get(q, no_ack=True))
    assert d.body == b"later"


def test_qpid_not_valid_before(make_client, names):
    c = make_client(confirms=True)
    q = names("nvb")
    c.declare_queue(q)
    at = int(time.time() * 1000) + 300
    c.publish("", q, b"scheduled", {"headers": {"x-qpid-not-valid-before": at}})
    c.publish("", q, b"now")
    assert c.get(q, no_ack=True).body == b"now"
    assert wait_until(lambda: c.get(q, no_ack=True)).body == b"scheduled"
    assert time.time() * 1000 >= at - 50      # never before its time (clock slack)


# ---- x-queue-type (docs/queues.md, "Queue types") --------------------------------------------
def test_an_unknown_queue_type_is_refused_as_rabbitmq_refuses_it(cluster):
    """A type Shoal does not have is refused with RabbitMQ 3.10's 406 and text for an
    unsupported type, and nothing is created; ``quorum`` and ``stream`` are accepted
    (streams: tests/e2e/test_streams.py)."""
    import uuid

    import pika
    import pika.exceptions

    name = f"e2e-qtype-{uuid.uuid4().hex[:12]}"
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    try:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.queue_declare(name, durable=True, arguments={"x-queue-type": "lazy"})
        assert e.value.reply_code == 406
        assert e.value.reply_text == (
            f"PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue '{name}' in vhost "
            f"'/': \"unsupported queue type 'lazy'\"")
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.queue_declare(name, passive=True)
        assert e.value.reply_code == 404            # nothing was created
        ch = conn.channel()
        for qtype in ("quorum", "stream"):
            made = ch.queue_declare(f"{name}-{qtype}", durable=True,
                                    arguments={"x-queue-type": qtype}).method.queue
            ch.queue_delete(made)
    finally:
        conn.close()
