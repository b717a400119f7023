"""A quorum queue's state machine (node/replication/machine.py) on one member, without Raft."""
from __future__ import annotations

from shoal.node.queues.consumer import QueueConsumer
from shoal.node.queues.queue import Queue
from shoal.node.replication.machine import QueueMachine


class Sink:
    """Records what the queue delivers: (body, redelivered) as the consumer is sent it."""

    def __init__(self) -> None:
        self.delivered: list[tuple[bytes, bool]] = []

    def deliver(self, consumer, entry) -> None:
        self.delivered.append((entry.body, entry.redelivered))

    def work(self, consumer) -> None:
        pass


def test_an_older_leaders_message_reaches_a_waiting_consumer_flagged():
    """A new leader applies an entry of an older term (committed by the old leader, which may
    have delivered it): a consumer waiting with credit gets it with redelivered set (it was
    set after the queue had already handed it over: the fault campaign's unflagged
    duplicates)."""
    sink = Sink()
    q = Queue("/", "qq", sink=sink)
    m = QueueMachine(q)
    m.lead()
    c = QueueConsumer(1, None, "t1")
    q.add_consumer(c)
    q.add_credit(c, 10)
    assert m.apply(1, ["enq", "", "qq", b"h", b"old", None], older=True) is True
    assert m.apply(2, ["enq", "", "qq", b"h", b"new", None]) is True
    assert sink.delivered == [(b"old", True), (b"new", False)]
