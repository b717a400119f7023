"""One queue of the node's shard: :class:`Queue` (seeds 000, 002, 003, 004).

The queue owns its :class:`~shoal.node.queues.entry_list.QueueEntryList` (the strict order) and its
:class:`~shoal.node.queues.consumer_manager.QueueConsumerManager`. Consumers pull (seed 002):
:meth:`Queue.deliver_single_message` walks a consumer's pointer forward and acquires with the
guarded transition. :meth:`Queue.notify_work` notifies ONE interested consumer at a time, which
pulls until it has no credit or the queue has nothing for it, then goes to the back of
Interested (fairness, seed 002). Browsers (non-acquiring consumers) are always notified.

Output goes to a *sink* (the shard): ``deliver(consumer, entry)`` and ``work(consumer)``;
queues with features also call ``dead_letter(queue, entry, reason)`` (when
``x-dead-letter-exchange`` is set) and ``browse_done(consumer)`` (``x-filter-auto-close``).

Features (node/queues/args.py, docs/queues.md): queue types, TTL, scheduled delivery (HELD
entries), overflow, dead-lettering, delivery limit, message groups, single active consumer,
selectors, no_local, consumer timeout; what a message's properties make of its entry is in
node/queues/entry_features.py, and what the queue does for them is node/queues/features.py's
(:class:`~shoal.node.queues.features.QueueFeatures`, an object the queue holds as ``features``
and calls at its hook points). A queue without
any (``cfg.plain``) keeps the plain FIFO path: per message it reads two bytes of the content
header and nothing else.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

from shoal.node.queues.consumer import QueueConsumer
from shoal.node.queues.consumer_manager import QueueConsumerManager
from shoal.node.queues.entry import ACQUIRED, AVAILABLE, HELD, QueueEntry
from shoal.node.queues.entry_features import make_entry_list, scheduled
from shoal.node.queues.entry_list import QueueEntryList
from shoal.node.queues.args import Overflow, QueueConfig, parse_queue_arguments
from shoal.node.queues.features import DELIVERY_LIMIT, EXPIRED, REJECTED, QueueFeatures
from shoal.node.timers import Timers


class DeliverySink(Protocol):
    def deliver(self, consumer: QueueConsumer, entry: QueueEntry) -> None: ...
    def work(self, consumer: QueueConsumer) -> None: ...
    def lease_broken(self, queue: "Queue") -> None: ...


class Queue:
    """A queue (spec 1.7.2 ``queue.declare``) with its entries and consumers.

    ``exclusive_owner``: ``"<router_id>/<connection_id>"`` or None. ``arguments``: the declare
    table (checked into ``cfg``; raises AMQPError 406 on bad values). ``next_id``: callable
    returning node-unique entry ids. ``available``: count of AVAILABLE entries (the AMQP
    ``message_count``); ``held``: scheduled entries not yet visible; ``ready_bytes``: body bytes
    of the AVAILABLE and HELD entries (x-max-length-bytes, paging). ``timers``: the node's
    deadline heap (its ``now`` is the queue's clock).
    """

    __slots__ = ("vhost", "name", "durable", "exclusive_owner", "auto_delete", "arguments",
                 "entries", "qcm", "available", "sink", "next_id", "deleted", "had_consumers",
                 "exclusive_consumer", "work_wanted", "cfg", "timers", "held", "ready_bytes",
                 "groups", "active", "last_used", "journaled", "stats", "lease",
                 "lease_offer", "lease_id", "lease_revoked", "lease_hold_until", "features",
                 "replica")

    def __init__(self, vhost: str, name: str, *, durable: bool = False,
                 exclusive_owner: str | None = None, auto_delete: bool = False,
                 arguments: dict | None = None, sink: DeliverySink | None = None,
                 next_id: Callable[[], int] | None = None,
                 entries: QueueEntryList | None = None, timers: Timers | None = None,
                 config: QueueConfig | None = None) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.cfg = config if config is not None else parse_queue_arguments(
            vhost, name, self.arguments)
        #: TTL, scheduling, overflow, dead-lettering, groups, selectors, timeouts, x-expires
        self.features = QueueFeatures(self)
        self.entries = entries if entries is not None else make_entry_list(self.cfg)
        self.qcm = QueueConsumerManager()
        self.available = 0
        self.held = 0
        self.ready_bytes = 0
        self.sink = sink
        if next_id is None:
            counter = iter(range(1, 1 << 62))
            next_id = counter.__next__
        self.next_id = next_id
        self.timers = timers if timers is not None else Timers()
        self.deleted = False
        self.had_consumers = False
        self.exclusive_consumer: QueueConsumer | None = None
        self.work_wanted: dict[QueueConsumer, None] = {}
        # message groups: group -> [owner consumer, acquired count] (seed 003 9.1.7)
        self.groups: dict[Any, list] | None = {} if self.cfg.group_key is not None else None
        self.active: QueueConsumer | None = None          # single active consumer
        self.last_used = self.timers.now
        #: persistent messages of this queue go to the node's journal (node/durability/durable.py)
        self.journaled = False
        #: messages published to it, delivered or fetched from it, acknowledged (QUEUE_LIST:
        #: the management API's message_stats); [publish, deliver_get, ack]
        self.stats = [0, 0, 0]
        #: the consumers whose router holds a delivery lease (node/lease.py), whether it was
        #: revoked, and the clock (ms) before which the queue is not lent again
        self.lease: tuple[QueueConsumer, ...] | None = None
        #: the consumers a lease is offered with, until the router takes or declines it
        self.lease_offer: tuple[QueueConsumer, ...] | None = None
        #: the id of that offer, or of the lease it became (node/lease.py)
        self.lease_id = 0
        self.lease_revoked = False
        self.lease_hold_until = 0.0
        #: a quorum queue's group (node/replication/group.py), None for a classic queue
        self.replica: Any = None
        if self.cfg.expires:
            self.timers.add(self.last_used + self.cfg.expires, self.features.check_expires)

    # --- counts ---
    @property
    def message_count(self) -> int:
        """AVAILABLE entries (acquired-but-unsettled and held ones are not counted); a quorum
        queue's follower: what its member holds (node/replication/machine.py: a lazy one
        holds records, not entries)."""
        rep = self.replica
        return self.available if rep is None or rep.leading else rep.message_count()

    @property
    def consumer_count(self) -> int:
        return len(self.qcm.all)

    def touch(self) -> None:
        """The queue was used (declare, get, consume): restarts its ``x-expires`` clock."""
        self.last_used = self.timers.now

    # --- entries ---
    def enqueue(self, exchange: str, routing_key: str, header: bytes, body: bytes,
                publisher: str | None = None, at: float | None = None) -> QueueEntry | None:
        """Add a message in its place; returns its entry, or None when ``x-overflow``
        refused it (reject-publish: the publisher gets basic.nack). Does NOT notify: call
        :meth:`notify_work`. ``at``: when it was enqueued on the queue's clock (ms), from
        which its TTL and schedule count; default now (a quorum queue's log gives its
        leader's time: node/replication/machine.py)."""
        cfg = self.cfg
        flags = header[12] if len(header) > 13 else 0      # high byte of the property flags
        entry = QueueEntry(self.next_id(), exchange, routing_key, header, body, self)
        entry.publisher = publisher
        if cfg.plain and not flags & 0x01 and not (flags & 0x20 and scheduled(header)):
            self.entries.add(entry)                        # no expiration, not scheduled
            self.available += 1
            self.ready_bytes += len(body)
            return entry
        return self.features.enqueue(entry, flags << 8, at)

    def discard(self, e: QueueEntry) -> None:
        """Take back a just-enqueued entry that could not be journaled (not dead-lettered)."""
        self.features.remove_ready(e, None)

    def rewind_pointers(self, entry: QueueEntry) -> None:
        """Move back every consumer pointer that is past ``entry`` (seed 000)."""
        before = self.entries.before
        for c in self.qcm.all:
            if c.acquires:
                if before(entry, c.pointer):
                    c.pointer = entry
            elif entry.prev is not None and before(entry, c.pointer):
                c.pointer = entry.prev          # browsers: pointer = last seen (exclusive)

    def deliver_single_message(self, consumer: QueueConsumer) -> QueueEntry | None:
        """Acquire the next entry for ``consumer`` after its pointer, or None (seed 000
        ``subscriptionReadyAndHasInterest`` + seed 002 ``deliverSingleMessage``).

        Moves the pointer past acquired, dead and uninteresting entries; expired entries met
        on the way are removed (never delivered). Browsers get the next available entry
        without acquiring it. Does not touch credit.
        """
        if not consumer.acquires:
            return self._browse_next(consumer)
        if self.active is not None and consumer is not self.active:
            return None
        node = consumer.pointer
        nxt = self.entries.next
        plain = consumer.plain and self.groups is None
        while node is not None:
            if node.state is AVAILABLE:
                if node.expires_at and self.features.expired(node):
                    self.features.remove_ready(node, EXPIRED)
                elif (plain or self.features.interest(consumer, node)) and node.acquire(consumer):
                    consumer.pointer = node
                    self.available -= 1
                    self.ready_bytes -= len(node.body)
                    if not self.cfg.plain or self.groups is not None or consumer.timeout:
                        self.features.acquired(node, consumer)
                    return node
            n = nxt(node)
            if n is None:
                consumer.pointer = node
                return None
            node = n
        return None

    def _browse_next(self, c: QueueConsumer) -> QueueEntry | None:
        nxt = self.entries.next
        node = nxt(c.pointer)
        seen = c.seen
        while node is not None:
            if node.state is AVAILABLE and not (node.expires_at and self.features.expired(node)) \
                    and node.entry_id not in seen and self.features.interest(c, node):
                c.pointer = node
                if self.entries.inserts_before_tail:
                    seen.add(node.entry_id)
                return node
            c.pointer = node
            node = nxt(node)
        return None

    def has_work_for(self, c: QueueConsumer) -> bool:
        """Whether ``c`` would get a message now (decides wire WORK: no spurious wake-ups,
        seed 002 DG3)."""
        if not self.available:
            return False
        if c.acquires and c.plain and self.groups is None and self.active is None:
            return True
        if self.active is not None and c.acquires and c is not self.active:
            return False
        nxt = self.entries.next
        node = nxt(c.pointer) if not c.acquires else c.pointer
        while node is not None:
            if node.state is AVAILABLE and not (node.expires_at and self.features.expired(node)) \
                    and (c.acquires or node.entry_id not in c.seen) and self.features.interest(c, node):
                return True
            node = nxt(node)
        return False

    def get(self) -> QueueEntry | None:
        """``basic.get``: acquire the first AVAILABLE entry (no consumer), or None. Skips
        expired entries (removing them) and messages of groups owned by a consumer."""
        self.touch()
        if self.replica is not None:
            self.replica.used()         # a quorum queue's leader logs it (x-expires)
        e = self.entries.first()
        nxt = self.entries.next
        groups = self.groups
        while e is not None:
            n = nxt(e)
            if e.state is AVAILABLE:
                if e.expires_at and self.features.expired(e):
                    self.features.remove_ready(e, EXPIRED)
                elif (groups is None or e.group is None or e.group not in groups) \
                        and e.acquire(None):
                    self.available -= 1
                    self.ready_bytes -= len(e.body)
                    if not self.cfg.plain:
                        self.features.acquired(e, None)
                    return e
            e = n
        return None

    def release(self, entry: QueueEntry, counted: bool = True) -> bool:
        """ACQUIRED -> AVAILABLE at its original position, redelivered=True; consumer pointers
        past it move back so it is seen again (seed 000). Caller then calls notify_work.
        ``counted`` False: the delivery was not a failed attempt (AMQP 1.0 ``released``), so
        it does not count towards the delivery limit.

        With a delivery limit, an entry returned more often than allowed is dead-lettered
        (reason ``delivery_limit``) instead; an expired one is expired. Returns False then."""
        if not counted and entry.delivery_count > 0:
            entry.delivery_count -= 1
        if self.deleted:
            return False
        c = entry.consumer
        cfg = self.cfg
        if cfg.max_returns is not None and entry.state is ACQUIRED and \
                entry.delivery_count > cfg.max_returns:
            if entry.delete():
                self.features.unacquired(entry, c)
                self.entries.entry_dead(entry)
                self.features.dead_letter(entry, DELIVERY_LIMIT)
                _forget(entry)
            return False
        if not entry.release():
            return False
        self.available += 1
        self.ready_bytes += len(entry.body)
        if not cfg.plain or self.groups is not None:
            self.features.unacquired(entry, c)
            if entry.expires_at and self.features.expired(entry):
                self.features.remove_ready(entry, EXPIRED)
                return False
        self.rewind_pointers(entry)
        return True

    def requeued(self) -> None:
        """Messages came back (:meth:`release`): over a length limit with drop-head, the
        oldest ready ones go, the returned ones first (RabbitMQ's ``requeue_and_run``:
        ``maybe_drop_head``); then the consumers are told. Not on a quorum queue."""
        if self.cfg.overflow is Overflow.DROP_HEAD and self.replica is None:
            self.features.drop_head()
        self.notify_work()

    def dequeue(self, entry: QueueEntry) -> bool:
        """ACQUIRED -> DEQUEUED (acknowledged). False if not acquired (e.g. queue deleted)."""
        c = entry.consumer
        if not entry.dequeue():
            return False
        if self.groups is not None:
            self.features.unacquired(entry, c)
        self.entries.entry_dead(entry)
        _forget(entry)
        return True

    def reject(self, entry: QueueEntry) -> bool:
        """ACQUIRED -> DELETED (reject/nack without requeue): dead-lettered with reason
        ``rejected`` when the queue has x-dead-letter-exchange, else dropped."""
        c = entry.consumer
        if entry.state is not ACQUIRED or not entry.delete():
            return False
        if self.groups is not None:
            self.features.unacquired(entry, c)
        self.entries.entry_dead(entry)
        self.features.dead_letter(entry, REJECTED)
        _forget(entry)
        return True

    def purge(self) -> int:
        """Delete every AVAILABLE (and HELD) entry (``queue.purge``); acquired ones stay.
        Purged messages are not dead-lettered (as RabbitMQ). Returns the count."""
        n = 0
        for e in list(self.entries):
            if e.state is AVAILABLE or e.state is HELD:
                self.features.remove_ready(e, None)
                n += 1
        return n

    def delete(self) -> list[QueueConsumer]:
        """Mark the queue deleted: every entry DELETED, every consumer detached. Returns the
        consumers it had (the caller tells their routers: CONSUMER_CANCELLED)."""
        consumers = list(self.qcm.all)
        for c in consumers:
            self.qcm.remove(c)
        self.work_wanted.clear()
        self.exclusive_consumer = None
        self.active = None
        for e in list(self.entries):
            e.delete()
        self.available = self.held = self.ready_bytes = 0
        self.deleted = True
        self.lease = self.lease_offer = None
        return consumers

    # --- consumers ---
    def add_consumer(self, consumer: QueueConsumer) -> None:
        """Attach ``consumer``; its pointer starts at the head (it sees every message)."""
        consumer.queue = self
        consumer.pointer = self.entries.head
        self.qcm.add(consumer)
        self.had_consumers = True
        self.touch()
        if consumer.exclusive:
            self.exclusive_consumer = consumer
        if self.cfg.single_active and consumer.acquires and self.active is None:
            self.active = consumer

    def remove_consumer(self, consumer: QueueConsumer) -> bool:
        """Detach ``consumer``; its acquired entries stay acquired (spec: cancel keeps
        unacked). Standard-mode groups it owned become free; with single active consumer the
        next consumer (in arrival order) becomes active."""
        if not self.qcm.remove(consumer):
            return False
        self.work_wanted.pop(consumer, None)
        if self.lease_offer is not None and consumer in self.lease_offer:
            self.lease_offer = None
        if self.lease is not None and consumer in self.lease:
            self.unlend()                   # the lease ends: the others are served
        self.touch()
        if self.replica is not None:
            self.replica.used()         # a quorum queue's leader logs it (x-expires)
        if self.exclusive_consumer is consumer:
            self.exclusive_consumer = None
        if self.groups is not None and not self.cfg.shared_groups:
            mine = [g for g, owner in self.groups.items() if owner[0] is consumer]
            for g in mine:
                del self.groups[g]
            if mine:
                self.features.rewind_all()
        if self.active is consumer:
            self.active = next((c for c in self.qcm.all if c.acquires), None)
            if self.active is not None:
                self.notify_work()
        return True

    def unlend(self) -> None:
        """The delivery lease is over (node/lease.py): the node delivers again to those of its
        consumers still here that hold credit."""
        lent, self.lease = self.lease, None
        self.lease_revoked = False
        for c in lent or ():
            if c.credit > 0 and c in self.qcm.all:
                self.qcm.set_interest(c, True)

    def add_credit(self, consumer: QueueConsumer, credit: int) -> None:
        """Give ``consumer`` more credit and let it pull what it can now."""
        consumer.credit += credit
        lent = self.lease               # lent: the router delivers to it
        if consumer.credit > 0 and (lent is None or consumer not in lent):
            if not consumer.acquires:
                self._pull(consumer)
                return
            self.qcm.set_interest(consumer, True)
            if self.available:
                self.qcm.set_notified(consumer)
                self._pull(consumer)
                self.qcm.no_more_work(consumer)

    def drain(self, consumer: QueueConsumer) -> int:
        """Take back ``consumer``'s unused credit (after it pulled what it could). Returns it."""
        unused = consumer.credit
        consumer.credit = 0
        self.qcm.set_interest(consumer, False)
        return unused

    def want_work(self, consumer: QueueConsumer) -> None:
        """The consumer (credit 0) asks for one WORK when a message is available for it."""
        consumer.wants_work = True
        if consumer.credit == 0 and self.has_work_for(consumer):
            consumer.wants_work = False
            self.sink.work(consumer)
        else:
            self.work_wanted[consumer] = None

    def _pull(self, consumer: QueueConsumer) -> int:
        """Deliver to ``consumer`` while it has credit and the queue has something for it."""
        n = 0
        sink = self.sink
        if self.replica is not None and not self.replica.may_deliver():
            return 0        # a quorum queue's leader that may have been replaced: wait
        # Nothing available: an acquiring consumer's scan would find nothing (a browser still
        # scans, to reach the end and auto-close).
        while consumer.credit > 0 and (self.available or not consumer.acquires):
            e = self.deliver_single_message(consumer)
            if e is None:
                if consumer.auto_close and not consumer.acquires:
                    sink.browse_done(consumer)
                break
            consumer.credit -= 1
            n += 1
            sink.deliver(consumer, e)
            if consumer.no_ack and consumer.acquires:
                self.dequeue(e)
        return n

    def notify_work(self) -> None:
        """A message arrived or came back: notify one interested consumer at a time (seed 002)
        until nothing is available or every interested consumer had its turn; browsers with
        credit always pull; then send one WORK to each credit-less consumer that asked for it
        and has something to take (DG3: no spurious wake-ups)."""
        if not self.available:
            return
        if self.lease is not None:
            self.sink.lease_broken(self)      # revoke; the lease holder is not interested
        qcm = self.qcm
        tries = qcm.interested_count
        if tries == 1 and self.groups is None:
            # One consumer to notify, the common case: Interested -> Notified -> back of
            # Interested would leave it where it stands, so only leaving for NotInterested
            # (credit used up) is a move. (Groups are excluded: freeing one may notify again
            # from inside the pull.)
            c = qcm.first_interested()
            self._pull(c)
            if c.credit <= 0:
                qcm.set_interest(c, False)
        else:
            while tries and self.available:
                c = qcm.first_interested()
                qcm.set_notified(c)
                self._pull(c)
                qcm.no_more_work(c)
                tries -= 1
        if qcm.browser_count:
            for c in [c for c in qcm.all if not c.acquires and c.credit > 0]:
                if not self.deleted:
                    self._pull(c)
        if self.available and self.work_wanted:
            wanted = [c for c in self.work_wanted if c.credit == 0 and self.has_work_for(c)]
            for c in wanted:
                del self.work_wanted[c]
                c.wants_work = False
                self.sink.work(c)

    def __repr__(self) -> str:
        return f"Queue({self.vhost!r}, {self.name!r}, available={self.available})"


def _forget(entry: QueueEntry) -> None:
    """Drop a dead entry's message bytes once nothing needs them (after any dead-lettering):
    the entry stays linked until the list scavenges it (consumer pointers may rest on it,
    seed 000), but must not keep a large body resident meanwhile."""
    entry.header = entry.body = b""
