"""One quorum queue on one member node: its Raft member, its state machine and the answers
waiting for its log (design.md section 8, docs/replication.md).

:class:`QuorumGroup` is sans-IO like the Raft core it holds: the node's
:class:`~shoal.node.replication.manager.Replication` persists its Ready, sends its messages and
hands the committed entries back to :meth:`QuorumGroup.apply`. What the group does for the
routers (confirms, replies, consumers dropped when it stops leading) goes through ``host``,
what it needs of the node: :class:`GroupHost`.
"""
from __future__ import annotations

import hashlib
import logging
import random
from typing import Any, Callable, Protocol

from shoal.node.queues.args import Overflow
from shoal.node.queues.entry import AVAILABLE, QueueEntry
from shoal.node.queues.queue import Queue
from shoal.node.replication.dead_letters import DeadLetters, at_least_once
from shoal.node.replication.log import Entry, NORMAL, Snapshot
from shoal.node.replication.machine import QueueMachine
from shoal.node.replication.membership import node_of
from shoal.node.replication.raft import Raft

log = logging.getLogger("shoal.node.replication")

#: The Raft clock: one tick every TICK_MS; an election timeout of ELECTION_TICKS (randomized
#: up to twice that), a heartbeat every HEARTBEAT_TICKS.
TICK_MS = 100
ELECTION_TICKS = 10
HEARTBEAT_TICKS = 1
#: A leader's lease (ms), counted from a follower's answer in its term: shorter than the
#: earliest a follower may vote for another (its election_elapsed reaches ELECTION_TICKS after
#: at least ELECTION_TICKS - 1 whole ticks: 900 ms), with a margin for its answer's trip.
LEASE_MS = (ELECTION_TICKS - 3) * TICK_MS
#: Take a snapshot (and drop the log before it) once this many entries were applied since
#: the last one and the log holds more entries than the queue holds messages.
COMPACT_ENTRIES = 4096
#: messages checked out in the log ahead of the consumers' credit (``mark_ahead``): four
#: times what the consumers took while the last ``mark`` went through the log, within these
#: bounds; and the fewest worth an entry of their own
MARK_AHEAD_MIN = 256
MARK_AHEAD_MAX = 4096
MARK_BATCH = 16

#: The result a waiter gets when its entry will not be applied by this member as leader.
LOST = object()


class GroupHost(Protocol):
    """What a group uses of its node (node/replication/manager.py's ``Replication``)."""

    node_id: str

    def now(self) -> float: ...
    sink: Any                   #: the shard: a leader's queue delivers through it

    def send(self, identity: bytes, msg: list) -> None: ...

    def dead_letter_confirm(self, group: "QuorumGroup", index: int) -> int: ...

    def leader_changed(self, group: "QuorumGroup") -> None: ...

    def stopped_leading(self, group: "QuorumGroup") -> None: ...

    def deleted(self, group: "QuorumGroup") -> None: ...


class QuorumGroup:
    """The member ``member_id`` of quorum queue ``queue``.

    ``header``: ``[vhost, name, arguments, uid]``, the declaration every member agrees on.
    ``raft``: its Raft member (restored from disk or new). ``wanted``: the node ids that should
    hold a member (``x-quorum-initial-group-size`` nodes, chosen at declare time).
    """

    def __init__(self, host: GroupHost, queue: Queue, header: list, raft: Raft,
                 wanted: list[str]) -> None:
        self.host = host
        self.queue = queue
        self.header = header
        self.key = (header[0], header[1])
        self.uid = header[3]
        self.raft = raft
        self.wanted = wanted
        self.machine = QueueMachine(queue)
        raft.snapshot_source = self.state
        self.waiters: dict[int, list[Callable[[Any], None]]] = {}
        self.leading = False
        self.leader_term = 0            # the term of the last leader announced
        self.known_leader: str | None = None
        self.snapshot: Snapshot | None = None     # the last one, for a log rewrite
        self.pending_declares: list[Callable[[], None]] = []
        self.deleted = False
        #: the leader's lease: member -> when (ms) it last answered in this term
        self.acked_at: dict[str, float] = {}
        self.retire_ticks = 0       #: a deleted leader's ticks left (manager.py RETIRE_TICKS)
        #: the enqueues this leader logged in its term and has not applied yet: [count,
        #: bytes] (x-overflow reject-publish counts them as queued)
        self.pending = [0, 0]
        #: of those, the ones logged checked out (``can_mark``)
        self.pending_marked = 0
        self.expiring = False       #: this leader proposed the delete of x-expires
        #: the log index of this leader's first entry of its term: it delivers nothing
        #: before that is applied (every older checkout is applied by then)
        self.term_start = 0
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
        #: in_lease's answer holds until this time (ms) for this (term, configuration)
        self._lease_until = float("-inf")
        self._lease_key: tuple = ()
        #: the held lists whose ``checkout`` is logged and not applied yet
        self.in_flight: list[list[list]] = []
        self.settled_out: list[int] = []    # those settled as sent (no_ack)
        #: membership reconciliation (reconcile.py): since when (ms) this member has known
        #: no leader, and the other members' answers (member id -> member, removed, none)
        self.leaderless_since: float | None = None
        self.answers: dict[str, str] = {}
        #: at-least-once dead-lettering (dead_letters.py), None when the queue has not it
        self.dlx = DeadLetters(self) if at_least_once(header[2] or {}, queue.cfg) else None
        queue.sink = None               # a follower never delivers or dead-letters

    def state(self) -> dict:
        """The snapshot data: the machine's, and the nodes that should hold members."""
        data = self.machine.snapshot(self.header)
        data["wanted"] = list(self.wanted)
        return data

    # ---- proposals (leader) ----------------------------------------------------------------
    def propose(self, cmd: list, then: Callable[[Any], None] | None = None) -> bool:
        """Append ``cmd`` to the log as leader; ``then(result)`` runs when it is applied here
        (``LOST`` if this member stops leading first). False when not leader."""
        index = self.raft.propose(cmd)
        if index is None:
            return False
        if then is not None:
            self.waiters.setdefault(index, []).append(then)
        return True

    def settle(self, op: str, entries: list[QueueEntry], table: bytes | None = None) -> None:
        """This leader settled these deliveries (``op``: ack, requeue or drop, see
        node/replication/machine.py): the other members do the same when it is applied.
        ``table``: a modified outcome's annotations merged into them (a return only)."""
        captured = self.machine.captured        # dead-lettered at least once: ``dlx`` says it
        idx = [i for i in map(self.machine.index, entries) if i is not None and i not in captured]
        if idx:
            # refused when not leader: the new leader redelivers
            self.propose([op, idx, table] if table else [op, idx])

    def removed(self, entry: QueueEntry) -> None:
        """The leader's queue removed ``entry`` by itself (TTL expiry, x-overflow drop-head,
        a last value replaced): the other members drop it when that is applied (they
        decide none of these themselves: machine.py)."""
        if self.leading:
            self.settle("drop", [entry])

    # ---- checkouts (docs/replication.md "Checkouts in the log") ---------------------------
    def check_out(self, entry: QueueEntry, identity: bytes, msg: list, redelivered: bool,
                  settled: bool, lost: list | None = None) -> None:
        """The leader hands ``entry`` to a consumer or a basic.get: ``msg`` (the DELIVER, or
        the REPLY) goes to ``identity`` once the checkout is in the log and applied, so a
        new leader knows exactly what was delivered (RabbitMQ's checkouts, rabbit_fifo).
        ``settled``: no_ack (acknowledged as sent); ``lost``: sent instead if this member
        stops leading first (a basic.get's MOVED)."""
        index = self.machine.index(entry)
        if index is None:                   # not from the log: nothing to record
            self.host.send(identity, msg)
            return
        self.taken += 1
        fresh = self.machine.fresh
        if index in fresh:                  # logged checked out already (enq out, mark)
            fresh.discard(index)
            if settled:
                self.settled_out.append(index)
            # behind the deliveries still waiting for their checkout: the consumer gets the
            # queue's order (the fault campaign's rule 4 found a marked message overtaking a
            # requeued one ahead of it)
            self.send_ordered(identity, msg)
            return
        if settled:
            self.settled_out.append(index)
        elif index in self.marking:         # its mark is on its way: it counts for this
            self.premarked.append(index)
        else:
            self.checkouts.append(index)
        self.held.append([identity, msg, entry, redelivered, lost])

    def _older_checkout(self, index: int) -> None:
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
        already so logged (``pending_marked``)."""
        q = self.queue
        qcm = q.qcm
        if not qcm.all:
            return False
        fresh, marking = len(self.machine.fresh), len(self.marking)
        if q.available <= fresh + marking and \
                self.pending_marked + fresh + marking < self.mark_want:
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
                if spare > self.pending_marked:
                    return True
        return False

    def has_turn_entries(self) -> bool:
        """Whether the turn left deliveries, dead letters or marks to log (:meth:`log_turn`)."""
        return bool(self.held or self.settled_out or self.machine.fresh) or (
            self.dlx is not None and bool(self.dlx.to_log or self.dlx.confirmed)) or (
            self.leading and self.queue.available > len(self.machine.fresh) and
            self.queue.consumer_count > 0)

    def log_turn(self, first: bool = True) -> None:
        """The turn's checkouts, and at-least-once dead letters, as log entries (at the
        start of each Ready pass: manager.py); the next messages marked checked out ahead of
        the consumers' credit (:meth:`mark_ahead`)."""
        if self.dlx is not None:
            self.dlx.log_turn()
        if self.leading and first:
            self.mark_ahead()
        self.log_checkouts()

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
                self.propose(["unout", sorted(fresh)])
                fresh.clear()
            self.mark_want = MARK_AHEAD_MIN
            return
        have = len(fresh) + len(self.marking) + self.pending_marked
        want = self.mark_want
        if want - have < max(MARK_BATCH, want // 4) or q.available <= len(fresh) or \
                not self.may_deliver():
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
        if self.propose(["mark", picked], applied):
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
        if not self.propose(cmd, applied):
            self.in_flight.remove(held)
            self._unsent(held)

    def send_ordered(self, identity: bytes, msg: list) -> None:
        """Send ``msg`` (CREDIT_DRAINED, a CANCEL's answer) to a router behind the
        deliveries this leader holds for their checkouts: the router must see them first,
        as it does from a classic queue (its credit accounting counts them)."""
        if self.held:
            self.held.append([identity, msg, None, False, None])
        elif self.in_flight:
            self.in_flight[-1].append([identity, msg, None, False, None])
        else:
            self.host.send(identity, msg)

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

    # ---- the leader's decisions (docs/replication.md "Time from the leader") ---------------
    def wall_now(self) -> float:
        """This member's clock, epoch ms: what it logs as the leader's time."""
        t = self.queue.timers
        return t.now + t.wall_offset_ms

    def enqueue_command(self, exchange: str, routing_key: str, header: bytes, body: bytes,
                        publisher: Any, again: bool, out: bool = False) -> list:
        """The ``enq`` command of a publish (machine.py), stamped with the leader's time;
        ``out``: logged checked out (:meth:`can_mark`)."""
        return ["enq", exchange, routing_key, header, body, publisher, again, self.wall_now(),
                out]

    def refuses(self, size: int) -> bool:
        """x-overflow reject-publish (``qpid.policy_type: reject``) as leader: whether a
        message of ``size`` bytes would take the queue over ``x-max-length`` or
        ``x-max-length-bytes`` (ready messages, as RabbitMQ counts them, plus those logged
        and not applied yet, plus at-least-once dead letters not confirmed yet). Decided
        before the message is logged, so that every member applies only what was accepted
        (RabbitMQ: basic.nack to a confirming publisher)."""
        q = self.queue
        cfg = q.cfg
        if cfg.overflow is not Overflow.REJECT_PUBLISH:
            return False
        m = self.machine
        if cfg.max_length is not None and \
                q.available + q.held + self.pending[0] + len(m.discards) >= cfg.max_length:
            return True
        return cfg.max_length_bytes is not None and \
            q.ready_bytes + self.pending[1] + m.discard_bytes + size > cfg.max_length_bytes

    def logged(self, size: int, out: bool) -> None:
        """An enqueue of ``size`` bytes was logged by this leader (see ``pending``), checked
        out with it when ``out`` (``pending_marked``)."""
        self.pending[0] += 1
        self.pending[1] += size
        if out:
            self.pending_marked += 1

    def used(self) -> None:
        """The queue was used (a basic.get, a consumer came or went): with x-expires, the
        leader logs the time (``active``), from which every member counts (rabbit_fifo's
        ``last_active``, set by the commands of a get and of a consumer leaving)."""
        if self.leading and self.queue.cfg.expires:
            self.propose(["active", self.wall_now()])

    def check_expiry(self) -> None:
        """x-expires, as leader (every tick; rabbit_fifo ``tick`` -> ``is_expired``): a
        queue without consumers whose last use (``last_active``, in the log) is older than
        x-expires by this leader's clock is deleted through the log, on every member."""
        q = self.queue
        expires = q.cfg.expires
        if not expires or not self.leading or self.expiring or q.qcm.all or self.deleted:
            return
        m = self.machine
        now = self.wall_now()
        if not m.last_active:
            m.last_active = now         # a queue of a release that did not log it: from now
        if now > m.last_active + expires:
            log.info("quorum queue '%s' in vhost '%s' expired (x-expires %d ms)", self.key[1],
                     self.key[0], expires)
            self.expiring = self.propose(["delete"])

    # ---- applying the log ------------------------------------------------------------------
    def install(self, snap: Snapshot) -> None:
        """A snapshot from the leader replaces the whole state."""
        m = self.machine
        for i, e in list(m.by_index.items()):
            m._untrack(i, e)
            if not e.is_dead:
                self.queue.features.remove_ready(e, None)
        if isinstance(snap.data, dict):
            m.restore(snap.data)
        self.snapshot = snap

    def apply(self, entry: Entry) -> None:
        result: Any = None
        data = entry.data
        if entry.kind == NORMAL and data is not None:
            op = data[0]
            leading = self.leading
            older = leading and entry.term < self.raft.term
            if op == "enq" and leading and not older:
                pending = self.pending
                pending[0] -= 1
                pending[1] -= len(data[4])
                if len(data) > 8 and data[8]:
                    self.pending_marked -= 1
            try:
                result = self.machine.apply(entry.index, data)
            except Exception:  # noqa: BLE001 - a bad command must not stop the group
                log.exception("quorum queue '%s': cannot apply entry %d", self.key[1],
                              entry.index)
            if op == "enq":
                if older and entry.index in self.machine.fresh:
                    self._older_checkout(entry.index)
            elif op == "mark":
                if leading:
                    for i in data[1]:
                        self.marking.discard(i)
                        if older and i in self.machine.fresh:
                            self._older_checkout(i)
            elif op == "wanted":                # an operator's add/delete_member, grow, shrink
                self.wanted = [str(n) for n in data[1]]
            elif op == "dlx":
                if leading and self.dlx is not None and result:
                    self.dlx.send(result, self.host.now())
            elif op == "delete":
                self._answer(entry.index, result)
                self.deleted = True
                self.host.deleted(self)
                return
        self._answer(entry.index, result)
        if entry.index == self.term_start and self.leading:
            self.queue.notify_work()        # it may deliver now (may_deliver)

    def _answer(self, index: int, result: Any) -> None:
        waiting = self.waiters.pop(index, None)
        if waiting:
            for fn in waiting:
                fn(result)

    def maybe_compact(self) -> Snapshot | None:
        """A snapshot to persist when the log grew long (COMPACT_ENTRIES), else None."""
        rl = self.raft.log
        if rl.applied - rl.snap_index < COMPACT_ENTRIES or \
                len(rl.entries) < 2 * len(self.machine.by_index):
            return None
        self.machine.forget_dead()
        self.snapshot = self.raft.compact(rl.applied, self.state())
        return self.snapshot

    # ---- roles -----------------------------------------------------------------------------
    def check_role(self) -> None:
        """After a step or a tick: react to becoming or ceasing to be leader, and to a new
        leader elsewhere."""
        r = self.raft
        if r.is_leader and not self.leading:
            self.leading = True
            now = self.host.now()
            self.acked_at = {m: now for m, granted in r.votes.items() if granted}
            self.pending = [0, 0]
            self.pending_marked = 0
            self.term_start = r.log.last_index      # its empty entry of the new term
            self.queue.sink = self.host.sink
            self.machine.lead()
            if self.dlx is not None:
                self.dlx.lead(now)
            log.info("quorum queue '%s' in vhost '%s': %s leads (term %d)", self.key[1],
                     self.key[0], self.host.node_id, r.term)
        elif self.leading and not r.is_leader:
            self.leading = False
            self.expiring = False
            self.host.stopped_leading(self)
            self.machine.follow()
            if self.dlx is not None:
                self.dlx.follow()
            self.queue.sink = None
            unlogged, self.held = self.held, []
            self.checkouts, self.settled_out, self.premarked = [], [], []
            self.marking.clear()
            self._mark_cursor = None
            self.in_flight = []             # their waiters get LOST below
            self._unsent(unlogged)
            lost, self.waiters = self.waiters, {}
            for fns in lost.values():
                for fn in fns:
                    fn(LOST)
        leader = node_of(r.leader) if r.leader else None
        if (leader, r.term) != (self.known_leader, self.leader_term) and leader is not None:
            self.known_leader, self.leader_term = leader, r.term
            if self.pending_declares:
                waiting, self.pending_declares = self.pending_declares, []
                for fn in waiting:
                    fn()
            self.host.leader_changed(self)
        elif leader is None:
            self.known_leader = None

    def election_delay(self, lost_member: str) -> int:
        """Ticks this member waits before campaigning when the leader's link closed: its rank
        among the other voters (by a hash of the queue and member, so that new leaders spread
        over nodes), two ticks apart, so one wins at once."""
        others = sorted((m for m in self.raft.voters if m != lost_member),
                        key=lambda m: hashlib.blake2b(f"{self.uid}/{m}".encode(),
                                                      digest_size=8).digest())
        rank = others.index(self.raft.id) if self.raft.id in others else len(others)
        return 1 + 2 * rank

    def heard(self, member: str, term: int) -> bool:
        """A message from ``member`` in ``term``: as leader, its lease is renewed. Returns
        True when that makes the lease valid again (deliveries may resume)."""
        if not self.leading or term != self.raft.term:
            return False
        before = self.in_lease()
        self.acked_at[member] = self.host.now()
        return not before and self.in_lease()

    def in_lease(self) -> bool:
        """A majority of voters answered this leader within LEASE_MS: no other leader can
        have been elected meanwhile (a follower grants no vote for an election timeout after
        it heard from its leader), so what this leader holds is current."""
        now = self.host.now()
        r = self.raft
        key = (r.term, r.conf_seq)
        if now <= self._lease_until and key == self._lease_key:
            return True
        # until when: the newest answer of the majority's least recent member, + LEASE_MS
        # (answers only move forward, so it holds until then or a new term or membership)
        times = sorted((self.acked_at.get(m, -1e18) for m in r.voters if m != r.id),
                       reverse=True)
        need = len(r.voters) // 2 + 1 - (r.id in r.voters)
        until = float("inf") if need <= 0 else \
            times[need - 1] + LEASE_MS if need <= len(times) else float("-inf")
        self._lease_until, self._lease_key = until, key
        return now <= until

    def may_deliver(self) -> bool:
        """A quorum queue delivers (and answers basic.get) only from a leader in its lease
        (one that was stopped or cut off may have been replaced, and what it would deliver
        may already be gone: etcd's lease-based reads) that has applied its term's first
        entry (so every checkout of an older leader is applied: what that one delivered is
        flagged redelivered before this one hands it out)."""
        return self.leading and self.in_lease() and self.raft.log.applied >= self.term_start

    def lists_here(self) -> bool:
        """Whether this member reports the queue (QUEUE_LIST): the leader, or while there is
        none the member on the first node in id order."""
        return self.leading or (self.known_leader is None and
                                self.host.node_id == min(self.members() or [self.host.node_id]))

    def members(self) -> list[str]:
        """The node ids of the voters, sorted."""
        return sorted(node_of(m) for m in self.raft.voters)


def new_raft(member_id: str, rng_seed: Any = None, **kw: Any) -> Raft:
    """A Raft member with the node's clock settings."""
    return Raft(member_id, election_ticks=ELECTION_TICKS, heartbeat_ticks=HEARTBEAT_TICKS,
                rng=random.Random(rng_seed), **kw)
