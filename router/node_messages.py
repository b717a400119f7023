"""What the broker does with each message a node sends it (design.md section 4): a delivery
to a consumer's channel, the answers to publishes (each run of them: shared/wire.py
``coalesce_results``), credit's WORK and CREDIT_DRAINED, a lease's offer and answers
(router/lease.py), a consumer the node cancelled, a topology sync or event, a dead letter to
route, a forced close, a node's alarm. Functions of the broker (router/broker.py), which
hands :func:`on_node_message` to each NodeLink; the link's own messages (REPLY, HELLO_OK,
HEARTBEAT, GOODBYE) never reach them.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from shoal.shared import wire
from shoal.shared.wire import T, TAG_DELIVER, TAG_PUBLISH_MOVED, TAG_PUBLISH_RESULT, TAG_SETTLE

from shoal.router import consumers as credit, dead_letters, node_events, pushback, quorum
from shoal.router.links.node_link import NodeLink
from shoal.router.sender_selected import stored_routes

log = logging.getLogger("shoal.router.broker")


def publish_result(broker: Any, link: NodeLink, pid: int, code: int, routed: int) -> None:
    """PUBLISH_RESULT for publish ``pid`` from ``link``'s node: once every node it went
    to has answered, confirm it (basic.ack, or basic.nack if one refused it)."""
    p = broker.publishes.get(pid)
    if p is None or not p.answer(link.node_id, pid, code, routed):
        return
    if not p.waiting:
        if p.extra:
            broker.finish_pending(p)
        else:
            del broker.publishes[pid]
            broker.finish_publish(p)


def on_node_message(broker: Any, link: NodeLink, msg: list) -> None:
    """Handle one wire message from ``link``'s node (shared/wire.py names each); an
    unknown tag is logged and dropped."""
    tag = msg[0]
    if tag == TAG_DELIVER:
        _, cid, delivery_id, redelivered, exchange, routing_key, header, body = msg
        entry = broker.consumers.get(cid)
        if entry is None or entry[1].node_id != link.node_id:
            # gone, or moved to a quorum queue's new leader (which delivers again what this
            # one may not have settled in its log): this node's delivery is void
            link.send([TAG_SETTLE, wire.OUTCOME_REQUEUE, [delivery_id]])
            return
        ch, c = entry
        if ch.closed:
            # its channel closed while this was on its way: requeued, or, no-ack, its node
            # let it go and the client never had it: back to its queue
            if c.target.no_ack:
                dead_letters.give_back(broker, c, exchange, routing_key, header, body)
            else:
                link.send([TAG_SETTLE, wire.OUTCOME_REQUEUE, [delivery_id]])
            return
        if c.stream:
            c.last_header = header
        broker.stats["delivered"] += 1
        try:
            ch.deliver(c, delivery_id, redelivered, exchange, routing_key, header, body)
        except Exception:  # noqa: BLE001 - a bug costs this connection, not the message
            broker.delivery_failed(link, ch, delivery_id)
        broker.mark_dirty(ch.client)
    elif tag == TAG_PUBLISH_RESULT:
        if len(msg) == 5:               # a run: seq .. seq + n - 1 (wire.coalesce_results)
            _, first, code, routed, n = msg
            for pid in range(first, first + n):
                publish_result(broker, link, pid, code, routed)
        else:
            publish_result(broker, link, msg[1], msg[2], msg[3])
    elif tag == TAG_PUBLISH_MOVED:
        quorum.on_publish_moved(broker, link, msg)
    elif tag == T.WORK:
        broker.stats["work"] += 1
        entry = broker.consumers.get(msg[1])
        if entry is not None and entry[1].node_id == link.node_id:
            credit.on_work(entry[1])
            broker.replenish(entry[0], entry[1].target)
    elif tag == T.CREDIT_DRAINED:
        entry = broker.consumers.get(msg[1])
        if entry is not None and entry[1].node_id == link.node_id:
            ch, c = entry
            if msg[2] >= c.last_grant > 0:
                broker.stats["empty_drains"] += 1
            credit.on_drained(c, msg[2])
            broker.replenish_channel(ch)
    elif tag == T.LEASE_GRANT:
        broker.leases.on_grant(link, msg[1], msg[2])
    elif tag == T.LEASE_TAKEN:
        broker.leases.on_taken(msg[1], msg[2])
    elif tag == T.LEASE_REVOKE:
        broker.leases.on_revoke(link, msg[1], msg[2])
    elif tag == T.CONSUMER_CANCELLED:
        entry = broker.consumers.get(msg[1])
        if entry is not None and entry[1].node_id == link.node_id:
            broker.server_cancel(entry[0], entry[1].target)
    elif tag == T.TOPOLOGY_SYNC:          # the events before it are applied: say so
        link.send([int(T.TOPOLOGY_SYNCED), msg[1]], urgent=True)
    elif tag == T.REPUBLISH:
        if len(msg) > 6 and msg[6]:         # at-least-once: answer when confirmed
            asyncio.ensure_future(
                dead_letters.republish_confirmed(broker, link, msg[6], *msg[1:6]))
        else:
            _republish(broker, *msg[1:6])
    elif tag == T.FORCE_CLOSE:            # the management API of some router asked
        broker.close_connection(msg[2], msg[3])
    elif tag == T.NODE_BLOCKED:
        pushback.set_node_blocked(broker, link.node_id, msg[2] if msg[1] else None)
    elif tag == T.TOPOLOGY_EVENT:
        node_events.topology_event(broker, link, msg[1], msg[2])
    else:
        log.warning("unexpected message %r from node %s", tag, link.node_id)


def _republish(broker: Any, vhost: str, exchange: str, routing_key: str, header: bytes,
               body: bytes) -> None:
    """REPUBLISH from a node (a dead letter): route like basic.publish, no confirm; an
    unknown exchange drops it (as RabbitMQ does with a missing dead-letter exchange)."""
    if broker.topology.get(vhost, exchange) is None:
        log.info("dropping dead letter: no exchange '%s' in vhost '%s'", exchange, vhost)
        return
    queues = broker.topology.route(vhost, exchange, routing_key, None, header,
                                   stored_routes(header))
    broker.send_unconfirmed(vhost, dead_letters.without_cycles(queues, header), exchange,
                            routing_key, header, body)
