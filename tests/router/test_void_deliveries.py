"""A node's delivery that reaches the router after its consumer's channel closed
(router/node_messages.py): an acknowledged one is requeued at its node (a SETTLE); a no-ack
one goes back to its queue as a publish (router/dead_letters.py ``give_back``), since its
node let it go when it sent it and the client never had it. A stream's stays in the stream's
log. One from a quorum queue's old leader after the consumer moved is void: the new leader
delivers again what the old one had not settled.

Found with an AMQP 1.0 receiver whose connection closed while its quorum queue's node was
still sending pre-settled deliveries it held credit for: 12 of 20 were lost
(tests/e2e/amqp10/test_proton.py has the end-to-end case).
"""
from __future__ import annotations

import pytest

from shoal.router.consumers import Consumer, ConsumerTarget
from shoal.router.dead_letters import DeadLetter, DeadLetterChannel
from shoal.router.node_messages import on_node_message
from shoal.shared import wire
from shoal.shared.wire import TAG_DELIVER, TAG_SETTLE


class Channel:
    def __init__(self, closed: bool) -> None:
        self.closed = closed
        self.client = None
        self.delivered: list = []

    def deliver(self, c, delivery_id, redelivered, exchange, routing_key, header, body):
        self.delivered.append((delivery_id, body))


class Broker:
    def __init__(self) -> None:
        self.consumers: dict = {}
        self.published: list = []
        self.stats = {"delivered": 0}

    def publish(self, ch, seq, ev, queues, future=None, count=True) -> None:
        self.published.append((ch, seq, ev, queues, count))

    def mark_dirty(self, client) -> None:
        pass


class Link:
    node_id = "node-1"

    def __init__(self) -> None:
        self.sent: list = []

    def send(self, msg: list, urgent: bool = False) -> None:
        self.sent.append(msg)


def setup(no_ack: bool, closed: bool, node_id: str = "node-1", stream: bool = False):
    broker, link = Broker(), Link()
    t = ConsumerTarget("ctag", 1, "vh", no_ack)
    c = Consumer(7, "q1", node_id, t, stream=stream)
    ch = Channel(closed)
    broker.consumers[7] = (ch, c)
    on_node_message(broker, link, [TAG_DELIVER, 7, 41, False, "ex", "rk", b"hdr", b"body"])
    return broker, link, ch


def test_a_no_ack_delivery_after_its_channel_closed_goes_back_to_its_queue():
    broker, link, ch = setup(True, True)
    assert ch.delivered == [] and link.sent == []
    [(dch, seq, ev, queues, count)] = broker.published
    assert isinstance(dch, DeadLetterChannel) and dch.vhost == "vh" and seq == 0
    assert isinstance(ev, DeadLetter) and not ev.mandatory
    assert (ev.exchange, ev.routing_key, ev.header, ev.body) == ("ex", "rk", b"hdr", b"body")
    assert queues == {"q1"} and count is False


@pytest.mark.parametrize("no_ack", [True, False])
def test_a_delivery_from_a_quorum_queues_old_leader_is_void(no_ack):
    """The consumer moved to a new leader, which delivers again what the old one's log may
    not have settled (node/replication/checkouts.py sends a marked no-ack delivery before
    its checkout is committed): giving it back too could make it a duplicate, unflagged."""
    broker, link, ch = setup(no_ack, False, node_id="node-2")
    assert ch.delivered == [] and broker.published == []
    assert link.sent == [[TAG_SETTLE, wire.OUTCOME_REQUEUE, [41]]]


def test_a_void_acknowledged_delivery_is_requeued_at_its_node():
    broker, link, ch = setup(False, True)
    assert ch.delivered == [] and broker.published == []
    assert link.sent == [[TAG_SETTLE, wire.OUTCOME_REQUEUE, [41]]]


def test_a_void_no_ack_stream_delivery_stays_in_the_log():
    broker, link, ch = setup(True, True, stream=True)
    assert ch.delivered == [] and broker.published == [] and link.sent == []


def test_a_delivery_to_an_open_channel_is_delivered():
    broker, link, ch = setup(True, False)
    assert ch.delivered == [(41, b"body")] and broker.published == [] and link.sent == []
