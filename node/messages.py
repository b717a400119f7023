"""The message handlers of a shard (design.md section 3, seed 002's pull model over the link):
PUBLISH, CONSUME, CANCEL, CREDIT, SETTLE and GET, each a function ``on_x(shard, peer, msg)``
that :meth:`Shard.handle <shoal.node.shard.Shard.handle>` calls with the message checked for
shape. They raise :class:`~shoal.shared.errors.AMQPError` (the shard turns it into a REPLY).

The shard's topology requests (declares, deletes, bindings) and the router link stay in
node/shard.py and node/peers.py; what these functions need of the shard is :class:`ShardCore`.
"""
from __future__ import annotations

import logging
from typing import Any, Protocol

from shoal.shared.errors import ACCESS_REFUSED, COMMAND_INVALID, NOT_IMPLEMENTED, \
    RESOURCE_ERROR, hard_error, soft_error
from shoal.shared.errors import AMQPError
from shoal.shared.wire import (MOVED, OUTCOME_ACK, OUTCOME_REJECT, OUTCOME_RELEASE,
                               OUTCOME_REQUEUE, TAG_PUBLISH_MOVED, TAG_PUBLISH_RESULT, TAG_REPLY, T)

from shoal.node.queues.consumer import QueueConsumer
from shoal.node.queues.deadletter import annotated_header, delivery_count_header
from shoal.node import lease
from shoal.node.durability.durable import DurableLog
from shoal.node.queues.entry import QueueEntry
from shoal.node.durability.journal import JournalUnavailable
from shoal.node.queues.message import body_size, is_persistent
from shoal.node.queues.paging import PageStore, body_bytes
from shoal.node.peers import DEFERRED, RouterPeer
from shoal.node.queues.queue import Queue
from shoal.node.replication.group import LOST
from shoal.node.queues.args import parse_consume_arguments
from shoal.node.timers import Timers

log = logging.getLogger("shoal.node")


class ShardCore(Protocol):
    """What the message handlers use of the shard (node/shard.py's ``Shard``)."""

    queues: dict[tuple[str, str], Queue]
    durable: DurableLog | None
    timers: Timers
    pages: PageStore | None
    leases_on: bool
    #: the quorum queues (node/replication/manager.py's Replication), or None
    replication: Any
    #: the streams (node/streams/hosting.py's Streams)
    streams: Any

    def send(self, identity: bytes, msg: list) -> None: ...

    def queue_for(self, vhost: str, name: str, owner: str | None) -> Queue: ...

    def maybe_auto_delete(self, q: Queue) -> None: ...


def delivered_header(entry: QueueEntry) -> bytes:
    """The content header a delivery of ``entry`` carries: with ``x-delivery-count`` when the
    queue counts returns (``x-max-delivery-count``; Qpid's delivery limit) and it came back."""
    if entry.delivery_count > 1 and entry.queue.cfg.max_returns is not None:
        return delivery_count_header(entry.header, body_size(entry.header),
                                     entry.delivery_count - 1)
    return entry.header


def on_publish(shard: ShardCore, state: RouterPeer, msg: list) -> None:
    """PUBLISH: enqueue on each named queue that exists; PUBLISH_RESULT if seq != 0;
    then notify consumers (seed 002). A queue over its memory budget keeps the body in the
    node's page files (node/queues/paging.py)."""
    _, seq, vhost, names, exchange, routing_key, header, body, publisher = msg \
        if len(msg) == 9 else msg[:9]
    queues = shard.queues
    pages = shard.pages
    routed = 0
    refused = 0
    lsn = 0
    paged = None        # one page-file copy of the body, shared by this node's queues
    quorum = None
    streamed = False
    moved = None
    for name in names:
        q = queues.get((vhost, name))
        if q is None:
            s = shard.streams.streams.get((vhost, name))
            if s is not None:       # a stream: confirmed when the turn's chunk is on disk
                if s.replica is not None and not s.replica.leading:
                    if moved is None:       # its leader takes it (router/quorum.py)
                        moved = []
                        shard.streams.members.announce(s.replica, state.identity)
                    moved.append(name)
                    continue
                if seq < 0:         # sent again: its first publish id is the writer's seq
                    first = msg[9] if len(msg) > 9 else 0
                    shard.streams.publish(s, exchange, routing_key, header, body,
                                          state.router_id,
                                          first if type(first) is int and first > 0 else 0,
                                          True)
                else:
                    shard.streams.publish(s, exchange, routing_key, header, body,
                                          state.router_id, seq)
                streamed = True
                routed += 1
        else:
            if q.replica is not None:       # a quorum queue: its log decides (below)
                if quorum is None:
                    quorum = []
                quorum.append(q)
                continue
            e = q.enqueue(exchange, routing_key, header, body, publisher)
            if e is None:
                refused += 1
                continue
            q.stats[0] += 1
            if q.journaled and is_persistent(header):
                try:
                    lsn = shard.durable.enqueue(q, e, shard.timers.now)
                    routed += 1
                except JournalUnavailable as exc:   # disk failing, buffer full: refuse
                    log.warning("refusing persistent message for queue '%s': %s", name, exc)
                    q.discard(e)
                    refused += 1
            else:
                routed += 1
            if pages is not None and pages.over_budget(q) and not e.is_dead:
                if paged is None:
                    paged = pages.page_out(body)
                e.body = paged
    if quorum is not None:
        publish_quorum(shard, state, seq, quorum, msg, routed, refused, lsn,
                       shard.streams.turns if streamed else -1, moved)
    elif seq:
        res = [TAG_PUBLISH_RESULT, seq, RESOURCE_ERROR if refused else 0, routed] \
            if moved is None else \
            [TAG_PUBLISH_MOVED, seq, RESOURCE_ERROR if refused else 0, routed, moved]
        if streamed:
            shard.streams.hold(state.identity, res, lsn)
        elif lsn:
            shard.durable.defer(lsn, state.identity, res)   # answered once on disk
        else:
            shard.send(state.identity, res)
    if routed:
        for name in names:
            q = queues.get((vhost, name))
            if q is not None:
                q.notify_work()
                if q.features.zero_ttl:
                    q.features.expire_untaken()
                if q.qcm.interested_count:
                    lease.maybe_grant(shard, q)


def publish_quorum(shard: ShardCore, state: RouterPeer, seq: int, quorum: list[Queue],
                   msg: list, routed: int, refused: int, lsn: int, turn: int = -1,
                   streams_moved: list[str] | None = None) -> None:
    """The quorum queues of a PUBLISH: each leader appends the message to its log; the
    answer (PUBLISH_RESULT, with the classic queues' part) waits until every one has it
    committed, i.e. on a majority of members' disks, and applied. Queues this node does not
    lead are named in PUBLISH_MOVED: the router sends them the message again at their
    leader (it is told who that is first, EV_QUEUE_LEADER). A publish sent again (``seq`` <
    0, its first send's id in ``msg[9]``) that the leader's log holds already is not logged
    twice: its answer is that entry's (group.py ``find_publish``). ``turn``: the publish went to a
    stream too in the streams' turn of that number (-1: none); an answer ready before that
    turn's chunk is on disk waits for it (node/streams/hosting.py); ``streams_moved``: the
    replicated streams of the publish this node does not lead (PUBLISH_MOVED too)."""
    _, _, vhost, _, exchange, routing_key, header, body, publisher = msg[:9]
    # a publish sent again names its first send's id (router/quorum.py _resend)
    first = seq if seq > 0 else (msg[9] if len(msg) > 9 and type(msg[9]) is int else 0)
    writer = state.router_id if first > 0 and len(state.router_id) < 256 else ""
    cmd: list | None = None
    moved: list[str] = list(streams_moved or ())
    tally = [routed, refused, 0]        # routed, refused, proposals outstanding
    done = [False]

    def finish() -> None:
        if done[0] or tally[2]:
            return
        done[0] = True
        if not seq:
            return
        code = RESOURCE_ERROR if tally[1] else 0
        res = [TAG_PUBLISH_RESULT, seq, code, tally[0]] if not moved else \
            [TAG_PUBLISH_MOVED, seq, code, tally[0], moved]
        if turn >= 0 and shard.streams.turns == turn:     # the stream's chunk: not yet
            shard.streams.hold(state.identity, res, lsn)
        elif lsn:
            shard.durable.defer(lsn, state.identity, res)
        else:
            shard.send(state.identity, res)

    for q in quorum:
        g = q.replica

        def applied(result: Any, name: str = q.name) -> None:
            tally[2] -= 1
            if result is LOST:
                moved.append(name)
            elif result:
                tally[0] += 1
            else:
                tally[1] += 1
            finish()
        if g.leading:
            if seq < 0 and writer:
                at = g.find_publish(writer, first)
                if at is not None:          # logged already: not twice; its answer is ours
                    if at <= g.applied_index():
                        tally[0] += 1
                    else:
                        tally[2] += 1
                        g.await_entry(at, applied)
                    continue
            if g.refuses(len(body)):        # x-overflow reject-publish: basic.nack
                tally[1] += 1
                continue
            out = g.out.can_mark() and g.may_deliver()
            if cmd is None or cmd[8] != out:
                cmd = g.enqueue_command(exchange, routing_key, header, body, publisher,
                                        seq < 0, out, writer, first)
            tally[2] += 1
            if g.propose(cmd, applied if seq else None):
                g.logged(len(body), out)
            else:
                tally[2] -= 1
                moved.append(q.name)
        else:
            moved.append(q.name)
            shard.replication.announce(g, state.identity)
    finish()


def on_consume(shard: ShardCore, state: RouterPeer, msg: list) -> int:
    """CONSUME (spec 1.8.3.3): a consumer with credit 0; returns the queue's AVAILABLE entries,
    so that a multi-queue consumer can pull at once from every queue with work (seed 002 DG5)
    instead of waiting for WORK. Raises 404, 405, 403 (exclusive use), 406 (bad consume
    arguments: node/queues/args.py), 503 (consumer_id already used by this router for
    another queue).

    The same router's consumer id registered again on the same queue is the same consumer
    (a quorum queue's consumer follows its leader: router/quorum.py registers it again at
    each announcement, and after a link flap the node may still hold it): its credit goes
    back to 0, as the router's count of it does, and what it holds acquired stays so."""
    _, _, cid, vhost, name, tag, no_ack, exclusive, args, owner = msg[:10]
    if (vhost, name) in shard.streams.streams and (vhost, name) not in shard.queues:
        if cid in state.consumers:
            raise hard_error(COMMAND_INVALID, f"consumer id {cid} already in use")
        return shard.streams.consume(state, cid, shard.streams.streams[(vhost, name)], tag,
                                     bool(no_ack), args or {}, msg[10] if len(msg) > 10
                                     else None)
    q = shard.queue_for(vhost, name, owner)
    if q.replica is not None and not q.replica.leading:
        raise moved(shard, state, q)
    known = state.consumers.get(cid)
    if known is not None:
        if known.queue is not q:
            raise hard_error(COMMAND_INVALID, f"consumer id {cid} already in use")
        q.drain(known)
        known.wants_work = False
        q.work_wanted.pop(known, None)
        if lease.lends(q, known):
            lease.revoke(shard, q)
        return q.message_count
    if q.exclusive_consumer is not None or (exclusive and q.consumer_count):
        raise soft_error(ACCESS_REFUSED, f"queue '{name}' in vhost '{vhost}' in exclusive use")
    args = args or {}
    cc = parse_consume_arguments(vhost, name, args)
    c = QueueConsumer(cid, state, tag, bool(no_ack), bool(exclusive), args, cc.priority)
    c.configure(cc, owner)
    q.add_consumer(c)
    state.consumers[cid] = c
    if q.lease is not None:
        lease.revoke(shard, q)          # another consumer: the node decides again
    return q.message_count


def on_cancel(shard: ShardCore, state: RouterPeer, msg: list) -> Any:
    """CANCEL (spec 1.8.3.5): unsettled deliveries stay acquired. Auto-delete queues lose
    their last consumer -> deleted. Unknown consumer: success."""
    c = state.consumers.pop(msg[2], None)
    if c is None:
        sc = shard.streams.consumer(state.identity, msg[2])
        if sc is not None:
            shard.streams.cancel(sc)
        return None
    if c.queue.remove_consumer(c):
        shard.maybe_auto_delete(c.queue)
        lease.maybe_grant(shard, c.queue)
    if c.queue.replica is not None:
        # answered behind the deliveries held for their checkouts (the router must see
        # them before it forgets the consumer)
        c.queue.replica.out.send_ordered(state.identity, [TAG_REPLY, msg[1], 0, "", None])
        return DEFERRED


def on_credit(shard: ShardCore, state: RouterPeer, msg: list) -> None:
    """CREDIT: add credit and pull; drain -> CREDIT_DRAINED; credit 0 -> wants one WORK."""
    _, cid, credit, drain = msg
    c = state.consumers.get(cid) if type(cid) is int else None
    if c is None or type(credit) is not int or credit < 0:
        sc = shard.streams.consumer(state.identity, cid) if c is None else None
        if sc is not None and type(credit) is int and credit >= 0:
            left = shard.streams.credit(sc, credit, bool(drain))
            if left is not None:
                shard.send(state.identity, [int(T.CREDIT_DRAINED), cid, left])
        return
    q = c.queue
    if credit or drain:
        q.add_credit(c, credit)
        if q.lease is None and not drain:
            lease.maybe_grant(shard, q)
    if drain:
        drained = [int(T.CREDIT_DRAINED), cid, q.drain(c)]
        if q.replica is not None:       # behind the deliveries held for their checkouts
            q.replica.out.send_ordered(state.identity, drained)
        else:
            shard.send(state.identity, drained)
    elif not credit:
        q.want_work(c)


def on_settle(shard: ShardCore, state: RouterPeer, msg: list) -> None:
    """SETTLE: ACK dequeues, REQUEUE releases (original position, redelivered) and
    notifies, REJECT drops. Unknown delivery ids are ignored. ``annotations`` (a 4th
    element, shared/wire.py): merged into the headers of the messages first."""
    outcome, ids = msg[1], msg[2]
    if type(ids) is not list:
        log.warning("dropping SETTLE whose delivery ids are not a list")
        return
    unsettled = state.unsettled
    table = msg[3] if len(msg) > 3 and msg[3] else None
    if table is not None and outcome != OUTCOME_ACK:
        annotate(unsettled, ids, table)
    if shard.replication is not None and shard.replication.groups:
        settle_with_quorum(state, outcome, ids, table)
        return
    if outcome == OUTCOME_ACK:
        for i in ids:
            e = unsettled.pop(i, None)
            if e is not None:
                e.queue.stats[2] += 1
                e.queue.dequeue(e)
    elif outcome == OUTCOME_REQUEUE or outcome == OUTCOME_RELEASE:
        touched: dict[Queue, None] = {}
        for i in ids:
            e = unsettled.pop(i, None)
            if e is not None and e.queue.release(e, outcome == OUTCOME_REQUEUE):
                touched[e.queue] = None
        for q in touched:
            q.requeued()
    elif outcome == OUTCOME_REJECT:
        for i in ids:
            e = unsettled.pop(i, None)
            if e is not None:
                e.queue.reject(e)
    else:
        log.warning("dropping SETTLE with unknown outcome %r", outcome)


def annotate(unsettled: dict, ids: list, table: bytes) -> None:
    """A modified outcome's annotations (``table``) merged into the messages ``ids``
    (AMQP 1.0 3.4.5; RabbitMQ 4). A table that does not decode is logged and ignored."""
    for i in ids:
        e = unsettled.get(i)
        if e is not None and not e.is_dead:
            try:
                e.header = annotated_header(e.header, table)
            except ValueError as exc:
                log.warning("ignoring the annotations of a settlement: %s", exc)
                return


def settle_with_quorum(state: RouterPeer, outcome: int, ids: list,
                       table: bytes | None = None) -> None:
    """SETTLE on a node with quorum queues: each delivery is settled here as on a classic
    queue (the leader's acquisitions are its own), and a quorum queue's settlements then go
    to its log for the other members: ``ack``, ``requeue`` (returned: redelivered, counted),
    ``release`` (returned, not counted: AMQP 1.0 released),
    ``drop`` (rejected, or dead-lettered at its delivery limit). ``table``: a modified
    outcome's annotations, already merged here, logged with a return for the others."""
    unsettled = state.unsettled
    ops: dict[Any, dict[str, list]] = {}
    touched: dict[Queue, None] = {}
    for i in ids:
        e = unsettled.pop(i, None)
        if e is None:
            continue
        q = e.queue
        if outcome == OUTCOME_ACK:
            q.stats[2] += 1
            q.dequeue(e)
            op = "ack"
        elif outcome == OUTCOME_REQUEUE or outcome == OUTCOME_RELEASE:
            if q.release(e, outcome == OUTCOME_REQUEUE):
                touched[q] = None
                op = "requeue" if outcome == OUTCOME_REQUEUE else "release"
            else:
                op = "drop"
        elif outcome == OUTCOME_REJECT:
            q.reject(e)
            op = "drop"
        else:
            log.warning("dropping SETTLE with unknown outcome %r", outcome)
            return
        if q.replica is not None:
            ops.setdefault(q.replica, {}).setdefault(op, []).append(e)
    for g, by_op in ops.items():
        for op, entries in by_op.items():
            g.settle(op, entries, table if op in ("requeue", "release") else None)
    for q in touched:
        q.requeued()


def moved(shard: ShardCore, state: RouterPeer, q: Queue) -> AMQPError:
    """The MOVED answer (shared/wire.py) to a request about a quorum queue this node does
    not lead, after telling the router who does."""
    g = q.replica
    shard.replication.announce(g, state.identity)
    return AMQPError(MOVED, f"quorum queue '{q.name}' is led by "
                            f"{g.known_leader or 'no member yet'}")


def on_get(shard: ShardCore, state: RouterPeer, msg: list) -> Any:
    """GET (spec 1.8.3.10) -> None or [delivery_id, redelivered, exchange, routing_key,
    header, body, message_count]. Raises 404, 405. A quorum queue answers once what its log
    holds now is applied (a publish just before the get is seen, as in RabbitMQ, where a get
    is a command in the log), and only from a leader in its lease (else MOVED)."""
    _, req_id, vhost, name, no_ack, owner = msg
    if (vhost, name) in shard.streams.streams and (vhost, name) not in shard.queues:
        raise hard_error(NOT_IMPLEMENTED, f"basic.get not supported by stream queues queue "
                                          f"'{name}' in vhost '{vhost}'")
    q = shard.queue_for(vhost, name, owner)
    g = q.replica
    if g is None:
        return take(shard, state, q, bool(no_ack))
    if not g.leading or not g.in_lease():
        raise moved(shard, state, q)
    gone = [TAG_REPLY, req_id, MOVED, f"quorum queue '{name}' moved", None]

    def then(result: Any = None) -> None:
        if result is LOST or not g.may_deliver():
            shard.send(state.identity, gone)
            return
        e = q.get()
        if e is None:
            shard.send(state.identity, [TAG_REPLY, req_id, 0, "", None])
            return
        flag = e.redelivered
        reply = [TAG_REPLY, req_id, 0, "", taken(shard, state, q, e, bool(no_ack))]
        if g.out.check_out(e, state.identity, reply, flag, bool(no_ack), gone):
            shard.send(state.identity, reply)
    last = g.raft.log.last_index
    if last > g.raft.log.applied:
        g.waiters.setdefault(last, []).append(then)
    else:
        then()
    return DEFERRED


def take(shard: ShardCore, state: RouterPeer, q: Queue, no_ack: bool) -> list | None:
    """basic.get's acquisition of ``q``'s first message (GET's payload, or None)."""
    e = q.get()
    if e is None:
        return None
    return taken(shard, state, q, e, no_ack)


def taken(shard: ShardCore, state: RouterPeer, q: Queue, e: Any, no_ack: bool) -> list:
    """GET's payload for ``e``, just acquired from ``q``: settled at once with ``no_ack``,
    else unsettled for ``state``'s router."""
    q.stats[1] += 1
    reply = [e.entry_id, e.redelivered, e.exchange, e.routing_key, delivered_header(e),
             body_bytes(e.body), 0]
    if no_ack:
        q.dequeue(e)        # drops the entry's bytes: the reply holds them
    else:
        state.unsettled[e.entry_id] = e
        if q.journaled:
            shard.durable.delivered.append((e.entry_id, True, e.delivery_count))
    reply[6] = q.message_count
    return reply
