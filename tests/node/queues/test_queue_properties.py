"""The seeds' race as a property (seed 000 "compare-and-set acquisition", seed 004).

Random interleavings of enqueue / acquire by consumer A / acquire by consumer B / basic.get /
release / ack / purge on one queue must never hand one message to two acquirers at once, never
lose a message, and keep FIFO order among available entries.
"""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.node.queues.consumer import QueueConsumer
from shoal.node.queues.entry import EntryState
from shoal.node.queues.entry_list import StandardQueueEntryList
from shoal.node.queues.queue import Queue


class RecordingSink:
    def __init__(self) -> None:
        self.holder: dict[int, str] = {}      # entry id -> who holds it now
        self.violations: list[str] = []
        self.queue: Queue | None = None

    def deliver(self, consumer, entry) -> None:
        who = f"c{consumer.consumer_id}"
        if entry.entry_id in self.holder:
            self.violations.append(f"{entry.entry_id} to {who} while held by "
                                   f"{self.holder[entry.entry_id]}")
        # strict order: the delivered entry is the first one that was available
        earlier = [e for e in self.queue.entries
                   if e.state is EntryState.AVAILABLE and e.entry_id < entry.entry_id]
        if earlier:
            self.violations.append(f"{entry.entry_id} delivered before {earlier[0].entry_id}")
        self.holder[entry.entry_id] = who

    def work(self, consumer) -> None:
        pass


OPS = st.lists(st.tuples(st.sampled_from(["enqueue", "enqueue", "pull_a", "pull_b", "get",
                                          "release", "ack", "purge", "notify"]),
                         st.integers(0, 1000)), max_size=120)


@settings(max_examples=300, deadline=None)
@given(ops=OPS, batch=st.integers(1, 8))
def test_no_double_delivery_no_loss_fifo(ops, batch):
    sink = RecordingSink()
    q = Queue("/", "q", sink=sink, entries=StandardQueueEntryList(batch))
    sink.queue = q
    a, b = QueueConsumer(1, None), QueueConsumer(2, None)
    q.add_consumer(a)
    q.add_consumer(b)
    entries = {}
    acked: list[int] = []
    purged = 0
    for op, n in ops:
        held = sorted(sink.holder)
        if op == "enqueue":
            e = q.enqueue("", "k", b"", b"%d" % n)
            entries[e.entry_id] = e
            q.notify_work()
        elif op in ("pull_a", "pull_b"):
            q.add_credit(a if op == "pull_a" else b, 1 + n % 3)
        elif op == "get":
            e = q.get()
            if e is not None:
                if e.entry_id in sink.holder:
                    sink.violations.append(f"get {e.entry_id} while held")
                sink.holder[e.entry_id] = "get"
        elif op == "release" and held:
            e = entries[held[n % len(held)]]
            assert q.release(e)
            del sink.holder[e.entry_id]
            q.notify_work()
        elif op == "ack" and held:
            e = entries[held[n % len(held)]]
            assert q.dequeue(e)
            del sink.holder[e.entry_id]
            acked.append(e.entry_id)
        elif op == "purge":
            purged += q.purge()
        elif op == "notify":
            q.notify_work()
        assert not sink.violations, sink.violations
        avail = [e.entry_id for e in q.entries if e.state is EntryState.AVAILABLE]
        assert avail == sorted(avail)
        assert q.message_count == len(avail)
        # every live entry is either available or held by exactly one acquirer
        for e in q.entries:
            assert (e.state is EntryState.ACQUIRED) == (e.entry_id in sink.holder)

    # finally: give everything back, then drain and ack it all
    for eid in list(sink.holder):
        assert q.release(entries[eid])
        del sink.holder[eid]
    a.credit = 0
    q.add_credit(a, 10_000)
    for eid in list(sink.holder):
        assert q.dequeue(entries[eid])
        acked.append(eid)
    assert not sink.violations, sink.violations
    assert len(acked) == len(set(acked))
    assert len(acked) + purged == len(entries)
    assert all(e.state in (EntryState.DEQUEUED, EntryState.DELETED) for e in entries.values())
    assert list(q.entries) == []
