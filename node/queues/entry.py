"""One message on one queue: :class:`QueueEntry` and its state machine (design.md section 2).

States follow seed 000 ("entry states and compare-and-set acquisition"): an entry is
``AVAILABLE`` until a consumer (or ``basic.get``) acquires it, then ``DEQUEUED`` once settled,
or ``DELETED`` (purged, rejected, expired, replaced, queue deleted). A scheduled message
(``x-delay``, ``x-qpid-not-valid-before``) starts ``HELD``: in its place but invisible until
its time (Qpid's "held" entries, seed 002). Every transition is a guarded method that
returns whether it happened, so no caller can deliver one entry twice. The only table of legal
transitions is :data:`TRANSITIONS`.
"""
from __future__ import annotations

from enum import IntEnum
from typing import Any


class EntryState(IntEnum):
    """State of a :class:`QueueEntry`. Values > HELD are dead (unlinked lazily)."""

    AVAILABLE = 0
    ACQUIRED = 1
    HELD = 2
    DEQUEUED = 3
    DELETED = 4


AVAILABLE = EntryState.AVAILABLE
ACQUIRED = EntryState.ACQUIRED
HELD = EntryState.HELD
DEQUEUED = EntryState.DEQUEUED
DELETED = EntryState.DELETED

#: The one transition table: target state -> states it may be entered from.
TRANSITIONS: dict[EntryState, frozenset[EntryState]] = {
    ACQUIRED: frozenset({AVAILABLE}),            # acquire (consumer pull, basic.get)
    AVAILABLE: frozenset({ACQUIRED, HELD}),      # release (requeue, router gone); hold ends
    DEQUEUED: frozenset({ACQUIRED}),             # dequeue (ack, no-ack delivery)
    DELETED: frozenset({AVAILABLE, ACQUIRED, HELD}),  # purge, reject, expire, replace, delete
}

_FROM_UNHOLD = frozenset({HELD})

_FROM_ACQUIRE = TRANSITIONS[ACQUIRED]
_FROM_RELEASE = frozenset({ACQUIRED})
_FROM_DEQUEUE = TRANSITIONS[DEQUEUED]
_FROM_DELETE = TRANSITIONS[DELETED]


class QueueEntry:
    """A message on a queue, linked into its :class:`~shoal.node.queues.entry_list.QueueEntryList`.

    ``entry_id``: int, unique in the node for its lifetime; it is the wire ``delivery_id``.
    ``header``/``body``: bytes exactly as the publisher sent them (never re-encoded).
    ``consumer``: the acquirer (a consumer, or None for ``basic.get``) while ACQUIRED.
    ``next``/``prev``: list links, owned by the entry list. ``order``: the sort key of
    ordered lists (priority, sorted), else None. ``expires_at``: ms (0 = never).
    ``publisher``: the publishing connection's owner string (no_local). ``group``: the
    message group (groups), ``props``: decoded properties when a feature needed them.
    """

    __slots__ = ("entry_id", "exchange", "routing_key", "header", "body", "redelivered",
                 "delivery_count", "state", "consumer", "queue", "next", "prev", "order",
                 "expires_at", "publisher", "group", "props", "lvq_key", "not_before")

    def __init__(self, entry_id: int, exchange: str = "", routing_key: str = "",
                 header: bytes = b"", body: bytes = b"", queue: Any = None) -> None:
        self.entry_id = entry_id
        self.exchange = exchange
        self.routing_key = routing_key
        self.header = header
        self.body = body
        self.redelivered = False
        self.delivery_count = 0
        self.state = AVAILABLE
        self.consumer: Any = None
        self.queue = queue
        self.next: QueueEntry | None = None
        self.prev: QueueEntry | None = None
        self.order: Any = None
        self.expires_at = 0
        self.publisher: str | None = None
        self.group: Any = None
        self.props: Any = None
        self.lvq_key: Any = None
        self.not_before = 0

    # --- guarded transitions (seed 000: compare-and-set) ---
    def acquire(self, consumer: Any = None) -> bool:
        """AVAILABLE -> ACQUIRED by ``consumer`` (None for basic.get). False if not available."""
        if self.state not in _FROM_ACQUIRE:
            return False
        self.state = ACQUIRED
        self.consumer = consumer
        self.delivery_count += 1
        return True

    def release(self) -> bool:
        """ACQUIRED -> AVAILABLE at the same position, ``redelivered`` set. Else False."""
        if self.state not in _FROM_RELEASE:
            return False
        self.state = AVAILABLE
        self.consumer = None
        self.redelivered = True
        return True

    def unhold(self) -> bool:
        """HELD -> AVAILABLE: a scheduled message's time came. False from any other state."""
        if self.state not in _FROM_UNHOLD:
            return False
        self.state = AVAILABLE
        return True

    def dequeue(self) -> bool:
        """ACQUIRED -> DEQUEUED (settled). False from any other state."""
        if self.state not in _FROM_DEQUEUE:
            return False
        self.state = DEQUEUED
        self.consumer = None
        return True

    def delete(self) -> bool:
        """AVAILABLE, HELD or ACQUIRED -> DELETED (purge, reject, expiry, queue deleted)."""
        if self.state not in _FROM_DELETE:
            return False
        self.state = DELETED
        self.consumer = None
        return True

    @property
    def is_available(self) -> bool:
        return self.state is AVAILABLE

    @property
    def is_dead(self) -> bool:
        """True once DEQUEUED or DELETED: the entry no longer belongs to the queue's order."""
        return self.state > HELD

    def __repr__(self) -> str:
        return f"QueueEntry({self.entry_id}, {self.state.name})"
