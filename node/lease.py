"""A node's side of delivery leases (docs/consumers.md, "Delivery leases"; wire LEASE_GRANT,
LEASE_REVOKE, LEASED and LEASE_END).

While a plain queue is empty and has exactly one consumer, the node lends that consumer's
deliveries to the consumer's router: the router writes matching publishes to the client
itself and sends a LEASED record for each, a few milliseconds later, which the node turns
into an entry acquired by that consumer. The node stays the queue's owner: settlements,
requeues, cancel and a lost router work on those entries as on any other. While a lease is
out the node delivers nothing to that consumer (its interest is off), so the router's count
of the consumer's credit stays exact; anything that makes the queue non-empty or shared
revokes the lease, and what arrived waits for the router's LEASE_END, behind its records.

Why (docs/performance.md, "Why a delivery lease"): at moderate rates each burst otherwise wakes
the node from idle and costs a second trip through the router before the consumer sees it.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from shoal.shared.wire import TAG_LEASE_GRANT, TAG_LEASE_REVOKE

from shoal.node.durability.journal import JournalUnavailable
from shoal.node.queues.message import is_persistent

if TYPE_CHECKING:
    from shoal.node.peers import RouterPeer
    from shoal.node.queues.queue import Queue

log = logging.getLogger("shoal.node")

#: After a lease ends, the queue is not lent again for this long (ms): a router that returned
#: it needed the node's path (a confirm, no credit), and a queue another router publishes to
#: would otherwise be granted and revoked for every burst.
HOLD_OFF_MS = 100


class ShardCore(Protocol):
    """What leases use of the shard (node/shard.py's ``Shard``)."""

    leases_on: bool     #: the node's ``delivery_leases`` setting
    timers: Any         #: its ``now`` is the node's clock (ms)
    durable: Any        #: node/durability/durable.py's DurableLog, or None

    def send(self, identity: bytes, msg: list) -> None: ...


def maybe_grant(shard: "ShardCore", q: "Queue") -> None:
    """Lend ``q`` to its consumer's router if the rule holds: a plain queue (no type, group,
    TTL, length limit, delivery limit, consumer timeout or single active consumer), nothing
    ready or held, one consumer, which acquires, has no filter and holds credit."""
    if not shard.leases_on or q.lease is not None or q.available or q.held or q.deleted \
            or q.replica is not None \
            or not q.cfg.plain or q.cfg.max_returns is not None or q.groups is not None \
            or shard.timers.now < q.lease_hold_until:
        return
    qcm = q.qcm
    if len(qcm.all) != 1:
        return
    c = next(iter(qcm.all))
    if not c.plain or not c.acquires or c.timeout or c.credit <= 0 or c.peer is None:
        return
    q.lease = c
    q.lease_revoked = False
    qcm.set_interest(c, False)          # the node delivers nothing to it while lent
    shard.send(c.peer.identity, [TAG_LEASE_GRANT, c.consumer_id, c.peer.publishes])


def revoke(shard: "ShardCore", q: "Queue") -> None:
    """Something other than the lease holder made ``q`` non-empty or shared: ask for it back
    (once). What arrived waits until LEASE_END."""
    c = q.lease
    if c is not None and not q.lease_revoked:
        q.lease_revoked = True
        if c.peer is not None:
            shard.send(c.peer.identity, [TAG_LEASE_REVOKE, c.consumer_id])


def end(q: "Queue", now_ms: float) -> None:
    """The lease is over (LEASE_END, or its consumer left): the node delivers to the consumer
    again. The caller then calls ``q.notify_work()``."""
    c = q.lease
    if c is None:
        return
    q.lease = None
    q.lease_revoked = False
    q.lease_hold_until = now_ms + HOLD_OFF_MS
    if c.queue is q and c in q.qcm.all and c.credit > 0:
        q.qcm.set_interest(c, True)


def on_lease_end(shard: "ShardCore", state: "RouterPeer", msg: list) -> None:
    """LEASE_END [consumer_id]: the router holds the lease no longer; deliver what waited.
    Unknown or already ended: ignored."""
    c = state.consumers.get(msg[1]) if type(msg[1]) is int else None
    if c is None or c.queue is None or c.queue.lease is not c:
        return
    q = c.queue
    end(q, shard.timers.now)
    q.notify_work()


def on_leased(shard: "ShardCore", state: "RouterPeer", msg: list) -> None:
    """LEASED [consumer_id, delivery_id, exchange, routing_key, header, body, publisher]: the
    router delivered this message under ``delivery_id``; enqueue it acquired by the consumer
    (journaled as a publish and a delivery, counted as both). If the consumer or its queue is
    gone (or the record is malformed), it is dropped, as a publish to a deleted queue is, and
    the client's settlement of it finds nothing; if the lease ended under it, it is enqueued
    ready like any publish."""
    _, cid, did, exchange, routing_key, header, body, publisher = msg
    c = state.consumers.get(cid) if type(cid) is int else None
    q = c.queue if c is not None else None
    if q is None or q.deleted or type(did) is not int or type(header) is not bytes \
            or type(body) is not bytes:
        log.debug("dropping LEASED for consumer %r: no such consumer, queue or shape", cid)
        return
    e = q.enqueue(exchange, routing_key, header, body, publisher)
    if e is None:                       # x-overflow refused it: not a plain queue; cannot be
        return
    q.stats[0] += 1
    if q.journaled and is_persistent(header):
        try:
            shard.durable.enqueue(q, e, shard.timers.now)
        except JournalUnavailable as exc:   # delivered already: keep it in memory only
            log.warning("leased message for queue '%s' not journaled: %s", q.name, exc)
    if q.lease is not c or not e.acquire(c):
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
