"""A quorum queue's state machine (node/replication/machine.py) on one member, without Raft."""
from __future__ import annotations

from pamqp import encode
from pamqp.commands import Basic

from shoal.node.queues.consumer import QueueConsumer
from shoal.node.queues.message import encode_header, parse_properties
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


def test_a_checkout_flags_and_counts_what_was_delivered_and_nothing_else():
    """The leader's checkouts are in the log: a member that applies one marks the message
    redelivered and counts the delivery, so that as a new leader it flags exactly what an
    older leader delivered (the fault campaign's unflagged duplicates came from a leader
    that flagged nothing; flagging everything was the fix before checkouts)."""
    q = Queue("/", "qq")
    m = QueueMachine(q)
    for i, body in enumerate((b"delivered", b"never", b"released"), start=1):
        assert m.apply(i, ["enq", "", "qq", b"h", body, None]) is True
    m.apply(4, ["checkout", [1, 3], []])
    m.apply(5, ["release", [3]])
    got = {bytes(e.body): (e.redelivered, e.delivery_count) for e in q.entries}
    assert got == {b"delivered": (True, 1), b"never": (False, 0), b"released": (True, 0)}
    sink = Sink()
    q.sink = sink
    m.lead()
    c = QueueConsumer(1, None, "t1")
    q.add_consumer(c)
    q.add_credit(c, 10)
    assert sink.delivered == [(b"delivered", True), (b"never", False), (b"released", True)]


def test_a_checkout_settled_as_sent_removes_the_message():
    q = Queue("/", "qq")
    m = QueueMachine(q)
    m.apply(1, ["enq", "", "qq", b"h", b"no-ack", None])
    m.apply(2, ["checkout", [], [1]])
    assert q.message_count == 0 and not m.by_index


def test_a_returns_annotations_reach_a_new_leader_too():
    """A modified outcome's annotations ride on the return (``requeue``'s table): a member
    that leads when it applies an older leader's return merges them as a follower does."""
    q = Queue("/", "qq")
    m = QueueMachine(q)
    m.apply(1, ["enq", "", "qq", encode_header(Basic.Properties(headers={"k": "v"}), 1), b"x",
                None])
    m.apply(2, ["checkout", [1], []])
    m.lead()
    m.apply(3, ["requeue", [1], encode.field_table({"x-opt-note": "seen"})])
    (e,) = list(q.entries)
    assert parse_properties(e.header).headers == {"k": "v", "x-opt-note": "seen"}
