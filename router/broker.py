"""The router's shared state: node links, topology cache, consumers and pending publishes.

Everything the router keeps across connections lives here, owned by the router's single event
loop (no locks). Work queued during one event-loop turn (CREDIT grants, client writes) leaves
once at the end of the turn (design.md section 4, "batch on both sides"); client writes also
leave after each read from a Unix node link, so that deliveries move on while the node still
makes the rest of a grant (docs/performance.md, "the credit loop").
"""
from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from typing import Any, Callable

import zmq
from pamqp import commands as C

from shoal.shared import placement, wire
from shoal.shared.definitions import Definitions, definitions_for
from shoal.shared.errors import CONNECTION_FORCED, INTERNAL_ERROR
from shoal.shared.linkauth import connect_curve
from shoal.shared.settings import Settings
from shoal.shared.wire import T, TAG_PUBLISH, TAG_SETTLE

from shoal.router import consumers as credit, node_events, node_messages, pushback, quorum
from shoal.router.access.users import UserStore
from shoal.router.access.limits import Limits
from shoal.router.consumers import Consumer, ConsumerTarget
from shoal.router.lease import Leases
from shoal.router.links.local_link import Attach
from shoal.router.links.node_link import NodeLink
from shoal.router.links.unix_link import open_link
from shoal.router.locations import Locations
from shoal.router.routing import Topology
from shoal.router.session import BrokerChannel, BrokerClient, Delivery, PendingPublish

log = logging.getLogger("shoal.router.broker")

#: Seconds a starting router waits for every node before it serves with those that answered.
STARTUP_WAIT_S = 3.0


class Broker:
    """Owns the node links and routes work between client channels and nodes."""

    def __init__(self, settings: Settings, ctx: zmq.Context | None = None,
                 local_nodes: dict[str, Attach] | None = None,
                 definitions: Definitions | None = None) -> None:
        """``ctx``: the ZeroMQ context for the node links (by default the broker makes its
        own and terminates it in :meth:`stop`). ``local_nodes``: node id -> ``attach`` of a
        node hosted in this process, linked by a LocalLink instead of ZeroMQ.
        ``definitions``: users, vhosts and permissions (default:
        :func:`~shoal.shared.definitions.definitions_for` ``settings``; ConfigError)."""
        self.settings = settings
        self.local_nodes = local_nodes or {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.router_id = uuid.uuid4().hex[:12]
        self.node_map = settings.node_map()
        self.node_ids = [n for n, _ in self.node_map]
        self.definitions = definitions or definitions_for(settings)
        self.users = UserStore(self.definitions, tuple(settings.loopback_users))
        self.limits = Limits(self.definitions)
        self.topology = Topology(self.users.vhosts)
        #: the stored users and permissions' version in use, and who applies a new one
        #: (router/access_sync.py, wired by router/server.py: this module does not import it)
        self.access_version = 0
        self.on_access: Callable[[int, dict], None] = lambda version, doc: None
        #: run when the first node (which keeps them) says HELLO_OK (router/access_sync.py)
        self.on_owner_up: Callable[[], None] = lambda: None
        self.links: dict[str, NodeLink] = {}
        self.consumers: dict[int, tuple[BrokerChannel, Consumer]] = {}  # by consumer_id
        #: Pull-model counters (seed 002 DG3): WORK notifications received, drain grants
        #: sent, drains that came back with nothing delivered, deliveries; and RabbitMQ's
        #: global message counters (publishes received, routed and unroutable, confirmed,
        #: acknowledged) and the times publishers were paused for a full node link
        #: (router/management/metrics.py); "leased": deliveries made under a delivery lease
        self.stats = {"work": 0, "drains": 0, "empty_drains": 0, "delivered": 0,
                      "received": 0, "routed": 0, "unroutable": 0, "returned": 0,
                      "confirmed": 0,
                      "acknowledged": 0, "publishers_paused": 0, "leased": 0}
        self.publishes: dict[int, PendingPublish] = {}
        self.connections: set[BrokerClient] = set()
        #: set when a connection opens or closes: router/live.py reports at once
        self.report_soon = asyncio.Event()
        self._next_consumer = 0
        self._next_publish = 0
        self._next_conn = 0
        self._placement: dict[tuple[str, str, str], str] = {}
        #: where each classic queue is, as the nodes say (router/locations.py)
        self.locations = Locations(self.node_ids, lambda n: self.links[n].up,
                                   lambda key: self._placement.pop(("q", *key), None))
        self._dirty: set[BrokerClient] = set()
        self._flush_scheduled = False
        self.leases = Leases(self)       #: delivery leases held (router/lease.py)
        #: what each node link calls with each message it reads (router/node_messages.py)
        self.on_node_message = functools.partial(node_messages.on_node_message, self)
        self.quorum = quorum.QuorumLeaders()  #: quorum queues' leaders (router/quorum.py)
        self.topology.usable = self._local
        self.congested_links = 0         #: node links whose queue is full (router/pushback.py)
        #: TOPOLOGY_SNAPSHOT per node, asked when it comes up (router/node_events.py)
        self.snapshots: dict[str, asyncio.Future] = {}
        #: nodes whose journal cannot write (NODE_BLOCKED): node_id -> reason
        self.blocked_nodes: dict[str, str] = {}
        #: why publishers are blocked (some node's alarm or journal), or None
        self.blocked_reason: str | None = None
        self._own_ctx = ctx is None
        self._ctx = zmq.Context() if ctx is None else ctx

    # ---- lifecycle ---------------------------------------------------------------------------
    async def start(self, wait: float = STARTUP_WAIT_S) -> list[str]:
        """Link to every node and wait up to ``wait`` s for all of them to say HELLO_OK and
        send their topology. Returns the nodes that did not: the router serves without them
        and takes each in when it answers (issue 36; RabbitMQ's nodes, too, serve while a
        cluster member is down)."""
        s = self.settings
        for node_id, endpoint in self.node_map:
            args = (node_id, endpoint, self.router_id, s.link_heartbeat_ms,
                    int(s.link_heartbeat_timeout * 1000),
                    self.on_node_message,
                    lambda link, restarted: node_events.node_up(self, link, restarted),
                    lambda link: node_events.node_down(self, link),
                    lambda link, on: pushback.on_congestion(self, on), self.flush_clients)
            link = open_link(self._ctx, self.local_nodes.get(node_id), args,
                             lambda sock, ep: connect_curve(sock, ep, s))
            self.links[node_id] = link
            link.start()
        return await node_events.await_nodes(self, wait)

    async def stop(self) -> None:
        for link in self.links.values():
            await link.stop()
        if self._own_ctx:
            self._ctx.term()

    def new_connection_id(self) -> str:
        self._next_conn += 1
        return f"{self.router_id}/{self._next_conn}"

    def new_consumer_id(self) -> int:
        self._next_consumer += 1
        return self._next_consumer

    # ---- placement ---------------------------------------------------------------------------
    def owner(self, vhost: str, name: str, kind: str) -> str:
        key = (kind, vhost, name)
        node = self._placement.get(key)
        if node is None:
            node = None
            if kind == "q":
                led = self.quorum.leaders.get((vhost, name))
                node = led[0] if led is not None else self.locations.where.get((vhost, name))
            if node is None:
                node = placement.owner(vhost, name, self.node_ids, kind)
            if len(self._placement) > 100_000:
                self._placement.clear()
            self._placement[key] = node
        return node

    def queue_link(self, vhost: str, name: str) -> NodeLink:
        return self.links[self.owner(vhost, name, "q")]

    def _local(self, vhost: str, name: str) -> bool:
        """Whether a local-random exchange may pick queue ``name``: a classic queue (not
        replicated, as RabbitMQ 4 picks only classic queues' processes) whose node this
        router reaches (router/routing.py ``Topology.usable``)."""
        if (vhost, name) in self.quorum.leaders:
            return False
        link = self.links.get(self.owner(vhost, name, "q"))
        return link is not None and link.up

    async def declare_request(self, vhost: str, name: str, msg: list) -> Any:
        """QUEUE_DECLARE ``msg`` (non-passive) of queue ``name``: sent where the queue is, or
        to a reachable node when its usual one is not (router/locations.py). A usual node that
        no node has heard from yet (a cluster still forming) is waited for first, up to
        ``link_heartbeat_timeout``. Returns the payload; raises AMQPError (404 when it is on
        an unreachable node)."""
        msg = self.with_default_type(vhost, msg)
        if (vhost, name) in self.quorum.leaders:
            return await self.queue_request(vhost, name, msg)
        usual = placement.owner(vhost, name, self.node_ids)
        if usual not in self.locations.known and not self.links[usual].up:
            await node_events.await_unseen(self, usual)
        node, placed = self.locations.place(vhost, name, usual)
        try:
            return await self.queue_request(vhost, name, msg)
        except Exception:
            if placed:
                self.locations.unplace(vhost, name, node)
            raise

    def with_default_type(self, vhost: str, msg: list) -> list:
        """QUEUE_DECLARE ``msg`` with ``x-queue-type`` set to ``vhost``'s default queue type
        when it names none (RabbitMQ's ``rabbit_amqqueue:augment_declare_args``): a quorum
        or stream default applies to durable, non-exclusive, non-auto-delete queues only
        (others stay classic, as the types' ``is_compatible`` says)."""
        qtype = self.definitions.default_queue_types.get(vhost)
        args = msg[7] or {}
        if qtype is None or "x-queue-type" in args:
            return msg
        durable, exclusive, auto_delete = msg[4], msg[5], msg[6]
        if qtype in ("quorum", "stream") and not (durable and not exclusive and not auto_delete):
            return msg
        return [*msg[:7], {**args, "x-queue-type": qtype}, *msg[8:]]

    def set_queue_node(self, vhost: str, name: str, node: str) -> None:
        """Route queue ``name`` to ``node`` (a quorum queue's new leader)."""
        self._placement[("q", vhost, name)] = node

    async def queue_request(self, vhost: str, name: str, msg: list) -> Any:
        """A request about a queue, to the node that serves it (a quorum queue's leader,
        asked again when a member answers MOVED: router/quorum.py). Returns the payload;
        raises AMQPError, NodeDown."""
        return (await quorum.queue_request(self, vhost, name, msg))[1]

    async def await_unseen(self, node: str) -> None:
        """Until ``node``, not heard from yet, says HELLO_OK (router/node_events.py)."""
        await node_events.await_unseen(self, node)

    async def get_request(self, vhost: str, name: str, msg: list) -> tuple[str, Any]:
        """As :meth:`queue_request`, and the node that answered (basic.get settles there)."""
        return await quorum.queue_request(self, vhost, name, msg)

    async def consume_request(self, c: Consumer, vhost: str, msg: list) -> Any:
        """Register queue consumer ``c`` with ``msg`` (CONSUME without req_id) at the node
        that serves its queue; ``c.node_id`` becomes that node."""
        c.request = msg
        return (await quorum.consume(self, vhost, c))[1]

    def exchange_link(self, vhost: str, name: str) -> NodeLink:
        return self.links[self.owner(vhost, name, "e")]

    # ---- end-of-turn flushing ----------------------------------------------------------------
    def mark_dirty(self, client: BrokerClient) -> None:
        self._dirty.add(client)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop = self._loop
            if loop is None:   # looked up once: on Python 3.11 each lookup is a getpid call
                loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self.flush_clients()

    def flush_clients(self) -> None:
        """Write every dirty client's output now (at the turn's end, or a Unix link's read)."""
        if self._dirty:
            dirty, self._dirty = self._dirty, set()
            for client in dirty:
                client.flush()

    # ---- publishing --------------------------------------------------------------------------
    def publish(self, ch: BrokerChannel, seq: int, ev: Any, queues: set[str],
                future: asyncio.Future | None = None, count: bool = True) -> None:
        """Send a routed publish to the owner node of each queue (one PUBLISH per node).

        ``seq``: the channel's confirm sequence number (0 without confirms). ``future``: set
        to the finished PendingPublish once every node answered (tx.commit waits on it).
        ``count``: count it in the routed statistics (not a copy of a publish to several
        queues that a lease held, router/lease.py: that publish was counted).
        """
        want_result = seq or ev.mandatory or future is not None
        if self.leases.held:            # delivered, held or partly delivered under leases?
            queues = self.leases.route(ch, seq, ev, queues, future, count)
            if queues is None:
                return
        by_node = self._by_node(ch.vhost, queues)
        if not want_result:     # routed as far as the router knows (no node answer)
            if count:
                self.stats["routed" if queues else "unroutable"] += 1
            for node_id, qs in by_node.items():
                link = self.links[node_id]
                if link.up:
                    link.send([TAG_PUBLISH, 0, ch.vhost, qs, ev.exchange, ev.routing_key,
                               ev.header, ev.body, ch.client.owner])
            return
        pending = PendingPublish(ch, seq, ev, set(), future)
        self._next_publish += 1
        pid = pending.pid = self._next_publish
        pending.sent = by_node
        for node_id, qs in by_node.items():
            link = self.links[node_id]
            if not link.up:
                if not quorum.park(self, pending, ch.vhost, qs):
                    pending.failed = True       # a classic queue's node: nacked
                continue
            pending.waiting.add(node_id)
            link.send([TAG_PUBLISH, pid, ch.vhost, qs, ev.exchange, ev.routing_key, ev.header,
                       ev.body, ch.client.owner])
        if pending.waiting:
            self.publishes[pid] = pending
        else:
            self.finish_publish(pending)

    def pending_answer(self, pid: int, ch: BrokerChannel, seq: int, ev: Any, node_id: str,
                       queue: str) -> None:
        """Publish ``pid`` (from :meth:`next_publish_id`), with a confirm, is answered by
        ``node_id`` for ``queue`` other than through :meth:`publish` (a leased delivery's
        record, router/lease.py): PUBLISH_RESULT finishes it."""
        pending = PendingPublish(ch, seq, ev, {node_id})
        pending.pid = pid
        pending.sent = {node_id: [queue]}
        self.publishes[pid] = pending

    def _by_node(self, vhost: str, queues: Any) -> dict[str, list[str]]:
        """The queue names grouped by their owner node (one PUBLISH per node)."""
        if len(queues) == 1:            # the common case: no grouping
            (q,) = queues
            return {self.owner(vhost, q, "q"): [q]}
        by_node: dict[str, list[str]] = {}
        for q in queues:
            by_node.setdefault(self.owner(vhost, q, "q"), []).append(q)
        return by_node

    def next_publish_id(self) -> int:
        self._next_publish += 1
        return self._next_publish

    def finish_pending(self, p: PendingPublish) -> None:
        """Every node answered ``p`` (or was lost): forget its ids, confirm or nack it."""
        self.publishes.pop(p.pid, None)
        for pid in p.extra:
            self.publishes.pop(pid, None)
        self.finish_publish(p)

    def finish_publish(self, p: PendingPublish) -> None:
        """``p`` is answered: count it, return it (``mandatory`` and routed nowhere, 312) and
        confirm it (basic.ack, or basic.nack if it failed) on its channel, if still open."""
        ch = p.channel
        if p.future is not None and not p.future.done():
            p.future.set_result(p)
        if not p.failed:
            self.stats["routed" if p.routed else
                       "returned" if p.ev.mandatory else "unroutable"] += 1
        if ch.closed:
            return
        if p.ev.mandatory and p.routed == 0 and not p.failed:
            ch.returned(p.ev)
        if p.seq:
            ch.confirmed(p.seq, not p.failed)
        self.mark_dirty(ch.client)

    # ---- consumers and credit ----------------------------------------------------------------
    def replenish(self, ch: BrokerChannel, t: ConsumerTarget) -> None:
        """Grant ``t``'s queue consumers whatever credit the qos invariant allows now."""
        for c, msg in credit.credit_messages(ch.pool, t):
            link = self.links[c.node_id]
            if link.up:
                if msg[3]:
                    self.stats["drains"] += 1
                    if not msg[2] and self.leases.holds(c):     # credit asked back: the
                        self.leases.end_for(c.target.vhost, (c.queue,))  # node decides
                # Credit for a consumer that still holds some can wait a moment for company;
                # a starved one (or a pull) gets it at once.
                if c.granted > msg[2] and not msg[3]:
                    link.send_lazy(msg)
                else:
                    link.send(msg, urgent=True)
        if self.leases.waiting:         # publishes that wait for this credit (router/lease.py)
            self.leases.retry()

    def replenish_channel(self, ch: BrokerChannel) -> None:
        for t in credit.in_turn(ch.pool):
            self.replenish(ch, t)

    def cancel_consumer(self, ch: BrokerChannel, t: ConsumerTarget) -> list[asyncio.Future]:
        """Client basic.cancel or channel close: every node forgets its part of ``t``;
        deliveries already made stay unacked (spec 1.8.3.5). Returns the nodes' CANCEL
        replies: until each arrives, deliveries the node sent before it still reach the
        client (spec 1.8.3.5: "the client may receive an arbitrary number of messages in
        between sending the cancel method and receiving the cancel-ok reply"), so a no-ack
        delivery in flight is never dropped; basic.cancel-ok waits for them."""
        t.cancelled = True
        ch.pool.targets.pop(t.tag, None)
        self.leases.forget(t)
        replies = []
        for c in t.consumers:
            link = self.links[c.node_id]
            if not link.up:
                self.consumers.pop(c.consumer_id, None)
                continue
            fut = link.request([T.CANCEL, c.consumer_id])
            fut.add_done_callback(self._cancelled(c.consumer_id))
            replies.append(fut)
        return replies

    def _cancelled(self, consumer_id: int):
        def done(fut: asyncio.Future) -> None:
            _ignore(fut)
            self.consumers.pop(consumer_id, None)
        return done

    def settle(self, ch: BrokerChannel, deliveries: list[Delivery], outcome: int,
               annotations: bytes = b"") -> None:
        """Forward settlements to the nodes (one SETTLE per node) and free their credit.
        ``annotations``: an encoded 0-9-1 field table the nodes merge into the messages (a
        modified outcome's, shared/wire.py SETTLE).

        A SETTLE usually goes lazily, ahead of queued messages (NodeLink.send_lazy). One that
        settles deliveries of a cancelled consumer (a channel closed, a link detached) goes in
        order instead, behind that consumer's CANCEL. Else the node would requeue them while
        the consumer was still there with credit, and deliver them to it again. The router
        would release those, so nothing would be lost, but a count or a purge right after
        the close would miss them (RabbitMQ's AMQP 1.0 client's tests saw 44 of 50).

        An ack of a leased delivery whose LEASED record is still waiting here sends no SETTLE:
        the record becomes a LEASE_ACKED count (NodeLink.acked_unsent), the node stores
        nothing of that message, and a publish with a confirm is confirmed here, acknowledged
        by its one queue's consumer (router/links/records.py)."""
        by_node: dict[str, list[int]] = {}
        touched = []
        behind = False
        acked = outcome == wire.OUTCOME_ACK and not annotations
        if outcome == wire.OUTCOME_ACK:
            self.stats["acknowledged"] += len(deliveries)
        links = self.links
        for d in deliveries:
            if d.node_id is not None:
                pid = None
                if acked and d.delivery_id < 0:   # leased: its record may not have left
                    link = links[d.node_id]
                    pid = link.acked_unsent(d.delivery_id)
                    if pid:
                        node_messages.publish_result(self, link, pid, 0, 1)
                if pid is None:
                    by_node.setdefault(d.node_id, []).append(d.delivery_id)
            if d.consumer is not None:
                credit.on_settled(ch.pool, d.consumer)
                touched.append(d.consumer.target)
                behind = behind or d.consumer.target.cancelled
        for node_id, ids in by_node.items():
            link = self.links[node_id]
            if link.up and annotations:
                link.send([TAG_SETTLE, outcome, ids, annotations])
            elif link.up and behind:
                link.send([TAG_SETTLE, outcome, ids])
            elif link.up:
                link.send_lazy([TAG_SETTLE, outcome, ids])
        if ch.pool.global_prefetch:
            self.replenish_channel(ch)
        else:
            for t in set(touched):
                self.replenish(ch, t)

    def close_connection(self, name: str, reason: str) -> bool:
        """Close this router's client connection ``name`` (router/live.py's rows) with 320
        CONNECTION_FORCED and ``reason`` (RabbitMQ: "Closed via management plugin"). Returns
        whether it was here."""
        for client in list(self.connections):
            if getattr(client, "name", None) == name:
                client.shutdown(CONNECTION_FORCED, f"CONNECTION_FORCED - {reason}"[:255])
                return True
        return False

    def delivery_failed(self, link: NodeLink, ch: BrokerChannel, delivery_id: int) -> None:
        """A bug while writing a delivery (called from an ``except`` block): log it with its
        traceback, give the message back to its queue unless the channel already holds it as
        unacked (then closing the connection requeues it), and close the client's connection
        with 541 INTERNAL_ERROR (spec 1.2: a connection exception)."""
        log.exception("internal error delivering to channel %d of connection %s",
                      ch.number, ch.client.owner)
        if not any(d.delivery_id == delivery_id and d.node_id == link.node_id
                   for d in ch.unacked.values()):
            link.send([TAG_SETTLE, wire.OUTCOME_REQUEUE, [delivery_id]])
        ch.client.shutdown(INTERNAL_ERROR, "INTERNAL_ERROR - internal error delivering a "
                                           "message; see the broker log")

    def publish_unconfirmed(self, vhost: str, exchange: str, routing_key: str, header: bytes,
                            body: bytes, also: tuple[str, ...] = ()) -> bool:
        """Route a message like basic.publish without a channel or a confirm (dead letters,
        the management API's publish); ``also``: more routing keys (router/sender_selected.py).
        Returns whether any queue was routed to."""
        return self.send_unconfirmed(vhost, self.topology.route(
            vhost, exchange, routing_key, None, header, also), exchange, routing_key, header,
            body)

    def send_unconfirmed(self, vhost: str, queues: set[str], exchange: str, routing_key: str,
                         header: bytes, body: bytes) -> bool:
        """:meth:`publish_unconfirmed` to the ``queues`` already routed to."""
        if self.leases.held:
            self.leases.end_for(vhost, queues)
        for node_id, qs in self._by_node(vhost, queues).items():
            link = self.links[node_id]
            if link.up:
                link.send([TAG_PUBLISH, 0, vhost, qs, exchange, routing_key, header, body, None])
        return bool(queues)

    def server_cancel(self, ch: BrokerChannel, t: ConsumerTarget) -> None:
        """The broker ends a consumer (a queue deleted, a node lost): its other queue
        consumers are cancelled too, and clients that announced ``consumer_cancel_notify``
        (RabbitMQ extension) get basic.cancel: after the queue.delete-ok when the channel is
        deleting one of its queues (``ch.deleting``, topology_methods.on_queue_delete)."""
        if t.cancelled:
            return
        queues = t.queues
        self.cancel_consumer(ch, t)
        if not ch.closed and ch.client.capabilities.get("consumer_cancel_notify"):
            cancel = C.Basic.Cancel(t.tag, nowait=True)
            held = next((ch.deleting[q] for q in queues if q in ch.deleting), None)
            if held is not None:        # after the channel's own queue.delete-ok, as RabbitMQ
                held.append(cancel)
                return
            ch.send(cancel)
            self.mark_dirty(ch.client)

    @property
    def congested(self) -> bool:
        """Some node's link queue is full: client reading stays paused until it drains."""
        return self.congested_links > 0


def _ignore(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()
