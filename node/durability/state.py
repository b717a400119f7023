"""What the journal's records add up to: :class:`JournalState` (design.md section 5).

The same code applies records at replay (rebuilding a node) and at append (keeping the live
index the journal compacts with), so the two cannot disagree. Rules, in log order:

- ENQUEUE adds entry ``entry_id`` (a later ENQUEUE of the same id is a compaction copy and
  replaces it, keeping the id and so the position); SETTLE removes entries; DELIVERY_STATE
  updates ``redelivered`` / ``delivery_count`` of live entries; unknown ids are ignored.
- QUEUE_DELETED removes the queue and its entries. EXCHANGE_DELETED removes the exchange and
  the bindings whose source it is. TOPOLOGY_SNAPSHOT replaces all topology and drops the entries
  of queues it does not list.
- Queue order on recovery is entry id order (ids grow in enqueue order).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from shoal.node.durability.format import (BindingAdded, BindingRemoved, DeliveryState, Enqueue,
                             ExchangeDeclared, ExchangeDeleted, QueueDeclared, QueueDeleted,
                             Record, Settle, TopologySnapshot)
from shoal.shared.topology import freeze

log = logging.getLogger("shoal.node.durability.journal")

QueueKey = tuple[str, str]          # (vhost, queue name)


class LiveEntry:
    """Index entry of one live ENQUEUE: where its current copy is and its delivery state.
    ``segment`` 0 means written by a commit not finished yet."""

    __slots__ = ("qkey", "segment", "offset", "size", "redelivered", "delivery_count")

    def __init__(self, qkey: QueueKey, redelivered: bool, delivery_count: int) -> None:
        self.qkey = qkey
        self.segment = 0
        self.offset = 0
        self.size = 0
        self.redelivered = redelivered
        self.delivery_count = delivery_count


@dataclass
class TornTail:
    """A torn tail cut at recovery: ``path``, ``offset`` (new file size), ``dropped`` bytes."""

    path: str
    offset: int
    dropped: int
    reason: str


@dataclass
class Recovered:
    """The durable state found by :meth:`Journal.open`, for the node to rebuild from.

    ``queues``/``exchanges``: (vhost, name) -> declare record; ``bindings``: BindingAdded
    records; ``messages``: (vhost, queue) -> Enqueue records in queue order (entry id order)
    with their current ``redelivered``/``delivery_count``; ``max_entry_id``: the largest entry
    id in the log (the node's id counter must continue above it); ``cuts``: torn tails cut.
    """

    queues: dict[QueueKey, QueueDeclared] = field(default_factory=dict)
    exchanges: dict[QueueKey, ExchangeDeclared] = field(default_factory=dict)
    bindings: list[BindingAdded] = field(default_factory=list)
    messages: dict[QueueKey, list[Enqueue]] = field(default_factory=dict)
    max_entry_id: int = 0
    cuts: list[TornTail] = field(default_factory=list)


def _binding_key(r: BindingAdded | BindingRemoved) -> tuple:
    return (r.vhost, r.exchange, r.dest_kind, r.destination, r.routing_key, freeze(r.arguments))


class JournalState:
    """Topology plus the index of live entries. ``on_dead(entry)`` is called for every live
    entry that stops being live (settled, replaced, queue deleted) so segment accounting can
    follow. ``messages``: when not None (replay), the full ENQUEUE record of each live entry."""

    def __init__(self, on_dead: Callable[[LiveEntry], None], keep_messages: bool) -> None:
        self.on_dead = on_dead
        self.queues: dict[QueueKey, QueueDeclared] = {}
        self.exchanges: dict[QueueKey, ExchangeDeclared] = {}
        self.bindings: dict[tuple, BindingAdded] = {}
        self.entries: dict[int, LiveEntry] = {}
        self.by_queue: dict[QueueKey, dict[int, None]] = {}
        self.messages: dict[int, Enqueue] | None = {} if keep_messages else None
        self.max_entry_id = 0

    # ------------------------------------------------------------------ entries
    def kill(self, entry_id: int) -> None:
        e = self.entries.pop(entry_id, None)
        if e is None:
            return
        ids = self.by_queue.get(e.qkey)
        if ids is not None:
            ids.pop(entry_id, None)
        if self.messages is not None:
            self.messages.pop(entry_id, None)
        self.on_dead(e)

    def add_entry(self, qkey: QueueKey, entry_id: int, redelivered: bool,
                  delivery_count: int) -> LiveEntry:
        """Index a new live entry (``entry_id`` not live); returns it."""
        if entry_id > self.max_entry_id:
            self.max_entry_id = entry_id
        e = self.entries[entry_id] = LiveEntry(qkey, bool(redelivered), int(delivery_count))
        ids = self.by_queue.get(qkey)
        if ids is None:
            ids = self.by_queue[qkey] = {}
        ids[entry_id] = None
        return e

    def _drop_queue_entries(self, qkey: QueueKey) -> None:
        for entry_id in list(self.by_queue.pop(qkey, ())):
            self.kill(entry_id)

    def apply(self, rec: Record) -> LiveEntry | None:
        """Apply one record; for an ENQUEUE returns its new LiveEntry. An ENQUEUE may name a
        queue not declared yet: its declaration was compacted away and the TOPOLOGY_SNAPSHOT
        that replaces it comes later in the log (see :meth:`drop_orphans`)."""
        t = type(rec)
        if t is Enqueue:
            qkey = (rec.vhost, rec.queue)
            if rec.entry_id > self.max_entry_id:
                self.max_entry_id = rec.entry_id
            self.kill(rec.entry_id)                    # compaction copy replaces
            e = self.add_entry(qkey, rec.entry_id, rec.redelivered, rec.delivery_count)
            if self.messages is not None:
                self.messages[rec.entry_id] = rec
            return e
        if t is Settle:
            for entry_id in rec.entry_ids:
                if entry_id > self.max_entry_id:
                    self.max_entry_id = entry_id
                self.kill(entry_id)
        elif t is DeliveryState:
            for entry_id, redelivered, count in rec.updates:
                e = self.entries.get(entry_id)
                if e is not None:
                    e.redelivered = bool(redelivered)
                    e.delivery_count = int(count)
        elif t is QueueDeclared:
            self.queues[(rec.vhost, rec.name)] = rec
        elif t is QueueDeleted:
            self.queues.pop((rec.vhost, rec.name), None)
            self._drop_queue_entries((rec.vhost, rec.name))
        elif t is ExchangeDeclared:
            self.exchanges[(rec.vhost, rec.name)] = rec
        elif t is ExchangeDeleted:
            self.exchanges.pop((rec.vhost, rec.name), None)
            for key in [k for k in self.bindings if k[0] == rec.vhost and k[1] == rec.name]:
                del self.bindings[key]
        elif t is BindingAdded:
            self.bindings[_binding_key(rec)] = rec
        elif t is BindingRemoved:
            self.bindings.pop(_binding_key(rec), None)
        elif t is TopologySnapshot:
            self.queues = {}
            for items in rec.queues:
                q = QueueDeclared(*items)
                self.queues[(q.vhost, q.name)] = q
            self.exchanges = {}
            for items in rec.exchanges:
                x = ExchangeDeclared(*items)
                self.exchanges[(x.vhost, x.name)] = x
            self.bindings = {}
            for items in rec.bindings:
                b = BindingAdded(*items)
                self.bindings[_binding_key(b)] = b
            for qkey in [k for k in self.by_queue if k not in self.queues]:
                self._drop_queue_entries(qkey)
        return None

    def drop_orphans(self) -> None:
        """End of replay: drop entries of queues that are not declared (logged)."""
        for qkey in [k for k in self.by_queue if k not in self.queues]:
            n = len(self.by_queue[qkey])
            if n:
                log.warning("journal: %d entries name undeclared queue %r in vhost %r; "
                            "dropped", n, qkey[1], qkey[0])
            self._drop_queue_entries(qkey)

    def snapshot(self) -> TopologySnapshot:
        """The current topology as one TOPOLOGY_SNAPSHOT record."""
        return TopologySnapshot([q.to_list() for q in self.queues.values()],
                                [x.to_list() for x in self.exchanges.values()],
                                [b.to_list() for b in self.bindings.values()])

    def recovered(self) -> Recovered:
        """The state as a :class:`Recovered` (replay mode only; call :meth:`drop_orphans`)."""
        assert self.messages is not None
        messages: dict[QueueKey, list[Enqueue]] = {}
        for qkey, ids in self.by_queue.items():
            if not ids:
                continue
            out = []
            for entry_id in sorted(ids):
                rec = self.messages[entry_id]
                e = self.entries[entry_id]
                rec.redelivered = e.redelivered
                rec.delivery_count = e.delivery_count
                out.append(rec)
            messages[qkey] = out
        return Recovered(dict(self.queues), dict(self.exchanges), list(self.bindings.values()),
                         messages, self.max_entry_id)
