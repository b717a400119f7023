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
    """A node said HELLO_OK: ask its topology; ``Broker.start`` waits a moment for these
    answers. Its answer replaces what was known of its exchanges (a restarted node forgot its
    transient ones), and says where its classic queues are and what it knows of the other
    nodes: the exchanges, bindings and queues of a node not up here are taken from it
    (router/locations.py, node/replication/catalogue.py)."""
    node = link.node_id
    fut = link.request([T.TOPOLOGY_SNAPSHOT])

    def loaded(f: asyncio.Future) -> None:
        if f.cancelled() or f.exception() is not None or not link.up:
            return
        exchanges, bindings, queues, catalogue = f.result()
        broker.topology.forget_owned(lambda vhost, name: broker.owner(vhost, name, "e") == node)
        broker.topology.load_snapshot(exchanges, bindings)
        for other, ex, b, _qs in catalogue:   # a node never heard from here: its peer's word
            if other not in broker.locations.spoken and other in broker.links \
                    and not broker.links[other].up:
                broker.topology.load_snapshot(ex, b)
        broker.locations.load(node, queues, catalogue)
    fut.add_done_callback(loaded)
    broker.snapshots[node] = fut


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
