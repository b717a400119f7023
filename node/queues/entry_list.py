"""The strict order of a queue: :class:`QueueEntryList` and the FIFO variant (seed 000).

Seed 000 "Strict Ordering": entries stay in the order they were added for their whole life; a
released entry becomes AVAILABLE again where it stood. Consumers keep a pointer (the entry they
last looked at) and walk forward with :meth:`QueueEntryList.next`.

Dead entries (DEQUEUED/DELETED) are unlinked lazily, in batches (seed 004 "scavenging"). An
unlinked entry keeps its ``next`` link, so a consumer pointer resting on it still walks forward
into the live list; the tail is never unlinked (new entries are appended after it).

Variants (seed 000 "Priority Queues", seed 003 9.1): :class:`PriorityQueueEntryList` (one
linked list holding the priority sub-lists back to back, highest first),
:class:`SortedQueueEntryList` (ordered by a header's string value) and
:class:`LastValueQueueEntryList` (FIFO; a newer entry with the same key replaces an available
older one). Each overrides :meth:`add`, :meth:`before` and :attr:`inserts_before_tail`.
"""
from __future__ import annotations

from typing import Iterator

import bisect

from shoal.node.queues.entry import AVAILABLE, DELETED, HELD, QueueEntry

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

    __slots__ = ("_head", "_tail", "_dead", "scavenge_batch", "linked", "settled")

    def __init__(self, scavenge_batch: int = SCAVENGE_BATCH) -> None:
        head = QueueEntry(-1)
        head.state = DELETED
        self._head = head
        self._tail = head
        self._dead: list[QueueEntry] = []
        self.scavenge_batch = scavenge_batch
        self.linked = 0          #: entries currently linked (live + dead not yet unlinked)
        #: journaled queues: the shard's list of entry ids that died (settled in the journal
        #: at the end of the turn, node/durability/durable.py); None for queues without a journal
        self.settled: list[int] | None = None

    @property
    def head(self) -> QueueEntry:
        return self._head

    @property
    def tail(self) -> QueueEntry:
        """The last linked entry (the head sentinel when empty)."""
        return self._tail

    def _link_after(self, prev: QueueEntry, entry: QueueEntry) -> None:
        """Insert ``entry`` right after ``prev`` (out-of-order variants: priority, sorted)."""
        nx = prev.next
        entry.prev = prev
        entry.next = nx
        prev.next = entry
        if nx is None:
            self._tail = entry
        else:
            nx.prev = entry

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
        while n is not None and n.state > HELD:
            n = n.next
        return n

    def before(self, a: QueueEntry, b: QueueEntry) -> bool:
        return a.entry_id < b.entry_id

    def entry_dead(self, entry: QueueEntry) -> None:
        settled = self.settled
        if settled is not None:
            settled.append(entry.entry_id)
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


class PriorityQueueEntryList(StandardQueueEntryList):
    """Strict priority order (seed 000 "Priority Queues"): the sub-list of each level follows
    the one of the next higher level, FIFO within a level. ``levels``: number of levels
    (0..levels-1). An entry's level must be set in ``entry.order`` as ``(-level, entry_id)``
    before :meth:`add` (the Queue does it; see :meth:`order_for`).

    The last linked entry of each level (``_tails``) is never unlinked, so a new entry is
    always inserted after a live link, and a pointer resting on an unlinked entry still walks
    into its level's remaining entries.
    """

    __slots__ = ("_tails", "levels")
    inserts_before_tail = True

    def __init__(self, levels: int, scavenge_batch: int = SCAVENGE_BATCH) -> None:
        super().__init__(scavenge_batch)
        self.levels = levels
        self._head.order = (-(1 << 30), -1)
        self._tails: list[QueueEntry | None] = [None] * levels

    @staticmethod
    def order_for(level: int, entry_id: int) -> tuple[int, int]:
        return (-level, entry_id)

    def add(self, entry: QueueEntry) -> QueueEntry:
        level = -entry.order[0]
        tails = self._tails
        prev = None
        for lv in range(level, self.levels):
            prev = tails[lv]
            if prev is not None:
                break
        if prev is None:
            prev = self._head
        self._link_after(prev, entry)
        tails[level] = entry
        self.linked += 1
        return entry

    def before(self, a: QueueEntry, b: QueueEntry) -> bool:
        return a.order < b.order

    def scavenge(self) -> int:
        keep: list[QueueEntry] = []
        tails = self._tails
        n = 0
        for e in self._dead:
            level = -e.order[0]
            if e is self._tail or tails[level] is e:
                keep.append(e)
                continue
            p = e.prev
            nx = e.next
            p.next = nx
            nx.prev = p
            n += 1
        self._dead = keep
        self.linked -= n
        return n


class SortedQueueEntryList(StandardQueueEntryList):
    """Ordered by ``entry.order`` (seed 003 9.1.3, sorted queues): the Queue sets it to
    ``(0, key, entry_id)`` for a message with the sort header and ``(1, entry_id)`` for one
    without ("inserted into the last position"). Equal keys keep arrival order.

    A sorted index (bisect) finds the insertion point; an unlinked entry gets ``prev = None``
    and :meth:`next` from it looks its successor up in the index, so pointers resting on it
    never skip entries inserted later.
    """

    __slots__ = ("_orders", "_nodes")
    inserts_before_tail = True

    def __init__(self, scavenge_batch: int = SCAVENGE_BATCH) -> None:
        super().__init__(scavenge_batch)
        self._head.order = (-1,)
        self._orders: list = []
        self._nodes: list[QueueEntry] = []

    @staticmethod
    def order_for(key: str | None, entry_id: int) -> tuple:
        return (1, entry_id) if key is None else (0, key, entry_id)

    def add(self, entry: QueueEntry) -> QueueEntry:
        i = bisect.bisect_right(self._orders, entry.order)
        prev = self._nodes[i - 1] if i else self._head
        self._link_after(prev, entry)
        self._orders.insert(i, entry.order)
        self._nodes.insert(i, entry)
        self.linked += 1
        return entry

    def next(self, entry: QueueEntry) -> QueueEntry | None:
        if entry.prev is None and entry is not self._head:   # unlinked: look it up
            i = bisect.bisect_right(self._orders, entry.order)
            n = self._nodes[i] if i < len(self._nodes) else None
        else:
            n = entry.next
        while n is not None and n.state > HELD:
            n = n.next
        return n

    def before(self, a: QueueEntry, b: QueueEntry) -> bool:
        return a.order < b.order

    def scavenge(self) -> int:
        n = 0
        for e in self._dead:
            p = e.prev
            nx = e.next
            p.next = nx
            if nx is None:
                self._tail = p
            else:
                nx.prev = p
            e.prev = None
            n += 1
        self._dead = []
        if n:
            keep = [(o, e) for o, e in zip(self._orders, self._nodes) if e.prev is not None]
            self._orders = [o for o, _ in keep]
            self._nodes = [e for _, e in keep]
        self.linked -= n
        return n


class LastValueQueueEntryList(StandardQueueEntryList):
    """FIFO with conflation (seed 003 9.1.4, LVQ): :meth:`add` of an entry whose ``lvq_key``
    is set deletes the newest older entry with the same key if it is still AVAILABLE (or
    HELD), and reports it in :attr:`replaced` so the Queue can fix its counts. An acquired
    older entry is not replaced; entries without a key are never replaced. ``conflate``
    False (a quorum queue's follower, whose leader logs each replacement) keeps the older
    entry and only notes the newest of each key."""

    __slots__ = ("latest", "replaced", "replaced_held", "conflate")

    def __init__(self, scavenge_batch: int = SCAVENGE_BATCH) -> None:
        super().__init__(scavenge_batch)
        self.latest: dict = {}
        self.replaced: QueueEntry | None = None
        self.replaced_held = False
        self.conflate = True

    def add(self, entry: QueueEntry) -> QueueEntry:
        self.replaced = None
        key = entry.lvq_key
        if key is not None:
            old = self.latest.get(key) if self.conflate else None
            held = old is not None and old.state is HELD
            if old is not None and old.state in (AVAILABLE, HELD) and old.delete():
                self.replaced_held = held
                self.replaced = old
                self.entry_dead(old)
            self.latest[key] = entry
        return super().add(entry)

    def entry_dead(self, entry: QueueEntry) -> None:
        key = entry.lvq_key
        if key is not None and self.latest.get(key) is entry:
            del self.latest[key]
        super().entry_dead(entry)
