"""The router's side of delivery leases (node/lease.py has the node's; docs/consumers.md,
"Delivery leases"; wire LEASE_GRANT, LEASE_TAKE, LEASE_TAKEN, LEASE_REVOKE, LEASED and
LEASE_END).

A node lends an empty plain queue's consumers, all on one router, to that router. While the
router holds the lease, a publish on it routed to that queue, with no ``mandatory`` and no
transaction, is written here to the next of those consumers (round robin) that holds credit
at the node and whose channel is writable, with a delivery id of the router's (negative,
never an entry id), and recorded at the node afterwards (LEASED, ahead of its settlements,
``LEASE_FLUSH_S`` later). A publish with a confirm carries its publish id in the record and
is confirmed when the node answers it, as a PUBLISH would be (on disk first where durable);
its record leaves at once when its channel's publisher seems to wait for that confirm
(:class:`ConfirmPace`). Anything else ends the lease first (LEASE_END, behind the records)
and goes through the node as always, so a publishing channel's messages keep their order.

Taking a lease is fenced: LEASE_GRANT is an offer, which the router takes with LEASE_TAKE,
sent behind every PUBLISH it had sent. Until the node answers (LEASE_TAKEN, or LEASE_REVOKE
when the rule no longer holds there) the router holds its publishes to the queue, in order;
then it delivers them itself, or sends them through the node. So no earlier PUBLISH to the
queue is still on its way when the router starts delivering.

A publish that finds none of the lease's consumers with credit or room waits here too, in
order with those after it, for up to ``WAIT_S`` and ``WAIT_MAX`` publishes: a consumer's
acks bring credit back (``Leases.retry``) and the lease goes on. Past either bound the lease
is returned (LEASE_END with ``soon``: the node lends the queue again once it is empty) and
they go through the node, in order. A consumer that falls behind for a moment under a flood
(its process descheduled for a few milliseconds) so keeps its lease.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from shoal.shared.wire import TAG_LEASE_END, TAG_LEASE_TAKE, TAG_LEASED, leasable

from shoal.router.links.node_link import LEASE_FLUSH_S

if TYPE_CHECKING:
    from shoal.router.consumers import Consumer, ConsumerTarget
    from shoal.router.links.node_link import NodeLink
    from shoal.router.session import BrokerChannel

log = logging.getLogger("shoal.router")


class Broker(Protocol):
    """What leases use of router/broker.py's ``Broker``."""

    consumers: dict[int, tuple["BrokerChannel", "Consumer"]]
    links: dict[str, "NodeLink"]
    stats: dict[str, int]

    def mark_dirty(self, client: Any) -> None: ...

    def delivery_failed(self, link: "NodeLink", ch: "BrokerChannel", delivery_id: int) -> None:
        ...

    def publish(self, ch: "BrokerChannel", seq: int, ev: Any, queues: set[str],
                future: Any = None, count: bool = True) -> None: ...

    def next_publish_id(self) -> int: ...

    def pending_answer(self, pid: int, ch: "BrokerChannel", seq: int, ev: Any, node_id: str,
                       queue: str) -> None: ...


#: How long (s) and how many publishes to a lent queue may wait at the router for credit
#: (Leases.hold) before the lease is returned and they go through the node: a consumer's
#: acks late by a scheduler's slice or two, not one that has stopped.
WAIT_S = 0.01
WAIT_MAX = 1024

#: A publisher with confirms outstanding that sent nothing for this long (s) when its
#: records' flush came due is taken to be waiting for them (:class:`ConfirmPace`).
STALL_S = 0.002


class ConfirmPace:
    """When a leased publish's record (and so its confirm) may wait ``LEASE_FLUSH_S``.

    Waiting lets the node wake once per few bursts; but a publisher that keeps at most W
    confirms outstanding would then send W messages per ``LEASE_FLUSH_S``. So the window is
    learned per channel: a channel found with confirms outstanding and silent for
    ``STALL_S`` when its records' flush came due is waiting for them, and its ``window`` is
    how many it had outstanding. From then on a record leaves at once (the end of the
    router's turn) whenever the channel has half its window or more outstanding, so that the
    confirms of one half come back while the publisher sends the other; a channel seen past
    its window raises it. A publisher that waits for each confirm (W = 1) is learned on its
    first publish through a lease; one that never stalls never flushes early.
    """

    __slots__ = ("window", "last")

    def __init__(self) -> None:
        self.window = 1 << 30           #: the confirms outstanding at which it stalled
        self.last = 0.0                 #: time.monotonic() of its last leased confirmed publish

    def now(self, outstanding: int) -> bool:
        """A leased publish with a confirm, ``outstanding`` confirms now outstanding on its
        channel: whether its record should leave at the end of this turn."""
        self.last = time.monotonic()
        if outstanding > self.window:
            self.window = outstanding
        return outstanding * 2 >= self.window

    def check(self, outstanding: int, now: float) -> None:
        """Its records' flush came due: learn a window from a stall."""
        if outstanding and now - self.last >= STALL_S and outstanding < self.window:
            self.window = outstanding


class Lease:
    """A lease held or being taken: its queue's name, its consumers here as (channel,
    consumer), whose turn is next, and, until the node's answer to LEASE_TAKE, the
    publishes to the queue held meanwhile as (channel, confirm seq, publish, counted: False
    for one of a publish to several queues); ``held`` is None once the lease has started."""

    __slots__ = ("queue", "entries", "turn", "held", "offer", "waiting")

    def __init__(self, queue: str, entries: list[tuple["BrokerChannel", "Consumer"]],
                 offer: Any) -> None:
        self.queue = queue
        self.offer = offer              #: the node's offer id, named in every message of it
        self.entries = entries
        self.turn = 0
        self.held: list[tuple["BrokerChannel", int, Any, bool]] | None = []
        #: not 0: the lease started, and ``held`` waits for credit (the wait's number)
        self.waiting = 0

    def pick(self) -> tuple["BrokerChannel", "Consumer"] | None:
        """The next consumer, round robin, that holds credit at the node and whose channel is
        open and writable; None when none does."""
        entries = self.entries
        n = len(entries)
        i = self.turn
        for _ in range(n):
            if i >= n:
                i = 0
            entry = entries[i]
            i += 1
            cch, c = entry
            if c.granted > 0 and not cch.closed and not cch.pool.paused:
                self.turn = i
                return entry
        return None

    def ready(self) -> bool:
        """Whether :meth:`pick` would find a consumer now (without taking its turn)."""
        for cch, c in self.entries:
            if c.granted > 0 and not cch.closed and not cch.pool.paused:
                return True
        return False

    def has(self, c: "Consumer") -> bool:
        return any(e[1] is c for e in self.entries)


class Leases:
    """The leases this router holds: ``held`` maps (vhost, queue) to a :class:`Lease`;
    ``waiting`` those of them whose publishes wait for credit. ``call_later(seconds, fn,
    *args)``: a timer (default: the running event loop's)."""

    def __init__(self, broker: Broker, call_later: Any = None) -> None:
        self._broker = broker
        self.held: dict[tuple[str, str], Lease] = {}
        self.waiting: dict[tuple[str, str], Lease] = {}
        self._last_id = 0
        self._waits = 0
        self._paced: dict["BrokerChannel", None] = {}   # channels to check for a stall
        self._call_later = call_later

    def on_grant(self, link: "NodeLink", cids: Any, offer: Any) -> None:
        """LEASE_GRANT: take the lease offered (LEASE_TAKE, behind every PUBLISH sent; the
        queue's publishes are held until the answer), or decline it (LEASE_END at once,
        naming its first consumer) when a consumer is going or serves several queues, or the
        consumers are not one queue's on this node."""
        if type(cids) is not list or not cids:
            return
        consumers = self._broker.consumers
        entries = []
        key = None
        ok = True
        for cid in cids:
            entry = consumers.get(cid)
            if entry is None:
                ok = False
                break
            ch, c = entry
            t = c.target
            k = (t.vhost, c.queue)
            if key is None:
                key = k
            if k != key or k in self.held or t.cancelled or not t.registered \
                    or len(t.consumers) != 1 or ch.closed or c.node_id != link.node_id:
                ok = False
                break
            entries.append(entry)
        if ok and key is not None:
            self.held[key] = Lease(key[1], entries, offer)
            link.leases += 1
            link.send([TAG_LEASE_TAKE, cids, offer])
            return
        link.send_record([TAG_LEASE_END, cids[0], offer], now=True)

    def on_taken(self, cid: Any, offer: Any) -> None:
        """LEASE_TAKEN: the lease has started; the publishes held meanwhile are delivered
        under it, in order (or through the node, if it does not allow one)."""
        entry = self._broker.consumers.get(cid)
        lease = self._lease_of(entry[1]) if entry is not None else None
        if lease is not None and lease.offer == offer and lease.held is not None \
                and not lease.waiting:
            held, lease.held = lease.held, None
            self._release(lease, held)

    def on_revoke(self, link: "NodeLink", cid: Any, offer: Any) -> None:
        """LEASE_REVOKE: give it back at once (behind the records already queued); the answer
        to a LEASE_TAKE when the node no longer lends the queue. Another lease's: ignored."""
        entry = self._broker.consumers.get(cid)
        lease = self._lease_of(entry[1]) if entry is not None else None
        if lease is not None and lease.offer == offer:
            self._end(entry[1], now=True)

    def route(self, ch: "BrokerChannel", seq: int, ev: Any, queues: Any, future: Any,
              count: bool) -> Any:
        """``Broker.publish`` while this router holds leases: deliver publish ``ev`` under
        the lease of its queue, or hold it while that lease is taken, where the lease allows
        it; returns None when nothing is left to do, else the queues to publish to through
        their nodes (leases of those ended first). ``seq``: its confirm sequence number (0:
        none); ``future``: a transaction's (never leased); ``count``: as ``Broker.publish``."""
        if ev.mandatory or future is not None:
            self.end_for(ch.vhost, queues)
            return queues
        if len(queues) == 1:
            q = next(iter(queues))
            if self.hold(ch, seq, ev, q):
                return None
            pid = self._broker.next_publish_id() if seq else 0
            node_id = self.deliver(ch, ev, q, count=count and not seq, pid=pid)
            if node_id is None:                 # waits for credit
                return None if self.hold(ch, seq, ev, q, count) else queues
            if node_id:
                if seq:
                    self._broker.pending_answer(pid, ch, seq, ev, node_id, q)
                return None
        elif len(queues) > 1 and not seq:
            # each leased queue as if published to alone; the rest through the nodes
            queues = self.deliver_each(ch, ev, queues)
            if not queues:
                self._broker.stats["routed"] += 1
                return None
        self.end_for(ch.vhost, queues)
        return queues

    def hold(self, ch: "BrokerChannel", seq: int, ev: Any, queue: str,
             count: bool = True) -> bool:
        """Hold a publish to ``queue`` (no ``mandatory``, no transaction) while its lease is
        being taken, or while none of its consumers can take it (then for ``WAIT_S`` and
        ``WAIT_MAX`` publishes at most); False when neither. ``count``: False for one queue
        of a publish to several (counted routed by the caller)."""
        lease = self.held.get((ch.vhost, queue))
        if lease is None or lease.held is None or not leasable(ev.header):
            return False
        held = lease.held
        held.append((ch, seq, ev, count))
        if lease.waiting and len(held) >= WAIT_MAX:
            self._end(lease.entries[0][1], soon=True)
        return True

    def _wait(self, key: tuple[str, str], lease: Lease) -> None:
        """None of ``lease``'s consumers can take a publish: hold publishes (:meth:`hold`)
        until credit comes back (:meth:`retry`) or ``WAIT_S`` passes (:meth:`_give_up`)."""
        self._waits += 1
        lease.waiting = wait = self._waits
        lease.held = []
        self.waiting[key] = lease
        self._later(WAIT_S, self._give_up, key, wait)

    def _later(self, seconds: float, fn: Any, *args: Any) -> None:
        if self._call_later is None:    # looked up once: a getpid system call each on 3.11
            self._call_later = asyncio.get_running_loop().call_later
        self._call_later(seconds, fn, *args)

    def _give_up(self, key: tuple[str, str], wait: int) -> None:
        lease = self.waiting.get(key)
        if lease is not None and lease.waiting == wait:
            self._end(lease.entries[0][1], soon=True)

    def retry(self) -> None:
        """Credit came back (``Broker.replenish``): each waiting lease one of whose
        consumers can take a publish now delivers what waits, in order (and may wait again
        on the way)."""
        for key, lease in list(self.waiting.items()):
            if lease.ready():
                del self.waiting[key]
                held, lease.held = lease.held, None
                lease.waiting = 0
                self._release(lease, held)

    def deliver(self, ch: "BrokerChannel", ev: Any, queue: str, count: bool = True,
                pid: int = 0) -> str | None:
        """Deliver publish ``ev`` (routed to ``queue``) under the lease, if one is held and
        allows it, and return the node id its record goes to; None when none of the lease's
        consumers can take it now (the lease starts waiting for credit: the caller holds
        it, :meth:`hold`); else end the lease (if held) and return "": the caller publishes
        through the node. ``count``: count it routed (once per publish: a publish to several
        queues is counted by the caller; a confirmed one when its answer comes). ``pid``: the
        publish id of a publish with a confirm (0: none), answered by the node."""
        key = (ch.vhost, queue)
        lease = self.held.get(key)
        if lease is None:
            return ""
        if not leasable(ev.header) or lease.held is not None:
            self._end(lease.entries[0][1])
            return ""
        entry = lease.pick()
        if entry is None:               # no credit or room now
            self._wait(key, lease)
            return None
        cch, c = entry
        broker = self._broker
        link = broker.links[c.node_id]
        self._last_id -= 1
        did = self._last_id
        record = [TAG_LEASED, c.consumer_id, did, ev.exchange, ev.routing_key, ev.header,
                  ev.body, ch.client.owner]
        if pid:
            record.append(pid)
            link.send_record(record, now=self._pace(ch))
        else:
            link.send_record(record)
        stats = broker.stats
        if count:
            stats["routed"] += 1
        stats["delivered"] += 1
        stats["leased"] += 1
        try:
            cch.deliver(c, did, False, ev.exchange, ev.routing_key, ev.header, ev.body)
        except Exception:  # noqa: BLE001 - a bug costs this connection, not the message
            self._end(c)
            broker.delivery_failed(link, cch, did)
        broker.mark_dirty(cch.client)
        return c.node_id

    def _pace(self, ch: "BrokerChannel") -> bool:
        """Whether a confirmed record of ``ch`` leaves at once (:class:`ConfirmPace`); if not,
        ``ch`` is checked for a stall when its flush comes due."""
        pace = ch.lease_pace
        if pace is None:
            pace = ch.lease_pace = ConfirmPace()
        if pace.now(ch.unconfirmed_count):
            return True
        paced = self._paced
        if not paced:
            self._later(LEASE_FLUSH_S, self._check_stalls)
        paced[ch] = None
        return False

    def _check_stalls(self) -> None:
        paced, self._paced = self._paced, {}
        now = time.monotonic()
        for ch in paced:
            if not ch.closed and ch.lease_pace is not None:
                ch.lease_pace.check(ch.unconfirmed_count, now)

    def deliver_each(self, ch: "BrokerChannel", ev: Any, queues: Any) -> list[str]:
        """A publish routed to several queues (a fanout, a topic), no answer wanted: delivered
        under the lease of each queue whose lease allows it (or held while it is taken), as a
        publish to that queue alone would be; returns the other queues (a lease that did not
        allow it is ended), which go through their nodes. Not counted routed: the caller
        counts the publish once."""
        held, vhost = self.held, ch.vhost
        return [q for q in queues if (vhost, q) not in held or not self._take_copy(ch, ev, q)]

    def _take_copy(self, ch: "BrokerChannel", ev: Any, queue: str) -> bool:
        """One queue's copy of a publish to several: held, delivered, or (False) not."""
        if self.hold(ch, 0, ev, queue, False):
            return True
        node_id = self.deliver(ch, ev, queue, count=False)
        return self.hold(ch, 0, ev, queue, False) if node_id is None else bool(node_id)

    def end_for(self, vhost: str, queues: Any) -> None:
        """A PUBLISH to ``queues`` is about to go through the node: end their leases first."""
        held = self.held
        for q in queues:
            lease = held.get((vhost, q))
            if lease is not None:
                self._end(lease.entries[0][1])

    def forget(self, t: "ConsumerTarget") -> None:
        """``t`` is being cancelled (or its node cancelled it): the node ends the lease when it
        removes the consumer, so nothing is sent."""
        for c in t.consumers:
            if self.holds(c):
                self._drop(c)

    def forget_node(self, node_id: str) -> None:
        """The node is down: every lease on it is gone (the link reset its count); publishes
        held for one go the way of any publish to that node."""
        for lease in list(self.held.values()):
            c = lease.entries[0][1]
            if c.node_id == node_id:
                self._drop(c)

    def holds(self, c: "Consumer") -> bool:
        """Whether this router holds (or is taking) a lease that lends queue consumer ``c``."""
        return self._lease_of(c) is not None

    def _lease_of(self, c: "Consumer") -> Lease | None:
        lease = self.held.get((c.target.vhost, c.queue))
        return lease if lease is not None and lease.has(c) else None

    def _drop(self, c: "Consumer") -> None:
        key = (c.target.vhost, c.queue)
        lease = self.held.pop(key)
        self.waiting.pop(key, None)
        link = self._broker.links[c.node_id]
        if link.leases > 0:
            link.leases -= 1
        if lease.held:              # not taken, or not delivered: through the node, in order
            self._release(lease, lease.held)

    def _end(self, c: "Consumer", now: bool = False, soon: bool = False) -> None:
        """LEASE_END for ``c``'s lease, behind its records (``now``: at the end of this
        turn); ``soon``: returned for want of credit (shared/wire.py)."""
        lease = self.held[(c.target.vhost, c.queue)]
        msg = [TAG_LEASE_END, c.consumer_id, lease.offer]
        if soon:
            msg.append(True)
        self._broker.links[c.node_id].send_record(msg, now=now)
        self._drop(c)

    def _release(self, lease: Lease, held: list) -> None:
        publish = self._broker.publish
        queues = {lease.queue}
        for ch, seq, ev, count in held:
            publish(ch, seq, ev, queues, None, count)
