"""A quorum queue's replicated state machine (design.md section 8, docs/replication.md).

Every member holds the same :class:`~shoal.node.queues.queue.Queue` (the Qpid queue model of
node/queues/) and applies the group's committed log to it in order, so that all members hold
the same messages in the same order. What is not in the log stays with the leader: consumers,
credit and which entry is acquired by whom. A follower's queue has no consumers and no sink
(it never delivers or dead-letters); when it becomes leader its entries are all AVAILABLE,
and those an older leader checked out (and nothing else) are flagged redelivered (AMQP 0-9-1
spec 1.8.3.9; RabbitMQ's quorum queues, whose checkouts are in their log, do the same).

Commands (lists, msgpack values), each applied by :meth:`QueueMachine.apply`:

- ``["enq", exchange, routing_key, header, body, publisher, again, ts]`` -> whether it was
  accepted; ``again``: the router sent it again after a leader change (it may be in the
  queue already), so it is enqueued ``redelivered``; ``ts``: the leader's clock when it
  appended the message (epoch ms), from which every member reckons its TTL and schedule;
- ``["ack", [index, ...]]``: the messages enqueued at those log indexes are settled;
- ``[..., "enq" as above, out]``: ``out`` true: the leader had a consumer waiting with
  credit and nothing ahead, so the message is checked out as it is enqueued (the checkout
  rides on the enqueue's entry: one round through the log, not two);
- ``[..., "enq" as above, out, writer, seq]``: a confirmed publish names its router
  (``writer``) and that router's publish id (``seq``, its first send's for one sent again),
  so that a leader finds a publish sent again in its log (group.py ``find_publish``);
  applying ignores them;
- ``["unout", [index, ...]]``: such a message was not handed out after all (the consumer
  went, its credit was taken): it is available again, unflagged, not counted;
- ``["mark", [index, ...]]``: the leader checks out these available messages ahead of the
  credit that will take them (its consumers are behind: checkouts.py ``mark_ahead``), as an
  enqueue's ``out`` does for a new one: it then hands them out at once, and ``unout`` gives
  back those it did not;
- ``["checkout", [index, ...], [index, ...], [index, ...]]``: the leader delivered these
  messages (to a consumer or a basic.get), the second list settled as sent (no_ack). It
  sends them only once this is applied, so every member knows what was delivered: each is
  marked redelivered and counted as a delivery (``x-delivery-limit``) where it was not
  acquired. The third (optional) list: delivered under this leader's own ``mark``, which
  counted them already;
- ``["requeue", [index, ...](, table)]``: returned to the queue (a nack or reject with
  requeue, a modified outcome: the delivery stays counted); ``table``: a modified outcome's
  annotations (an encoded 0-9-1 field table) merged into their headers;
- ``["release", [index, ...](, table)]``: returned, not counted (AMQP 1.0 released);
- ``["drop", [index, ...]]``: gone (rejected, expired, or dead-lettered at the delivery
  limit);

A leader settles its deliveries at once, as a classic queue does (acquisitions are its own),
then appends ``ack``, ``requeue``, ``release`` or ``drop`` for the other members: applied on
the leader they only forget what was already done. A leader that applies an older leader's
settlement acts on the message as it finds it.
- ``["purge", [index, ...]]``: the leader's AVAILABLE messages when it was asked -> count;
- ``["delete"]`` -> the message count (the group then removes the queue on every member);
- ``["wanted", [node, ...]]``: the nodes that should hold a member (an operator's
  add_member, delete_member, grow or shrink; the leader then changes the membership);
- ``["dlx", [[index, reason], ...]]``: dead-lettered at least once: the message leaves the
  queue for its discards until its targets confirm it (dead_letters.py) -> the indexes;
- ``["dlx-done", [index, ...]]``: they did: the discards are gone;
- ``["active", ts]``: the queue was used at ``ts`` (the leader's clock, epoch ms: a
  basic.get, a consumer gone), from which ``x-expires`` counts (rabbit_fifo's
  ``last_active``).

Time is the leader's (docs/replication.md, "Time from the leader"). A member reads no clock
of its own while it follows: it arms no TTL, schedule or expiry timer, refuses no publish
and drops no head (x-overflow), and replaces no last value; what the leader decided reaches
it as ``drop``. A member that becomes leader arms the timers of what it holds from the
times in the log.

A follower holds its messages as the log gave them (``lazy``): a :class:`Logged` record per
message, by log index, and no queue entry, since it neither delivers nor routes. The same
commands act on those records as on entries (a record is always available and never dead).
Entering, restoring or ordering a message costs a follower nothing more than the record: its
queue is built from the records, in log order as a follower would have enqueued them, when it
becomes leader (:meth:`QueueMachine.lead`). A follower with a backlog (more than
:data:`LAZY_MAX` messages) makes its entries then, so that leading never has many to build,
and holds records again once its queue is empty (a member that led, too).

Snapshot data: ``{"queue": [vhost, name, arguments, uid], "messages": [[index, exchange,
routing_key, header, body, redelivered, delivery_count, publisher, ts], ...],
"last_active": epoch ms, "out": [index, ...], "discards": [[index, exchange, routing_key,
header, body, reason], ...]}`` in queue order (``ts``: the leader's clock at
the enqueue, for messages whose TTL or schedule reckon from it, else 0; ``out``: the
messages checked out and not settled).
"""
from __future__ import annotations

from typing import Any

from shoal.node.queues.deadletter import annotated_header
from shoal.node.queues.entry import ACQUIRED, HELD, QueueEntry
from shoal.node.queues.paging import body_bytes
from shoal.node.queues.queue import Queue
from shoal.node.replication.logged import LAZY_MAX, Following, Logged

__all__ = ["LAZY_MAX", "QueueMachine"]


class QueueMachine:
    """The state machine of one quorum queue over ``queue``; ``lazy_max`` > 0: it holds up to
    that many messages as ``Logged`` records while it follows (logged.py; a group's member
    passes ``LAZY_MAX``; see the module docstring), 0: queue entries always."""

    def __init__(self, queue: Queue, lazy_max: int = 0) -> None:
        self.queue = queue
        #: whether it holds records now; the most it holds (0: never, always entries)
        self.lazy = lazy_max > 0
        self.lazy_max = lazy_max
        self.by_index: dict[int, QueueEntry] = {}
        self.index_of: dict[int, int] = {}          # entry_id -> log index
        self.leading = False
        #: the leader's clock (epoch ms) at the enqueue of each message whose TTL or schedule
        #: reckons from it, by log index (kept for snapshots)
        self.ts_of: dict[int, float] = {}
        #: when the queue was last used (epoch ms, the leader's clock): x-expires counts
        #: from here (rabbit_fifo's last_active)
        self.last_active = 0.0
        #: log indexes checked out and not settled (delivered, as the log says)
        self.out: set[int] = set()
        #: at-least-once dead letters waiting for their targets' confirms (dead_letters.py):
        #: index -> [exchange, routing_key, header, body, reason]; and their body bytes
        self.discards: dict[int, list] = {}
        self.discard_bytes = 0
        #: the leader's copy of what it dead-lettered, until the ``dlx`` is applied
        self.captured: dict[int, list] = {}
        #: messages logged checked out ahead of a delivery (``enq``'s ``out``, ``mark``), by
        #: index -> their redelivered flag before (what ``unout`` gives back); and, on the
        #: leader, those it may still hand out at once, their checkout being in the log already
        self.marked: dict[int, bool] = {}
        self.fresh: set[int] = set()
        if hasattr(queue.entries, "conflate"):
            queue.entries.conflate = False      # a follower: its leader logs replacements

    def index(self, entry: QueueEntry) -> int | None:
        return self.index_of.get(entry.entry_id)

    def apply(self, index: int, cmd: Any) -> Any:
        """Apply one committed command; returns its result (see the module docstring).
        Raises ValueError for an unknown command (the caller logs it and goes on)."""
        op = cmd[0]
        q = self.queue
        if op == "enq":
            n = len(cmd)
            if self.lazy:
                e: Any = Logged(cmd)
                self.by_index[index] = e
                dead = False
            else:
                e = self._entry(index, cmd[1], cmd[2], cmd[3], cmd[4], cmd[5],
                                cmd[7] if n > 7 else None)
                if e is None:
                    return False
                dead = e.is_dead
            again = n > 6 and cmd[6]
            if again:
                e.redelivered = True
            if n > 8 and cmd[8] and not dead:      # checked out as enqueued (group.py)
                self.out.add(index)
                self.marked[index] = bool(again)
                if self.leading:
                    self.fresh.add(index)
                else:
                    e.redelivered = True
                    e.delivery_count += 1
            if dead and self.leading and q.replica is not None:
                q.replica.settle("drop", [e])   # its own drop-head took it (x-max-length 0)
            q.stats[0] += 1
            if self.leading:
                q.notify_work()
            elif self.lazy and len(self.by_index) > self.lazy_max:
                self.materialize()          # a backlog: its entries now, not all as it leads
            return True
        if op in ("ack", "drop", "purge"):
            n = 0
            for i in cmd[1]:
                e = self.by_index.get(i)
                if e is None:
                    continue
                self._untrack(i, e)
                n += 1
                if e.is_dead or self.lazy:      # the leader settled it already; a record
                    continue
                if e.state is ACQUIRED:
                    q.dequeue(e)
                else:
                    q.features.remove_ready(e, None)
            if not (self.by_index or self.lazy or self.leading) and self.lazy_max:
                self.lazy = True            # a follower emptied: records again
            return n
        if op == "unout":                   # an enqueue logged checked out, not handed out
            for i in cmd[1]:
                again = self.marked.pop(i, False)
                self.fresh.discard(i)
                e = self.by_index.get(i)
                if i in self.out and e is not None and not e.is_dead:
                    self.out.discard(i)
                    if not self.leading and e.state is not ACQUIRED:
                        e.redelivered = again
                        e.delivery_count = max(0, e.delivery_count - 1)
            return None
        if op == "checkout":
            for i in cmd[1]:
                e = self.by_index.get(i)
                if e is not None and not e.is_dead:
                    self.out.add(i)
                    self.marked.pop(i, None)        # an older leader's mark: this is another
                    e.redelivered = True
                    if e.state is not ACQUIRED:     # the leader counted it as it acquired
                        e.delivery_count += 1
            if len(cmd) > 3:
                for i in cmd[3]:                    # its mark counted and flagged it
                    self.marked.pop(i, None)
            if len(cmd) > 2 and cmd[2]:
                self.apply(index, ["ack", cmd[2]])
            return None
        if op == "mark":
            for i in cmd[1]:
                e = self.by_index.get(i)
                if e is None or e.is_dead or i in self.out:
                    continue
                self.out.add(i)
                self.marked[i] = e.redelivered
                if self.leading:
                    if e.state is not ACQUIRED:     # else handed out meanwhile, checked out
                        self.fresh.add(i)
                else:
                    e.redelivered = True
                    e.delivery_count += 1
            return None
        if op in ("requeue", "release"):
            table = cmd[2] if len(cmd) > 2 else None
            for i in cmd[1]:
                self.out.discard(i)
                self.marked.pop(i, None)
                e = self.by_index.get(i)
                if table and e is not None and not e.is_dead:
                    # every member, the leader too: it merged them as it settled, and a new
                    # leader applying an older leader's return has not (merging is idempotent)
                    try:
                        e.header = annotated_header(e.header, table)
                    except ValueError:
                        pass                                # as the leader: not annotated
                if e is not None and not e.is_dead and e.state is not ACQUIRED:
                    e.redelivered = True
                    if op == "release" and not self.leading and e.delivery_count > 0:
                        e.delivery_count -= 1       # released: not a delivery attempt
            return None
        if op == "delete":
            return self.message_count()
        if op == "wanted":
            return None             # the group's (node/replication/group.py)
        if op == "active":
            self.last_active = max(self.last_active, float(cmd[1]))
            return None
        if op == "dlx":
            return self._discard(cmd[1])
        if op == "dlx-done":
            for i in cmd[1]:
                d = self.discards.pop(i, None)
                if d is not None:
                    self.discard_bytes -= len(d[3])
            return None
        raise ValueError(f"unknown quorum queue command {op!r}")

    def _discard(self, pairs: list) -> list[int]:
        """``dlx``: each [index, reason]'s message leaves the queue for the discards (the
        leader took it out already and kept a copy: ``captured``). Returns the indexes."""
        q = self.queue
        added = []
        for i, reason in pairs:
            e = self.by_index.get(i)
            data = self.captured.pop(i, None)
            if e is not None:
                if data is None and not e.is_dead:
                    data = [e.exchange, e.routing_key, e.header, body_bytes(e.body), reason]
                self._untrack(i, e)
                if not (e.is_dead or self.lazy):
                    if e.state is ACQUIRED:
                        q.dequeue(e)
                    else:
                        q.features.remove_ready(e, None)
            if data is not None and i not in self.discards:
                self.discards[i] = data
                self.discard_bytes += len(data[3])
                added.append(i)
        return added

    def _track(self, index: int, e: QueueEntry) -> None:
        self.by_index[index] = e
        self.index_of[e.entry_id] = index

    def _untrack(self, index: int, e: QueueEntry) -> None:
        self.by_index.pop(index, None)
        self.index_of.pop(e.entry_id, None)
        if self.ts_of:
            self.ts_of.pop(index, None)
        if self.out:
            self.out.discard(index)
        if self.marked:
            self.marked.pop(index, None)
        if self.fresh:
            self.fresh.discard(index)

    def message_count(self) -> int:
        """The messages a declare-ok or a queue listing reports from this member: the queue's
        (available ones), or a lazy follower's records (all it holds)."""
        return len(self.by_index) if self.lazy else self.queue.available

    def clear(self) -> None:
        """Forget every message (a snapshot from the leader replaces the state)."""
        for i, e in list(self.by_index.items()):
            self._untrack(i, e)
            if not (e.is_dead or self.lazy):
                self.queue.features.remove_ready(e, None)
        if not self.leading and self.lazy_max:
            self.lazy = True

    def materialize(self) -> None:
        """A lazy follower's records become queue entries, enqueued in log order as a
        follower enqueues them (logged.py ``Following``: no timer, no refusal, no drop), with
        the flags and counts the log gave them; the machine is lazy no more."""
        q = self.queue
        records, self.by_index = self.by_index, {}
        self.lazy = False
        replica, q.replica = q.replica, Following()
        try:
            for i in sorted(records):
                r = records[i]
                e = self._entry(i, r.exchange, r.routing_key, r.header, r.body, r.publisher,
                                r.ts)
                if e is not None:
                    e.redelivered = r.redelivered
                    e.delivery_count = r.delivery_count
        finally:
            q.replica = replica

    def _entry(self, index: int, exchange: str, routing_key: str, header: bytes, body: bytes,
               publisher: str | None, ts: float | None) -> QueueEntry | None:
        """Enqueue a logged message as the entry of log index ``index``; ``ts``: the
        leader's clock at its enqueue (epoch ms; None: the command has none), from which its
        TTL and schedule count. None when the queue refused it."""
        q = self.queue
        e = q.enqueue(exchange, routing_key, header, body, publisher,
                      None if ts is None else ts - q.timers.wall_offset_ms)
        if e is not None:
            self._track(index, e)
            if ts is not None and (e.expires_at or e.state is HELD):
                self.ts_of[index] = ts
        return e

    def forget_dead(self) -> None:
        """Drop the entries the queue removed by itself (TTL expiry, delivery limit)."""
        dead = [(i, e) for i, e in self.by_index.items() if e.is_dead]
        for i, e in dead:
            self._untrack(i, e)

    def lead(self) -> None:
        """This member became leader (what an older one delivered is flagged by its
        checkouts, applied before this one delivers: group.py ``may_deliver``). Its clock
        now decides: the TTL and schedule timers of what it holds are armed from
        the times in the log. A last-value queue replaces from now on; an older value it
        still holds stays (the old leader's consumer may hold it acquired, or its
        replacement was not committed: either way it is a message, not lost)."""
        if self.lazy:
            self.materialize()
        self.leading = True
        self.forget_dead()
        q = self.queue
        features = q.features
        timers = q.timers
        if hasattr(q.entries, "conflate"):
            q.entries.conflate = True
        for e in self.by_index.values():
            if e.expires_at:
                timers.add(e.expires_at + 1, features.expire_due, e)
            if e.state is HELD:
                timers.add(e.not_before, features.unhold, e)

    def follow(self) -> None:
        self.leading = False
        self.fresh.clear()
        if hasattr(self.queue.entries, "conflate"):
            self.queue.entries.conflate = False

    def snapshot(self, header: list) -> dict:
        """The snapshot data: ``header`` ([vhost, name, arguments, uid]) and every live
        message in queue order, with its log index."""
        if self.lazy:
            msgs = [[i, r.exchange, r.routing_key, r.header, r.body, r.redelivered,
                     r.delivery_count, r.publisher, r.ts or 0] for i, r in self.by_index.items()]
        else:
            msgs = []
            for e in self.queue.entries:
                i = self.index_of.get(e.entry_id)
                if i is None or e.is_dead:
                    continue
                msgs.append([i, e.exchange, e.routing_key, e.header, body_bytes(e.body),
                             e.redelivered, e.delivery_count, e.publisher,
                             self.ts_of.get(i, 0)])
        return {"queue": header, "messages": msgs, "last_active": self.last_active,
                "out": sorted(self.out), "marked": sorted(self.marked.items()),
                "discards": [[i, *d] for i, d in sorted(self.discards.items())]}

    def restore(self, data: dict) -> None:
        """Load a snapshot's messages into the (empty) queue."""
        self.last_active = float(data.get("last_active") or 0)
        for row in data.get("messages") or ():
            i, exchange, rk, header, body, redelivered, count, publisher = row[:8]
            ts = row[8] if len(row) > 8 and row[8] else None
            if self.lazy:
                e: Any = Logged(["enq", exchange, rk, header, body, publisher, False, ts])
                self.by_index[i] = e
            else:
                e = self._entry(i, exchange, rk, header, body, publisher, ts)
                if e is None:
                    continue
            e.redelivered = bool(redelivered)
            e.delivery_count = count
        if self.lazy and len(self.by_index) > self.lazy_max:
            self.materialize()
        self.out = {i for i in data.get("out") or () if i in self.by_index}
        self.marked = {i: bool(a) for i, a in data.get("marked") or () if i in self.out}
        for i, *d in data.get("discards") or ():
            self.discards[i] = list(d)
            self.discard_bytes += len(d[3])
