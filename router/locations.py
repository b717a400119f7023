"""Where each classic queue lives, as the nodes say, and where a new one goes when its usual
node is unreachable (issue 36; docs/reliability.md, "Serving with nodes missing").

A queue's usual node is the rendezvous hash of its name over every configured node
(shared/placement.py). When that node is unreachable, a declare of a queue nobody knows is
placed on the reachable node the same hash prefers among the reachable ones, and is found
there again after any restart because the routers learn where every classic queue is from the
nodes themselves:

- a node's TOPOLOGY_SNAPSHOT lists its classic queues (its word for itself), and what it
  knows of the other nodes (node/replication/catalogue.py): a router that starts while a node
  is down still knows that node's queues (and routes through its exchanges);
- EV_QUEUE_ADDED / EV_QUEUE_REMOVED keep every router current.

A queue known to live on an unreachable node is answered as RabbitMQ 3.10 answers for a
durable classic queue whose home node is down: 404 NOT_FOUND "home node 'N' of durable queue
'q' in vhost '/' is down or inaccessible" (``rabbit_amqqueue``'s ``absent``/``nodedown``), for
declare, consume and get; a confirmed publish routed to it is nacked (router/broker.py). When
two reachable nodes hold a queue of the same name (one was cut off while the other got a new
one), the hash's choice between the two is used by every router, and a warning is logged.
"""
from __future__ import annotations

import logging
from typing import Callable, Iterable

from shoal.shared import placement
from shoal.shared.errors import NOT_FOUND, AMQPError, soft_error

log = logging.getLogger("shoal.router")

Key = tuple[str, str]


def home_down(node: str, vhost: str, name: str) -> AMQPError:
    """RabbitMQ 3.10's 404 for a classic queue whose home node is down or cut off."""
    return soft_error(NOT_FOUND, f"home node '{node}' of durable queue '{name}' in vhost "
                                 f"'{vhost}' is down or inaccessible")


class Locations:
    """``where``: (vhost, name) -> node id of every classic queue the nodes told of.
    ``is_up(node)``: its link is up; ``moved(key)``: the queue's node changed (the broker
    forgets its cached owner)."""

    def __init__(self, node_ids: list[str], is_up: Callable[[str], bool],
                 moved: Callable[[Key], None]) -> None:
        self.node_ids = node_ids
        self.where: dict[Key, str] = {}
        #: nodes whose own TOPOLOGY_SNAPSHOT was loaded (what a peer knows of them is older)
        self.spoken: set[str] = set()
        #: nodes whose queues are known, from themselves or from a peer's catalogue
        self.known: set[str] = set()
        self._is_up, self._moved = is_up, moved

    def _set(self, key: Key, node: str) -> None:
        old = self.where.get(key)
        if old == node:
            return
        if old is not None and self._is_up(old):
            keep = placement.owner(key[0], key[1], [old, node])
            log.warning("queue '%s' in vhost '%s' is on both %s and %s: using %s's", key[1],
                        key[0], old, node, keep)
            if keep == old:
                return
        self.where[key] = node
        self._moved(key)

    def _drop(self, key: Key) -> None:
        del self.where[key]
        self._moved(key)

    # ---- what the nodes say ----------------------------------------------------------------
    def load(self, node: str, queues: Iterable[list], catalogue: Iterable[list]) -> None:
        """A node's TOPOLOGY_SNAPSHOT: its own ``queues`` (``[vhost, name, durable]``) replace
        what was known of it; its ``catalogue`` rows (``[node, exchanges, bindings, queues]``)
        add the queues of nodes not up here (a node that is up speaks for itself)."""
        self.spoken.add(node)
        self.known.add(node)
        own = {(v, n) for v, n, _ in queues}
        for key in [k for k, n in self.where.items() if n == node and k not in own]:
            self._drop(key)
        for key in own:
            self._set(key, node)
        for other, _ex, _b, qs in catalogue:
            if other in self.spoken or other not in self.node_ids or self._is_up(other):
                continue
            self.known.add(other)
            for v, n, _ in qs:
                if (v, n) not in self.where:
                    self.where[(v, n)] = other
                    self._moved((v, n))

    def added(self, node: str, vhost: str, name: str) -> None:
        """EV_QUEUE_ADDED from ``node``."""
        self._set((vhost, name), node)

    def removed(self, node: str, vhost: str, name: str) -> None:
        """EV_QUEUE_REMOVED from ``node``."""
        if self.where.get((vhost, name)) == node:
            self._drop((vhost, name))

    # ---- placing a new queue -----------------------------------------------------------------
    def place(self, vhost: str, name: str, usual: str) -> tuple[str, bool]:
        """``(node, placed)``: the node a (non-passive) declare of queue ``name`` goes to,
        whose usual node is ``usual``: where it is, if known and reachable; else ``usual`` if
        reachable; else the reachable node the hash prefers (``placed``: remembered, so that
        the declare goes there; :meth:`unplace` if it fails). Raises 404 (:func:`home_down`)
        when the queue is known to be on an unreachable node, when nothing is known of the
        unreachable usual node's queues, or when no node is reachable."""
        key = (vhost, name)
        node = self.where.get(key)
        if node is not None:
            if self._is_up(node):
                return node, False
            raise home_down(node, vhost, name)
        if self._is_up(usual):
            return usual, False
        up = [n for n in self.node_ids if self._is_up(n)]
        if not up or usual not in self.known:
            # nothing is known of that node's queues (no node heard from it since they all
            # started): the queue may be there, and a second one must not be made
            raise home_down(usual, vhost, name)
        node = placement.owner(vhost, name, up)
        log.info("queue '%s' in vhost '%s' placed on %s: %s is unreachable", name, vhost, node,
                 usual)
        self.where[key] = node
        self._moved(key)
        return node, True

    def unplace(self, vhost: str, name: str, node: str) -> None:
        """The declare :meth:`place` sent to ``node`` failed: forget the placement (unless the
        node said since that the queue is there)."""
        if self.where.get((vhost, name)) == node:
            self._drop((vhost, name))
