"""The router's side of delivery leases (node/lease.py has the node's; docs/consumers.md,
"Delivery leases"; wire LEASE_GRANT, LEASE_REVOKE, LEASED and LEASE_END).

A node lends an empty plain queue's only consumer to the consumer's router. While the router
holds the lease, a publish on it routed to that queue alone, with no confirm, no
``mandatory`` and no transaction, whose consumer holds credit at the node and whose channel
is writable, is written to the consumer here, with a delivery id of the router's (negative,
never an entry id), and recorded at the node afterwards (LEASED, ahead of its settlements,
``LEASE_FLUSH_S`` later). Anything else ends the lease first (LEASE_END, behind the records)
and goes through the node as always, so a publishing channel's messages keep their order.

Accepting a grant is fenced: LEASE_GRANT carries how many of this router's PUBLISH messages
the node had handled; a router that has sent more declines, since one of them may be about to
make the queue non-empty behind the lease's back.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from shoal.shared.wire import TAG_LEASE_END, TAG_LEASED, leasable

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


class Leases:
    """The leases this router holds: ``held`` maps (vhost, queue) to (channel, consumer)."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self.held: dict[tuple[str, str], tuple["BrokerChannel", "Consumer"]] = {}
        self._last_id = 0

    def on_grant(self, link: "NodeLink", cid: Any, publishes: Any) -> None:
        """LEASE_GRANT: take the lease, or decline it (LEASE_END at once) when the consumer is
        going, serves several queues, or PUBLISHes the node had not seen were sent."""
        entry = self._broker.consumers.get(cid)
        if entry is not None:
            ch, c = entry
            t = c.target
            key = (t.vhost, c.queue)
            if publishes == link.publishes and key not in self.held \
                    and not t.cancelled and t.registered and len(t.consumers) == 1 \
                    and not ch.closed and c.node_id == link.node_id:
                self.held[key] = entry
                link.leases += 1
                return
        link.send_record([TAG_LEASE_END, cid], now=True)

    def on_revoke(self, link: "NodeLink", cid: Any) -> None:
        """LEASE_REVOKE: give it back at once (behind the records already queued)."""
        entry = self._broker.consumers.get(cid)
        if entry is not None and self.holds(entry[1]):
            self._end(entry[1], now=True)

    def deliver(self, ch: "BrokerChannel", ev: Any, queue: str, count: bool = True) -> bool:
        """Deliver publish ``ev`` (routed to ``queue``, no answer wanted) under the lease, if
        one is held and allows it; else end the lease (if held) and return False: the caller
        publishes through the node. ``count``: count it routed (once per publish: a
        publish to several queues is counted by the caller)."""
        entry = self.held.get((ch.vhost, queue))
        if entry is None:
            return False
        cch, c = entry
        if c.granted <= 0 or cch.closed or cch.pool.paused or not leasable(ev.header):
            self._end(c)
            return False
        broker = self._broker
        link = broker.links[c.node_id]
        self._last_id -= 1
        did = self._last_id
        link.send_record([TAG_LEASED, c.consumer_id, did, ev.exchange, ev.routing_key,
                          ev.header, ev.body, ch.client.owner])
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
        return True

    def deliver_each(self, ch: "BrokerChannel", ev: Any, queues: Any) -> list[str]:
        """A publish routed to several queues (a fanout, a topic), no answer wanted: delivered
        under the lease of each queue whose lease allows it, as a publish to that queue alone
        would be; returns the other queues (a lease that did not allow it is ended), which
        go through their nodes. Not counted routed: the caller counts the publish once."""
        held, vhost = self.held, ch.vhost
        return [q for q in queues
                if (vhost, q) not in held or not self.deliver(ch, ev, q, count=False)]

    def end_for(self, vhost: str, queues: Any) -> None:
        """A PUBLISH to ``queues`` is about to go through the node: end their leases first."""
        held = self.held
        for q in queues:
            entry = held.get((vhost, q))
            if entry is not None:
                self._end(entry[1])

    def forget(self, t: "ConsumerTarget") -> None:
        """``t`` is being cancelled (or its node cancelled it): the node ends the lease when it
        removes the consumer, so nothing is sent."""
        for c in t.consumers:
            if self.holds(c):
                self._drop(c)

    def forget_node(self, node_id: str) -> None:
        """The node is down: every lease on it is gone (the link reset its count)."""
        for key, (_, c) in list(self.held.items()):
            if c.node_id == node_id:
                del self.held[key]

    def holds(self, c: "Consumer") -> bool:
        """Whether this router holds the lease of queue consumer ``c``."""
        entry = self.held.get((c.target.vhost, c.queue))
        return entry is not None and entry[1] is c

    def _drop(self, c: "Consumer") -> None:
        del self.held[(c.target.vhost, c.queue)]
        link = self._broker.links[c.node_id]
        if link.leases > 0:
            link.leases -= 1

    def _end(self, c: "Consumer", now: bool = False) -> None:
        self._drop(c)
        self._broker.links[c.node_id].send_record([TAG_LEASE_END, c.consumer_id], now=now)
