"""Scenarios 2-4 and consumer life cycle: requeue order, prefetch limits, redelivery after a
connection drop, basic.recover, auto-delete. Run with every client."""
from __future__ import annotations

import pytest

from .amqp_raw import RawAMQP
from .conftest import unsupported

pytestmark = pytest.mark.e2e

QUIET = 1.0   # seconds to watch that no further delivery arrives (not a timing assertion)


def fill(make_client, queue: str, count: int, prefix: str = "m") -> list[bytes]:
    """Declare ``queue`` and publish ``count`` confirmed messages to it (so they are there)."""
    pub = make_client(confirms=True)
    pub.declare_queue(queue)
    bodies = [f"{prefix}{i}".encode() for i in range(1, count + 1)]
    for b in bodies:
        pub.publish("", queue, b)
    return bodies


# ---- 2. requeue keeps order ---------------------------------------------------------------
def test_reject_requeue_restores_original_order(make_client, names):
    q = names("order")
    bodies = fill(make_client, q, 10)
    c = make_client()
    tag = c.consume(q)
    got = c.wait_for(10)
    assert [d.body for d in got] == bodies
    assert not any(d.redelivered for d in got)
    c.cancel(tag)              # unacked deliveries stay with the channel
    c.take()
    for d in reversed(got):    # release in reverse: positions, not release order, count
        c.reject(d, requeue=True)
    c.consume(q)
    again = c.wait_for(10)
    assert [d.body for d in again] == bodies
    assert all(d.redelivered for d in again)


def test_nack_requeue_some_keeps_order(make_client, names, kind):
    q = names("nack")
    fill(make_client, q, 10)
    c = make_client()
    c.qos(10)
    c.consume(q)
    got = c.wait_for(10)
    # stop new deliveries from racing with the releases: ack nothing yet, cancel nothing;
    # nack the odd ones (requeue) and ack the even ones
    requeued = [d for d in got if int(d.body[1:]) % 2 == 1]
    c.take()
    for d in got:
        if any(d is r for r in requeued):
            unsupported(c.nack, d, requeue=True)
        else:
            c.ack(d)
    again = c.wait_for(len(requeued))
    assert [d.body for d in again] == [d.body for d in requeued]
    assert all(d.redelivered for d in again)
    for d in again:
        c.ack(d)


def test_nack_multiple_requeue(make_client, names):
    q = names("nackm")
    bodies = fill(make_client, q, 6)
    c = make_client()
    tag = c.consume(q)
    got = c.wait_for(6)
    c.cancel(tag)
    c.take()
    unsupported(c.nack, got[-1], requeue=True, multiple=True)
    c.consume(q)
    again = c.wait_for(6)
    assert [d.body for d in again] == bodies
    assert all(d.redelivered for d in again)


def test_channel_close_requeues_in_order(make_client, names):
    q = names("chclose")
    bodies = fill(make_client, q, 10)
    c = make_client()
    c.consume(q)
    got = c.wait_for(10)
    c.ack(got[0])            # the acked one must not come back
    c.close()                # unacked deliveries go back where they stood
    c2 = make_client()
    c2.consume(q)
    again = c2.wait_for(9)
    assert [d.body for d in again] == bodies[1:]
    assert all(d.redelivered for d in again)
    assert len(c2.settle_quietly(QUIET)) == 9, "the acked message came back"


# ---- 3. prefetch ----------------------------------------------------------------------------
@pytest.mark.parametrize("prefetch", [1, 3])
def test_prefetch_is_never_exceeded(make_client, names, prefetch):
    q = names("qos")
    fill(make_client, q, 20)
    c = make_client()
    c.qos(prefetch)
    c.consume(q)
    got = c.wait_for(prefetch)
    assert len(c.settle_quietly(QUIET)) == prefetch, "more unacked deliveries than prefetch"
    c.ack(got[0])
    c.wait_for(prefetch + 1)
    assert len(c.settle_quietly(QUIET)) == prefetch + 1, "one ack must free exactly one slot"
    for d in c.deliveries[1:]:
        c.ack(d)
    c.wait_for(2 * prefetch + 1)
    assert len(c.settle_quietly(QUIET)) == 2 * prefetch + 1


@pytest.mark.parametrize("queue_first", [True, False])
def test_without_a_prefetch_limit_every_message_is_delivered_unacked(make_client, names,
                                                                     queue_first):
    """No basic.qos: prefetch is unlimited (spec 1.8.3.13; RabbitMQ delivers the whole queue
    to a consumer that acks nothing). Shoal gave such a consumer's node credit in chunks of
    512 and topped it up only on acks, so it stopped after 512 (amqp091-go's
    TestCorruptedMessageIssue7). Messages already queued, and messages published to the
    consumer's empty queue (a delivery lease's path)."""
    q, n = names("unlimited"), 1200
    bodies = fill(make_client, q, n) if queue_first else []
    c = make_client()
    if not queue_first:
        c.declare_queue(q)
    c.consume(q)
    if not queue_first:
        bodies = fill(make_client, q, n)
    assert [d.body for d in c.wait_for(n)] == bodies


def test_global_prefetch_over_consumers_on_two_nodes(make_client, names, cluster):
    qa, qb = cluster.queues_on_distinct_nodes(2, "gqos")
    fill(make_client, qa, 10, "a")
    fill(make_client, qb, 10, "b")
    c = make_client()
    c.qos(4, global_=True)
    c.consume(qa)
    c.consume(qb)
    got = c.wait_for(4)
    got = c.settle_quietly(QUIET)
    assert len(got) == 4, f"global prefetch 4 exceeded: {[d.body for d in got]}"
    for d in got[:2]:
        c.ack(d)
    c.wait_for(6)
    assert len(c.settle_quietly(QUIET)) == 6, "two acks must free exactly two slots"


def test_per_consumer_prefetch_with_two_consumers(make_client, names, cluster):
    qa, qb = cluster.queues_on_distinct_nodes(2, "cqos")
    fill(make_client, qa, 10, "a")
    fill(make_client, qb, 10, "b")
    c = make_client()
    c.qos(2)
    c.consume(qa)
    c.consume(qb)
    c.wait_for(4)
    got = c.settle_quietly(QUIET)
    assert sorted(d.body[:1] for d in got) == [b"a", b"a", b"b", b"b"]


def test_changing_qos_while_consuming_applies(make_client, names):
    q = names("qoschange")
    fill(make_client, q, 20)
    c = make_client()
    c.qos(2, global_=True)
    c.consume(q)
    c.wait_for(2)
    assert len(c.settle_quietly(QUIET)) == 2
    c.qos(5, global_=True)          # raise: three more may come
    c.wait_for(5)
    assert len(c.settle_quietly(QUIET)) == 5
    c.qos(1, global_=True)          # lower: nothing until unacked < 1
    first = c.take()
    for d in first[:4]:
        c.ack(d)
    assert c.settle_quietly(QUIET) == [], "delivered while unacked >= the new prefetch"
    c.ack(first[4])
    c.wait_for(1)
    assert len(c.settle_quietly(QUIET)) == 1


# ---- 4. connection drop ---------------------------------------------------------------------
def test_unacked_come_back_after_connection_close(make_client, names):
    q = names("drop")
    bodies = fill(make_client, q, 5)
    c = make_client()
    c.consume(q)
    assert [d.body for d in c.wait_for(5)] == bodies
    c.close()
    c2 = make_client()
    c2.consume(q)
    again = c2.wait_for(5)
    assert [d.body for d in again] == bodies
    assert all(d.redelivered for d in again)


def test_unacked_come_back_after_tcp_reset(make_client, names, cluster):
    """No connection.close at all: the socket just goes away (a crashed client)."""
    from pamqp import commands
    q = names("reset")
    bodies = fill(make_client, q, 3)
    raw = RawAMQP(cluster.host, cluster.port).open()
    raw.open_channel(1)
    raw.send_frame(commands.Basic.Consume(queue=q, consumer_tag="raw"), 1)
    raw.expect(commands.Basic.ConsumeOk, 1)
    seen = 0
    while seen < 3:
        _, value = raw.read_frame()
        seen += isinstance(value, commands.Basic.Deliver)
    raw.close()
    c = make_client()
    c.consume(q)
    again = c.wait_for(3)
    assert [d.body for d in again] == bodies
    assert all(d.redelivered for d in again)


# ---- recover, auto-delete -------------------------------------------------------------------
def test_basic_recover_redelivers(make_client, names):
    q = names("recover")
    bodies = fill(make_client, q, 3)
    c = make_client()
    c.consume(q)
    c.wait_for(3)
    c.take()
    c.recover()
    again = c.wait_for(3)
    assert sorted(d.body for d in again) == bodies
    assert all(d.redelivered for d in again)
    for d in again:
        c.ack(d)
    assert len(c.settle_quietly(QUIET)) == 3


def test_auto_delete_queue_goes_after_last_consumer(make_client, names):
    c = make_client()
    q = c.declare_queue(names("autodel"), auto_delete=True)[0]
    t1 = c.consume(q)
    t2 = c.consume(q)
    c.cancel(t1)
    assert c.declare_queue(q, passive=True)[2] == 1, "deleted while a consumer remains"
    c.cancel(t2)
    checker = make_client()
    from .clients import BrokerError
    with pytest.raises(BrokerError) as e:
        for _ in range(50):      # deletion may follow the cancel-ok asynchronously
            checker.declare_queue(q, passive=True)
            checker.pump(0.1)
    assert e.value.code == 404


def test_no_ack_consumer(make_client, names):
    q = names("noack")
    bodies = fill(make_client, q, 5)
    c = make_client()
    c.qos(1)                   # prefetch does not limit no-ack consumers
    c.consume(q, no_ack=True)
    assert [d.body for d in c.wait_for(5)] == bodies
    c.close()
    c2 = make_client()
    assert c2.get(q) is None, "no-ack deliveries must not come back"


def test_ack_multiple(make_client, names):
    q = names("ackm")
    fill(make_client, q, 5)
    c = make_client()
    c.consume(q)
    got = c.wait_for(5)
    c.ack(got[3], multiple=True)
    c.close()
    c2 = make_client()
    c2.consume(q)
    [d] = c2.wait_for(1)
    assert len(c2.settle_quietly(QUIET)) == 1
    assert (d.body, d.redelivered) == (b"m5", True)


def test_deleting_a_queue_cancels_its_consumers(make_client, names):
    """basic.cancel from the broker (consumer_cancel_notify) reaches every client."""
    c, admin = make_client(), make_client()
    q = c.declare_queue(names("cancel"))[0]
    tag = c.consume(q)
    admin.delete_queue(q)
    for _ in range(100):
        if c.cancelled:
            break
        c.pump(0.1)
    assert c.cancelled == [tag]
    c.declare_queue(names("alive"))     # the channel itself stays open
