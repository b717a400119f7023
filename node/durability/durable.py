"""The shard's side of the journal: :class:`DurableLog` (design.md section 5, issue 5).

:class:`~shoal.node.durability.journal.Journal` is the storage engine; this module decides *what* a shard
journals and *when* answers may leave (docs/durability.md, "Where the node calls it"):

- ENQUEUE of persistent messages (``delivery_mode`` 2, :func:`~shoal.node.queues.message.is_persistent`)
  on durable queues (``queue.journaled``: durable and not exclusive, as RabbitMQ);
- SETTLE of every entry of a journaled queue that dies (ack, reject, expiry, purge, LVQ
  replacement, drop-head, dead-lettering): the entry lists collect the ids in
  :attr:`DurableLog.settled`, written once per turn by :meth:`DurableLog.flush`;
- DELIVERY_STATE ``(entry_id, True, delivery_count)`` for every acquiring delivery, so a message
  delivered before a crash comes back with ``redelivered`` set and its delivery count;
- topology: durable queues, durable exchanges, and bindings whose source exchange is durable
  (built-in exchanges are durable). The node that owns a binding's source does not know whether
  a destination *queue* (on another node) is durable, so such bindings are kept whatever the
  destination; a binding to a queue that is gone routes to nothing.

Answers that promise durability wait in :attr:`DurableLog.deferred` until the journal's
``durable_lsn`` reaches their LSN: PUBLISH_RESULT of a publish that wrote an ENQUEUE, and the
REPLY of a topology request made while journal records were pending. Everything else is
answered at once.
"""
from __future__ import annotations

import itertools
import logging
from collections import deque
from typing import TYPE_CHECKING, Protocol

from shoal.shared.errors import AMQPError
from shoal.shared.wire import (
    EV_BINDING_ADDED,
    EV_BINDING_REMOVED,
    EV_EXCHANGE_ADDED,
    EV_EXCHANGE_REMOVED,
)

from shoal.node.queues.entry import HELD, QueueEntry
from shoal.node.durability.journal import Journal
from shoal.node.durability.state import Recovered
from shoal.node.queues.paging import PageStore
from shoal.node.timers import Timers
from shoal.node.topology import BUILTIN_EXCHANGES, Topology

if TYPE_CHECKING:
    from shoal.node.queues.queue import Queue

log = logging.getLogger("shoal.node.durability.durable")


class RestoreTarget(Protocol):
    """What :meth:`DurableLog.restore` rebuilds: an empty shard (node/shard.py's ``Shard``,
    which passes itself; this module does not import it)."""

    node_id: str
    topology: Topology
    timers: Timers
    queues: dict[tuple[str, str], Queue]
    pages: PageStore | None

    def reset_entry_ids(self, start: int) -> None: ...

    def restore_queue(self, vhost: str, name: str, auto_delete: bool, args: dict) -> Queue: ...


class DurableLog:
    """Journal glue of one shard. ``journal``: the open Journal; ``wall_offset_ms``: epoch ms
    minus the shard's monotonic ms (times on disk are epoch ms)."""

    def __init__(self, journal: Journal, wall_offset_ms: float) -> None:
        self.journal = journal
        self.wall_offset_ms = wall_offset_ms
        self.settled: list[int] = []                    #: ids that died this turn
        self.delivered: list[tuple[int, bool, int]] = []  #: deliveries this turn
        self.deferred: deque[tuple[int, bytes, list]] = deque()  #: (lsn, router, message)
        self.last_lsn = 0          #: LSN of the last record this shard appended
        self.replaying = False     #: rebuilding from the journal: topology is not re-journaled

    # ---- records --------------------------------------------------------------------------
    def attach(self, q: Queue) -> None:
        """Make ``q`` journaled (durable, not exclusive): its dead entries are settled."""
        q.journaled = True
        q.entries.settled = self.settled

    def declare_queue(self, q: Queue) -> None:
        self.attach(q)
        if not self.replaying:
            self.last_lsn = self.journal.declare_queue(q.vhost, q.name, q.auto_delete,
                                                       q.arguments)

    def delete_queue(self, q: Queue) -> None:
        if q.journaled:
            self.last_lsn = self.journal.delete_queue(q.vhost, q.name)

    def enqueue(self, q: Queue, e: QueueEntry, now_ms: float) -> int:
        """ENQUEUE ``e`` (just added to ``q``); returns its LSN. Raises JournalUnavailable
        (disk failing and the buffer full)."""
        off = self.wall_offset_ms
        lsn = self.journal.enqueue(
            q.vhost, q.name, e.entry_id, e.exchange, e.routing_key, e.header, e.body,
            redelivered=e.redelivered, delivery_count=e.delivery_count,
            enqueue_ms=int(now_ms + off),
            expiry_ms=int(e.expires_at + off) if e.expires_at else 0,
            not_before_ms=int(e.not_before + off) if e.state is HELD else 0)
        self.last_lsn = lsn
        return lsn

    def topology_event(self, event: int, data: list, exchanges: dict) -> None:
        """A change of the shard's Topology (the same EV_* data routers get)."""
        if self.replaying:
            return
        j = self.journal
        if event == EV_EXCHANGE_ADDED:
            vhost, name, type_, durable, auto_delete, internal, args = data
            if durable:
                self.last_lsn = j.declare_exchange(vhost, name, type_, bool(auto_delete),
                                                   bool(internal), args)
        elif event == EV_EXCHANGE_REMOVED:
            if (data[0], data[1]) in j.state.exchanges:
                self.last_lsn = j.delete_exchange(data[0], data[1])
        elif event in (EV_BINDING_ADDED, EV_BINDING_REMOVED):
            vhost, exchange = data[0], data[1]
            ex = exchanges.get((vhost, exchange))
            if exchange in BUILTIN_EXCHANGES or (ex is not None and ex.durable):
                fn = j.bind if event == EV_BINDING_ADDED else j.unbind
                self.last_lsn = fn(*data)

    def flush(self) -> None:
        """Append this turn's DELIVERY_STATE and SETTLE records (ids not journaled are
        ignored by the journal)."""
        if self.delivered:
            self.last_lsn = self.journal.delivery_state(self.delivered)
            self.delivered = []
        if self.settled:
            self.last_lsn = self.journal.settle(self.settled)
            self.settled.clear()          # the list object is shared with the entry lists

    # ---- answers --------------------------------------------------------------------------
    def defer(self, lsn: int, identity: bytes, msg: list) -> None:
        self.deferred.append((lsn, identity, msg))

    def ready(self) -> list[tuple[bytes, list]]:
        """Deferred answers whose records are now durable, in order."""
        durable = self.journal.durable_lsn
        out = []
        d = self.deferred
        while d and d[0][0] <= durable:
            _, identity, msg = d.popleft()
            out.append((identity, msg))
        return out

    def forget_router(self, identity: bytes) -> None:
        """A router went away: its deferred answers are dropped (it nacks them itself)."""
        self.deferred = deque(x for x in self.deferred if x[1] != identity)

    # ---- recovery -------------------------------------------------------------------------
    def restore(self, shard: RestoreTarget, rec: Recovered, clean: bool = True) -> int:
        """Rebuild ``shard`` from ``rec`` (Journal.recovered): durable exchanges, durable
        queues with their arguments, bindings, then every queue's messages in their original
        order with the same entry ids, ``redelivered``, delivery counts, TTL deadlines and
        scheduled times. Expired messages go at the first tick (settled). The entry id counter
        continues above ``rec.max_entry_id``. Returns the number of messages restored.

        ``clean=False`` (the node did not stop cleanly: the DELIVERY_STATE records of its last
        turn may be lost) sets ``redelivered`` on every restored message and journals that,
        so a message that may have been delivered never comes back looking fresh (AMQP
        0-9-1 1.8.3.9: redelivered means "may have been delivered before")."""
        shard.reset_entry_ids(rec.max_entry_id + 1)
        self.replaying = True
        try:
            for x in rec.exchanges.values():
                shard.topology.declare_exchange(x.vhost, x.name, x.type, False, True,
                                                bool(x.auto_delete), bool(x.internal),
                                                x.arguments or {})
            for qd in rec.queues.values():
                shard.restore_queue(qd.vhost, qd.name, bool(qd.auto_delete), qd.arguments or {})
            for b in rec.bindings:
                try:
                    shard.topology.bind(b.vhost, b.exchange, b.dest_kind, b.destination,
                                        b.routing_key, b.arguments or {})
                except AMQPError as err:
                    log.warning("journal: binding of exchange '%s' not restored: %s",
                                b.exchange, err.text)
        finally:
            self.replaying = False
        timers = shard.timers
        pages = shard.pages
        n = 0
        for qkey, msgs in rec.messages.items():
            q = shard.queues.get(qkey)
            if q is None:
                continue
            keep_id = q.next_id
            for m in msgs:
                q.next_id = itertools.repeat(m.entry_id).__next__
                e = q.enqueue(m.exchange, m.routing_key, m.header, m.body, None)
                if e is None:           # over x-max-length with reject-publish: not kept
                    self.settled.append(m.entry_id)
                    continue
                n += 1
                e.redelivered = bool(m.redelivered) or not clean
                if not clean and not m.redelivered:
                    self.delivered.append((m.entry_id, True, int(m.delivery_count)))
                e.delivery_count = int(m.delivery_count)
                if m.expiry_ms:
                    e.expires_at = max(1.0, timers.wall_to_monotonic(m.expiry_ms))
                    timers.add(e.expires_at + 1, q.features.expire_due, e)
                if m.not_before_ms and e.state is HELD:
                    e.not_before = timers.wall_to_monotonic(m.not_before_ms)
                    timers.add(e.not_before, q.features.unhold, e)
                if pages is not None and pages.over_budget(q):
                    e.body = pages.page_out(m.body)     # a long queue restored: paged again
            q.next_id = keep_id
        log.log(logging.INFO if rec.queues or rec.exchanges else logging.DEBUG,
                "node %s: restored %d queues, %d exchanges, %d bindings, %d messages",
                 shard.node_id, len(rec.queues), len(rec.exchanges), len(rec.bindings), n)
        return n
