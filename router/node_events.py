"""What the broker does when a node's link comes up or goes down (design.md section 4), and
with the topology changes nodes announce: how long a starting router waits for the nodes
(issue 36: a moment, then it serves with those that answered); the topology it asks of a node
that comes up; for one that is lost, its consumers cancelled (a quorum queue's wait for the
new leader instead: router/quorum.py), its pending confirms nacked and its unacked deliveries
made no-ops to settle; and each TOPOLOGY_EVENT. Functions of the broker (router/broker.py),
which hands them to each NodeLink.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from shoal.shared import wire
from shoal.shared.wire import T

from shoal.router import pushback, quorum

log = logging.getLogger("shoal.router.broker")


async def await_nodes(broker: Any, wait: float) -> list[str]:
    """Wait up to ``wait`` s for every node's HELLO_OK and topology. Returns the nodes that
    did not answer (each is taken in when it does: :func:`node_up`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    ready = [asyncio.ensure_future(l.ready.wait()) for l in broker.links.values()]
    await asyncio.wait(ready, timeout=wait)
    for f in ready:
        f.cancel()
    answers = [f for f in broker.snapshots.values() if not f.done()]
    if answers:
        await asyncio.wait(answers, timeout=max(0.5, deadline - loop.time()))
    missing = [n for n, l in broker.links.items()
               if not l.up or n not in broker.snapshots or not broker.snapshots[n].done()]
    if missing:
        log.warning("serving without nodes %s: they did not answer within %.0f s; each is "
                    "taken in when it does", ", ".join(missing), wait)
    return missing


async def await_unseen(broker: Any, node: str) -> None:
    """Wait up to ``link_heartbeat_timeout`` s for ``node``, which no node has heard from since
    they started (nothing is known of its queues: a cluster still forming, as pods start in
    any order on Kubernetes), to say HELLO_OK and give its topology. Returns when it did, or
    at the bound; the caller then places the queue as it would have (router/locations.py:
    the node's, or RabbitMQ's 404 when it is still absent). Issue 43 point 5."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + broker.settings.link_heartbeat_timeout
    link = broker.links[node]
    try:
        await asyncio.wait_for(link.ready.wait(), deadline - loop.time())
        snapshot = broker.snapshots.get(node)
        if snapshot is not None:
            await asyncio.wait_for(asyncio.shield(snapshot), max(0.0, deadline - loop.time()))
    except Exception:  # noqa: BLE001 - the bound, or the link lost: placed as before (404)
        return


def node_up(broker: Any, link: Any, restarted: bool) -> None:
    """A node said HELLO_OK: ask its topology; ``Broker.start`` waits a moment for these
    answers. Its answer replaces what was known of its exchanges (a restarted node forgot its
    transient ones), and says where its classic queues are and what it knows of the other
    nodes: the exchanges, bindings and queues of a node not up here are taken from it
    (router/locations.py, node/replication/catalogue.py)."""
    node = link.node_id
    if node == broker.node_ids[0]:
        broker.on_owner_up()            # users and permissions (router/access_sync.py)
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
    quorum.readers_lost(broker, node_id)
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


def topology_event(broker: Any, link: Any, event: int, data: list) -> None:
    """A TOPOLOGY_EVENT from ``link``'s node: users and permissions, a quorum queue's leader,
    where a classic queue is (router/locations.py), or a change of the routing cache (a
    queue or exchange gone: every node drops its bindings to it)."""
    if event == wire.EV_ACCESS:
        broker.on_access(*data)
        return
    if event == wire.EV_QUEUE_LEADER:
        quorum.on_leader(broker, data)
        return
    if event == wire.EV_QUEUE_ADDED:
        broker.locations.added(link.node_id, data[0], data[1])
        return
    if event == wire.EV_QUEUE_REMOVED:
        broker.quorum.forget(data[0], data[1])
        broker.locations.removed(link.node_id, data[0], data[1])
    unbind = [(wire.DEST_QUEUE, vhost, name) for vhost, name in broker.topology.apply(event, data)]
    if event == wire.EV_EXCHANGE_REMOVED:
        unbind.append((wire.DEST_EXCHANGE, data[0], data[1]))
    for kind, vhost, name in unbind:
        for l in broker.links.values():
            if l.up:
                l.send([T.UNBIND_DESTINATION, vhost, kind, name])
