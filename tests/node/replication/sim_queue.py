"""The quorum queue's state machine in the Raft simulator (issue 44 point 7): every host of
sim.py applies its committed entries to a :class:`~shoal.node.replication.machine.QueueMachine`
as a follower does, and a client (:class:`Client`) proposes queue commands to the leader as
the real leader does: enqueues stamped with the leader's clock, checkouts of the first
available messages, settlements of what the log says is checked out (ack, requeue, release,
drop), drops of available messages (the leader's expiry, drop-head, replacement), at-least-once
dead letters and their confirmations (``dlx``, ``dlx-done``), purges and uses (``active``); never before the leader has applied its term's first entry, and one at a
time, as node/replication/group.py delivers.

Checks (sim.py raises them as ``queue state`` and ``queue replay``):

- **the same state at the same index**: after each applied entry, a digest of the queue as
  the log made it (messages in order with their index, body, redelivered flag, delivery
  count, leader's enqueue time; the checked-out set; last use) must equal the digest every
  other host had at that index, whether it got there entry by entry, from a snapshot, or
  after a restart. Each host's clock is skewed differently, so a follower that read its own
  clock (TTL, schedules) would differ;
- **snapshots restore the state**: at each compaction the machine's snapshot, restored into a
  fresh queue, has the same digest;
- **a plain classic queue agrees**: at the end, the committed log replayed as the operations
  it records (enqueue, acquire, ack, release, reject, purge, dead-letter) on one plain classic
  :class:`~shoal.node.queues.queue.Queue` accepts every one of them and ends with the same
  messages, in the same order, each delivered before or not, with the same delivery counts
  and the same checked-out (acquired) set and dead letters waiting for confirms.
"""
from __future__ import annotations

from typing import Any

from pamqp import commands, header

from shoal.node.queues.entry import ACQUIRED, AVAILABLE, HELD
from shoal.node.queues.queue import Queue
from shoal.node.replication.group import find_publish
from shoal.node.replication.log import NORMAL
from shoal.node.replication.machine import QueueMachine
from shoal.node.timers import Timers

PLAIN = bytes([0, 60, 0, 0, 0, 0, 0, 0, 0, 1, 0x10, 0, 2])
#: The queue declarations a seed chooses from: features a follower must not act on.
CONFIGS = ({}, {"x-message-ttl": 40}, {"qpid.last_value_queue_key": "k"},
           {"x-max-length": 3, "x-overflow": "drop-head"}, {"x-delivery-limit": 1},
           {"qpid.group_header_key": "k"})


def keyed(key: str) -> bytes:
    """A content header with header ``k: key`` (last-value key, message group), persistent."""
    return header.ContentHeader(0, 1, commands.Basic.Properties(
        delivery_mode=2, headers={"k": key}, expiration="30")).marshal()


class Follower:
    """What a follower's queue needs of its group (``queue.replica``): it never leads."""

    leading = False

    def used(self) -> None:
        pass

    def removed(self, entry: Any) -> None:
        pass

    def settle(self, op: str, entries: list) -> None:
        pass


def with_entries(m: QueueMachine) -> QueueMachine:
    """A machine whose queue holds ``m``'s messages as entries: ``m`` itself, or (lazy) a copy
    of its state made into entries as a new leader makes them (``QueueMachine.materialize``)."""
    if not m.lazy:
        return m
    q = m.queue
    copy = Queue(q.vhost, q.name, durable=True, arguments=dict(q.arguments),
                 timers=Timers(q.timers.now, q.timers.wall_offset_ms))
    copy.replica = Follower()
    o = QueueMachine(copy, m.lazy_max)
    o.by_index = dict(m.by_index)       # records are only read by materialize
    o.out, o.marked = set(m.out), dict(m.marked)
    o.discards, o.last_active = {i: list(d) for i, d in m.discards.items()}, m.last_active
    o.materialize()
    return o


#: a lazy host's most records (machine.py ``LAZY_MAX``), small so that a schedule crosses it
#: both ways: records made into entries mid-log, records again once the queue is empty
SIM_LAZY_MAX = 2


class HostQueue:
    """One host's queue and machine; ``wall_offset`` (ms): its clock's skew; ``lazy``: the
    machine holds records until it leads, as a group's member does (machine.py)."""

    def __init__(self, args: dict, wall_offset: float, lazy: bool = False) -> None:
        self.args = args
        self.wall_offset = wall_offset
        self.lazy = lazy
        self.reset()

    def reset(self) -> None:
        q = Queue("/", "q", durable=True, arguments=dict(self.args),
                  timers=Timers(0.0, self.wall_offset))
        q.replica = Follower()
        self.queue = q
        self.machine = QueueMachine(q, SIM_LAZY_MAX if self.lazy else 0)

    def apply(self, index: int, kind: int, data: Any) -> bool:
        """Apply a queue command (a NORMAL entry's list); False for other entries
        (configuration changes, noops, the sim's own)."""
        if kind != NORMAL or not isinstance(data, (list, tuple)) or not data or \
                not isinstance(data[0], str):
            return False
        self.machine.apply(index, list(data))
        return True

    def rebuild(self, applied: list[tuple]) -> None:
        """The queue of a snapshot: its applied entries ``(index, term, kind, data)`` again."""
        self.reset()
        for x in applied:
            self.apply(x[0], x[2], x[3])

    def digest(self) -> tuple:
        """(messages, checked out, last use); a message is (index, body, redelivered,
        delivery count, its expiry on the wall clock (ms, 0: none))."""
        m = with_entries(self.machine)
        off = self.wall_offset
        msgs = tuple((m.index_of[e.entry_id], bytes(e.body), e.redelivered, e.delivery_count,
                      round(e.expires_at + off) if e.expires_at else 0)
                     for e in m.queue.entries if not e.is_dead and e.entry_id in m.index_of)
        return msgs, tuple(sorted(m.out)), tuple(sorted(m.discards)), m.last_active

    def snapshot_digest(self) -> tuple:
        """The digest of this machine's snapshot restored into a fresh queue, lazy if this
        one is not and the other way round."""
        other = HostQueue(self.args, self.wall_offset + 17.0, lazy=not self.machine.lazy)
        other.machine.restore(self.machine.snapshot(["/", "q", self.args, "u"]))
        return other.digest()


#: The router whose confirmed publishes the client makes (``writer`` in an ``enq``).
WRITER = "r1"


def publish_of(data: Any) -> int | None:
    """The publish id of ``WRITER`` that an entry's data enqueues, or None."""
    if isinstance(data, (list, tuple)) and len(data) > 10 and data[0] == "enq" and \
            data[9] == WRITER:
        return data[10]
    return None


class Publisher:
    """The router's side of the client's confirmed publishes (router/quorum.py ``_resend``,
    node/messages.py ``publish_quorum``). A publish logged by a leader is answered when that
    leader, still leading in the same term and process, has applied it. A leader that stops
    leading (or its process) first takes the answer with it: the publish is *lost* and is
    sent again, flagged redelivered, to a leader, which looks for it in its log (group.py
    ``find_publish``) and logs it only when it does not find it. Found but not applied yet,
    its answer waits for that entry (``await_entry``).

    The checks (sim.py raises them): the entry an answer is given for enqueues that publish;
    a leader that does not find a publish sent again does not hold it in the log it keeps in
    memory, and one that finds it holds it there; at the end every confirmed publish is in
    the committed log, and none is there more often than once plus the times a leader logged
    it again because it lay under that leader's snapshot (the look stops there by design: at
    least once, never lost)."""

    def __init__(self, rng: Any, no_dedup: bool = False) -> None:
        self.rng = rng
        self.no_dedup = no_dedup
        #: publish id -> its enq command as first sent
        self.sent: dict[int, list] = {}
        #: publish id -> (host, its Raft, term, log index): an answer to come from there
        self.waiting: dict[int, tuple] = {}
        #: publish ids whose answer was lost, to send again
        self.lost: dict[int, None] = {}
        self.confirmed: set[int] = set()
        #: publish id -> the times a leader logged it again from under its snapshot
        self.again: dict[int, int] = {}
        self.stats = {"resent": 0, "resent_found": 0, "resent_under_snapshot": 0}

    def logged(self, cmd: list, host: Any, index: int) -> None:
        """``host``'s leader logged ``cmd`` at ``index``."""
        q = publish_of(cmd)
        if q is not None:
            self.sent.setdefault(q, cmd)
            self.lost.pop(q, None)
            self.waiting[q] = (host, host.raft, host.raft.term, index)

    def answers(self, leader_role: Any) -> str | None:
        """Collect the answers given and the ones lost; a text when an answer is given for an
        entry that does not enqueue its publish."""
        for q, (h, r, term, index) in list(self.waiting.items()):
            if h.raft is not r or r.state != leader_role or r.term != term:
                del self.waiting[q]
                self.lost[q] = None
                continue
            if h.sm_index < index:
                continue
            got = publish_of(h.sm[index - 2][3])
            if got != q:
                return f"{h.id} answers publish {q} for index {index}, which enqueues {got}"
            del self.waiting[q]
            self.confirmed.add(q)
        return None

    def resend(self, h: Any) -> tuple[list | None, str | None]:
        """Maybe send a lost publish again to leader ``h``: (the command to log or None,
        a violation's text or None)."""
        if not self.lost or self.rng.random() < 0.7:
            return None, None
        q = min(self.lost)
        r = h.raft
        at = None if self.no_dedup else find_publish(r.log, WRITER, q)
        held = [e.index for e in r.log.entries if publish_of(e.data) == q]
        self.stats["resent"] += 1
        if at is None and held:
            return None, (f"{h.id} did not find publish {q}; its log holds it at "
                          f"{held}")
        if at is not None:
            if at not in held:
                return None, f"{h.id} found publish {q} at {at}; its log holds it at {held}"
            self.stats["resent_found"] += 1
            del self.lost[q]
            self.waiting[q] = (h, r, r.term, at)
            return None, None
        if any(publish_of(x[3]) == q for x in h.sm[:max(0, r.log.mem_base - 1)]):
            self.stats["resent_under_snapshot"] += 1
            self.again[q] = self.again.get(q, 0) + 1
        cmd = list(self.sent[q])
        cmd[6], cmd[8] = True, False        # flagged redelivered; not checked out with it
        return cmd, None

    def check_end(self, sm: list[tuple]) -> tuple[str, str] | None:
        """Over the committed log ``sm`` ((index, term, kind, data)): (invariant, text) when
        a confirmed publish is missing or one is there too often."""
        count: dict[int, int] = {}
        for x in sm:
            q = publish_of(x[3])
            if q is not None:
                count[q] = count.get(q, 0) + 1
        for q in sorted(self.confirmed):
            if not count.get(q):
                return ("no confirmed publish lost",
                        f"confirmed publish {q} is not in the committed log")
        for q, n in sorted(count.items()):
            if n > 1 + self.again.get(q, 0):
                return ("a publish sent again is stored once",
                        f"publish {q} is in the committed log {n} times (logged again "
                        f"from under a snapshot {self.again.get(q, 0)} times)")
        return None


class Client:
    """Proposes queue commands to the leader, from what the leader has applied."""

    def __init__(self, rng: Any, args: dict) -> None:
        self.rng = rng
        self.args = args
        self.n = 0
        #: per (leader, term): its first entry's index, and its last queue command's
        self.term_start: dict[tuple[str, int], int] = {}
        self.last: dict[tuple[str, int], int] = {}
        #: the indexes each (leader, term) marked
        self.marks: dict[tuple[str, int], set[int]] = {}

    def command(self, leader_id: str, term: int, log: Any, hq: HostQueue, now: int
                ) -> list | None:
        """The next command for this leader, or None when it may not act yet."""
        key = (leader_id, term)
        start = self.term_start.setdefault(key, log.last_index)
        if log.applied < max(start, self.last.get(key, 0)):
            return None
        rng = self.rng
        m = with_entries(hq.machine)
        live = [m.index_of[e.entry_id] for e in m.queue.entries
                if not e.is_dead and e.entry_id in m.index_of]
        available = [i for i in live if i not in m.out]
        out = sorted(m.out)
        x = rng.random()
        ts = 1_000_000 + now
        if x < 0.4 or not live:
            self.n += 1
            hdr = keyed(rng.choice("ab")) if rng.random() < 0.5 else PLAIN
            out = not available and rng.random() < 0.5     # a consumer waits: fast path
            # a confirmed publish: it names its router and publish id (group.py
            # enqueue_command), which rise, so that a leader finds it when it is sent again
            return ["enq", "", "q", hdr, f"m{self.n}".encode(), None, False, ts, out, WRITER,
                    self.n]
        marked = [i for i in out if i in m.marked]
        if x < 0.45 and marked:
            return ["unout", [rng.choice(marked)]]
        if x < 0.5 and available:           # checked out ahead of credit (mark_ahead)
            take = available[:rng.randint(1, 3)]
            self.marks.setdefault(key, set()).update(take)
            return ["mark", take]
        if x < 0.65 and (available or marked):
            own = [i for i in marked if i in self.marks.get(key, ())]
            if own and rng.random() < 0.3:  # acquired while its mark was on its way
                return ["checkout", [], [], own[:1]]
            # an older leader's marks: this leader delivers them again (counted again)
            take = (available + [i for i in marked if i not in own])[:rng.randint(1, 3)]
            return ["checkout", [], take] if rng.random() < 0.2 else ["checkout", take, []]
        if x < 0.9 and out:
            op = rng.choice(("ack", "requeue", "release", "drop"))
            return [op, [rng.choice(out)]]
        if x < 0.93 and available:
            return ["drop", [rng.choice(available)]]
        if x < 0.95 and live:               # dead-lettered at least once
            return ["dlx", [[rng.choice(live), "rejected"]]]
        if x < 0.96 and m.discards:         # and confirmed by its targets
            return ["dlx-done", [rng.choice(sorted(m.discards))]]
        if x < 0.98:
            return ["purge", available]
        return ["active", ts]


def replay_into_classic(applied: list[tuple]) -> tuple[tuple, tuple] | str:
    """The committed log as operations on one plain classic queue: its (messages, acquired,
    dead letters set aside) in the digest's form, or a text naming the first operation the
    queue would not do."""
    q = Queue("/", "ref")
    by_index: dict[int, Any] = {}
    discards: set[int] = set()
    #: marked or enqueued checked out, not handed out yet: index -> redelivered before
    marked: dict[int, bool] = {}
    for index, _, kind, data in applied:
        if kind != NORMAL or not isinstance(data, (list, tuple)) or not data or \
                not isinstance(data[0], str):
            continue
        op = data[0]
        if op == "enq":
            e = q.enqueue(data[1], data[2], data[3], data[4], data[5])
            if e is None:
                return f"enq at {index} refused"
            if data[6]:                     # sent again: the message may have been seen
                e.redelivered = True
            by_index[index] = e
            if len(data) > 8 and data[8]:   # delivered as enqueued
                if not _acquire(q, e):
                    return f"enq out at {index}: not acquired"
                marked[index] = bool(data[6])
            continue
        if op == "mark":                    # checked out ahead: acquired, until unout
            for i in data[1]:
                e = by_index.get(i)
                if e is None or e.state is ACQUIRED:
                    continue                # gone, or checked out already (the machine's)
                marked[i] = e.redelivered
                if not _acquire(q, e):
                    return f"mark of {i} at {index}: not available"
            continue
        if op == "unout":                   # not handed out after all: as it was
            for i in data[1]:
                e = by_index.get(i)
                if e is None or e.state is not ACQUIRED:
                    return f"unout of {i} at {index}: not acquired"
                q.release(e)
                e.redelivered = marked.pop(i, False)
                e.delivery_count -= 1
            continue
        if op == "active":
            continue
        if op == "dlx":                     # the dead letter leaves the queue, kept aside
            for i, _ in data[1]:
                marked.pop(i, None)
                e = by_index.pop(i, None)
                if e is None:
                    continue
                if e.state is ACQUIRED:
                    q.reject(e)
                else:
                    q.features.remove_ready(e, None)
                discards.add(i)
            continue
        if op == "dlx-done":
            discards.difference_update(data[1])
            continue
        if op == "checkout":
            for i in data[3] if len(data) > 3 else ():
                if marked.pop(i, None) is None:
                    return f"checkout under a mark of {i} at {index}: not marked"
            for i in list(data[1]) + list(data[2]):
                e = by_index.get(i)
                if i in marked:             # an older leader's mark, delivered again
                    del marked[i]
                    e.delivery_count += 1
                    continue
                if e is None or not _acquire(q, e):
                    return f"checkout of {i} at {index}: not available"
            for i in data[2]:
                marked.pop(i, None)
                q.dequeue(by_index.pop(i))
            continue
        for i in data[1]:
            marked.pop(i, None)
            e = by_index.get(i)
            if e is None:
                continue        # an earlier drop or purge took it (a leader's race)
            if op == "ack":
                if not q.dequeue(e):
                    return f"ack of {i} at {index}: not acquired"
            elif op in ("requeue", "release"):
                if e.state is not ACQUIRED:
                    return f"{op} of {i} at {index}: not acquired"
                if op == "release":
                    e.delivery_count -= 1
                q.release(e)
                continue
            elif op == "drop":
                if e.state is ACQUIRED:
                    q.reject(e)
                else:
                    q.features.remove_ready(e, None)
            elif op == "purge":
                if e.state is ACQUIRED:
                    return f"purge of {i} at {index}: acquired"
                q.features.remove_ready(e, None)
            by_index.pop(i)
    index_of = {e.entry_id: i for i, e in by_index.items()}
    msgs = tuple((index_of[e.entry_id], bytes(e.body), e.redelivered or e.state is ACQUIRED,
                  e.delivery_count) for e in q.entries if not e.is_dead)
    return (msgs, tuple(sorted(i for i, e in by_index.items() if e.state is ACQUIRED)),
            tuple(sorted(discards)))


def _acquire(q: Queue, e: Any) -> bool:
    """Acquire this very entry, as the leader's consumer did (the log names it)."""
    if e.state is not AVAILABLE and e.state is not HELD:
        return False
    was_held = e.state is HELD
    e.state = AVAILABLE
    if not e.acquire(None):
        return False
    if was_held:
        q.held -= 1
    else:
        q.available -= 1
    q.ready_bytes -= len(e.body)
    return True
