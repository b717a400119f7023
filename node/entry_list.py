"""The strict order of a queue: :class:`QueueEntryList` and the FIFO variant (seed 000).

Seed 000 "Strict Ordering": entries stay in the order they were added for their whole life; a
released entry becomes AVAILABLE again where it stood. Consumers keep a pointer (the entry they
last looked at) and walk forward with :meth:`QueueEntryList.next`.

Dead entries (DEQUEUED/DELETED) are unlinked lazily, in batches (seed 004 "scavenging"). An
unlinked entry keeps its ``next`` link, so a consumer pointer resting on it still walks forward
into the live list; the tail is never unlinked (new entries are appended after it).

Variants (priority = ordered sub-lists, sorted, last-value) subclass :class:`QueueEntryList` and
override :meth:`add`, :meth:`next`, :meth:`before` and :attr:`inserts_before_tail`.
"""
from __future__ import annotations

from typing import Iterator

from .entry import ACQUIRED, DELETED, QueueEntry

#: Dead entries collected before a scavenging pass unlinks them.
SCAVENGE_BATCH = 256


class QueueEntryList:
    """Interface of every entry list variant (seed 000 ``QueueEntryList``).

    ``head``: a sentinel entry (state DELETED, id -1) that precedes every entry; a new consumer's
    pointer starts there. ``next(entry)``: the next live entry after ``entry`` in queue order, or
    None. ``before(a, b)``: True when ``a`` sorts strictly before ``b``. ``inserts_before_tail``:
    True when :meth:`add` may place an entry before existing ones (then consumer pointers must be
    moved back on enqueue, seed 000 ``checkSubscriptionsNotAheadOfDelivery``).
    """

    inserts_before_tail = False

    def add(self, entry: QueueEntry) -> QueueEntry:
        raise NotImplementedError

    def next(self, entry: QueueEntry) -> QueueEntry | None:
        raise NotImplementedError

    @property
    def head(self) -> QueueEntry:
        raise NotImplementedError

    def before(self, a: QueueEntry, b: QueueEntry) -> bool:
        raise NotImplementedError

    def entry_dead(self, entry: QueueEntry) -> None:
        """Tell the list ``entry`` became DEQUEUED/DELETED (it is unlinked later, in a batch)."""
        raise NotImplementedError

    def first(self) -> QueueEntry | None:
        """The first live entry, or None."""
        return self.next(self.head)

    def __iter__(self) -> Iterator[QueueEntry]:
        """Live entries (AVAILABLE or ACQUIRED) in queue order."""
        e = self.next(self.head)
        while e is not None:
            yield e
            e = self.next(e)


class StandardQueueEntryList(QueueEntryList):
    """FIFO entry list: a doubly linked list behind a sentinel head; order = entry id order.

    O(1) ``add``; ``next`` skips dead entries not yet unlinked; ``entry_dead`` is O(1)
    amortised (one unlink per dead entry, done ``scavenge_batch`` at a time).
    """

    __slots__ = ("_head", "_tail", "_dead", "scavenge_batch", "linked")

    def __init__(self, scavenge_batch: int = SCAVENGE_BATCH) -> None:
        head = QueueEntry(-1)
        head.state = DELETED
        self._head = head
        self._tail = head
        self._dead: list[QueueEntry] = []
        self.scavenge_batch = scavenge_batch
        self.linked = 0          #: entries currently linked (live + dead not yet unlinked)

    @property
    def head(self) -> QueueEntry:
        return self._head

    @property
    def tail(self) -> QueueEntry:
        """The last linked entry (the head sentinel when empty)."""
        return self._tail

    def add(self, entry: QueueEntry) -> QueueEntry:
        """Append ``entry`` at the tail. Returns it."""
        tail = self._tail
        entry.prev = tail
        tail.next = entry
        self._tail = entry
        self.linked += 1
        return entry

    def next(self, entry: QueueEntry) -> QueueEntry | None:
        n = entry.next
        while n is not None and n.state > ACQUIRED:
            n = n.next
        return n

    def before(self, a: QueueEntry, b: QueueEntry) -> bool:
        return a.entry_id < b.entry_id

    def entry_dead(self, entry: QueueEntry) -> None:
        dead = self._dead
        dead.append(entry)
        if len(dead) >= self.scavenge_batch:
            self.scavenge()

    def scavenge(self) -> int:
        """Unlink every collected dead entry except the tail. Returns how many were unlinked."""
        keep: list[QueueEntry] = []
        tail = self._tail
        n = 0
        for e in self._dead:
            if e is tail:
                keep.append(e)
                continue
            p = e.prev
            nx = e.next
            p.next = nx            # e keeps e.next: pointers resting on e still walk forward
            nx.prev = p            # nx is not None: e is not the tail
            n += 1
        self._dead = keep
        self.linked -= n
        return n
