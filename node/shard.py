"""The sans-IO core of a node: :class:`Shard` (design.md section 7, "sans-IO protocol core").

A shard is a plain object: :meth:`Shard.handle` takes one wire message (shared/wire.py) from a
router, :meth:`Shard.take_outbox` returns the wire messages to send, per router, in order;
:meth:`Shard.tick` drives heartbeats and router expiry. No asyncio, no sockets, no clocks:
the caller passes ``now_ms``.

Errors: handlers raise :class:`~shoal.shared.errors.AMQPError`; :meth:`Shard.handle` turns it
into a REPLY (requests) in one place. Malformed messages (unknown tag, wrong field count or
types) are logged and dropped; a malformed *request* with an int req_id is answered with
SYNTAX_ERROR so the router does not wait forever.

Ordering rule: TOPOLOGY_EVENTs a request causes are queued to every router BEFORE the REPLY.

Rooms: this module holds the dispatch, the queues' life (made, looked up with the exclusive
check, deleted, auto-deleted, expired), the exchange requests, the journal glue and the queues'
DeliverySink; the message handlers (PUBLISH, CONSUME, CREDIT, SETTLE, GET...) are
node/messages.py's, the queue requests (declare, delete, purge, a closed connection's exclusive
queues) node/queue_requests.py's, the routers and their outboxes node/peers.py's.
"""
from __future__ import annotations

import itertools
import logging
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from shoal.shared.errors import (INTERNAL_ERROR, NOT_FOUND, SYNTAX_ERROR, AMQPError,
                                 InjectedFault, injected_faults, soft_error)
from shoal.shared.settings import Settings
from shoal.shared.wire import (DEST_QUEUE, EV_QUEUE_ADDED, EV_QUEUE_REMOVED, TAG_DELIVER, TAG_GOODBYE, TAG_HELLO,
                               TAG_NODE_BLOCKED, TAG_REPLY, TAG_TOPOLOGY_EVENT,
                               TAG_WORK, PEER_TAGS, T)

from shoal.node import messages as M
from shoal.node import queue_requests as Q
from shoal.node.access_store import AccessStore, on_access_get, on_access_set
from shoal.node.queues.consumer import QueueConsumer
from shoal.node.queues.deadletter import send_dead_letter
from shoal.node.lease import (on_lease_acked, on_lease_end, on_lease_take, on_leased,
                              revoke as revoke_lease)
from shoal.node.durability.durable import DurableLog
from shoal.node.queues.entry import QueueEntry
from shoal.node.durability.journal import Journal
from shoal.node.messages import delivered_header
from shoal.node.queues.paging import PageStore, body_bytes
from shoal.node.peers import DEFERRED, Peers, RouterPeer
from shoal.node.queues.queue import Queue
from shoal.node.replication.catalogue import own_queues
from shoal.node.replication.group import TICK_MS
from shoal.node.replication.operations import on_quorum_op
from shoal.node.queues.args import QueueConfig, parse_queue_arguments
from shoal.node.queue_requests import check_owner
from shoal.node.stats import (LoopLag, on_force_close, on_node_stats, on_queue_list, on_router_report,
                    on_router_reports)
from shoal.node.streams.hosting import Streams
from shoal.node.timers import Timers
from shoal.node.topology import Topology

log = logging.getLogger("shoal.node")

#: Requests whose REPLY waits for the journal when records are pending (a declare-ok means
#: the object survives a crash).
_TOPOLOGY_REQUESTS = frozenset(int(t) for t in (
    T.QUEUE_DECLARE, T.QUEUE_DELETE, T.QUEUE_PURGE, T.EXCHANGE_DECLARE, T.EXCHANGE_DELETE,
    T.BIND, T.UNBIND))

_S = (str, type(None))      # optional str (owner)
_D = (dict, type(None))     # optional table (arguments)
_L = (list, type(None))     # optional list (CONSUME's qos)
#: messages that may carry one more field than their spec's count: SETTLE's annotations,
#: CONSUME's qos, LEASE_END's soon (shared/wire.py)
_OPTIONAL_LAST = frozenset({int(T.SETTLE), int(T.CONSUME), int(T.PUBLISH), int(T.LEASED),
                            int(T.LEASE_END)})


class Shard:
    """The queues and exchanges of one node, driven by wire messages.

    ``Shard(node_id, incarnation=None, settings=None, wall_offset_ms=None)``; ``incarnation``
    defaults to a random hex string (a new one per process start, wire HELLO_OK). ``queues``:
    (vhost, name) -> Queue. ``timers``: the deadline heap (TTL, x-expires, scheduled
    delivery, consumer timeouts) run by :meth:`tick`; ``wall_offset_ms``: epoch ms minus the
    caller's ``now_ms`` clock (measured once when not given), for epoch-ms header values.
    """

    def __init__(self, node_id: str, incarnation: str | None = None,
                 settings: Settings | None = None,
                 wall_offset_ms: float | None = None) -> None:
        self.node_id = node_id
        self.incarnation = incarnation or uuid.uuid4().hex
        self.settings = settings or Settings(node_id=node_id)
        self.leases_on = self.settings.delivery_leases     #: node/lease.py may lend queues
        self.queues: dict[tuple[str, str], Queue] = {}
        #: journal glue (node/durability/durable.py) once :meth:`attach_journal` ran; None: nothing
        #: is durable (unit tests, a node without a data dir)
        self.durable: DurableLog | None = None
        #: page files for bodies over a queue's memory budget (node/queues/paging.py); None: no paging
        self.pages: PageStore | None = None
        self.loop_lag = LoopLag()       #: started by the node's server (node/stats.py)
        self.access = AccessStore()     #: users and permissions (node/access_store.py)
        self.topology = Topology(self._emit)
        #: the routers (node/peers.py); ``peers``: identity -> RouterPeer
        self.links = Peers(node_id, self.incarnation, self.settings, self._forget)
        self.peers = self.links.by_identity
        #: ``send(identity, msg)``: queue a wire message to one router (hot: bound once)
        self.send = self.links.send
        self._next_id = itertools.count(1).__next__
        self._events = 0        #: TOPOLOGY_EVENTs emitted (a request that emits syncs routers)
        #: the quorum queues (node/replication/manager.py's Replication), once attached
        self.replication: Any = None
        #: the streams (node/streams/hosting.py), in a temporary directory until
        #: :meth:`open_streams` names the node's
        self.streams = Streams(self.send, self._next_id, None)
        if wall_offset_ms is None:
            wall_offset_ms = time.time() * 1000.0 - time.monotonic() * 1000.0
        self.timers = Timers(0.0, wall_offset_ms)
        # tag -> (field count incl. tag, field types or None, handler(shard, peer, msg),
        # is_request); the message handlers are node/messages.py's, the queue requests
        # node/queue_requests.py's
        cls = type(self)
        H = Callable[[Any, RouterPeer, list], Any]
        spec: dict[int, tuple[int, tuple | None, H | None, bool]] = {
            T.HELLO: (4, (int, str, str), None, False),
            T.HEARTBEAT: (1, (), cls._on_heartbeat, False),
            T.GOODBYE: (1, (), cls._on_goodbye, False),
            T.QUEUE_DECLARE: (10, (int, str, str, int, int, int, int, _D, _S),
                              Q.on_queue_declare, True),
            T.QUEUE_DELETE: (7, (int, str, str, int, int, _S), Q.on_queue_delete, True),
            T.QUEUE_PURGE: (5, (int, str, str, _S), Q.on_queue_purge, True),
            T.EXCHANGE_DECLARE: (10, (int, str, str, str, int, int, int, int, _D),
                                 cls._on_exchange_declare, True),
            T.EXCHANGE_DELETE: (5, (int, str, str, int), cls._on_exchange_delete, True),
            T.BIND: (8, (int, str, str, str, str, str, _D), cls._on_bind, True),
            T.UNBIND: (8, (int, str, str, str, str, str, _D), cls._on_unbind, True),
            T.UNBIND_DESTINATION: (4, (str, str, str), cls._on_unbind_destination, False),
            T.TOPOLOGY_SNAPSHOT: (2, (int,), cls._on_snapshot, True),
            T.TOPOLOGY_SYNCED: (2, (int,), cls._on_synced, False),
            T.CONNECTION_CLOSED: (2, (str,), Q.on_connection_closed, False),
            T.QUEUE_LIST: (3, (int, _S), on_queue_list, True),
            T.NODE_STATS: (2, (int,), on_node_stats, True),
            T.ROUTER_REPORT: (3, (str, dict), on_router_report, False),
            T.ROUTER_REPORTS: (2, (int,), on_router_reports, True),
            T.FORCE_CLOSE: (4, (str, str, str), on_force_close, False),
            T.ACCESS_GET: (2, (int,), on_access_get, True),
            T.ACCESS_SET: (4, (int, int, dict), on_access_set, True),
            T.QUORUM_OP: (6, (int, str, _S, _S, _S), on_quorum_op, True),
            T.PUBLISH: (9, None, M.on_publish, False),      # hot path: count only
            T.CONSUME: (10, (int, int, str, str, str, int, int, _D, _S, _L), M.on_consume, True),
            T.CANCEL: (3, (int, int), M.on_cancel, True),
            T.CREDIT: (4, None, M.on_credit, False),        # hot: checked inside
            T.SETTLE: (3, None, M.on_settle, False),        # hot: checked inside
            T.GET: (6, (int, str, str, int, _S), M.on_get, True),
            T.LEASED: (8, None, on_leased, False),          # checked inside
            T.LEASE_ACKED: (3, (int, int), on_lease_acked, False),
            T.LEASE_END: (3, None, on_lease_end, False),
            T.LEASE_TAKE: (3, None, on_lease_take, False),
            T.REPUBLISH_RESULT: (3, (int, bool), cls._on_republish_result, False),
        }
        faults = injected_faults("node")        # tests only: SHOAL_INJECT_FAULTS
        self._spec = {int(k): (v if T(k).name.lower() not in faults else
                               (v[0], v[1], _faulty, v[3])) for k, v in spec.items()}

    # ------------------------------------------------------------------ plumbing
    def take_outbox(self) -> dict[bytes, list[list]]:
        """Messages to send since the last call: router identity -> wire messages, in order."""
        return self.links.take_outbox()

    @property
    def blocked_reason(self) -> str | None:
        """Why the journal cannot write (disk full...), told to routers (NODE_BLOCKED)."""
        return self.links.blocked_reason

    def _emit(self, event: int, data: list) -> None:
        """Queue a TOPOLOGY_EVENT to every registered router (and journal durable changes)."""
        self._events += 1
        if self.durable is not None:
            self.durable.topology_event(event, data, self.topology.exchanges)
        for identity in self.peers:
            self.send(identity, [TAG_TOPOLOGY_EVENT, event, data])
        if self.replication is not None:        # and to the other nodes' catalogues
            self.replication.catalogue.own_event(event, data)

    def queue_added(self, q: Queue) -> None:
        """A classic queue was made: EV_QUEUE_ADDED to every router, so that each knows
        where it is (router/locations.py; it matters for a queue made away from its usual
        node while that one is unreachable), and to the other nodes' catalogues. Routers
        get it in the batch that carries the declare's answer; the answer does not wait for
        them (no TOPOLOGY_SYNC), and the journal has the queue already."""
        data = [q.vhost, q.name, own_queues({None: q})[0][2]]
        for identity in self.peers:
            self.send(identity, [TAG_TOPOLOGY_EVENT, EV_QUEUE_ADDED, data])
        if self.replication is not None:
            self.replication.catalogue.own_event(EV_QUEUE_ADDED, data)

    def catalogue_own(self) -> list:
        """``[exchanges, bindings, queues]`` of this node (TOPOLOGY_SNAPSHOT's first three),
        its streams among the queues."""
        return [*self.topology.snapshot(),
                own_queues(self.queues) + own_queues(self.streams.streams)]

    # ------------------------------------------------------------------ streams
    def open_streams(self, directory: Path) -> int:
        """Serve streams from ``directory`` (the node's data dir), opening those it holds;
        returns how many."""
        self.streams.close()
        self.streams = Streams(self.send, self._next_id, directory)
        if self.replication is not None:
            self.streams.attach_replication(self.replication, lambda: self.peers)
        return self.streams.restore()


    # ------------------------------------------------------------------ durability
    def attach_journal(self, journal: Journal, clean: bool = True) -> int:
        """Make this (empty) shard durable with ``journal`` and rebuild it from
        ``journal.recovered`` (node/durability/durable.py; ``clean``: the last run stopped cleanly, else
        every restored message is marked redelivered); the recovered bodies are dropped
        afterwards. Returns the number of messages restored."""
        self.durable = DurableLog(journal, self.timers.wall_offset_ms)
        n = 0
        if journal.recovered is not None:
            n = self.durable.restore(self, journal.recovered, clean)
            journal.recovered = None
        return n

    def attach_replication(self, replication: Any) -> None:
        """Serve quorum queues with ``replication`` (node/replication/manager.py): its
        clock runs on this shard's timers, every TICK_MS."""
        self.replication = replication
        if self.streams.members is None:
            self.streams.attach_replication(replication, lambda: self.peers)

        def tick() -> None:
            replication.tick(self.timers.now)
            self.streams.tick()
            self.timers.add(self.timers.now + TICK_MS, tick)
        self.timers.add(self.timers.now + TICK_MS, tick)

    def reset_entry_ids(self, start: int) -> None:
        """Continue entry ids at ``start`` (above every id in the journal)."""
        self._next_id = itertools.count(start).__next__

    def restore_queue(self, vhost: str, name: str, auto_delete: bool, args: dict) -> Queue:
        """Re-create a durable queue from the journal (no records written)."""
        q = self.new_queue(vhost, name, True, auto_delete, None, args,
                           parse_queue_arguments(vhost, name, args, restored=True))
        self.queues[(vhost, name)] = q
        if self.durable is not None:
            self.durable.attach(q)
        return q

    def journal_flush(self) -> bool:
        """End of a turn: append the turn's SETTLE / DELIVERY_STATE records. Returns whether
        the journal has records to commit."""
        dl = self.durable
        if dl is None:
            return False
        dl.flush()
        return dl.journal.durable_lsn < dl.last_lsn

    def release_durable(self) -> int:
        """Queue the deferred answers whose records are on disk now. Returns how many."""
        dl = self.durable
        if dl is None:
            return 0
        ready = dl.ready()
        for identity, msg in ready:
            if identity in self.peers:
                self.send(identity, msg)
        return len(ready)

    def set_blocked(self, reason: str | None) -> None:
        """The journal stopped (``reason``) or resumed (None) writing: tell every router
        (NODE_BLOCKED), which blocks publishers with ``connection.blocked``."""
        if reason == self.links.blocked_reason:
            return
        self.links.blocked_reason = reason
        for identity in self.peers:
            self.send(identity, [TAG_NODE_BLOCKED, reason is not None, reason or ""])

    # DeliverySink (called by Queue)
    def deliver(self, consumer: QueueConsumer, entry: QueueEntry) -> None:
        peer = consumer.peer
        entry.queue.stats[1] += 1
        msg = [TAG_DELIVER, consumer.consumer_id, entry.entry_id, entry.redelivered,
               entry.exchange, entry.routing_key, delivered_header(entry),
               body_bytes(entry.body)]
        g = entry.queue.replica
        if g is not None and consumer.acquires:     # a quorum queue: sent once logged
            if not consumer.no_ack:
                peer.unsettled[entry.entry_id] = entry
            if g.out.check_out(entry, peer.identity, msg, entry.redelivered, consumer.no_ack):
                self.send(peer.identity, msg)
            return
        self.send(peer.identity, msg)
        if not consumer.no_ack and consumer.acquires:
            peer.unsettled[entry.entry_id] = entry
            if entry.queue.journaled:
                self.durable.delivered.append((entry.entry_id, True, entry.delivery_count))

    def work(self, consumer: QueueConsumer) -> None:
        self.send(consumer.peer.identity, [TAG_WORK, consumer.consumer_id])

    def dead_letter(self, q: Queue, entry: QueueEntry, reason: str) -> None:
        """Send ``entry`` to ``q``'s x-dead-letter-exchange (node/queues/deadletter.py); a
        quorum queue's at-least-once dead letter waits in its log for the targets' confirms
        (node/replication/dead_letters.py)."""
        g = q.replica
        if g is not None and g.dlx is not None and g.dlx.dead_letter(entry, reason):
            return
        send_dead_letter(self, q, entry, reason)

    def lease_broken(self, q: Queue) -> None:
        """``q`` has a ready message while lent: revoke the lease (node/lease.py)."""
        revoke_lease(self, q)

    def browse_done(self, consumer: QueueConsumer) -> None:
        """x-filter-auto-close: the browser reached the end of the queue; it is cancelled
        (the router sends basic.cancel)."""
        q = consumer.queue
        consumer.peer.consumers.pop(consumer.consumer_id, None)
        q.remove_consumer(consumer)
        self.send(consumer.peer.identity, [int(T.CONSUMER_CANCELLED), consumer.consumer_id,
                                            "browse complete"])

    def _on_republish_result(self, state: RouterPeer, msg: list) -> None:
        """REPUBLISH_RESULT: a confirmed dead letter's fate (node/replication/)."""
        if self.replication is not None:
            self.replication.dead_letter_result(msg[1], msg[2])

    def expire_queue(self, q: Queue) -> None:
        """x-expires: the queue was unused long enough; it is deleted."""
        if not q.deleted and self.queues.get((q.vhost, q.name)) is q:
            log.info("queue '%s' in vhost '%s' expired", q.name, q.vhost)
            self.delete_queue(q)

    # ------------------------------------------------------------------ dispatch
    def handle(self, peer: bytes, msg: list, now_ms: float) -> None:
        """Process one wire message ``msg`` from router ``peer`` (ZeroMQ identity) at ``now_ms``.

        Never raises AMQPError (converted to REPLY here, the one place). Malformed messages
        are logged and dropped.
        """
        tag = msg[0] if msg else None
        spec = self._spec.get(tag) if isinstance(tag, int) else None
        if spec is None:
            if tag in PEER_TAGS and self.replication is not None:
                self.timers.now = now_ms
                self.replication.on_peer(peer, msg, now_ms)
                return
            log.warning("dropping wire message with unknown tag %r from %r", tag, peer)
            return
        arity, types, handler, is_request = spec
        if (len(msg) != arity and not (len(msg) == arity + 1 and tag in _OPTIONAL_LAST)) or \
                (types and not all(map(isinstance, msg[1:], types))):
            self._malformed(peer, msg, is_request)
            return
        if tag == TAG_HELLO:
            self.links.hello(peer, msg, now_ms)
            return
        state = self.peers.get(peer)
        if state is None:
            if tag != TAG_GOODBYE:
                self.send(peer, [TAG_GOODBYE])
            return
        state.last_seen = now_ms
        self.timers.now = now_ms
        events = self._events
        try:
            payload = handler(self, state, msg)
        except AMQPError as err:
            if is_request:
                self.send(peer, [TAG_REPLY, msg[1], err.reply_code, err.text, None])
            else:
                log.debug("%s from %r failed: %s", T(tag).name, peer, err.text)
            return
        except Exception:  # noqa: BLE001 - a bug answers 541, never leaves a request hanging
            log.exception("internal error handling %s from %r", T(tag).name, peer)
            if is_request:
                self.send(peer, [TAG_REPLY, msg[1], INTERNAL_ERROR,
                                 f"internal error handling {T(tag).name.lower()} on node "
                                 f"{self.node_id}; see the node's log", None])
            return
        if is_request:
            if payload is DEFERRED:         # a quorum queue answers once its log says so
                return
            reply = [TAG_REPLY, msg[1], 0, "", payload]
            dl = self.durable
            lsn = dl.last_lsn if dl is not None and tag in _TOPOLOGY_REQUESTS and \
                dl.last_lsn > dl.journal.durable_lsn else 0
            if self._events == events or \
                    not self.links.sync_topology(peer, lambda: self._answer(peer, reply, lsn)):
                self._answer(peer, reply, lsn)

    def _answer(self, peer: bytes, reply: list, lsn: int) -> None:
        """Send a topology request's REPLY, held until the journal has ``lsn`` on disk (0:
        nothing to wait for) so that an -ok means the change survives a crash."""
        if peer not in self.peers:
            return
        dl = self.durable
        if lsn and dl is not None and lsn > dl.journal.durable_lsn:
            dl.defer(lsn, peer, reply)
        else:
            self.send(peer, reply)

    def _malformed(self, peer: bytes, msg: list, is_request: bool) -> None:
        name = T(msg[0]).name
        log.warning("dropping malformed %s message (%d fields) from %r", name, len(msg), peer)
        if is_request and len(msg) > 1 and isinstance(msg[1], int) and peer in self.peers:
            self.send(peer, [TAG_REPLY, msg[1], SYNTAX_ERROR, f"malformed {name} message", None])

    # ------------------------------------------------------------------ link
    def _on_heartbeat(self, state: RouterPeer, msg: list) -> None:
        pass

    def _on_synced(self, state: RouterPeer, msg: list) -> None:
        self.links.synced(state, msg[1])

    def _on_goodbye(self, state: RouterPeer, msg: list) -> None:
        log.info("router %r said goodbye", state.router_id)
        self.links.forget(state)

    def forget_silent(self, now_ms: float, silence_ms: float) -> int:
        """Forget routers silent for ``silence_ms`` (:meth:`Peers.forget_silent`)."""
        return self.links.forget_silent(now_ms, silence_ms)

    def goodbye_all(self) -> None:
        """Queue GOODBYE to every known router (the node is stopping)."""
        self.links.goodbye_all()

    def tick(self, now_ms: float) -> None:
        """Run due timers (TTL, x-expires, scheduled delivery, consumer timeouts), then the
        link's heartbeats and router expiry (node/peers.py)."""
        self.timers.run(now_ms)
        self.links.tick(now_ms)

    def _forget(self, state: RouterPeer) -> None:
        """The router is gone (node/peers.py removed it): drop its consumers, release its
        unsettled deliveries (original position, redelivered), delete its connections'
        exclusive queues (EV_QUEUE_REMOVED)."""
        if self.durable is not None:
            self.durable.forget_router(state.identity)
        self.streams.forget(state.identity)
        consumers = list(state.consumers.values())
        state.consumers.clear()
        for c in consumers:
            c.queue.remove_consumer(c)
        touched: dict[Queue, None] = {}
        for e in state.unsettled.values():
            if e.queue.release(e):
                touched[e.queue] = None
        state.unsettled.clear()
        for c in consumers:
            self.maybe_auto_delete(c.queue)
        prefix = state.router_id + "/"
        for q in [q for q in self.queues.values()
                  if q.exclusive_owner is not None and q.exclusive_owner.startswith(prefix)]:
            self.delete_queue(q)
        for q in touched:
            if not q.deleted:
                q.requeued()

    # ------------------------------------------------------------------ queues
    def queue_for(self, vhost: str, name: str, owner: str | None) -> Queue:
        """The queue, checked for access. Raises 404 (missing), 405 (other's exclusive)."""
        q = self.queues.get((vhost, name))
        if q is None:
            raise soft_error(NOT_FOUND, f"no queue '{name}' in vhost '{vhost}'")
        check_owner(q, owner)
        return q

    def new_queue(self, vhost: str, name: str, durable: bool, auto_delete: bool,
                  exclusive_owner: str | None, arguments: dict | None,
                  config: QueueConfig) -> Queue:
        """A queue of this shard (not yet in ``queues``), its deliveries sent by this shard."""
        return Queue(vhost, name, durable=durable, auto_delete=auto_delete,
                     exclusive_owner=exclusive_owner, arguments=arguments, sink=self,
                     next_id=self._next_id, timers=self.timers, config=config)

    def delete_queue(self, q: Queue) -> None:
        """Delete ``q``: cancel its consumers (CONSUMER_CANCELLED), drop its messages and this
        node's bindings to it, emit EV_QUEUE_REMOVED."""
        for c in q.delete():
            c.peer.consumers.pop(c.consumer_id, None)
            self.send(c.peer.identity, [int(T.CONSUMER_CANCELLED), c.consumer_id,
                                         "queue deleted"])
        del self.queues[(q.vhost, q.name)]
        if q.journaled:
            self.durable.delete_queue(q)
        self.queue_removed(q.vhost, q.name)

    def queue_removed(self, vhost: str, name: str) -> None:
        """A queue or stream is gone: this node's bindings to it go, EV_QUEUE_REMOVED."""
        self.topology.unbind_destination(vhost, DEST_QUEUE, name)
        self._emit(EV_QUEUE_REMOVED, [vhost, name])

    def maybe_auto_delete(self, q: Queue) -> None:
        if q.auto_delete and q.had_consumers and not q.consumer_count and not q.deleted:
            self.delete_queue(q)

    # ------------------------------------------------------------------ exchanges
    def _on_exchange_declare(self, state: RouterPeer, msg: list) -> None:
        _, _, vhost, name, type_, passive, durable, auto_delete, internal, args = msg
        self.topology.declare_exchange(vhost, name, type_, bool(passive), bool(durable),
                                       bool(auto_delete), bool(internal), args)

    def _on_exchange_delete(self, state: RouterPeer, msg: list) -> None:
        _, _, vhost, name, if_unused = msg
        self.topology.delete_exchange(vhost, name, bool(if_unused))

    def _on_bind(self, state: RouterPeer, msg: list) -> None:
        self.topology.bind(*msg[2:])

    def _on_unbind(self, state: RouterPeer, msg: list) -> None:
        self.topology.unbind(*msg[2:])

    def _on_unbind_destination(self, state: RouterPeer, msg: list) -> None:
        self.topology.unbind_destination(*msg[1:])

    def _on_snapshot(self, state: RouterPeer, msg: list) -> list:
        rows = self.replication.catalogue.rows() if self.replication is not None else []
        return [*self.catalogue_own(), rows]


def _faulty(shard: Shard, state: Any, msg: list) -> None:
    """The handler of a wire message named in SHOAL_INJECT_FAULTS (tests only)."""
    raise InjectedFault(f"fault injected into {T(msg[0]).name} (SHOAL_INJECT_FAULTS)")
