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


def _log(m: QueueMachine) -> None:
    """Priorities, a checkout, a release, an ack, a modified return: what a follower applies."""
    hdr = [encode_header(Basic.Properties(priority=p, headers={"n": p}), 1) for p in (0, 5)]
    m.apply(1, ["enq", "", "qq", hdr[0], b"low-1", None, False, 1000, False])
    m.apply(2, ["enq", "", "qq", hdr[1], b"high", None, False, 1000, False])
    m.apply(3, ["enq", "", "qq", hdr[0], b"low-2", None, True, 1000, True])
    m.apply(4, ["enq", "", "qq", hdr[0], b"gone", None, False, 1000, False])
    m.apply(5, ["checkout", [1, 2], []])
    m.apply(6, ["release", [2]])
    m.apply(7, ["ack", [4]])
    m.apply(8, ["requeue", [1], encode.field_table({"x-opt-note": "seen"})])


def _held(q: Queue) -> list[tuple]:
    return [(bytes(e.body), e.redelivered, e.delivery_count, parse_properties(e.header).headers)
            for e in q.entries if not e.is_dead]


def test_a_lazy_follower_leads_with_the_queue_an_eager_one_has():
    """A member that follows holds records, not entries (machine.py ``lazy``); when it
    leads they become the entries a follower applying the same log would hold: in queue
    order (priorities), with the flags, counts and merged annotations the log gave them."""
    args = {"x-max-priority": 9}
    eager, lazy = Queue("/", "qq", arguments=args), Queue("/", "qq", arguments=args)
    me, ml = QueueMachine(eager), QueueMachine(lazy, 100)
    _log(me)
    _log(ml)
    assert not list(lazy.entries) and ml.message_count() == 3
    ml.lead()
    assert not ml.lazy and _held(lazy) == _held(eager) == [
        (b"high", True, 0, {"n": 5}),
        (b"low-1", True, 1, {"n": 0, "x-opt-note": "seen"}),
        (b"low-2", True, 1, {"n": 0})]
    assert ml.out == me.out == {3}


def test_a_lazy_followers_snapshot_restores_the_same_queue_either_way():
    """A lazy member's snapshot restores, into an eager machine, the queue that an eager
    member's does; and the other way round."""
    args = {"x-max-priority": 9}
    eager, lazy = QueueMachine(Queue("/", "qq", arguments=args)), \
        QueueMachine(Queue("/", "qq", arguments=args), 100)
    _log(eager)
    _log(lazy)
    header = ["/", "qq", args, "u"]
    into_eager, into_lazy = QueueMachine(Queue("/", "qq", arguments=args)), \
        QueueMachine(Queue("/", "qq", arguments=args), 100)
    into_eager.restore(lazy.snapshot(header))
    into_lazy.restore(eager.snapshot(header))
    into_lazy.lead()
    assert _held(into_eager.queue) == _held(into_lazy.queue) == _held(eager.queue)


def test_a_lazy_follower_with_a_backlog_makes_its_entries_and_is_lazy_again_when_empty():
    """Past ``lazy_max`` records a follower makes its entries (becoming leader then builds
    none), and once its queue is empty it holds records again."""
    q = Queue("/", "qq")
    m = QueueMachine(q, 2)
    for i in (1, 2):
        m.apply(i, ["enq", "", "qq", b"h", b"m%d" % i, None])
    assert m.lazy and q.available == 0 and m.message_count() == 2
    m.apply(3, ["enq", "", "qq", b"h", b"m3", None])
    assert not m.lazy and [bytes(e.body) for e in q.entries] == [b"m1", b"m2", b"m3"]
    m.apply(4, ["ack", [1, 2, 3]])
    assert m.lazy and m.message_count() == 0
    m.apply(5, ["enq", "", "qq", b"h", b"m5", None])
    assert m.lazy and m.message_count() == 1
