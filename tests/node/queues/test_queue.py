"""Queue and QueueConsumerManager behaviour (seeds 000 and 002), without the wire."""
from __future__ import annotations

from shoal.node.queues.consumer import ConsumerListState as S
from shoal.node.queues.consumer import QueueConsumer
from shoal.node.queues.consumer_manager import QueueConsumerManager
from shoal.node.queues.entry import EntryState
from shoal.node.queues.queue import Queue


class Sink:
    def __init__(self) -> None:
        self.delivered: list[tuple[int, bytes]] = []
        self.worked: list[int] = []

    def deliver(self, consumer, entry) -> None:
        self.delivered.append((consumer.consumer_id, entry.body))

    def work(self, consumer) -> None:
        self.worked.append(consumer.consumer_id)


def make_queue() -> tuple[Queue, Sink]:
    sink = Sink()
    return Queue("/", "q", sink=sink), sink


def add(q: Queue, cid: int, credit: int = 0, priority: int = 0, no_ack=False) -> QueueConsumer:
    c = QueueConsumer(cid, None, f"t{cid}", no_ack=no_ack, priority=priority)
    q.add_consumer(c)
    if credit:
        q.add_credit(c, credit)
    return c


# --- QueueConsumerManager -------------------------------------------------------------

def test_qcm_moves_are_guarded():
    qcm = QueueConsumerManager()
    c = QueueConsumer(1, None)
    assert qcm.add(c) and not qcm.add(c)
    assert c.list_state is S.NOT_INTERESTED
    assert not qcm.set_notified(c)                # NotInterested -> Notified is not a move
    assert not qcm.no_more_work(c)
    assert qcm.set_interest(c, True) and not qcm.set_interest(c, True)
    assert qcm.in_list(S.INTERESTED) == [c] and qcm.interested_count == 1
    assert qcm.set_notified(c) and qcm.in_list(S.NOTIFIED) == [c]
    assert qcm.interested_count == 0
    c.credit = 1
    assert qcm.no_more_work(c) and c.list_state is S.INTERESTED
    assert qcm.remove(c) and not qcm.remove(c)
    assert c.list_state is S.DETACHED and qcm.levels == [] and len(qcm) == 0


def test_qcm_notified_consumer_goes_to_back_of_interested():
    qcm = QueueConsumerManager()
    a, b, c = (QueueConsumer(i, None) for i in (1, 2, 3))
    for x in (a, b, c):
        x.credit = 5
        qcm.add(x)
    assert qcm.first_interested() is a
    qcm.set_notified(a)
    qcm.no_more_work(a)
    assert qcm.in_list(S.INTERESTED) == [b, c, a]


def test_qcm_higher_priority_first():
    qcm = QueueConsumerManager()
    low, high = QueueConsumer(1, None, priority=0), QueueConsumer(2, None, priority=10)
    low.credit = high.credit = 1
    qcm.add(low)
    qcm.add(high)
    assert qcm.first_interested() is high
    qcm.set_interest(high, False)
    assert qcm.first_interested() is low


# --- Queue ----------------------------------------------------------------------------

def test_new_message_notifies_exactly_one_interested_consumer():
    q, sink = make_queue()
    add(q, 1, credit=5)
    add(q, 2, credit=5)
    q.enqueue("", "k", b"", b"m1")
    q.notify_work()
    assert sink.delivered == [(1, b"m1")]
    assert sink.worked == []


def test_fairness_alternates_between_consumers_with_credit():
    """Measure: with two consumers holding ample credit and messages arriving one at a time,
    deliveries alternate strictly (seed 002: notified consumer goes to the back)."""
    q, sink = make_queue()
    add(q, 1, credit=100)
    add(q, 2, credit=100)
    for i in range(10):
        q.enqueue("", "k", b"", b"m%d" % i)
        q.notify_work()
    assert [cid for cid, _ in sink.delivered] == [1, 2] * 5


def test_consumer_pulls_until_credit_runs_out_then_next_consumer():
    q, sink = make_queue()
    for i in range(5):
        q.enqueue("", "k", b"", b"m%d" % i)
    a = add(q, 1)
    b = add(q, 2)
    q.add_credit(a, 3)
    assert sink.delivered == [(1, b"m0"), (1, b"m1"), (1, b"m2")]
    assert a.credit == 0 and a.list_state is S.NOT_INTERESTED
    q.add_credit(b, 10)
    assert sink.delivered[3:] == [(2, b"m3"), (2, b"m4")]


def test_message_not_stranded_when_first_consumer_cannot_take_it():
    q, sink = make_queue()
    a = add(q, 1, credit=1)
    add(q, 2, credit=1)
    a.credit = 0          # a lost its credit without telling the QCM (defensive)
    q.enqueue("", "k", b"", b"m")
    q.notify_work()
    assert sink.delivered == [(2, b"m")]


def test_release_moves_pointers_back_and_keeps_order():
    q, sink = make_queue()
    entries = [q.enqueue("", "k", b"", b"m%d" % i) for i in range(3)]
    a = add(q, 1, credit=3)
    assert [b for _, b in sink.delivered] == [b"m0", b"m1", b"m2"]
    assert q.release(entries[1])
    assert entries[1].redelivered and q.message_count == 1
    b = add(q, 2)
    q.add_credit(b, 1)
    assert sink.delivered[-1] == (2, b"m1")
    # a's pointer was past m1; released again, a sees it again
    assert q.release(entries[1])
    q.add_credit(a, 1)
    assert sink.delivered[-1] == (1, b"m1")


def test_purge_removes_only_available():
    q, _ = make_queue()
    entries = [q.enqueue("", "k", b"", b"m%d" % i) for i in range(4)]
    got = q.get()
    assert got is entries[0]
    assert q.purge() == 3
    assert q.message_count == 0 and got.state is EntryState.ACQUIRED
    assert q.release(got) and q.message_count == 1


def test_no_ack_consumer_entries_are_dequeued_at_delivery():
    q, sink = make_queue()
    e = q.enqueue("", "k", b"", b"m")
    add(q, 1, credit=1, no_ack=True)
    assert sink.delivered == [(1, b"m")] and e.state is EntryState.DEQUEUED


def test_want_work_sends_one_work_only():
    q, sink = make_queue()
    c = add(q, 1)
    q.want_work(c)
    assert sink.worked == []
    for i in range(3):
        q.enqueue("", "k", b"", b"m")
        q.notify_work()
    assert sink.worked == [1]
    q.want_work(c)                       # asks again while messages wait: told at once
    assert sink.worked == [1, 1]
