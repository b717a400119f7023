"""Quorum queues as a router sees them (design.md section 8, docs/replication.md): where each
one's leader is, and what moves when the leader does.

A quorum queue is served by its leader, on one of its member nodes. The nodes tell every router
who leads (TOPOLOGY_EVENT ``EV_QUEUE_LEADER``, from the leader when it is elected and when a
router says HELLO, and from a member asked by a router that had it wrong). The broker routes a
quorum queue's publishes and requests to that node (``Broker._owner``), and when the leader
changes:

- publishes waiting for the old leader's answer are sent again to the new one (they may then
  be enqueued twice, never lost: at-least-once, as RabbitMQ's quorum queue client does);
  a node that answers PUBLISH_MOVED had no leader there, and the same happens;
- consumers stay subscribed (as in RabbitMQ): each is registered again with the new leader
  under the same consumer id and consumer tag; deliveries it had unacknowledged from the old
  leader are settled as no-ops, because the new leader delivers them again, redelivered;
- requests (declare, delete, purge, get, consume) answered MOVED are asked again at the leader
  once it is known (:func:`queue_request`).

While a queue has no leader (a majority of its members is unreachable), its publishes wait, to
be confirmed when a leader is elected; they are never confirmed before.

A replicated stream is announced the same way (flagged "stream"), but its consumers read from
any member, as RabbitMQ's do (node/streams/readers.py): :func:`read_node` chooses one, a
member that does not lead first, and a consumer stays there across leader changes. It moves,
from the offset after its last delivery, only when its member leaves the stream or its node
is lost.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from shoal.shared import wire
from shoal.shared.errors import NOT_FOUND, AMQPError, soft_error
from shoal.shared.wire import TAG_PUBLISH, T

from shoal.router.links.node_link import NodeDown
from shoal.router.locations import home_down
from shoal.router.session import PendingPublish

log = logging.getLogger("shoal.router")

#: How long a request waits for a quorum queue's leader to be known, in all (seconds).
LEADER_WAIT_S = 10.0


class QuorumLeaders:
    """The leaders the nodes announced: (vhost, name) -> [node, term, members, online]."""

    def __init__(self) -> None:
        self.leaders: dict[tuple[str, str], list] = {}
        #: the queues of ``leaders`` that are replicated streams
        self.streams: set[tuple[str, str]] = set()
        #: publishes waiting for a leader: (vhost, name) -> [(pending, names), ...]
        self.parked: dict[tuple[str, str], list[PendingPublish]] = {}
        self._changed: dict[tuple[str, str], asyncio.Event] = {}
        self.leader_changes = 0

    def leader(self, vhost: str, name: str) -> str | None:
        entry = self.leaders.get((vhost, name))
        return entry[0] if entry is not None else None

    def forget(self, vhost: str, name: str) -> None:
        self.leaders.pop((vhost, name), None)
        self.streams.discard((vhost, name))

    async def changed(self, vhost: str, name: str, timeout: float) -> None:
        """Until the leader of the queue changes (or ``timeout`` s)."""
        ev = self._changed.setdefault((vhost, name), asyncio.Event())
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def _wake(self, key: tuple[str, str]) -> None:
        ev = self._changed.pop(key, None)
        if ev is not None:
            ev.set()


def on_leader(broker: Any, data: list) -> None:
    """EV_QUEUE_LEADER ``[vhost, name, leader, term, members, online(, "stream")]``: route
    the queue to its leader; move what waited on another node (publishes, consumers), and a
    stream's readers whose member left."""
    vhost, name, node, term = data[0], data[1], data[2], data[3]
    ql: QuorumLeaders = broker.quorum
    key = (vhost, name)
    if data[6:7] == ["stream"]:
        ql.streams.add(key)
    old = ql.leaders.get(key)
    if old is not None and (term < old[1] or (term == old[1] and node == old[0])):
        if len(data) > 5:
            old[2], old[3] = data[4], data[5]
            if key in ql.streams and node in broker.links and broker.links[node].up:
                _move_consumers(broker, vhost, name, node)
        return
    ql.leaders[key] = [node, term, data[4], data[5]]
    broker.set_queue_node(vhost, name, node)
    if old is None or old[0] != node:
        ql.leader_changes += 1
    ql._wake(key)
    if node not in broker.links or not broker.links[node].up:
        return
    old_node = old[0] if old is not None else None
    # publishes that waited for the old leader's answer or for any leader
    for p in ql.parked.pop(key, []):
        _resend(broker, p, [name])
    if old_node is not None:
        for p in list(broker.publishes.values()):
            _retarget(broker, p, old_node, vhost)
    _move_consumers(broker, vhost, name, node)


def _retarget(broker: Any, p: PendingPublish, old_node: str, vhost: str) -> None:
    """``p`` waits on ``old_node`` for names that are all quorum queues now led elsewhere:
    stop waiting there and send them to their leaders."""
    if p.channel.vhost != vhost:
        return
    for key, node, names in _sends(p):
        if node != old_node or key not in p.waiting:
            continue
        leaders = [broker.quorum.leader(vhost, n) for n in names]
        if all(ld is not None and ld != old_node for ld in leaders):
            p.waiting.discard(key)
            _resend(broker, p, names)


def _resend(broker: Any, p: PendingPublish, names: list[str]) -> None:
    """Send ``p``'s message again for ``names``, each to its queue's leader (a new publish id
    per node, and ``p.pid``, its first: a stream that holds it already does not store it
    twice), or park it until the queue has one."""
    if p.channel.closed:
        _done_if_idle(broker, p)
        return
    vhost = p.channel.vhost
    by_node: dict[str, list[str]] = {}
    for n in names:
        node = broker.quorum.leader(vhost, n)
        link = broker.links.get(node) if node is not None else None
        if link is None or not link.up:
            broker.quorum.parked.setdefault((vhost, n), []).append(p)
            p.waiting.add(("parked", n))
            continue
        by_node.setdefault(node, []).append(n)
        p.waiting.discard(("parked", n))
    ev = p.ev
    for node, qs in by_node.items():
        pid = -broker.next_publish_id()     # negative: sent again (shared/wire.py PUBLISH)
        broker.publishes[pid] = p
        if not p.extra:
            p.extra = []
        p.extra.append(pid)
        p.waiting.add(pid)
        if p.sent is None:
            p.sent = {}
        p.sent[pid] = (node, qs)
        broker.links[node].send([TAG_PUBLISH, pid, vhost, qs, ev.exchange, ev.routing_key,
                                 ev.header, ev.body, p.channel.client.owner, p.pid])
    _done_if_idle(broker, p)


def _sends(p: PendingPublish) -> list[tuple[Any, str, list[str]]]:
    """(waiting key, node, queue names) of each PUBLISH sent for ``p``: the first ones are
    keyed by node id (``Broker.publish``), the ones sent again by their publish id."""
    return [(k, k, v) if isinstance(k, str) else (k, v[0], v[1])
            for k, v in (p.sent or {}).items()]


def _done_if_idle(broker: Any, p: PendingPublish) -> None:
    if not p.waiting:
        broker.finish_pending(p)


def on_publish_moved(broker: Any, link: Any, msg: list) -> None:
    """PUBLISH_MOVED ``[T, pid, code, routed, moved]``: the rest is as PUBLISH_RESULT; the
    ``moved`` queues go to their leader."""
    _, pid, code, routed, moved = msg
    p = broker.publishes.get(pid)
    if p is None or not p.answer(link.node_id, pid, code, routed):
        return
    vhost = p.channel.vhost
    ql = broker.quorum
    for n in moved:
        if ql.leader(vhost, n) == link.node_id:
            # it says it does not lead: wait for the leader to be announced
            ql.parked.setdefault((vhost, n), []).append(p)
            p.waiting.add(("parked", n))
        else:
            _resend(broker, p, [n])
    _done_if_idle(broker, p)


def node_down(broker: Any, node: str) -> set[int]:
    """A node was lost: the quorum queue parts of publishes waiting on it wait for a new
    leader (parked) instead of failing. Returns the publish ids now handled."""
    handled: set[int] = set()
    ql = broker.quorum
    for entry in ql.leaders.values():
        if entry[0] == node:
            # stale: its next announcement, even of the same leader (the node was only cut
            # off, or this router was hung), sends what waits and registers the consumers
            # again (the node forgot them with this router)
            entry[1] = -1
    for pid, p in list(broker.publishes.items()):
        if pid != p.pid:
            continue
        vhost = p.channel.vhost
        for key, n_id, names in _sends(p):
            if n_id != node or key not in p.waiting:
                continue
            if all((vhost, n) in ql.leaders for n in names):
                p.waiting.discard(key)
                for n in names:
                    ql.parked.setdefault((vhost, n), []).append(p)
                    p.waiting.add(("parked", n))
                handled.add(pid)
    return handled


def park(broker: Any, p: PendingPublish, vhost: str, names: list[str]) -> bool:
    """``p`` is for ``names``, whose node's link is down: if they are all quorum queues,
    wait for their leader's next announcement (a new leader, or the same one back) and return
    True; else False (the publish is nacked)."""
    ql = broker.quorum
    if not all((vhost, n) in ql.leaders for n in names):
        return False
    for n in names:
        ql.parked.setdefault((vhost, n), []).append(p)
        p.waiting.add(("parked", n))
    return True


def is_quorum(broker: Any, vhost: str, name: str) -> bool:
    return (vhost, name) in broker.quorum.leaders


def queue_type(broker: Any, vhost: str, name: str) -> str:
    """"stream", "quorum" or "classic": queue ``name``'s type as this router knows it from
    its leaders' announcements (a replicated queue not announced yet counts as classic)."""
    key = (vhost, name)
    if key in broker.quorum.streams:
        return "stream"
    return "quorum" if key in broker.quorum.leaders else "classic"


async def consume(broker: Any, vhost: str, c: Any) -> tuple[str, Any]:
    """Register consumer ``c`` (its CONSUME in ``c.request``) at the node that serves its
    queue, asked again at the leader after MOVED (:func:`queue_request`). Returns (node id,
    the node's answer: the queue's available entries); raises as :func:`queue_request`.

    One CONSUME for ``c`` is on its way at a time (``c.registering``; issue 48: a leader
    announced while the first was on its way registered it a second time, and the node closed
    the connection with 503). A leader announced meanwhile (``c.again``) registers it again
    once answered, where the queue is led then (a stream's consumer: unless its member is
    still one, :func:`_stays`)."""
    c.registering = True
    try:
        while True:
            c.again = False
            node, payload = await _ask_reader(broker, vhost, c)
            c.node_id = node
            if c.target.cancelled:
                _forget_at(broker, node, c)
                return node, payload
            if not c.again or _stays(broker, vhost, c.queue, node):
                return node, payload
            leader = broker.quorum.leader(vhost, c.queue)
            if leader is not None and leader != node:
                _forget_at(broker, node, c)
    finally:
        c.registering = False


def read_node(broker: Any, vhost: str, name: str, cid: int, avoid: str | None = None
              ) -> str | None:
    """The member a consumer (router consumer id ``cid``) of replicated stream ``name``
    reads from (node/streams/readers.py): one whose node this router reaches, other than
    ``avoid``, a member that does not lead first (RabbitMQ's stream clients prefer
    replicas, which leaves the leader its publishes), spread by ``cid``; the leader when no
    other is reachable; None when no member is, or ``name`` is not a known stream."""
    ql: QuorumLeaders = broker.quorum
    entry = ql.leaders.get((vhost, name))
    if entry is None or (vhost, name) not in ql.streams:
        return None
    leader, members = entry[0], entry[2]
    up = [n for n in members if n != avoid and n in broker.links and broker.links[n].up]
    pool = [n for n in up if n != leader] or up
    return pool[cid % len(pool)] if pool else None


def _stays(broker: Any, vhost: str, name: str, node: str | None) -> bool:
    """A consumer of replicated stream ``name`` registered at ``node`` stays there: ``node``
    is still a member, and this router reaches it."""
    entry = broker.quorum.leaders.get((vhost, name))
    return entry is not None and (vhost, name) in broker.quorum.streams and \
        node in entry[2] and node in broker.links and broker.links[node].up


async def _ask_reader(broker: Any, vhost: str, c: Any) -> tuple[str, Any]:
    """Consumer ``c``'s CONSUME: at the member :func:`read_node` chooses for a replicated
    stream (at the leader, :func:`queue_request`, when that member has no such stream yet
    (404) or is down); else at the node that serves the queue."""
    node = read_node(broker, vhost, c.queue, c.consumer_id)
    if node is not None and node != broker.quorum.leader(vhost, c.queue):
        try:
            return node, await broker.links[node].request(c.request)
        except AMQPError as err:    # NodeDown too
            if not isinstance(err, NodeDown) and err.reply_code not in (NOT_FOUND, wire.MOVED):
                raise
            log.info("consumer %s of stream '%s' reads from its leader: member %s: %s",
                     c.target.tag, c.queue, node, err)
    return await queue_request(broker, vhost, c.queue, c.request)


def _forget_at(broker: Any, node: str, c: Any) -> None:
    """``node`` forgets consumer ``c`` (CANCEL without an answer; unknown there: a no-op)."""
    link = broker.links.get(node)
    if link is not None and link.up:
        link.send([T.CANCEL, 0, c.consumer_id])


def _move_consumers(broker: Any, vhost: str, name: str, node: str) -> None:
    """Register the queue's consumers with its new leader ``node``, under the same ids (a
    replicated stream's: those whose member left, at another, :func:`read_node`). One
    whose CONSUME is on its way is not sent another: it is registered again once answered
    (``again``), where the queue is led then."""
    stream = (vhost, name) in broker.quorum.streams
    for ch, c in list(broker.consumers.values()):
        if c.queue != name or c.target.vhost != vhost or c.target.cancelled or \
                c.request is None:
            continue
        if stream and not c.registering and _stays(broker, vhost, name, c.node_id):
            continue
        if c.registering:
            c.again = True
            continue
        _retarget_consumer(broker, ch, c, read_node(broker, vhost, name, c.consumer_id)
                           or node if stream else node)
        c.registering = True
        asyncio.ensure_future(_register(broker, ch, c))


def _retarget_consumer(broker: Any, ch: Any, c: Any, node: str) -> None:
    """Consumer ``c`` is to be registered at ``node``: the node it leaves forgets it, and
    its deliveries from there are settled as no-ops (that node released them: the new leader
    delivers them again, redelivered). Its credit starts again from 0, as the node's does
    when the same consumer is registered again (node/messages.py ``on_consume``)."""
    old = c.node_id
    if old != node:
        _forget_at(broker, old, c)
        for d in ch.unacked.values():
            if d.consumer is c:
                d.node_id = None
    if c.stream and c.last_header is not None and c.request is not None:
        off = stream_offset(c.last_header)
        if off is not None:         # a stream's consumer goes on after its last delivery
            args = dict(c.request[7] or {})
            args["x-stream-offset"] = off + 1
            c.request = [*c.request[:7], args, *c.request[8:]]
    c.node_id = node
    c.granted = 0
    c.draining = c.has_work = c.interest_sent = False


_OFFSET_KEY = b"\x0fx-stream-offsetl"


def stream_offset(header: bytes) -> int | None:
    """The ``x-stream-offset`` header (a long, as every stream delivery carries it:
    node/streams/hosting.py) of a delivery's content header, or None."""
    at = header.rfind(_OFFSET_KEY)
    if at < 0 or at + len(_OFFSET_KEY) + 8 > len(header):
        return None
    return int.from_bytes(header[at + len(_OFFSET_KEY):at + len(_OFFSET_KEY) + 8], "big",
                          signed=True)


def _follow_leader(broker: Any, ch: Any, c: Any) -> None:
    """After a failed registration: at the leader, or a stream's next member to read."""
    vhost = c.target.vhost
    target = read_node(broker, vhost, c.queue, c.consumer_id, avoid=c.node_id) or \
        broker.quorum.leader(vhost, c.queue)
    if target is not None:
        _retarget_consumer(broker, ch, c, target)


def readers_lost(broker: Any, node: str) -> None:
    """``node`` was lost: replicated streams' consumers that read there move to another
    member (or wait for one, :func:`_register`)."""
    ql: QuorumLeaders = broker.quorum
    for ch, c in list(broker.consumers.values()):
        if c.node_id != node or (c.target.vhost, c.queue) not in ql.streams or \
                c.target.cancelled or c.request is None:
            continue
        if c.registering:
            c.again = True
            continue
        _follow_leader(broker, ch, c)
        c.registering = True
        asyncio.ensure_future(_register(broker, ch, c))


async def _register(broker: Any, ch: Any, c: Any) -> None:
    """Register consumer ``c`` again at ``c.node_id``, its queue's leader; while that fails
    (MOVED: it does not lead yet; its node is down), ask again at each leader announcement
    and at least once a second, following the leader, until the consumer ends. An
    announcement while a CONSUME is on its way (``c.again``) registers it again where the
    queue is led then. ``c`` is granted no credit meanwhile (``c.registering``)."""
    vhost = c.target.vhost
    try:
        while True:
            if c.target.cancelled or ch.closed:
                return
            c.again = False
            node = c.node_id
            link = broker.links.get(node)
            if link is None:
                return
            try:
                available = await link.request(c.request)
            except Exception as exc:  # noqa: BLE001 - MOVED, node down: ask again
                log.info("consumer %s on quorum queue '%s' waits for its leader: %s",
                         c.target.tag, c.queue, exc)
                if c.target.cancelled or ch.closed:
                    return
                leader = broker.quorum.leader(vhost, c.queue)
                if (vhost, c.queue) in broker.quorum.streams and leader not in (None, node) \
                        and isinstance(exc, AMQPError) and exc.reply_code == wire.MOVED:
                    # a stream's member behind its leader, for an offset past its end
                    # (node/streams/hosting.py consume): the leader holds it
                    _retarget_consumer(broker, ch, c, leader)
                    continue
                if not c.again:
                    await broker.quorum.changed(vhost, c.queue, 1.0)
                _follow_leader(broker, ch, c)
                continue
            if c.target.cancelled or ch.closed:
                _forget_at(broker, node, c)
                return
            if not c.again or _stays(broker, vhost, c.queue, node):
                break
            _follow_leader(broker, ch, c)
    finally:
        c.registering = False
    if type(available) is int and available > 0:
        c.has_work = True
    broker.replenish(ch, c.target)
    broker.mark_dirty(ch.client)


async def queue_request(broker: Any, vhost: str, name: str, msg: list
                        ) -> tuple[str, Any]:
    """Send a request about queue ``name`` to the node that serves it. A quorum queue's
    request goes again to its leader, once one is known (up to LEADER_WAIT_S s in all), when
    the member asked does not lead it (MOVED) or its node is down (a failover: as RabbitMQ's
    quorum queue client, which sends a command again to the next leader, the request may then
    be performed twice, e.g. a get whose answer was lost with the node). Returns (node id,
    REPLY payload). Raises AMQPError: the node's; when no leader came, 404 (no leader) or
    NodeDown (its last leader's node is down); 404 with RabbitMQ's "home node ... is down or
    inaccessible" for a classic queue's node down (after waiting once, up to
    ``link_heartbeat_timeout``, for a node this router has not reached since it started)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LEADER_WAIT_S
    waited = False
    while True:
        link = broker.queue_link(vhost, name)
        try:
            return link.node_id, await link.request(msg)
        except NodeDown as down:
            if not is_quorum(broker, vhost, name):
                if link.incarnation is None and not waited:
                    # a node this router has not reached yet (it just started, or the
                    # cluster is forming): not down; wait for it once, as a declare does
                    # (router/node_events.py await_unseen). A quorum queue's leader is
                    # often announced meanwhile, and the queue then goes there.
                    waited = True
                    await broker.await_unseen(link.node_id)
                    continue
                raise home_down(link.node_id, vhost, name) from None
            last: AMQPError = down
        except AMQPError as err:
            if err.reply_code != wire.MOVED:
                raise
            last = soft_error(NOT_FOUND, f"queue '{name}' in vhost '{vhost}' has no leader: "
                                         f"a majority of its members is not reachable")
        left = deadline - loop.time()
        if left <= 0:
            raise last
        if broker.quorum.leader(vhost, name) in (None, link.node_id):
            await broker.quorum.changed(vhost, name, min(left, 1.0))
