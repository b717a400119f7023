"""Transactions (AMQP 0-9-1 class tx, spec 1.9) with pika, across queues on two nodes."""
import pika
import pytest

pytestmark = pytest.mark.e2e


def _count(ch, q):
    return ch.queue_declare(q, passive=True).method.message_count


def test_publishes_appear_only_at_commit_and_vanish_on_rollback(cluster):
    qa, qb = cluster.queues_on_distinct_nodes(2, "tx")
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    ch = conn.channel()
    for q in (qa, qb):
        ch.queue_declare(q)
    look = conn.channel()
    ch.tx_select()
    ch.basic_publish("", qa, b"a1")
    ch.basic_publish("", qb, b"b1")
    assert (_count(look, qa), _count(look, qb)) == (0, 0)
    ch.tx_commit()
    assert (_count(look, qa), _count(look, qb)) == (1, 1)
    ch.basic_publish("", qa, b"a2")
    ch.tx_rollback()
    ch.tx_commit()
    assert _count(look, qa) == 1
    conn.close()


def test_acks_take_effect_at_commit_and_rollback_keeps_them_unacked(cluster):
    q = cluster.queue_on("node-0", "txack")
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    ch = conn.channel()
    ch.queue_declare(q)
    for i in range(3):
        ch.basic_publish("", q, f"m{i}".encode())
    ch.tx_select()
    tags = []
    for _ in range(3):
        method, _, _ = ch.basic_get(q)
        tags.append(method.delivery_tag)
    ch.basic_ack(tags[0])
    ch.tx_rollback()          # the ack is undone: tag 1 is still unacked and can be acked
    ch.basic_ack(tags[0])
    ch.basic_ack(tags[1])
    ch.tx_commit()
    conn.close()              # tag 3 was never acked: it comes back
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    ch = conn.channel()
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"m2" and method.redelivered
    assert ch.basic_get(q)[0] is None
    conn.close()


def test_uncommitted_acks_are_requeued_when_the_channel_closes(cluster):
    q = cluster.queue_on("node-1", "txclose")
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    ch = conn.channel()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"only")
    ch.tx_select()
    method, _, _ = ch.basic_get(q)
    ch.basic_ack(method.delivery_tag)
    ch.close()
    ch = conn.channel()
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"only" and method.redelivered
    conn.close()


def test_tx_and_confirm_modes_exclude_each_other(cluster):
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.tx_select()
    assert exc.value.reply_code == 406
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.tx_commit()
    assert exc.value.reply_code == 406
    conn.close()
