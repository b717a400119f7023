"""The per-message features of a queue (docs/queues.md): TTL and expiry, scheduled delivery
(HELD entries), overflow (x-max-length, x-max-length-bytes, x-overflow), dead-lettering,
message groups (seed 003 9.1.7, standard and shared modes), selectors and no_local, consumer
timeouts (seed 004's lock expiry) and x-expires.

:class:`QueueFeatures` is the half of :class:`~shoal.node.queue.Queue` that a queue without
features (``cfg.plain``) never runs: ``Queue`` keeps the plain FIFO path and the pull model
(seed 002) and calls into these methods only when ``cfg.plain`` is false, a message carries an
expiration or schedule, or the queue has groups. The attributes they use are ``Queue``'s.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shoal.shared.selector import selector_fields

from .consumer import QueueConsumer
from .entry import ACQUIRED, AVAILABLE, HELD, QueueEntry
from .entry_features import entry_props, not_before, place, read_properties, ttl_ms
from .queue_args import Overflow, QueueConfig, QueueType

if TYPE_CHECKING:
    from .consumer_manager import QueueConsumerManager
    from .entry_list import QueueEntryList
    from .timers import Timers

#: Dead-letter reasons (RabbitMQ's x-death ``reason`` values).
EXPIRED, REJECTED, MAXLEN, DELIVERY_LIMIT = "expired", "rejected", "maxlen", "delivery_limit"


class QueueFeatures:
    """Mixin of :class:`~shoal.node.queue.Queue`: its feature machinery (see the module)."""

    __slots__ = ()

    # Queue's attributes and methods used here (declared for readers and type checkers).
    cfg: QueueConfig
    entries: QueueEntryList
    qcm: QueueConsumerManager
    timers: Timers
    sink: Any
    deleted: bool
    available: int
    held: int
    ready_bytes: int
    last_used: float
    groups: dict[Any, list] | None
    # and its methods _rewind_pointers, release, notify_work

    def _enqueue_featured(self, entry: QueueEntry, flags: int) -> QueueEntry | None:
        cfg = self.cfg
        props = read_properties(cfg, entry, flags)
        now = self.timers.now
        # overflow: refuse before adding (reject-publish, reject-publish-dlx)
        if cfg.overflow is not Overflow.DROP_HEAD and self._over_limit(len(entry.body)):
            if cfg.overflow is Overflow.REJECT_PUBLISH_DLX:
                self._dead_letter(entry, MAXLEN)
            return None
        place(cfg, entry, props)
        ttl = ttl_ms(cfg, props)
        if ttl is not None:
            entry.expires_at = now + ttl
            self.timers.add(entry.expires_at + 1, self._expire_due, entry)
        at = not_before(props, now, self.timers.wall_to_monotonic)
        if at > now:
            entry.state = HELD
            entry.not_before = at
            self.held += 1
            self.timers.add(at, self._unhold, entry)
        else:
            self.available += 1
        self.ready_bytes += len(entry.body)
        entries = self.entries
        entries.add(entry)
        if cfg.type is QueueType.LAST_VALUE and entries.replaced is not None:
            self._gone_ready(entries.replaced, entries.replaced_held)
        if entries.inserts_before_tail:
            self._rewind_pointers(entry)
        if cfg.overflow is Overflow.DROP_HEAD:
            self._drop_head()
        return entry

    def _gone_ready(self, entry: QueueEntry, was_held: bool) -> None:
        """An AVAILABLE/HELD entry left the ready set by replacement (last-value queues)."""
        if was_held:
            self.held -= 1
        else:
            self.available -= 1
        self.ready_bytes -= len(entry.body)

    def _over_limit(self, extra_bytes: int) -> bool:
        cfg = self.cfg
        if cfg.max_length is not None and self.available + self.held >= cfg.max_length:
            return True
        return cfg.max_length_bytes is not None and \
            self.ready_bytes + extra_bytes > cfg.max_length_bytes

    def _drop_head(self) -> None:
        """x-overflow drop-head (Qpid ring): drop the oldest ready messages while over."""
        cfg = self.cfg
        while (cfg.max_length is not None and self.available + self.held > cfg.max_length) or \
                (cfg.max_length_bytes is not None and self.ready_bytes > cfg.max_length_bytes):
            e = self.entries.first()
            while e is not None and e.state is ACQUIRED:
                e = self.entries.next(e)
            if e is None:
                return
            self._remove_ready(e, MAXLEN)

    def _remove_ready(self, e: QueueEntry, reason: str | None) -> None:
        """Delete an AVAILABLE/HELD entry, dead-lettering it with ``reason`` (None: drop)."""
        was_held = e.state is HELD
        if not e.delete():
            return
        if was_held:
            self.held -= 1
        else:
            self.available -= 1
        self.ready_bytes -= len(e.body)
        self.entries.entry_dead(e)
        if reason is not None:
            self._dead_letter(e, reason)
        e.header = e.body = b""     # dead: its bytes are not needed any more (queue._forget)

    def _dead_letter(self, e: QueueEntry, reason: str) -> None:
        if self.cfg.dlx is not None and self.sink is not None:
            self.sink.dead_letter(self, e, reason)

    def _expired(self, e: QueueEntry) -> bool:
        return e.expires_at != 0 and self.timers.now > e.expires_at

    def _expire_due(self, e: QueueEntry) -> None:
        """Timer: a message's TTL passed. Ready ones go now; acquired ones when released."""
        if not self.deleted and e.state is AVAILABLE and self._expired(e):
            self._remove_ready(e, EXPIRED)

    def _unhold(self, e: QueueEntry) -> None:
        """Timer: a scheduled message's time came: it becomes visible where it stands."""
        if self.deleted or not e.unhold():
            return
        self.held -= 1
        self.available += 1
        self._rewind_pointers(e)
        self.notify_work()

    def _rewind_all(self) -> None:
        """A message group became free: every acquiring consumer looks again from the head
        (groups never block each other, seed 003 9.1.7.2)."""
        head = self.entries.head
        for c in self.qcm.all:
            if c.acquires:
                c.pointer = head

    def _interest(self, c: QueueConsumer, e: QueueEntry) -> bool:
        if c.no_local and e.publisher is not None and e.publisher == c.owner:
            return False
        if c.selector is not None and not c.selector.matches(self._fields(e)):
            return False
        if self.groups is not None and e.group is not None and c.acquires:
            owner = self.groups.get(e.group)
            if owner is not None and owner[0] is not c:
                return False
        return True

    def _fields(self, e: QueueEntry) -> dict:
        return selector_fields(entry_props(e))

    def _acquired(self, e: QueueEntry, c: QueueConsumer | None) -> None:
        groups = self.groups
        if groups is not None and e.group is not None and c is not None:
            owner = groups.get(e.group)
            if owner is None:
                groups[e.group] = [c, 1]
            else:
                owner[1] += 1
        timeout = self.cfg.consumer_timeout
        if c is not None and c.timeout is not None:
            timeout = c.timeout
        if timeout and c is not None and not c.no_ack:
            self.timers.add(self.timers.now + timeout, self._acquire_timeout, e,
                            e.delivery_count)

    def _unacquired(self, e: QueueEntry, c: QueueConsumer | None) -> None:
        """An acquired entry was settled or released (shared groups let go of the group)."""
        groups = self.groups
        if groups is not None and e.group is not None and c is not None:
            owner = groups.get(e.group)
            if owner is not None and owner[0] is c:
                owner[1] -= 1
                if owner[1] <= 0 and self.cfg.shared_groups:
                    del groups[e.group]
                    self._rewind_all()

    def _acquire_timeout(self, e: QueueEntry, count: int) -> None:
        """Timer (x-consumer-timeout, seed 004 lock expiry): still acquired by the same
        delivery -> released to its position, redelivered; the channel stays open."""
        if self.deleted or e.state is not ACQUIRED or e.delivery_count != count:
            return
        c = e.consumer
        if c is not None and c.peer is not None:
            c.peer.unsettled.pop(e.entry_id, None)
        if self.release(e):
            self.notify_work()

    def _check_expires(self) -> None:
        """Timer (x-expires): delete the queue once unused for that long (RabbitMQ: no
        consumers, no basic.get, no redeclare)."""
        if self.deleted:
            return
        due = self.last_used + self.cfg.expires
        if self.qcm.all:
            due = self.timers.now + self.cfg.expires
        elif self.timers.now >= due:
            self.sink.expire_queue(self)
            return
        self.timers.add(due, self._check_expires)
