"""The leader's deliveries of one quorum queue as log entries: checkouts and marks
(docs/replication.md "Checkouts in the log"; RabbitMQ's rabbit_fifo checkouts).

A delivery (or a basic.get's answer) is held until its ``checkout`` entry is applied, so that
a new leader knows exactly what was delivered and not settled. Marks (``mark``, and an
``enq`` logged checked out) put messages in the log checked out before a consumer has credit
for them, so that a consumer that keeps up is not a log round behind. :class:`Checkouts` is
the bookkeeping of one :class:`~shoal.node.replication.group.QuorumGroup` as leader; like the
group it is sans-IO: what it sends goes through the group's host, what it logs through
``group.propose``.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

from shoal.node.queues.entry import AVAILABLE, QueueEntry
from shoal.node.queues.queue import Queue
from shoal.node.replication.log import LOST
from shoal.node.replication.machine import QueueMachine

#: messages checked out in the log ahead of the consumers' credit (``mark_ahead``): four
#: times what the consumers took while the last ``mark`` went through the log, within these
#: bounds; and the fewest worth an entry of their own
MARK_AHEAD_MIN = 256
MARK_AHEAD_MAX = 4096
MARK_BATCH = 16


class Leader(Protocol):
    """What :class:`Checkouts` uses of its group (group.py's ``QuorumGroup``)."""

    queue: Queue
    machine: QueueMachine
    host: Any                   #: group.py's GroupHost: ``send(identity, msg)``
    leading: bool
    pending: list               #: [count, bytes, checked out] of enqueues logged, not applied

    def propose(self, cmd: list, then: Callable[[Any], None] | None = None) -> bool: ...

    def may_deliver(self) -> bool: ...


class Checkouts:
    """The checkouts and marks of ``group`` (a quorum queue's member) while it leads."""

    def __init__(self, group: Leader) -> None:
        # The group's queue and machine are read through it each time: a snapshot with the
        # declaration replaces both (manager.py ``_install``; the fault campaign's wiped
        # member caught a copy kept here).
        self.group = group
        #: deliveries (and basic.get answers) held until their checkout is applied:
        #: [identity, message, entry, its redelivered flag, message if lost or None]
        self.held: list[list] = []
        self.checkouts: list[int] = []      # their log indexes, acquired
        #: of those, the ones this leader marked (``mark``, not applied yet when acquired)
        self.premarked: list[int] = []
        #: this leader's marks not applied yet, and the last entry it marked
        self.marking: set[int] = set()
        self._mark_cursor: QueueEntry | None = None
        #: deliveries this leader made (to count what is taken while a mark is on its way),
        #: and how many messages it keeps marked ahead (``mark_ahead``)
        self.taken = 0
        self.mark_want = MARK_AHEAD_MIN
        #: the held lists whose ``checkout`` is logged and not applied yet
        self.in_flight: list[list[list]] = []
        self.settled_out: list[int] = []    # those settled as sent (no_ack)

    @property
    def queue(self) -> Queue:
        return self.group.queue

    @property
    def machine(self) -> QueueMachine:
        return self.group.machine

    @property
    def host(self) -> Any:
        return self.group.host

    def has_entries(self) -> bool:
        """Whether the turn left deliveries or marks to log (:meth:`log_turn`)."""
        return bool(self.held or self.settled_out or self.machine.fresh) or (
            self.group.leading and self.queue.available > len(self.machine.fresh) and
            self.queue.consumer_count > 0)

    def log_turn(self, first: bool) -> None:
        """The turn's checkouts as one log entry; in a turn's first Ready round, the next
        messages marked ahead of the consumers' credit too (:meth:`mark_ahead`)."""
        if self.group.leading and first:
            self.mark_ahead()
        self.log_checkouts()

    def applied_older_enq(self, index: int) -> None:
        """This leader applied an older leader's enqueue."""
        if index in self.machine.fresh:
            self.older(index)

    def applied_mark(self, indexes: list, older: bool) -> None:
        """This leader applied a ``mark``: its own, or an older leader's (``older``)."""
        fresh = self.machine.fresh
        for i in indexes:
            self.marking.discard(i)
            if older and i in fresh:
                self.older(i)

    def follow(self) -> None:
        """The group stopped leading: what it held is never sent as delivered (the new leader
        redelivers it); what was held behind those goes now."""
        unlogged, self.held = self.held, []
        self.checkouts, self.settled_out, self.premarked = [], [], []
        self.marking.clear()
        self._mark_cursor = None
        self.in_flight = []             # their waiters get LOST from the group
        self._unsent(unlogged)

    def check_out(self, entry: QueueEntry, identity: bytes, msg: list, redelivered: bool,
                  settled: bool, lost: list | None = None) -> bool:
        """The leader hands ``entry`` to a consumer or a basic.get: ``msg`` (the DELIVER, or
        the REPLY) goes to ``identity`` once the checkout is in the log and applied, so a
        new leader knows exactly what was delivered (RabbitMQ's checkouts, rabbit_fifo).
        ``settled``: no_ack (acknowledged as sent); ``lost``: sent instead if this member
        stops leading first (a basic.get's MOVED). Returns True when the caller sends
        ``msg`` now: its checkout is in the log already and nothing is held ahead of it."""
        m = self.group.machine
        index = m.index_of.get(entry.entry_id)
        if index is None:                   # not from the log: nothing to record
            return True
        self.taken += 1
        fresh = m.fresh
        if index in fresh:                  # logged checked out already (enq out, mark)
            fresh.discard(index)
            if settled:
                self.settled_out.append(index)
            # behind the deliveries still waiting for their checkout: the consumer gets the
            # queue's order (the fault campaign's rule 4 found a marked message overtaking a
            # requeued one ahead of it)
            return not self.queued_behind(identity, msg)
        if settled:
            self.settled_out.append(index)
        elif index in self.marking:         # its mark is on its way: it counts for this
            self.premarked.append(index)
        else:
            self.checkouts.append(index)
        self.held.append([identity, msg, entry, redelivered, lost])
        return False

    def older(self, index: int) -> None:
        """An older leader's enqueue logged checked out, applied by this leader: that one
        may have handed it out, so it is a delivery made (flagged, counted), not this
        leader's to hand out at once (it is not delivering yet: ``may_deliver``)."""
        m = self.machine
        m.fresh.discard(index)
        e = m.by_index.get(index)
        if e is not None and not e.is_dead:
            e.redelivered = True
            e.delivery_count += 1

    def can_mark(self) -> bool:
        """Whether a publish this leader logs now can be logged checked out (``enq``'s
        ``out``, machine.py), so that a consumer gets it as it is applied, its checkout
        riding on the enqueue's entry (one round through the log, not two); one that is not
        handed out after all is logged ``unout``. Either its consumers have credit for it
        and nothing is ready ahead of it, or they keep up with the queue: an acquiring
        consumer, everything ready is marked already (``fresh``, ``marking``), and fewer
        marks are out than :meth:`mark_ahead` keeps (``mark_want``), counting the enqueues
        already so logged (the group's ``pending``)."""
        g = self.group
        q = g.queue
        qcm = q.qcm
        if not qcm.all:
            return False
        fresh, marking = len(g.machine.fresh), len(self.marking)
        if q.available <= fresh + marking and \
                g.pending[2] + fresh + marking < self.mark_want:
            for c in qcm.all:
                if c.acquires:
                    return True
            return False
        if q.available or q.held or not qcm.interested_count:
            return False
        spare = 0
        for c in qcm.all:
            if c.acquires:
                spare += c.credit
                if spare > g.pending[2]:
                    return True
        return False

    def mark_ahead(self) -> None:
        """Keep messages checked out in the log before any consumer has credit for them
        (``mark``): a consumer that is behind then gets them as its credit comes, without
        waiting for a checkout to be committed (docs/replication.md "Checkouts in the
        log"). How many: four times what the consumers took while the last mark went through
        the log (``mark_want``, MARK_AHEAD_MIN to MARK_AHEAD_MAX). With no acquiring consumer
        left, the marks not handed out are given back (``unout``). The price: after a
        leader change, marked messages are flagged redelivered and counted though never
        delivered (AMQP 0-9-1 1.8.3.9 allows the flag: "may have been delivered")."""
        q, m = self.queue, self.machine
        fresh = m.fresh
        if not any(c.acquires for c in q.qcm.all):
            if fresh:
                self.group.propose(["unout", sorted(fresh)])
                fresh.clear()
            self.mark_want = MARK_AHEAD_MIN
            return
        have = len(fresh) + len(self.marking) + self.group.pending[2]
        want = self.mark_want
        if want - have < max(MARK_BATCH, want // 4) or q.available <= len(fresh) or \
                not self.group.may_deliver():
            return
        e = self._mark_cursor
        nxt = q.entries.next
        e = nxt(e) if e is not None and not e.is_dead else q.entries.first()
        index_of, out, marking = m.index_of, m.out, self.marking
        picked: list[int] = []
        last = None
        while e is not None and have < want:
            if e.state is AVAILABLE:
                i = index_of.get(e.entry_id)
                if i is not None and i not in out and i not in marking:
                    picked.append(i)
                    have += 1
                    last = e
            e = nxt(e)
        if not picked:
            return
        taken = self.taken

        def applied(result: Any) -> None:
            if result is not LOST:
                self.mark_want = min(MARK_AHEAD_MAX, max(
                    MARK_AHEAD_MIN, 4 * (self.taken - taken), self.mark_want * 7 // 8))
        if self.group.propose(["mark", picked], applied):
            marking.update(picked)
            self._mark_cursor = last

    def log_checkouts(self) -> None:
        """The turn's checkouts become one log entry (``checkout``); their messages go
        when it is applied here."""
        if not (self.held or self.settled_out):
            return
        held, self.held = self.held, []
        cmd = ["checkout", self.checkouts, self.settled_out]
        if self.premarked:
            cmd.append(self.premarked)
            self.premarked = []
        self.checkouts, self.settled_out = [], []
        self.in_flight.append(held)

        def applied(result: Any) -> None:
            if held in self.in_flight:
                self.in_flight.remove(held)
            if result is LOST:
                self._unsent(held)
                return
            send = self.host.send
            for identity, msg, _, _, _ in held:
                send(identity, msg)
        if not self.group.propose(cmd, applied):
            self.in_flight.remove(held)
            self._unsent(held)

    def send_ordered(self, identity: bytes, msg: list) -> None:
        """Send ``msg`` (CREDIT_DRAINED, a CANCEL's answer) to a router behind the
        deliveries this leader holds for their checkouts: the router must see them first,
        as it does from a classic queue (its credit accounting counts them)."""
        if not self.queued_behind(identity, msg):
            self.group.host.send(identity, msg)

    def queued_behind(self, identity: bytes, msg: list) -> bool:
        """Queue ``msg`` behind the deliveries this leader holds for their checkouts, to go
        with them; False when none are held (it may go now)."""
        if self.held:
            self.held.append([identity, msg, None, False, None])
        elif self.in_flight:
            self.in_flight[-1].append([identity, msg, None, False, None])
        else:
            return False
        return True

    def _unsent(self, held: list[list]) -> None:
        """Deliveries never sent (this member stopped leading first): their entries (now
        released) keep the redelivered flag they had; a basic.get is answered MOVED; the
        other messages held behind them go now."""
        for identity, msg, entry, redelivered, lost in held:
            if entry is None:
                self.host.send(identity, msg)
                continue
            if not entry.is_dead:
                entry.redelivered = redelivered
            if lost is not None:
                self.host.send(identity, lost)

