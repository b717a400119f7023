"""The queue's view of its consumers: :class:`QueueConsumerManager` (seed 002, "QCM").

Lists (seed 002): ``All``; and per consumer priority level ``NonAcquiring`` (browsers),
``NotInterested`` (no credit), ``Interested`` (has credit) and ``Notified`` (pulling now). A
consumer is in ``All`` and in exactly one of the others. Every list is an insertion-ordered
dict used as an ordered set, so appends, removals and moves are O(1). Moves are guarded: they
check the current list against :data:`MOVES` (the one table) and return whether they happened.
"""
from __future__ import annotations

from typing import Iterator

from shoal.node.queues.consumer import ConsumerListState as S
from shoal.node.queues.consumer import QueueConsumer

#: The one table of legal list moves (from, to). DETACHED means "not registered".
MOVES: frozenset[tuple[S, S]] = frozenset({
    (S.DETACHED, S.NON_ACQUIRING), (S.DETACHED, S.NOT_INTERESTED), (S.DETACHED, S.INTERESTED),
    (S.NOT_INTERESTED, S.INTERESTED),     # got credit
    (S.INTERESTED, S.NOT_INTERESTED),     # credit gone / drained
    (S.INTERESTED, S.NOTIFIED),           # chosen to do work
    (S.NOTIFIED, S.INTERESTED),           # pulled all it could: back of Interested (fairness)
    (S.NOTIFIED, S.NOT_INTERESTED),       # used up its credit
    (S.NON_ACQUIRING, S.DETACHED), (S.NOT_INTERESTED, S.DETACHED),
    (S.INTERESTED, S.DETACHED), (S.NOTIFIED, S.DETACHED),
})


class PriorityLevel:
    """The per-priority lists of seed 002 ("PriorityConsumerListPairs")."""

    __slots__ = ("priority", "lists")

    def __init__(self, priority: int) -> None:
        self.priority = priority
        self.lists: dict[S, dict[QueueConsumer, None]] = {
            S.NON_ACQUIRING: {}, S.NOT_INTERESTED: {}, S.INTERESTED: {}, S.NOTIFIED: {}}

    def __len__(self) -> int:
        return sum(len(d) for d in self.lists.values())


class QueueConsumerManager:
    """Tracks a queue's consumers in the seed-002 lists; decides whom to notify.

    ``all``: ordered set of every consumer. ``levels``: PriorityLevels, highest priority first.
    """

    __slots__ = ("all", "levels", "interested_count", "browser_count")

    def __init__(self) -> None:
        self.all: dict[QueueConsumer, None] = {}
        self.levels: list[PriorityLevel] = []
        self.interested_count = 0
        self.browser_count = 0      #: consumers in NonAcquiring (browsers)

    def __len__(self) -> int:
        return len(self.all)

    def __iter__(self) -> Iterator[QueueConsumer]:
        return iter(self.all)

    # --- the one guarded move ---
    def _move(self, consumer: QueueConsumer, to: S) -> bool:
        frm = consumer.list_state
        if (frm, to) not in MOVES:
            return False
        lists = consumer.level.lists
        if frm is not S.DETACHED:
            del lists[frm][consumer]
            if frm is S.INTERESTED:
                self.interested_count -= 1
            elif frm is S.NON_ACQUIRING:
                self.browser_count -= 1
        if to is not S.DETACHED:
            lists[to][consumer] = None
            if to is S.INTERESTED:
                self.interested_count += 1
            elif to is S.NON_ACQUIRING:
                self.browser_count += 1
        consumer.list_state = to
        return True

    # --- registration ---
    def add(self, consumer: QueueConsumer) -> bool:
        """Register ``consumer`` (into NonAcquiring, Interested or NotInterested by credit)."""
        if consumer in self.all:
            return False
        level = None
        for i, lvl in enumerate(self.levels):
            if lvl.priority == consumer.priority:
                level = lvl
                break
            if lvl.priority < consumer.priority:
                level = PriorityLevel(consumer.priority)
                self.levels.insert(i, level)
                break
        if level is None:
            level = PriorityLevel(consumer.priority)
            self.levels.append(level)
        consumer.level = level
        if not consumer.acquires:
            to = S.NON_ACQUIRING
        else:
            to = S.INTERESTED if consumer.credit > 0 else S.NOT_INTERESTED
        self._move(consumer, to)
        self.all[consumer] = None
        return True

    def remove(self, consumer: QueueConsumer) -> bool:
        """Unregister ``consumer``. False if it was not registered."""
        if consumer not in self.all:
            return False
        del self.all[consumer]
        level = consumer.level
        self._move(consumer, S.DETACHED)
        if not len(level):
            self.levels.remove(level)
        consumer.level = None
        return True

    # --- state changes (seed 002 setNotifyWorkDesired / notifyWork) ---
    def set_interest(self, consumer: QueueConsumer, interested: bool) -> bool:
        """NotInterested -> Interested (credit arrived) or Interested/Notified ->
        NotInterested (credit gone). False when the consumer is already there (or a browser)."""
        if interested:
            return self._move(consumer, S.INTERESTED)
        return self._move(consumer, S.NOT_INTERESTED)

    def set_notified(self, consumer: QueueConsumer) -> bool:
        """Interested -> Notified: ``consumer`` was chosen to pull."""
        return self._move(consumer, S.NOTIFIED)

    def no_more_work(self, consumer: QueueConsumer) -> bool:
        """Notified -> back of Interested (it still has credit) or NotInterested (it has not)."""
        if consumer.list_state is not S.NOTIFIED:
            return False
        return self._move(consumer, S.INTERESTED if consumer.credit > 0 else S.NOT_INTERESTED)

    def first_interested(self) -> QueueConsumer | None:
        """The consumer to notify next: head of Interested at the highest priority level."""
        if not self.interested_count:
            return None
        for level in self.levels:
            d = level.lists[S.INTERESTED]
            if d:
                return next(iter(d))
        return None

    def in_list(self, state: S) -> list[QueueConsumer]:
        """Consumers in one list, highest priority first, in list order (for tests, admin)."""
        return [c for lvl in self.levels for c in lvl.lists[state]] if state else []
