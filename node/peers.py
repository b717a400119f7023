"""The routers one node talks to (design.md section 4): who said HELLO, the wire messages
queued for each of them, heartbeats, and forgetting a router that said GOODBYE or went silent.

:class:`Peers` is sans-IO like the shard that owns it: the caller passes ``now_ms`` and sends
what :meth:`Peers.take_outbox` returns. What forgetting a router means for the queues (its
consumers, unsettled deliveries and exclusive queues) is the shard's: it passes ``on_forget``.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from shoal.shared.settings import Settings
from shoal.shared.wire import (TAG_GOODBYE, TAG_HEARTBEAT, TAG_NODE_BLOCKED, WIRE_VERSION,
                               T)

from shoal.node.queues.consumer import QueueConsumer
from shoal.node.queues.entry import QueueEntry

log = logging.getLogger("shoal.node")

_TOPOLOGY_SYNC = int(T.TOPOLOGY_SYNC)

#: What a request handler returns when it answers the router (REPLY) later itself: a quorum
#: queue answers once its log has the change (node/replication/).
DEFERRED = object()

#: Messages queued to one router that make a batch worth sending before the turn ends: a
#: consumer's credit arriving on a backlog is delivered in batches of this size, so the router
#: forwards the first while the node makes the rest (docs/performance-log.md, session 15).
EARLY_BATCH = 64


class RouterPeer:
    """What the node knows of one router that said HELLO.

    ``identity``: its ZeroMQ identity (bytes). ``last_seen``: ms of its last message.
    ``consumers``: consumer_id -> QueueConsumer. ``unsettled``: delivery_id -> QueueEntry it
    holds acquired (released when it goes away).
    """

    __slots__ = ("identity", "router_id", "last_seen", "consumers", "unsettled", "report")

    def __init__(self, identity: bytes, router_id: str, now_ms: float) -> None:
        self.identity = identity
        self.router_id = router_id
        self.last_seen = now_ms
        self.consumers: dict[int, QueueConsumer] = {}
        self.unsettled: dict[int, QueueEntry] = {}
        #: its latest ROUTER_REPORT and when it came (ms): node/stats.py
        self.report: tuple[Any, float] | None = None


class Peers:
    """The routers of one node and their outboxes.

    ``by_identity``: ZeroMQ identity -> :class:`RouterPeer`, for routers whose HELLO was
    accepted. ``on_forget(peer)`` runs after a router is removed (GOODBYE, silence, a new
    HELLO from the same identity). ``blocked_reason``: told to every router that says HELLO
    while the node's journal cannot write (NODE_BLOCKED).
    """

    def __init__(self, node_id: str, incarnation: str, settings: Settings,
                 on_forget: Callable[[RouterPeer], None]) -> None:
        self.node_id = node_id
        self.incarnation = incarnation
        self.settings = settings
        self.by_identity: dict[bytes, RouterPeer] = {}
        self.blocked_reason: str | None = None
        self._on_forget = on_forget
        self._outbox: dict[bytes, list[list]] = {}
        #: ``on_full(identity)``: a router's outbox just reached :data:`EARLY_BATCH` messages
        #: (the caller may send it now: :meth:`take_box`)
        self.on_full: Callable[[bytes], None] | None = None
        self._last_heartbeat: float | None = None
        #: sync_id -> (routers yet to answer TOPOLOGY_SYNCED, what to run when none is left)
        self._syncs: dict[int, tuple[set[bytes], Callable[[], None]]] = {}
        self._next_sync = 0

    def send(self, identity: bytes, msg: list) -> None:
        """Queue wire message ``msg`` to the router ``identity`` (in order)."""
        box = self._outbox.get(identity)
        if box is None:
            box = self._outbox[identity] = []
        box.append(msg)
        if len(box) == EARLY_BATCH and self.on_full is not None:
            self.on_full(identity)

    def take_box(self, identity: bytes) -> list[list]:
        """The messages queued to one router so far, in order (none left queued)."""
        return self._outbox.pop(identity, [])

    def take_outbox(self) -> dict[bytes, list[list]]:
        """Messages to send since the last call: router identity -> wire messages, in order."""
        out = self._outbox
        self._outbox = {}
        return out

    def hello(self, peer: bytes, msg: list, now_ms: float) -> None:
        """HELLO [version, router_id, expected node id]: answer HELLO_OK always; register the
        router only if it speaks this WIRE_VERSION and expects this node (a router that said
        HELLO before from the same identity restarted: it is forgotten first)."""
        _, version, router_id, expected = msg
        self.send(peer, [int(T.HELLO_OK), WIRE_VERSION, self.node_id, self.incarnation])
        if version != WIRE_VERSION or expected != self.node_id:
            log.error("refusing router %r: wire version %r (mine %d), expects node %r (I am %r)",
                      router_id, version, WIRE_VERSION, expected, self.node_id)
            return
        old = self.by_identity.get(peer)
        if old is not None:
            self.forget(old)
        self.by_identity[peer] = RouterPeer(peer, router_id, now_ms)
        log.info("router %r connected", router_id)
        if self.blocked_reason is not None:
            self.send(peer, [TAG_NODE_BLOCKED, True, self.blocked_reason])

    def forget(self, state: RouterPeer) -> None:
        """Remove the router, then let the shard clean up after it (``on_forget``). A
        topology sync waits for it no longer."""
        self.by_identity.pop(state.identity, None)
        self._on_forget(state)
        for sync_id in [k for k, (waiting, _) in self._syncs.items()
                        if state.identity in waiting]:
            self._answered(sync_id, state.identity)

    # ---- read-your-writes across routers (wire TOPOLOGY_SYNC) ----------------------------------
    def sync_topology(self, requester: bytes, done: Callable[[], None]) -> bool:
        """A topology request of router ``requester`` queued TOPOLOGY_EVENTs to every router:
        ask every other router to confirm it applied them (TOPOLOGY_SYNC, after the events in
        its outbox) and run ``done()`` once all answered or were forgotten. Returns False,
        without calling ``done``, when there is no other router (the requester itself applies
        the events before the REPLY that follows them on its link)."""
        others = {i for i in self.by_identity if i != requester}
        if not others:
            return False
        self._next_sync += 1
        sync_id = self._next_sync
        self._syncs[sync_id] = (others, done)
        for identity in others:
            self.send(identity, [_TOPOLOGY_SYNC, sync_id])
        return True

    def synced(self, state: RouterPeer, sync_id: int) -> None:
        """TOPOLOGY_SYNCED from ``state``: it applied the events before that sync."""
        self._answered(sync_id, state.identity)

    def _answered(self, sync_id: int, identity: bytes) -> None:
        entry = self._syncs.get(sync_id)
        if entry is None:
            return
        waiting, done = entry
        waiting.discard(identity)
        if not waiting:
            del self._syncs[sync_id]
            done()

    def forget_silent(self, now_ms: float, silence_ms: float) -> int:
        """Forget every router not heard from for ``silence_ms`` (a connection to this node
        closed; ZeroMQ does not say whose, and live routers heartbeat every
        ``link_heartbeat_ms``). Their deliveries are released at once instead of after
        ``link_heartbeat_timeout``. Returns how many routers were forgotten."""
        gone = [p for p in self.by_identity.values() if now_ms - p.last_seen > silence_ms]
        for state in gone:
            log.warning("router %r disconnected: forgetting it", state.router_id)
            self.forget(state)
        return len(gone)

    def disconnected(self, identity: bytes) -> bool:
        """The connection of router ``identity`` closed (a ``unix://`` link says whose): forget
        it now, releasing its deliveries. False when it was not known (no HELLO, or forgotten
        already)."""
        state = self.by_identity.get(identity)
        if state is None:
            return False
        log.warning("router %r disconnected: forgetting it", state.router_id)
        self.forget(state)
        return True

    def tick(self, now_ms: float) -> None:
        """Queue HEARTBEAT to every router each ``link_heartbeat_ms``; forget routers silent
        for more than ``link_heartbeat_timeout`` (settings; its seconds, their deliveries
        released as if their connections closed)."""
        st = self.settings
        if self._last_heartbeat is None or now_ms - self._last_heartbeat >= st.link_heartbeat_ms:
            self._last_heartbeat = now_ms
            for identity in self.by_identity:
                self.send(identity, [TAG_HEARTBEAT])
        for state in [p for p in self.by_identity.values()
                      if now_ms - p.last_seen > st.link_heartbeat_timeout * 1000]:
            log.warning("router %r silent for %d ms: forgetting it", state.router_id,
                        now_ms - state.last_seen)
            self.forget(state)
            # if only its way here is cut, it learns now that it must say HELLO again (its
            # publishes waiting here are nacked then, rather than when the cut heals)
            self.send(state.identity, [TAG_GOODBYE])

    def goodbye_all(self) -> None:
        """Queue GOODBYE to every known router (the node is stopping)."""
        for identity in self.by_identity:
            self.send(identity, [TAG_GOODBYE])
