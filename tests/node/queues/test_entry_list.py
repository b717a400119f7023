"""Contract tests for every QueueEntryList variant (Qpid's QueueEntryListTestBase pattern).

A variant's test class subclasses :class:`QueueEntryListContract` and implements
``make_list`` (and ``make_entry`` if it needs message properties).
"""
from __future__ import annotations


from shoal.node.queues.entry import EntryState, QueueEntry, TRANSITIONS
from shoal.node.queues.entry_list import QueueEntryList, StandardQueueEntryList


class QueueEntryListContract:
    def make_list(self, scavenge_batch: int = 4) -> QueueEntryList:
        raise NotImplementedError

    def make_entry(self, i: int) -> QueueEntry:
        return QueueEntry(i, "ex", "rk", b"h", b"body%d" % i)

    def filled(self, n: int, batch: int = 4) -> tuple[QueueEntryList, list[QueueEntry]]:
        lst = self.make_list(batch)
        entries = [lst.add(self.make_entry(i)) for i in range(1, n + 1)]
        return lst, entries

    def kill(self, lst: QueueEntryList, e: QueueEntry) -> None:
        assert e.acquire(None) and e.dequeue()
        lst.entry_dead(e)

    def test_empty(self):
        lst = self.make_list()
        assert list(lst) == []
        assert lst.next(lst.head) is None
        assert lst.first() is None

    def test_iteration_keeps_add_order(self):
        lst, entries = self.filled(10)
        assert list(lst) == entries

    def test_next_and_head(self):
        lst, entries = self.filled(3)
        assert lst.next(lst.head) is entries[0]
        assert lst.next(entries[0]) is entries[1]
        assert lst.next(entries[2]) is None
        assert all(lst.before(lst.head, e) for e in entries)
        assert lst.before(entries[0], entries[1]) and not lst.before(entries[1], entries[0])

    def test_release_keeps_position(self):
        lst, entries = self.filled(5)
        e = entries[2]
        assert e.acquire("c")
        assert e.release()
        assert e.redelivered and e.state is EntryState.AVAILABLE
        assert list(lst) == entries

    def test_next_skips_dead_entries_before_scavenging(self):
        lst, entries = self.filled(5, batch=100)
        self.kill(lst, entries[1])
        self.kill(lst, entries[2])
        assert lst.next(entries[0]) is entries[3]
        assert list(lst) == [entries[0], entries[3], entries[4]]

    def test_scavenging_keeps_order_and_skips_dead(self):
        lst, entries = self.filled(20, batch=4)
        dead = [entries[i] for i in (0, 3, 4, 9, 10, 11, 15, 19)]
        for e in dead:
            self.kill(lst, e)
        live = [e for e in entries if e not in dead]
        assert list(lst) == live
        nxt, got = lst.head, []
        while (nxt := lst.next(nxt)) is not None:
            got.append(nxt)
        assert got == live

    def test_pointer_on_unlinked_entry_still_walks_forward(self):
        lst, entries = self.filled(10, batch=2)
        pointer = entries[4]
        for e in entries[3:7]:
            self.kill(lst, e)
        assert lst.next(pointer) is entries[7]
        later = lst.add(self.make_entry(11))
        for e in entries[7:]:
            self.kill(lst, e)
        assert lst.next(pointer) is later

    def test_dead_tail_is_not_lost(self):
        lst, entries = self.filled(3, batch=1)
        self.kill(lst, entries[2])           # the tail: must stay linked
        new = lst.add(self.make_entry(4))
        assert list(lst) == [entries[0], entries[1], new]
        assert lst.next(entries[2]) is new


class TestStandardQueueEntryList(QueueEntryListContract):
    def make_list(self, scavenge_batch: int = 4) -> QueueEntryList:
        return StandardQueueEntryList(scavenge_batch)

    def test_scavenging_unlinks(self):
        lst, entries = self.filled(10, batch=4)
        for e in entries[:8]:
            self.kill(lst, e)
        assert lst.linked == 2


class TestQueueEntryTransitions:
    def test_transition_table_is_the_rule(self):
        for target, sources in TRANSITIONS.items():
            for src in EntryState:
                e = QueueEntry(1)
                e.state = src
                # AVAILABLE is entered by release (from ACQUIRED) or unhold (from HELD)
                release = e.unhold if src is EntryState.HELD else e.release
                method = {EntryState.ACQUIRED: e.acquire, EntryState.AVAILABLE: release,
                          EntryState.DEQUEUED: e.dequeue, EntryState.DELETED: e.delete}[target]
                assert method() == (src in sources)
                assert e.state is (target if src in sources else src)

    def test_release_and_unhold_are_distinct(self):
        e = QueueEntry(1)
        e.state = EntryState.HELD
        assert not e.release() and e.unhold() and not e.redelivered
        assert not e.unhold()

    def test_acquire_once(self):
        e = QueueEntry(1)
        assert e.acquire("a")
        assert not e.acquire("b")
        assert e.consumer == "a" and e.delivery_count == 1

    def test_dequeued_entry_cannot_come_back(self):
        e = QueueEntry(1)
        assert e.acquire("a") and e.dequeue()
        assert not e.release() and not e.delete() and not e.acquire("b")
