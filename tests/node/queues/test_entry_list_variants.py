"""The QueueEntryList contract over every variant (Qpid's QueueEntryListTestBase pattern), the
variants' own ordering rules, and property tests (hypothesis): random interleavings of
enqueue / pull / get / release / ack / expire / purge on a queue of each type never hand a
message to two acquirers, never lose one, and keep the type's order.
"""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp.commands import Basic
from test_entry_list import QueueEntryListContract

from shoal.node.queues.consumer import QueueConsumer
from shoal.node.queues.entry import EntryState, QueueEntry
from shoal.node.queues.entry_list import (LastValueQueueEntryList, PriorityQueueEntryList,
                                   SortedQueueEntryList)
from shoal.node.queues.message import encode_header
from shoal.node.queues.queue import Queue


# ---- the contract, per variant -------------------------------------------------------------
class TestPriorityListContract(QueueEntryListContract):
    def make_list(self, scavenge_batch: int = 4):
        return PriorityQueueEntryList(10, scavenge_batch)

    def make_entry(self, i: int) -> QueueEntry:
        e = super().make_entry(i)
        e.order = PriorityQueueEntryList.order_for(4, i)
        return e


class TestSortedListContract(QueueEntryListContract):
    def make_list(self, scavenge_batch: int = 4):
        return SortedQueueEntryList(scavenge_batch)

    def make_entry(self, i: int) -> QueueEntry:
        e = super().make_entry(i)
        e.order = SortedQueueEntryList.order_for("k%05d" % i, i)
        return e


class TestLastValueListContract(QueueEntryListContract):
    def make_list(self, scavenge_batch: int = 4):
        return LastValueQueueEntryList(scavenge_batch)


def _entry(i: int, order=None, key=None) -> QueueEntry:
    e = QueueEntry(i, "", "", b"", b"%d" % i)
    e.order = order
    e.lvq_key = key
    return e


def test_priority_list_orders_levels_and_keeps_fifo_within():
    lst = PriorityQueueEntryList(10, 2)
    prios = [1, 5, 9, 5, 0, 9]
    es = [lst.add(_entry(i, PriorityQueueEntryList.order_for(p, i)))
          for i, p in enumerate(prios, 1)]
    assert [e.entry_id for e in lst] == [3, 6, 2, 4, 1, 5]
    assert lst.before(es[2], es[1]) and not lst.before(es[1], es[2])
    for e in es[:4]:                                   # scavenging keeps the order
        assert e.acquire(None) and e.dequeue()
        lst.entry_dead(e)
    lst.add(_entry(7, PriorityQueueEntryList.order_for(5, 7)))
    assert [e.entry_id for e in lst] == [6, 7, 5]


def test_pointer_on_an_unlinked_entry_still_sees_later_inserts():
    lst = SortedQueueEntryList(1)
    a = lst.add(_entry(1, SortedQueueEntryList.order_for("a", 1)))
    c = lst.add(_entry(3, SortedQueueEntryList.order_for("c", 3)))
    assert a.acquire(None) and a.dequeue()
    lst.entry_dead(a)                                  # unlinked now (batch 1)
    b = lst.add(_entry(2, SortedQueueEntryList.order_for("b", 2)))
    assert lst.next(a) is b and lst.next(b) is c


def test_last_value_list_replaces_available_not_acquired():
    lst = LastValueQueueEntryList()
    old = lst.add(_entry(1, key="IBM"))
    new = lst.add(_entry(2, key="IBM"))
    assert lst.replaced is old and old.state is EntryState.DELETED
    assert new.acquire(None)
    newer = lst.add(_entry(3, key="IBM"))
    assert lst.replaced is None and new.state is EntryState.ACQUIRED
    lst.add(_entry(4))
    lst.add(_entry(5))                                 # no key: never replaced
    assert [e.entry_id for e in lst] == [2, 3, 4, 5] and newer in list(lst)


# ---- property tests over queue types -------------------------------------------------------
def header(**props) -> bytes:
    return encode_header(Basic.Properties(**props), 1)


class RecordingSink:
    def __init__(self) -> None:
        self.holder: dict[int, str] = {}
        self.violations: list[str] = []
        self.queue: Queue | None = None
        self.dead: list[tuple[int, str]] = []

    def deliver(self, consumer, entry) -> None:
        who = f"c{consumer.consumer_id}"
        if entry.entry_id in self.holder:
            self.violations.append(f"{entry.entry_id} to {who} while held")
        first = next((e for e in self.queue.entries if e.state is EntryState.AVAILABLE
                      and not self.queue.features.expired(e)), None)
        if first is not None and self.queue.entries.before(first, entry):
            self.violations.append(f"{entry.entry_id} delivered before "
                                   f"{first.entry_id if first else None}")
        self.holder[entry.entry_id] = who

    def work(self, consumer) -> None:
        pass

    def dead_letter(self, queue, entry, reason) -> None:
        self.dead.append((entry.entry_id, reason))


QUEUE_TYPES = {
    "standard": {},
    "priority": {"x-max-priority": 9},
    "sorted": {"qpid.queue_sort_key": "k"},
    "lvq": {"qpid.last_value_queue_key": "k"},
}
OPS = st.lists(st.tuples(st.sampled_from(["enqueue", "enqueue", "enqueue_ttl", "pull_a",
                                          "pull_b", "get", "release", "ack", "tick",
                                          "purge"]),
                         st.integers(0, 1000)), max_size=80)


def _expected_order(q: Queue) -> list:
    """The type's order over live entries (what iteration must give)."""
    live = list(q.entries)
    if "x-max-priority" in q.arguments:
        return sorted(live, key=lambda e: e.order)
    if "qpid.queue_sort_key" in q.arguments:
        return sorted(live, key=lambda e: e.order)
    return sorted(live, key=lambda e: e.entry_id)


@settings(max_examples=120, deadline=None)
@given(kind=st.sampled_from(sorted(QUEUE_TYPES)), ops=OPS)
def test_random_interleavings_never_double_deliver_or_lose(kind, ops):
    args = {**QUEUE_TYPES[kind], "x-dead-letter-exchange": "dlx"}
    sink = RecordingSink()
    q = Queue("/", "q", sink=sink, arguments=args)
    q.entries.scavenge_batch = 3
    sink.queue = q
    a, b = QueueConsumer(1, None), QueueConsumer(2, None)
    q.add_consumer(a)
    q.add_consumer(b)
    entries: dict[int, QueueEntry] = {}
    acked: list[int] = []
    purged = 0
    for op, n in ops:
        held = sorted(sink.holder)
        if op in ("enqueue", "enqueue_ttl"):
            props = {"priority": n % 10, "headers": {"k": "k%d" % (n % 4)}}
            if op == "enqueue_ttl":
                props["expiration"] = str(n % 7)
            e = q.enqueue("", "rk", header(**props), b"x")
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
            q.release(e)                        # may expire it instead
            del sink.holder[e.entry_id]
            q.notify_work()
        elif op == "ack" and held:
            e = entries[held[n % len(held)]]
            assert q.dequeue(e)
            del sink.holder[e.entry_id]
            acked.append(e.entry_id)
        elif op == "tick":
            q.timers.run(q.timers.now + n % 5)
        elif op == "purge":
            purged += q.purge()
        assert not sink.violations, sink.violations
        live = list(q.entries)
        assert live == _expected_order(q)
        assert q.message_count == sum(e.state is EntryState.AVAILABLE for e in live)
        for e in live:
            assert (e.state is EntryState.ACQUIRED) == (e.entry_id in sink.holder)
    # settle everything: give back, drain, ack
    for eid in list(sink.holder):
        q.release(entries[eid])
        del sink.holder[eid]
    a.credit = 0
    q.add_credit(a, 10_000)
    for eid in list(sink.holder):
        assert q.dequeue(entries[eid])
        acked.append(eid)
    assert not sink.violations, sink.violations
    assert len(acked) == len(set(acked))
    dead = {eid for eid, _ in sink.dead}
    replaced = {e.entry_id for e in entries.values()
                if e.state is EntryState.DELETED and e.entry_id not in dead}
    # every message is accounted for exactly once: acked, dead-lettered, purged or replaced
    assert len(acked) + len(dead) + len(replaced) == len(entries)
    assert not (set(acked) & dead)
    assert all(e.state in (EntryState.DEQUEUED, EntryState.DELETED) for e in entries.values())
    assert list(q.entries) == []
    if kind != "lvq":
        assert len(replaced) == purged
