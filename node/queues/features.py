"""The per-message features of a queue (docs/queues.md): TTL and expiry, scheduled delivery
(HELD entries), overflow (x-max-length, x-max-length-bytes, x-overflow), dead-lettering,
message groups (seed 003 9.1.7, standard and shared modes), selectors and no_local, consumer
timeouts (seed 004's lock expiry) and x-expires.

:class:`QueueFeatures` is an object each :class:`~shoal.node.queues.queue.Queue` holds
(``queue.features``) and calls at its hook points; a queue without features (``cfg.plain``)
never calls it on its plain FIFO path. ``Queue`` keeps that path and the pull model (seed 002)
and calls in only when ``cfg.plain`` is false, a message carries an expiration or schedule, or
the queue has groups.
"""
from __future__ import annotations

from typing import Any

from shoal.shared.selector import selector_fields

from shoal.node.queues.consumer import QueueConsumer
from shoal.node.queues.entry import ACQUIRED, AVAILABLE, HELD, QueueEntry
from shoal.node.queues.entry_features import entry_props, not_before, place, read_properties, ttl_ms
from shoal.node.queues.args import Overflow, QueueType

#: Dead-letter reasons (RabbitMQ's x-death ``reason`` values).
EXPIRED, REJECTED, MAXLEN, DELIVERY_LIMIT = "expired", "rejected", "maxlen", "delivery_limit"


class QueueFeatures:
    """The feature machinery of one :class:`~shoal.node.queues.queue.Queue` (see the module).

    Held by the queue as ``queue.features`` and called at its hook points: enqueue, acquire,
    release and settle, and the timers these set. It keeps no state of its own: the counts
    (``available``, ``held``, ``ready_bytes``), the entry list, the consumers and the message
    groups are the queue's, read and changed through ``self.queue``.
    """

    __slots__ = ("queue", "zero_ttl")

    def __init__(self, queue: Any) -> None:
        #: the :class:`~shoal.node.queues.queue.Queue` that holds this object (typed ``Any``:
        #: importing ``Queue`` here, even for type checkers, would be an import circle)
        self.queue = queue
        #: entries just published with a TTL of 0 ms: expired by :meth:`expire_untaken`
        #: unless a consumer took them as they arrived
        self.zero_ttl: list[QueueEntry] = []

    def enqueue(self, entry: QueueEntry, flags: int, at: float | None = None) -> QueueEntry | None:
        """Add ``entry`` with its features; ``at``: its enqueue time on the queue's clock
        (default now). A quorum queue's follower (``replica`` not leading) only applies its
        log: it arms no timer, refuses nothing and drops no head (its leader decides those
        and logs them, node/replication/machine.py); a quorum leader's reject-publish was
        decided before the message was logged (node/replication/group.py ``refuses``)."""
        q = self.queue
        cfg = q.cfg
        props = read_properties(cfg, entry, flags)
        now = q.timers.now if at is None else at
        rep = q.replica
        leads = rep is None or rep.leading
        # overflow: refuse before adding (reject-publish, reject-publish-dlx)
        if rep is None and cfg.overflow is not Overflow.DROP_HEAD and \
                self.over_limit(len(entry.body)):
            if cfg.overflow is Overflow.REJECT_PUBLISH_DLX:
                self.dead_letter(entry, MAXLEN)
            return None
        place(cfg, entry, props)
        ttl = ttl_ms(cfg, props)
        if ttl is not None:
            entry.expires_at = now + ttl
            if leads:
                q.timers.add(entry.expires_at + 1, self.expire_due, entry)
                if ttl == 0 and rep is None and at is None:
                    self.zero_ttl.append(entry)
        due = not_before(props, now, q.timers.wall_to_monotonic)
        if due > now:
            entry.state = HELD
            entry.not_before = due
            q.held += 1
            if leads:
                q.timers.add(due, self.unhold, entry)
        else:
            q.available += 1
        q.ready_bytes += len(entry.body)
        entries = q.entries
        entries.add(entry)
        if cfg.type is QueueType.LAST_VALUE and entries.replaced is not None:
            self.gone_ready(entries.replaced, entries.replaced_held)
            if rep is not None:
                rep.removed(entries.replaced)   # the leader logs the replacement (drop)
        if entries.inserts_before_tail:
            q.rewind_pointers(entry)
        if cfg.overflow is Overflow.DROP_HEAD and leads:
            self.drop_head()
        return entry

    def gone_ready(self, entry: QueueEntry, was_held: bool) -> None:
        """An AVAILABLE/HELD entry left the ready set by replacement (last-value queues)."""
        q = self.queue
        if was_held:
            q.held -= 1
        else:
            q.available -= 1
        q.ready_bytes -= len(entry.body)

    def over_limit(self, extra_bytes: int) -> bool:
        q = self.queue
        cfg = q.cfg
        if cfg.max_length is not None and q.available + q.held >= cfg.max_length:
            return True
        return cfg.max_length_bytes is not None and \
            q.ready_bytes + extra_bytes > cfg.max_length_bytes

    def drop_head(self) -> None:
        """x-overflow drop-head (Qpid ring): drop the oldest ready messages while over."""
        q = self.queue
        cfg = q.cfg
        while (cfg.max_length is not None and q.available + q.held > cfg.max_length) or \
                (cfg.max_length_bytes is not None and q.ready_bytes > cfg.max_length_bytes):
            e = q.entries.first()
            while e is not None and e.state is ACQUIRED:
                e = q.entries.next(e)
            if e is None:
                return
            self.remove_ready(e, MAXLEN)

    def remove_ready(self, e: QueueEntry, reason: str | None) -> None:
        """Delete an AVAILABLE/HELD entry, dead-lettering it with ``reason`` (None: drop)."""
        q = self.queue
        was_held = e.state is HELD
        if not e.delete():
            return
        if was_held:
            q.held -= 1
        else:
            q.available -= 1
        q.ready_bytes -= len(e.body)
        q.entries.entry_dead(e)
        if reason is not None:
            self.dead_letter(e, reason)
            if q.replica is not None:           # a quorum queue's leader logs the expiry
                q.replica.removed(e)
        e.header = e.body = b""     # dead: its bytes are not needed any more (queue._forget)

    def dead_letter(self, e: QueueEntry, reason: str) -> None:
        q = self.queue
        if q.cfg.dlx is not None and q.sink is not None:
            q.sink.dead_letter(q, e, reason)

    def expired(self, e: QueueEntry) -> bool:
        """Whether ``e``'s TTL has passed on the queue's clock (never on a quorum queue's
        follower: it reads no clock, its leader logs the expiry)."""
        q = self.queue
        return e.expires_at != 0 and q.timers.now > e.expires_at and \
            (q.replica is None or q.replica.leading)

    def expire_untaken(self) -> None:
        """After a publish was offered to the consumers: its messages with a TTL of 0 that no
        consumer took expire now (RabbitMQ: a message with TTL 0 is delivered at once or
        not at all, so a basic.get right after it finds nothing; one that a consumer took
        and gave back expires when it is released). Classic queues only: a quorum queue's
        leader expires it on its timer, 1 ms on."""
        q = self.queue
        zero, self.zero_ttl = self.zero_ttl, []
        for e in zero:
            if not q.deleted and e.state is AVAILABLE:
                self.remove_ready(e, EXPIRED)

    def expire_due(self, e: QueueEntry) -> None:
        """Timer: a message's TTL passed. Ready ones go now; acquired ones when released."""
        q = self.queue
        if not q.deleted and e.state is AVAILABLE and self.expired(e):
            self.remove_ready(e, EXPIRED)

    def unhold(self, e: QueueEntry) -> None:
        """Timer: a scheduled message's time came: it becomes visible where it stands (on
        a quorum queue's follower it waits: its leader re-arms this when it leads)."""
        q = self.queue
        if q.deleted or (q.replica is not None and not q.replica.leading) or not e.unhold():
            return
        q.held -= 1
        q.available += 1
        q.rewind_pointers(e)
        q.notify_work()

    def rewind_all(self) -> None:
        """A message group became free: every acquiring consumer looks again from the head
        (groups never block each other, seed 003 9.1.7.2)."""
        q = self.queue
        head = q.entries.head
        for c in q.qcm.all:
            if c.acquires:
                c.pointer = head

    def interest(self, c: QueueConsumer, e: QueueEntry) -> bool:
        q = self.queue
        if c.no_local and e.publisher is not None and e.publisher == c.owner:
            return False
        if c.selector is not None and not c.selector.matches(self.fields(e)):
            return False
        if q.groups is not None and e.group is not None and c.acquires:
            owner = q.groups.get(e.group)
            if owner is not None and owner[0] is not c:
                return False
        return True

    def fields(self, e: QueueEntry) -> dict:
        return selector_fields(entry_props(e))

    def acquired(self, e: QueueEntry, c: QueueConsumer | None) -> None:
        q = self.queue
        groups = q.groups
        if groups is not None and e.group is not None and c is not None:
            owner = groups.get(e.group)
            if owner is None:
                groups[e.group] = [c, 1]
            else:
                owner[1] += 1
        timeout = q.cfg.consumer_timeout
        if c is not None and c.timeout is not None:
            timeout = c.timeout
        if timeout and c is not None and not c.no_ack:
            q.timers.add(q.timers.now + timeout, self.acquire_timeout, e,
                            e.delivery_count)

    def unacquired(self, e: QueueEntry, c: QueueConsumer | None) -> None:
        """An acquired entry was settled or released (shared groups let go of the group)."""
        q = self.queue
        groups = q.groups
        if groups is not None and e.group is not None and c is not None:
            owner = groups.get(e.group)
            if owner is not None and owner[0] is c:
                owner[1] -= 1
                if owner[1] <= 0 and q.cfg.shared_groups:
                    del groups[e.group]
                    self.rewind_all()

    def acquire_timeout(self, e: QueueEntry, count: int) -> None:
        """Timer (x-consumer-timeout, seed 004 lock expiry): still acquired by the same
        delivery -> released to its position, redelivered; the channel stays open."""
        q = self.queue
        if q.deleted or e.state is not ACQUIRED or e.delivery_count != count:
            return
        c = e.consumer
        if c is not None and c.peer is not None:
            c.peer.unsettled.pop(e.entry_id, None)
        if q.release(e):
            q.notify_work()

    def check_expires(self) -> None:
        """Timer (x-expires): delete the queue once unused for that long (RabbitMQ: no
        consumers, no basic.get, no redeclare)."""
        q = self.queue
        if q.deleted or q.replica is not None:      # a quorum queue: its leader's clock
            return                                  # (node/replication/group.py)
        due = q.last_used + q.cfg.expires
        if q.qcm.all:
            due = q.timers.now + q.cfg.expires
        elif q.timers.now >= due:
            q.sink.expire_queue(q)
            return
        q.timers.add(due, self.check_expires)
