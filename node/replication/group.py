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
from shoal.node.queues.entry import QueueEntry
from shoal.node.queues.queue import Queue
from shoal.node.replication.checkouts import Checkouts
from shoal.node.replication.dead_letters import DeadLetters, at_least_once
from shoal.node.replication.log import LOST, Entry, NORMAL, Snapshot
from shoal.node.replication.machine import LAZY_MAX, QueueMachine
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
#: How far back (log entries) a leader looks for a publish sent again (:meth:`find_publish`).
FIND_ENTRIES = 4096


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


def answer_declares(holder: Any, moved: bool) -> None:
    """Answer, once, the declares waiting in ``holder.pending_declares`` (a quorum group's
    or a stream member's; requests.declare_answer): declare-ok when it knows a leader, MOVED
    (``moved``) when it goes before it had one (the router asks the leader again)."""
    waiting, holder.pending_declares = holder.pending_declares, []
    for fn in waiting:
        fn(moved)


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
        self.machine = QueueMachine(queue, LAZY_MAX)
        raft.snapshot_source = self.state
        self.waiters: dict[int, list[Callable[[Any], None]]] = {}
        self.leading = False
        self.leader_term = 0            # the term of the last leader announced
        self.known_leader: str | None = None
        self.snapshot: Snapshot | None = None     # the last one, for a log rewrite
        #: declare answers waiting for a leader (requests.declare_answer)
        self.pending_declares: list[Callable[[bool], None]] = []
        self.deleted = False
        #: the leader's lease: member -> when (ms) it last answered in this term
        self.acked_at: dict[str, float] = {}
        self.retire_ticks = 0       #: a deleted leader's ticks left (manager.py RETIRE_TICKS)
        #: the enqueues this leader logged in its term and has not applied yet: [count,
        #: bytes, those logged checked out] (x-overflow reject-publish counts them as
        #: queued; checkouts.py ``can_mark`` counts the last as marked)
        self.pending = [0, 0, 0]
        self.expiring = False       #: this leader proposed the delete of x-expires
        #: the log index of this leader's first entry of its term: it delivers nothing
        #: before that is applied (every older checkout is applied by then)
        self.term_start = 0
        #: in_lease's answer holds until this time (ms) for this (term, configuration)
        self._lease_until = float("-inf")
        self._lease_term = -1
        self._lease_conf = -1
        #: membership reconciliation (reconcile.py): ticks since a leader last replicated to
        #: this member, and the other members' answers (member id -> member, removed, none)
        self.silent_ticks = 0
        self.answers: dict[str, str] = {}
        #: at-least-once dead-lettering (dead_letters.py), None when the queue has not it
        self.dlx = DeadLetters(self) if at_least_once(header[2] or {}, queue.cfg) else None
        queue.sink = None               # a follower never delivers or dead-letters
        #: this leader's deliveries as checkouts, and its marks (checkouts.py)
        self.out = Checkouts(self)

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

    # ---- checkouts and marks (checkouts.py) -----------------------------------------------
    def has_turn_entries(self) -> bool:
        """Whether the turn left deliveries, dead letters or marks to log (:meth:`log_turn`)."""
        return self.out.has_entries() or (
            self.dlx is not None and bool(self.dlx.to_log or self.dlx.confirmed))

    def log_turn(self, first: bool = True) -> None:
        """The turn's checkouts, and at-least-once dead letters, as log entries (at the
        start of each Ready pass: manager.py); in a turn's first round, the next messages
        marked checked out ahead of the consumers' credit (checkouts.py)."""
        if self.dlx is not None:
            self.dlx.log_turn()
        self.out.log_turn(first)

    # ---- the leader's decisions (docs/replication.md "Time from the leader") ---------------
    def wall_now(self) -> float:
        """This member's clock, epoch ms: what it logs as the leader's time."""
        t = self.queue.timers
        return t.now + t.wall_offset_ms

    def enqueue_command(self, exchange: str, routing_key: str, header: bytes, body: bytes,
                        publisher: Any, again: bool, out: bool = False,
                        writer: str = "", seq: int = 0) -> list:
        """The ``enq`` command of a publish (machine.py), stamped with the leader's time;
        ``out``: logged checked out (checkouts.py ``can_mark``); ``writer``, ``seq``: the
        router's id and its publish id (its first send's for one sent again), named in the
        entry when the publish is confirmed (``seq`` > 0), so that :meth:`find_publish` finds
        it."""
        cmd = ["enq", exchange, routing_key, header, body, publisher, again, self.wall_now(),
               out]
        if seq > 0 and writer:
            cmd += [writer, seq]
        return cmd

    def find_publish(self, writer: str, seq: int) -> int | None:
        """The log index of the ``enq`` of publish ``seq`` of router ``writer`` in this
        member's log, or None (:func:`find_publish`)."""
        return find_publish(self.raft.log, writer, seq)

    def applied_index(self) -> int:
        """The last log index applied here."""
        return self.raft.log.applied

    def await_entry(self, index: int, then: Callable[[Any], None]) -> None:
        """``then(result)`` once log ``index`` (not applied yet) is applied here, as for a
        proposal (``LOST`` if this member stops leading first)."""
        self.waiters.setdefault(index, []).append(then)

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
        out with it when ``out``."""
        pending = self.pending
        pending[0] += 1
        pending[1] += size
        if out:
            pending[2] += 1

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
        m.clear()
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
                    pending[2] -= 1
            try:
                result = self.machine.apply(entry.index, data)
            except Exception:  # noqa: BLE001 - a bad command must not stop the group
                log.exception("quorum queue '%s': cannot apply entry %d", self.key[1],
                              entry.index)
            if op == "enq":
                if older:
                    self.out.applied_older_enq(entry.index)
            elif op == "mark":
                if leading:
                    self.out.applied_mark(data[1], older)
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
            self.pending = [0, 0, 0]
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
            self.out.follow()               # the waiters of its checkouts get LOST below
            lost, self.waiters = self.waiters, {}
            for fns in lost.values():
                for fn in fns:
                    fn(LOST)
        leader = node_of(r.leader) if r.leader else None
        if (leader, r.term) != (self.known_leader, self.leader_term) and leader is not None:
            self.known_leader, self.leader_term = leader, r.term
            answer_declares(self, moved=False)
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
        if now <= self._lease_until and r.term == self._lease_term and \
                r.conf_seq == self._lease_conf:
            return True
        # until when: the newest answer of the majority's least recent member, + LEASE_MS
        # (answers only move forward, so it holds until then or a new term or membership)
        times = sorted((self.acked_at.get(m, -1e18) for m in r.voters if m != r.id),
                       reverse=True)
        need = len(r.voters) // 2 + 1 - (r.id in r.voters)
        until = float("inf") if need <= 0 else \
            times[need - 1] + LEASE_MS if need <= len(times) else float("-inf")
        self._lease_until, self._lease_term, self._lease_conf = until, r.term, r.conf_seq
        return now <= until

    def may_deliver(self) -> bool:
        """A quorum queue delivers (and answers basic.get) only from a leader in its lease
        (one that was stopped or cut off may have been replaced, and what it would deliver
        may already be gone: etcd's lease-based reads) that has applied its term's first
        entry (so every checkout of an older leader is applied: what that one delivered is
        flagged redelivered before this one hands it out)."""
        return self.leading and self.in_lease() and self.raft.log.applied >= self.term_start

    def message_count(self) -> int:
        """What this member reports as the queue's message count while it follows
        (machine.py ``message_count``)."""
        return self.machine.message_count()

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


def find_publish(raft_log: Any, writer: str, seq: int) -> int | None:
    """The log index of the ``enq`` of publish ``seq`` of router ``writer`` in ``raft_log`` (a
    Raft member's :class:`~shoal.node.replication.log.RaftLog`), looked for from the log's end
    back, applied or not; None when it is not there.

    A leader asks before it logs a publish sent again (the router resends one whose answer
    was lost with a leader): found, the message is in the queue's log already and is not
    logged twice, as RabbitMQ's quorum queues drop an enqueuer's sequence number they have
    seen (``rabbit_fifo``'s enqueuers). The look stops at a first send of ``writer`` below
    ``seq`` (a router's publish ids rise, and it sends them in order), :data:`FIND_ENTRIES`
    entries back, or where the log held in memory starts (a snapshot). Every way of missing
    it logs the message twice (at-least-once, as before); none loses it: ``(writer, seq)``
    names one message. The Raft simulator checks it (tests/node/replication/sim_queue.py,
    ``Publisher``)."""
    i = raft_log.last_index
    base = raft_log.mem_base
    stop = max(base, i - FIND_ENTRIES)
    entries = raft_log.entries
    while i > stop:
        d = entries[i - base - 1].data
        if type(d) is list and len(d) > 10 and d[0] == "enq" and d[9] == writer:
            if d[10] == seq:
                return i
            if d[10] < seq and not d[6]:
                return None
        i -= 1
    return None
