"""A node's side of delivery leases (docs/consumers.md, "Delivery leases"; wire LEASE_GRANT,
LEASE_TAKE, LEASE_TAKEN, LEASE_REVOKE, LEASED, LEASE_ACKED and LEASE_END).

While a plain queue is empty and its consumers are all on one router, the node lends their
deliveries to that router: the router writes matching publishes to the clients itself and
sends a LEASED record for each, a few milliseconds later, which the node turns into an entry
acquired by that consumer. The node stays the queue's owner: settlements, requeues, cancel
and a lost router work on those entries as on any other.

Lending is a handshake, so that none of the router's earlier PUBLISHes to the queue is still
on its way when it starts delivering itself. LEASE_GRANT only offers the lease; the node
keeps delivering as before. The router answers LEASE_TAKE, behind every PUBLISH it sent
(and holds its later publishes to the queue). When the node reaches the TAKE, those
PUBLISHes are handled; if the rule still holds, the lease starts (LEASE_TAKEN), else it is
refused (LEASE_REVOKE). While a lease is out the node delivers nothing to its consumers
(their interest is off), so the router's count of their credit stays exact; anything that
makes the queue non-empty or shared revokes the lease, and what arrived waits for the
router's LEASE_END, behind its records.

Why (docs/performance.md, "Why a delivery lease"): at moderate rates each burst otherwise wakes
the node from idle and costs a second trip through the router before the consumer sees it.
"""
from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Any, Protocol

from shoal.shared.errors import RESOURCE_ERROR
from shoal.shared.wire import (TAG_LEASE_GRANT, TAG_LEASE_REVOKE, TAG_LEASE_TAKEN,
                               TAG_PUBLISH_RESULT)

from shoal.node.durability.journal import JournalUnavailable
from shoal.node.queues.message import is_persistent

if TYPE_CHECKING:
    from shoal.node.peers import RouterPeer
    from shoal.node.queues.consumer import QueueConsumer
    from shoal.node.queues.queue import Queue

log = logging.getLogger("shoal.node")

#: After a lease ends, the queue is not lent again for this long (ms): a router that returned
#: it needed the node's path (a mandatory or transactional publish, a message with a TTL), and
#: a queue another router publishes to would otherwise be granted and revoked for every
#: burst. Not after a router returned it for want of credit (LEASE_END's ``soon``): the
#: queue is lent again once it is empty, so that a flood keeps its lease between stalls.
HOLD_OFF_MS = 100
#: A queue with more consumers than this is not lent (LEASE_GRANT names every one).
MAX_LENT = 64
#: Offer ids: every message about an offer or the lease it became names it, so that an
#: answer to an older offer is never taken for one to a newer (found by
#: tests/router_glue/test_lease_schedules.py).
_offers = itertools.count(1)


class ShardCore(Protocol):
    """What leases use of the shard (node/shard.py's ``Shard``)."""

    leases_on: bool     #: the node's ``delivery_leases`` setting
    timers: Any         #: its ``now`` is the node's clock (ms)
    durable: Any        #: node/durability/durable.py's DurableLog, or None

    def send(self, identity: bytes, msg: list) -> None: ...


def lends(q: "Queue", c: "QueueConsumer") -> bool:
    """Whether ``q`` is lent and ``c`` is one of the consumers lent."""
    lent = q.lease
    return lent is not None and c in lent


def _lendable(shard: "ShardCore", q: "Queue") -> tuple | None:
    """The consumers ``q`` may be lent with now, or None (the rule of :func:`maybe_grant`)."""
    if not shard.leases_on or q.lease is not None or q.available or q.held or q.deleted \
            or q.replica is not None \
            or not q.cfg.plain or q.cfg.max_returns is not None or q.groups is not None \
            or shard.timers.now < q.lease_hold_until:
        return None
    lent = tuple(q.qcm.all)
    if not lent or len(lent) > MAX_LENT:
        return None
    first = lent[0]
    peer = first.peer
    if peer is None:
        return None
    credit = False
    for c in lent:
        if not c.plain or not c.acquires or c.timeout or c.peer is not peer \
                or c.priority != first.priority:
            return None
        credit = credit or c.credit > 0
    return lent if credit else None


def maybe_grant(shard: "ShardCore", q: "Queue") -> None:
    """Offer ``q``'s lease to its consumers' router if the rule holds and none is offered: a
    plain queue (no type, group, TTL, length limit, delivery limit, consumer timeout or single
    active consumer), nothing ready or held, and at most ``MAX_LENT`` consumers, all on one
    router and of one priority, each acquiring, without a filter or a timeout; at least one
    holds credit. The node goes on delivering until the router's LEASE_TAKE."""
    if q.lease_offer is not None:
        return
    lent = _lendable(shard, q)
    if lent is not None:
        q.lease_offer = lent
        q.lease_id = next(_offers)
        shard.send(lent[0].peer.identity,
                   [TAG_LEASE_GRANT, [c.consumer_id for c in lent], q.lease_id])


def on_lease_take(shard: "ShardCore", state: "RouterPeer", msg: list) -> None:
    """LEASE_TAKE [consumer_ids, offer_id]: the router takes that offer (every PUBLISH it
    sent before is handled). If it is the offer standing and the rule still holds for the
    same consumers, the lease starts: their interest goes off and the router is told
    (LEASE_TAKEN); else LEASE_REVOKE, so that a TAKE is always answered (the offer was
    withdrawn meanwhile: a consumer left, or the router declined it)."""
    _, cids, oid = msg
    if type(cids) is not list or not cids:
        return
    c = state.consumers.get(cids[0])
    q = c.queue if c is not None else None
    if q is None or q.lease_offer is None or q.lease_id != oid:
        shard.send(state.identity, [TAG_LEASE_REVOKE, cids[0], oid])
        return
    offered, q.lease_offer = q.lease_offer, None
    lent = _lendable(shard, q)
    if lent != offered:
        q.lease_hold_until = shard.timers.now + HOLD_OFF_MS
        shard.send(state.identity, [TAG_LEASE_REVOKE, cids[0], oid])
        return
    q.lease = lent
    q.lease_revoked = False
    for c in lent:
        q.qcm.set_interest(c, False)    # the node delivers nothing to them while lent
    shard.send(state.identity, [TAG_LEASE_TAKEN, cids[0], oid])


def revoke(shard: "ShardCore", q: "Queue") -> None:
    """Something other than the lease holder made ``q`` non-empty or shared: ask for it back
    (once), naming its first consumer. What arrived waits until LEASE_END."""
    lent = q.lease
    if lent is not None and not q.lease_revoked:
        q.lease_revoked = True
        c = lent[0]
        if c.peer is not None:
            shard.send(c.peer.identity, [TAG_LEASE_REVOKE, c.consumer_id, q.lease_id])


def end(q: "Queue", now_ms: float, soon: bool = False) -> None:
    """The router ended the lease (LEASE_END): the node delivers to the consumers again
    (``Queue.unlend``), and does not lend the queue for ``HOLD_OFF_MS`` unless ``soon`` (the
    consumers only ran out of credit). The caller then calls ``q.notify_work()``."""
    if q.lease is None:
        return
    q.lease_hold_until = now_ms if soon else now_ms + HOLD_OFF_MS
    q.unlend()


def on_lease_end(shard: "ShardCore", state: "RouterPeer", msg: list) -> None:
    """LEASE_END [consumer_id, offer_id(, soon)]: the router holds that lease (of which this
    is one consumer) no longer, or declines that offer; deliver what waited. ``soon``: it was
    returned for want of credit (:func:`end`). Another offer's or lease's, unknown or already
    ended: ignored."""
    c = state.consumers.get(msg[1]) if type(msg[1]) is int else None
    if c is None or c.queue is None or c.queue.lease_id != msg[2]:
        return
    q = c.queue
    if q.lease_offer is not None and c in q.lease_offer:      # declined
        q.lease_offer = None
        q.lease_hold_until = shard.timers.now + HOLD_OFF_MS
        return
    if not lends(q, c):
        return
    end(q, shard.timers.now, len(msg) > 3 and msg[3] is True)
    q.notify_work()


def on_lease_acked(shard: "ShardCore", state: "RouterPeer", msg: list) -> None:
    """LEASE_ACKED [consumer_id, count]: ``count`` leased deliveries to that consumer were
    acknowledged before their LEASEDs left the router: counted published, delivered and
    acknowledged (the management API's message_stats), taken from the consumer's credit as
    their LEASEDs would have been; nothing is stored or journaled (RabbitMQ writes no
    message acknowledged before it was written). A consumer or queue gone: ignored, as its
    LEASEDs would have been dropped."""
    _, cid, count = msg[:3]
    c = state.consumers.get(cid)
    q = c.queue if c is not None else None
    if q is None or q.deleted or count <= 0:
        return
    stats = q.stats
    stats[0] += count
    stats[1] += count
    stats[2] += count
    c.credit -= count


def on_leased(shard: "ShardCore", state: "RouterPeer", msg: list) -> None:
    """LEASED [consumer_id, delivery_id, exchange, routing_key, header, body, publisher]: the
    router delivered this message under ``delivery_id``; enqueue it acquired by the consumer
    (journaled as a publish and a delivery, counted as both). If the consumer or its queue is
    gone (or the record is malformed), it is dropped, as a publish to a deleted queue is, and
    the client's settlement of it finds nothing; if the lease ended under it, it is enqueued
    ready like any publish."""
    _, cid, did, exchange, routing_key, header, body, publisher = msg[:8]
    pid = msg[8] if len(msg) > 8 else 0
    c = state.consumers.get(cid) if type(cid) is int else None
    q = c.queue if c is not None else None
    if q is None or q.deleted or type(did) is not int or type(header) is not bytes \
            or type(body) is not bytes:
        log.debug("dropping LEASED for consumer %r: no such consumer, queue or shape", cid)
        if pid:
            shard.send(state.identity, [TAG_PUBLISH_RESULT, pid, 0, 0])
        return
    e = q.enqueue(exchange, routing_key, header, body, publisher)
    if e is None:                       # x-overflow refused it: not a plain queue; cannot be
        if pid:
            shard.send(state.identity, [TAG_PUBLISH_RESULT, pid, RESOURCE_ERROR, 0])
        return
    q.stats[0] += 1
    lsn = 0
    code = 0
    if q.journaled and is_persistent(header):
        try:
            lsn = shard.durable.enqueue(q, e, shard.timers.now)
        except JournalUnavailable as exc:   # delivered already: keep it in memory only
            log.warning("leased message for queue '%s' not journaled: %s", q.name, exc)
            code = RESOURCE_ERROR
    if pid:
        res = [TAG_PUBLISH_RESULT, pid, code, 0 if code else 1]
        if lsn:
            shard.durable.defer(lsn, state.identity, res)   # answered once on disk
        else:
            shard.send(state.identity, res)
    if not lends(q, c) or not e.acquire(c):
        q.notify_work()                 # the lease ended under it: an ordinary message now
        return
    q.available -= 1
    q.ready_bytes -= len(body)
    q.stats[1] += 1
    # May go below 0 for a moment: a record leaves ahead of the CREDIT the router queued
    # before making that delivery (the same batch, next in line).
    c.credit -= 1
    if c.no_ack:
        q.dequeue(e)
        return
    state.unsettled[did] = e
    if q.journaled:
        shard.durable.delivered.append((e.entry_id, True, e.delivery_count))
