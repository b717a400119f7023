"""Pushing back on publishers (design.md section 7, "bound every buffer"): a node link whose
queue is full pauses reading from publishing clients, and a node's resource alarm or
unwritable journal blocks them as RabbitMQ blocks them. State stays on the
:class:`~shoal.router.broker.Broker` (``congested_links``, ``blocked_nodes``,
``blocked_reason``); these functions change it.
"""
from __future__ import annotations

import logging
from typing import Any, Protocol

log = logging.getLogger("shoal.router.broker")


class Broker(Protocol):
    """What this module uses of router/broker.py's ``Broker``."""

    congested: bool
    congested_links: int
    connections: Any
    stats: dict[str, int]
    blocked_nodes: dict[str, str]
    blocked_reason: str | None


def on_congestion(broker: Broker, on: bool) -> None:
    """A node link's queue filled (``on``) or drained. Pause reading from publishing clients
    while any node link is full (their publishes wait in their sockets: TCP pushes back);
    resume when all links drain. Connections that only consume keep being read, so acks and
    credit keep flowing."""
    was = broker.congested
    broker.congested_links += 1 if on else -1
    if was != broker.congested:
        broker.stats["publishers_paused"] += broker.congested
        for client in broker.connections:
            if client.publisher:
                client.set_reading(not broker.congested)


def set_node_blocked(broker: Broker, node_id: str, reason: str | None) -> None:
    """NODE_BLOCKED: while any node has a resource alarm or a journal that cannot write,
    publishing connections are blocked as RabbitMQ blocks them (each at its next publish:
    ``connection.blocked`` with the reason to clients that announced the capability, and
    the socket no longer read); when the last node clears, every blocked connection gets
    ``connection.unblocked`` and is read again. Confirms of persistent messages on a node
    whose journal cannot write are withheld meanwhile (never a false confirm)."""
    if reason is None:
        broker.blocked_nodes.pop(node_id, None)
    else:
        broker.blocked_nodes[node_id] = str(reason)
        log.warning("node %s blocked publishers: %s", node_id, reason)
    was = broker.blocked_reason
    broker.blocked_reason = next(iter(broker.blocked_nodes.values()), None)
    if was is not None and broker.blocked_reason is None:
        for client in broker.connections:
            client.unblock()
