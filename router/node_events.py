"""What the broker does when a node's link comes up or goes down (design.md section 4):
the topology it asks of a node that comes up, and for one that is lost, its consumers
cancelled (a quorum queue's wait for the new leader instead: router/quorum.py), its pending
confirms nacked and its unacked deliveries made no-ops to settle. Functions of the
broker (router/broker.py), which hands them to each NodeLink.
"""
from __future__ import annotations

import asyncio
from typing import Any

from shoal.shared.wire import T

from shoal.router import pushback, quorum


def node_up(broker: Any, link: Any, restarted: bool) -> None:
    """A node said HELLO_OK: ask its topology (a restarted node's exchanges are forgotten
    first); ``Broker.start`` waits for these answers."""
    if restarted:
        broker.topology.forget_owned(
            lambda vhost, name: broker.owner(vhost, name, "e") == link.node_id)
    fut = link.request([T.TOPOLOGY_SNAPSHOT])

    def loaded(f: asyncio.Future) -> None:
        if not f.cancelled() and f.exception() is None:
            exchanges, bindings = f.result()
            broker.topology.load_snapshot(exchanges, bindings)
    fut.add_done_callback(loaded)
    broker.snapshots[link.node_id] = fut


def node_down(broker: Any, link: Any) -> None:
    """A node is lost: cancel its consumers, nack its pending confirms, and make its
    unacked deliveries settle as no-ops (design.md section 4)."""
    node_id = link.node_id
    if node_id in broker.blocked_nodes:
        pushback.set_node_blocked(broker, node_id, None)
    broker.leases.forget_node(node_id)
    for ch, c in list(broker.consumers.values()):
        if c.node_id == node_id and not quorum.is_quorum(broker, ch.vhost, c.queue):
            broker.server_cancel(ch, c.target)  # a quorum queue's wait for its new leader
    quorum.node_down(broker, node_id)
    for pid, p in list(broker.publishes.items()):
        if node_id in p.waiting:
            p.failed = True
            p.waiting.discard(node_id)
            if not p.waiting:
                broker.finish_pending(p)
    for client in broker.connections:
        for ch in client.channels.values():
            for d in ch.unacked.values():
                if d.node_id == node_id:
                    d.node_id = None
