"""What each node knows of the other nodes' topology (issue 36, docs/reliability.md): their
exchanges, bindings and classic queues, so that a router which starts, or restarts, while a
node is unreachable still routes through that node's exchanges and answers for its queues as
RabbitMQ does for a classic queue whose home node is down (404), instead of making a second
queue of the same name elsewhere.

RabbitMQ keeps this metadata in a replicated database on every node; here each node keeps its
own, and tells the other nodes over the node links (node/replication/links.py):

- every change of its topology (the TOPOLOGY_EVENTs routers get) as PEER_EVENT, numbered;
- the whole of it as PEER_CATALOGUE, when a node asks with PEER_WANT: a node asks when it sees
  a gap in the numbers, or a PEER_HELLO whose number (its sender's ``[incarnation, count]``)
  is not the one it holds, so a lost message or a restart heals within a hello (500 ms).

Routers read the catalogue in a node's TOPOLOGY_SNAPSHOT answer (router/locations.py). The
node also keeps it in ``<data_dir>/raft/catalogue`` (:func:`save`, at most once a second, by
node/replication/manager.py), so that after a restart of the whole cluster the nodes that come
back still know the queues of one that does not. The class is sans-IO: ``send(node, msg)``
queues a peer message.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable

import msgpack

from shoal.shared.wire import (EV_BINDING_ADDED, EV_BINDING_REMOVED, EV_EXCHANGE_ADDED,
                               EV_EXCHANGE_REMOVED, EV_QUEUE_ADDED, EV_QUEUE_REMOVED, T)

log = logging.getLogger("shoal.node.replication")

_CATALOGUE, _EVENT, _WANT = int(T.PEER_CATALOGUE), int(T.PEER_EVENT), int(T.PEER_WANT)
#: the TOPOLOGY_EVENTs the catalogue follows
EVENTS = frozenset({EV_EXCHANGE_ADDED, EV_EXCHANGE_REMOVED, EV_BINDING_ADDED,
                    EV_BINDING_REMOVED, EV_QUEUE_ADDED, EV_QUEUE_REMOVED})
#: ms before asking a node again for its whole catalogue
WANT_AGAIN_MS = 2000


def binding_key(data: list) -> tuple:
    """A binding's identity in EV_BINDING_* ``data`` (its arguments included)."""
    args = data[5] or {}
    return (*data[:5], repr(sorted(args.items(), key=lambda kv: str(kv[0]))))


class NodeEntry:
    """One other node's topology: ``exchanges`` (vhost, name) -> EV_EXCHANGE_ADDED data,
    ``bindings`` key -> EV_BINDING_ADDED data, ``queues`` (vhost, name) -> durable (1: a
    durable, non-exclusive, non-auto-delete queue; 0: a transient one); ``seq``: its sender's
    ``[incarnation, count]`` this entry is at."""

    def __init__(self, seq: list) -> None:
        self.seq = seq
        self.exchanges: dict[tuple[str, str], list] = {}
        self.bindings: dict[tuple, list] = {}
        self.queues: dict[tuple[str, str], int] = {}
        self.wanted_at = -WANT_AGAIN_MS

    @classmethod
    def whole(cls, seq: list, exchanges: list, bindings: list, queues: list) -> "NodeEntry":
        """An entry at ``seq`` from a whole catalogue (PEER_CATALOGUE, or the file)."""
        entry = cls(list(seq))
        for data in exchanges:
            entry.apply(EV_EXCHANGE_ADDED, data)
        for data in bindings:
            entry.apply(EV_BINDING_ADDED, data)
        for vhost, name, durable in queues:
            entry.queues[(vhost, name)] = int(durable)
        return entry

    def apply(self, event: int, data: list) -> None:
        if event == EV_EXCHANGE_ADDED:
            self.exchanges[(data[0], data[1])] = data
        elif event == EV_EXCHANGE_REMOVED:
            self.exchanges.pop((data[0], data[1]), None)
            for k in [k for k in self.bindings if k[0] == data[0] and k[1] == data[1]]:
                del self.bindings[k]
        elif event == EV_BINDING_ADDED:
            self.bindings[binding_key(data)] = data
        elif event == EV_BINDING_REMOVED:
            self.bindings.pop(binding_key(data), None)
        elif event == EV_QUEUE_ADDED:
            self.queues[(data[0], data[1])] = int(data[2])
        elif event == EV_QUEUE_REMOVED:
            self.queues.pop((data[0], data[1]), None)

    def row(self, node: str) -> list:
        """``[node, exchanges, bindings, queues]`` as a TOPOLOGY_SNAPSHOT carries it."""
        return [node, list(self.exchanges.values()), list(self.bindings.values()),
                [[v, n, d] for (v, n), d in self.queues.items()]]


class Catalogue:
    """This node's view of the others. ``own()``: this node's ``[exchanges, bindings,
    queues]`` (node/shard.py); ``send(node, msg)``: queue a message to a peer;
    ``peers()``: the other nodes' ids."""

    def __init__(self, node_id: str, incarnation: str, own: Callable[[], list],
                 send: Callable[[str, list], None], peers: Callable[[], list[str]]) -> None:
        self.node_id = node_id
        self.incarnation = incarnation
        self.count = 0                       #: own changes sent so far
        self._own, self._send, self._peers = own, send, peers
        self.nodes: dict[str, NodeEntry] = {}
        self.dirty = False               #: changed since the last :meth:`dump`

    @property
    def seq(self) -> list:
        return [self.incarnation, self.count]

    # ---- this node's changes -------------------------------------------------------------
    def own_event(self, event: int, data: list) -> None:
        """A TOPOLOGY_EVENT of this node: tell every peer (PEER_EVENT)."""
        if event not in EVENTS:
            return
        self.count += 1
        for peer in self._peers():
            self._send(peer, [_EVENT, self.node_id, self.seq, event, data])

    # ---- from peers ----------------------------------------------------------------------
    def on_peer(self, msg: list, now_ms: float) -> None:
        """PEER_CATALOGUE, PEER_EVENT or PEER_WANT from another node."""
        tag, node = msg[0], msg[1]
        if tag == _WANT:
            exchanges, bindings, queues = self._own()
            self._send(node, [_CATALOGUE, self.node_id, self.seq, exchanges, bindings, queues])
        elif tag == _CATALOGUE:
            _, _, seq, exchanges, bindings, queues = msg
            self.nodes[node] = NodeEntry.whole(seq, exchanges, bindings, queues)
            self.dirty = True
        elif tag == _EVENT:
            _, _, seq, event, data = msg
            entry = self.nodes.get(node)
            if entry is not None and entry.seq[0] == seq[0] and entry.seq[1] + 1 == seq[1]:
                entry.apply(event, data)
                entry.seq = list(seq)
                self.dirty = True
            else:
                self.heard(node, seq, now_ms)

    def heard(self, node: str, seq: list, now_ms: float) -> None:
        """``node`` is at ``seq`` (its PEER_HELLO, or an event out of order): ask for its
        whole catalogue when ours is not that one (at most every WANT_AGAIN_MS)."""
        entry = self.nodes.get(node)
        if entry is not None and entry.seq == list(seq):
            return
        if entry is None:
            entry = self.nodes[node] = NodeEntry([None, -1])
        if now_ms - entry.wanted_at >= WANT_AGAIN_MS:
            entry.wanted_at = now_ms
            self._send(node, [_WANT, self.node_id])

    def rows(self) -> list[list]:
        """Every other node's entry, for TOPOLOGY_SNAPSHOT: ``[[node, exchanges, bindings,
        queues], ...]`` (queues as ``[vhost, name, durable]``)."""
        return [e.row(n) for n, e in self.nodes.items() if e.seq[0] is not None]

    def dump(self) -> bytes:
        """The other nodes' entries, for :func:`save` (clears ``dirty``)."""
        self.dirty = False
        return msgpack.packb([[*e.row(n), e.seq] for n, e in self.nodes.items()
                              if e.seq[0] is not None])

    def restore(self, data: bytes) -> None:
        """Entries :meth:`dump` wrote in an earlier run; each is refreshed when its node is
        heard from (its number is of an older run, or its incarnation changed)."""
        for node, exchanges, bindings, queues, seq in msgpack.unpackb(data):
            self.nodes[node] = NodeEntry.whole(seq, exchanges, bindings, queues)


def save(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` (a temporary file renamed over it: a crash leaves the
    old or the new one). Not fsynced: it is a cache the peers refill."""
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def load(catalogue: Catalogue, path: Path) -> None:
    """Restore ``catalogue`` from ``path`` if it is there; a damaged file is logged and
    ignored (the peers refill it)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    try:
        catalogue.restore(data)
    except Exception as exc:  # noqa: BLE001 - any damage: start empty, the peers refill it
        log.warning("catalogue %s is unreadable (%s): starting without it", path, exc)
        catalogue.nodes.clear()


def own_queues(queues: Any) -> list[list]:
    """``[[vhost, name, durable], ...]`` of a shard's classic queues (quorum queues are the
    leaders' to announce: router/quorum.py)."""
    return [[q.vhost, q.name, int(q.durable and q.exclusive_owner is None and not q.auto_delete)]
            for q in queues.values() if q.replica is None]
