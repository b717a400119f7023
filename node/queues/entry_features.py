"""What a message's properties make of its entry on a queue with features (docs/queues.md).

:class:`~shoal.node.queues.queue.Queue` keeps the entry states and counts; this module reads the
content header of a new message once and derives, without touching the queue:

- its place in the order: priority level (seed 003 ``x-max-priority``, Qpid's priority
  queue), sort key (Qpid ``qpid.queue_sort_key``), last-value key (``qpid.last_value_queue_key``);
- its message group (seed 003 9.1.7, ``qpid.group_header_key``);
- its time to live in ms: the smaller of the ``expiration`` property and ``x-message-ttl``
  (RabbitMQ's rule);
- when it may be delivered (scheduled delivery: ``x-delay`` in ms, ``x-qpid-not-valid-before``
  in epoch ms).

Unparseable properties count as absent: the message is enqueued as if it had none.
"""
from __future__ import annotations

from typing import Any, Callable

from shoal.shared.header_table import F_HEADERS
from shoal.shared.wire import scheduled

from shoal.node.queues.entry import QueueEntry
from shoal.node.queues.entry_list import (LastValueQueueEntryList, PriorityQueueEntryList, QueueEntryList,
                         SortedQueueEntryList, StandardQueueEntryList)
from shoal.node.queues.message import (F_EXPIRATION, F_PRIORITY, expiration_ms, header_value,
                                       parse_properties)
from shoal.node.queues.args import QueueConfig, QueueType

#: entry.props after a parse that found nothing usable (None means "not parsed yet")
NO_PROPS = False


def make_entry_list(cfg: QueueConfig) -> QueueEntryList:
    """The QueueEntryList variant for a queue's type."""
    if cfg.type is QueueType.PRIORITY:
        return PriorityQueueEntryList(cfg.max_priority + 1)
    if cfg.type is QueueType.SORTED:
        return SortedQueueEntryList()
    if cfg.type is QueueType.LAST_VALUE:
        return LastValueQueueEntryList()
    return StandardQueueEntryList()


def read_properties(cfg: QueueConfig, entry: QueueEntry, flags: int) -> Any:
    """Parse ``entry``'s properties if the queue's features need them (``flags``: the
    content header's property flags, 16 bits); stores them on ``entry.props`` and returns
    them, or None when not needed or unparseable."""
    qtype = cfg.type
    need = bool(flags & F_EXPIRATION)
    if flags & F_HEADERS:
        need = need or (cfg.needs_props and qtype is not QueueType.PRIORITY) \
            or scheduled(entry.header)
    if qtype is QueueType.PRIORITY and flags & F_PRIORITY:
        need = True
    if not need:
        return None
    return entry_props(entry)


def entry_props(entry: QueueEntry) -> Any:
    """``entry``'s properties, parsed once and kept on ``entry.props``; None when the header
    is unparseable (then kept as :data:`NO_PROPS`, so it is not parsed again)."""
    props = entry.props
    if props is None:
        props = parse_properties(entry.header)
        entry.props = props if props is not None else NO_PROPS
    return None if props is NO_PROPS else props


def place(cfg: QueueConfig, entry: QueueEntry, props: Any) -> None:
    """Set the entry's order key (priority, sorted), last-value key and message group.
    A priority outside the queue's levels is clamped; no priority property means 0 on an
    ``x-max-priority`` queue (RabbitMQ) and 4 on an ``x-qpid-priorities`` one (the JMS
    default, as Qpid; docs/queues.md)."""
    qtype = cfg.type
    if qtype is QueueType.PRIORITY:
        prio = props.priority if props is not None and props.priority is not None \
            else cfg.default_priority
        level = min(max(prio - cfg.priority_offset, 0), cfg.max_priority)
        entry.order = (-level, entry.entry_id)
    elif qtype is QueueType.SORTED:
        key = header_value(props, cfg.sort_key)
        entry.order = SortedQueueEntryList.order_for(None if key is None else str(key),
                                                     entry.entry_id)
    elif qtype is QueueType.LAST_VALUE:
        entry.lvq_key = hashable(header_value(props, cfg.lvq_key))
    if cfg.group_key is not None:
        g = hashable(header_value(props, cfg.group_key))
        entry.group = cfg.default_group if g is None and cfg.shared_groups else g


def ttl_ms(cfg: QueueConfig, props: Any) -> int | None:
    """The message's time to live in ms (the smaller of ``expiration`` and the queue's
    ``x-message-ttl``), or None: it never expires."""
    ttl = expiration_ms(props)
    if cfg.message_ttl is not None and (ttl is None or cfg.message_ttl < ttl):
        ttl = cfg.message_ttl
    return ttl


def not_before(props: Any, now: float, wall_to_monotonic: Callable[[float], float]) -> float:
    """When a scheduled message becomes visible, on the queue's clock (ms); 0 when it is not
    scheduled. ``x-qpid-not-valid-before`` is epoch ms (converted by ``wall_to_monotonic``),
    ``x-delay`` ms from ``now``; the later of the two wins. Non-numeric values are ignored."""
    if not props or not props.headers:
        return 0
    h = props.headers
    at = 0.0
    nvb = h.get("x-qpid-not-valid-before")
    if isinstance(nvb, (int, float)) and not isinstance(nvb, bool):
        at = wall_to_monotonic(nvb)
    delay = h.get("x-delay")
    if isinstance(delay, (int, float)) and not isinstance(delay, bool) and delay > 0:
        at = max(at, now + delay)
    return at


def hashable(v: Any) -> Any:
    """A header value usable as a dict key (tables and arrays by their repr)."""
    if isinstance(v, (dict, list)):
        return repr(v)
    return v
