"""One queue of the node's shard: :class:`Queue` (seeds 000 and 002).

The queue owns its :class:`~shoal.node.entry_list.QueueEntryList` (the strict order) and its
:class:`~shoal.node.consumer_manager.QueueConsumerManager`. Consumers pull (seed 002):
:meth:`Queue.deliver_single_message` walks a consumer's pointer forward and acquires with the
guarded transition. :meth:`Queue.notify_work` notifies ONE interested consumer at a time, which
pulls until it has no credit or the queue has nothing for it, then goes to the back of
Interested (fairness, seed 002). Output goes to a *sink* (the shard) with two methods:
``deliver(consumer, entry)`` and ``work(consumer)``.
"""
from __future__ import annotations

from typing import Callable, Protocol

from .consumer import QueueConsumer
from .consumer_manager import QueueConsumerManager
from .entry import AVAILABLE, QueueEntry
from .entry_list import QueueEntryList, StandardQueueEntryList


class DeliverySink(Protocol):
    def deliver(self, consumer: QueueConsumer, entry: QueueEntry) -> None: ...
    def work(self, consumer: QueueConsumer) -> None: ...


class Queue:
    """A queue (spec 1.7.2 ``queue.declare``) with its entries and consumers.

    ``exclusive_owner``: ``"<router_id>/<connection_id>"`` or None. ``arguments``: the declare
    table. ``next_id``: callable returning node-unique entry ids. ``available``: count of
    AVAILABLE entries (the AMQP ``message_count``).
    """

    __slots__ = ("vhost", "name", "durable", "exclusive_owner", "auto_delete", "arguments",
                 "entries", "qcm", "available", "sink", "next_id", "deleted", "had_consumers",
                 "exclusive_consumer", "work_wanted")

    def __init__(self, vhost: str, name: str, *, durable: bool = False,
                 exclusive_owner: str | None = None, auto_delete: bool = False,
                 arguments: dict | None = None, sink: DeliverySink | None = None,
                 next_id: Callable[[], int] | None = None,
                 entries: QueueEntryList | None = None) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.entries = entries if entries is not None else StandardQueueEntryList()
        self.qcm = QueueConsumerManager()
        self.available = 0
        self.sink = sink
        if next_id is None:
            counter = iter(range(1, 1 << 62))
            next_id = counter.__next__
        self.next_id = next_id
        self.deleted = False
        self.had_consumers = False
        self.exclusive_consumer: QueueConsumer | None = None
        self.work_wanted: dict[QueueConsumer, None] = {}

    # --- counts ---
    @property
    def message_count(self) -> int:
        """AVAILABLE entries (acquired-but-unsettled ones are not counted, as in RabbitMQ)."""
        return self.available

    @property
    def consumer_count(self) -> int:
        return len(self.qcm.all)

    # --- entries ---
    def enqueue(self, exchange: str, routing_key: str, header: bytes, body: bytes) -> QueueEntry:
        """Append a message; returns its entry. Does NOT notify: call :meth:`notify_work`."""
        entry = QueueEntry(self.next_id(), exchange, routing_key, header, body, self)
        self.entries.add(entry)
        self.available += 1
        if self.entries.inserts_before_tail:
            self._rewind_pointers(entry)
        return entry

    def _rewind_pointers(self, entry: QueueEntry) -> None:
        """Move back every consumer pointer that is past ``entry`` (seed 000)."""
        before = self.entries.before
        for c in self.qcm.all:
            if before(entry, c.pointer):
                c.pointer = entry

    def deliver_single_message(self, consumer: QueueConsumer) -> QueueEntry | None:
        """Acquire the next entry for ``consumer`` after its pointer, or None (seed 000
        ``subscriptionReadyAndHasInterest`` + seed 002 ``deliverSingleMessage``).

        Moves the pointer past acquired, dead and uninteresting entries. Does not touch credit.
        """
        node = consumer.pointer
        nxt = self.entries.next
        while node is not None:
            if node.state is AVAILABLE and consumer.has_interest(node) and node.acquire(consumer):
                consumer.pointer = node
                self.available -= 1
                return node
            n = nxt(node)
            if n is None:
                consumer.pointer = node
                return None
            node = n
        return None

    def get(self) -> QueueEntry | None:
        """``basic.get``: acquire the first AVAILABLE entry (no consumer), or None."""
        e = self.entries.first()
        nxt = self.entries.next
        while e is not None:
            if e.state is AVAILABLE and e.acquire(None):
                self.available -= 1
                return e
            e = nxt(e)
        return None

    def release(self, entry: QueueEntry) -> bool:
        """ACQUIRED -> AVAILABLE at its original position, redelivered=True; consumer pointers
        past it move back so it is seen again (seed 000). Caller then calls notify_work."""
        if self.deleted or not entry.release():
            return False
        self.available += 1
        self._rewind_pointers(entry)
        return True

    def dequeue(self, entry: QueueEntry) -> bool:
        """ACQUIRED -> DEQUEUED (acknowledged). False if not acquired (e.g. queue deleted)."""
        if not entry.dequeue():
            return False
        self.entries.entry_dead(entry)
        return True

    def reject(self, entry: QueueEntry) -> bool:
        """ACQUIRED -> DELETED (reject without requeue; dead-lettering comes later)."""
        if entry.state is AVAILABLE or not entry.delete():
            return False
        self.entries.entry_dead(entry)
        return True

    def purge(self) -> int:
        """Delete every AVAILABLE entry (``queue.purge``); acquired ones stay. Returns count."""
        n = 0
        entries = self.entries
        for e in list(entries):
            if e.state is AVAILABLE and e.delete():
                entries.entry_dead(e)
                n += 1
        self.available -= n
        return n

    def delete(self) -> list[QueueConsumer]:
        """Mark the queue deleted: every entry DELETED, every consumer detached. Returns the
        consumers it had (the caller tells their routers: CONSUMER_CANCELLED)."""
        consumers = list(self.qcm.all)
        for c in consumers:
            self.qcm.remove(c)
        self.work_wanted.clear()
        self.exclusive_consumer = None
        for e in list(self.entries):
            e.delete()
        self.available = 0
        self.deleted = True
        return consumers

    # --- consumers ---
    def add_consumer(self, consumer: QueueConsumer) -> None:
        """Attach ``consumer``; its pointer starts at the head (it sees every message)."""
        consumer.queue = self
        consumer.pointer = self.entries.head
        self.qcm.add(consumer)
        self.had_consumers = True
        if consumer.exclusive:
            self.exclusive_consumer = consumer

    def remove_consumer(self, consumer: QueueConsumer) -> bool:
        """Detach ``consumer``; its acquired entries stay acquired (spec: cancel keeps unacked)."""
        if not self.qcm.remove(consumer):
            return False
        self.work_wanted.pop(consumer, None)
        if self.exclusive_consumer is consumer:
            self.exclusive_consumer = None
        return True

    def add_credit(self, consumer: QueueConsumer, credit: int) -> None:
        """Give ``consumer`` more credit and let it pull what it can now."""
        consumer.credit += credit
        if consumer.credit > 0:
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
        if self.available and consumer.credit == 0:
            consumer.wants_work = False
            self.sink.work(consumer)
        else:
            self.work_wanted[consumer] = None

    def _pull(self, consumer: QueueConsumer) -> int:
        """Deliver to ``consumer`` while it has credit and the queue has something for it."""
        n = 0
        sink = self.sink
        while consumer.credit > 0:
            e = self.deliver_single_message(consumer)
            if e is None:
                break
            consumer.credit -= 1
            n += 1
            sink.deliver(consumer, e)
            if consumer.no_ack:
                self.dequeue(e)
        return n

    def notify_work(self) -> None:
        """A message arrived or came back: notify one interested consumer at a time (seed 002)
        until nothing is available or every interested consumer had its turn; then send one WORK
        to each credit-less consumer that asked for it (DG3: no spurious wake-ups)."""
        if not self.available:
            return
        qcm = self.qcm
        tries = qcm.interested_count
        while tries and self.available:
            c = qcm.first_interested()
            qcm.set_notified(c)
            self._pull(c)
            qcm.no_more_work(c)
            tries -= 1
        if self.available and self.work_wanted:
            wanted = [c for c in self.work_wanted if c.credit == 0]
            for c in wanted:
                del self.work_wanted[c]
                c.wants_work = False
                self.sink.work(c)

    def __repr__(self) -> str:
        return f"Queue({self.vhost!r}, {self.name!r}, available={self.available})"
