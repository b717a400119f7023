"""The router's ConsumerTarget layer: turns basic.qos into credit granted to nodes (seed 002).

Seed 002: "The ConsumerTarget is the broker-side representation of a consuming client. Due to
multi-queue consumers a ConsumerTarget has one or more Consumers associated with one queue
each." Here a :class:`ConsumerTarget` is one ``basic.consume`` (one consumer tag, one stream of
deliveries) and each of its :class:`Consumer` objects is registered with the node that owns
its queue. A node delivers for a Consumer only while that Consumer holds *credit* there.

The invariant (AMQP 0-9-1 spec 1.8.3.13 ``basic.qos``; issues "prefetch is never exceeded"
and "credit is exact across shards"), for consumers that acknowledge:

* per target: ``target.unacked + sum(consumer.granted) <= prefetch_count`` if it is > 0;
* per channel (``global``): ``pool.unacked + sum(all granted) <= global_prefetch`` if > 0.

``granted`` is credit a node may still use, so a node can never deliver past the limit, however
deliveries from several nodes interleave. Two ways of granting:

* **standing credit** (one queue, no global limit): the router tops the consumer up as its
  deliveries are acknowledged, so a steady stream never waits a round trip (seed 002 DG4).
* **pull** (several queues, or a global limit): a Consumer first registers interest
  (``CREDIT 0``); its node answers ``WORK`` once it has a message for it (DG3: no spurious
  wake-ups); the router then grants a *drain* share of the free room (use it now, return the
  rest with ``CREDIT_DRAINED``), round-robin over the Consumers that have work (DG5 fairness),
  so unused credit flows back to where there is work. While several of a target's Consumers
  are known to have work (WORK, or a drain outstanding), none is granted past its fair share
  of the limit (``ceil(limit / those Consumers)``, counting its own unacked deliveries), and
  none gets a second grant while another's drain, granted before its last one, is still
  outstanding (turns, not only shares): a queue whose node answers fast (node-0 inside the
  router, ``--embed-node``) would otherwise take every slot the client frees while the
  others' grants are on the way, and lap a node process that a busy machine runs late. A
  consumer is so paced by its slowest queue's round trip; a node that stops answering is
  lost after ``link_heartbeat_timeout``, and the consumer with it (router/node_events.py).

A Consumer whose CONSUME is on its way to its node (``registering``: a quorum queue's
consumer following its leader, router/quorum.py) is granted nothing until the node answers:
credit that reached the node first would be dropped there, and counted as granted here.

A ``no_ack`` consumer has no prefetch limit of its own (spec 1.8.3.13); under a channel's
``global`` limit it is pulled for like the others, its grants counted against the limit while
it holds them (a drain: given back once its queue is empty) and its deliveries not (they need
no ack). So it has a delivery only while the limit is not reached, as RabbitMQ's limiter
decides for it (``rabbit_limiter:can_send``; the Java client's ``QosTests.noAckObeysLimit``),
and the channel's consumers that ack are served beside it. Otherwise unlimited prefetch (0)
and ``no_ack`` consumers get standing credit in chunks of :data:`CHUNK`, topped up below
:data:`LOW_WATER` after each delivery (Channel.deliver: a consumer that acks nothing still
gets the whole queue), and nothing while the client socket is backed up (``pool.paused``).
Lowering ``prefetch_count`` applies to credit granted afterwards; deliveries already granted
under the old value still arrive (as in RabbitMQ). A ``global`` limit set or lowered under
credit already granted takes that credit back (:func:`_reclaim`), as RabbitMQ's channel
limiter holds every consumer of the channel from its next delivery.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from shoal.shared.errors import PRECONDITION_FAILED, soft_error
from shoal.shared.wire import TAG_CREDIT

CHUNK = 512       #: credit granted at a time when no prefetch limit applies (messages)
LOW_WATER = 128   #: top up unlimited credit when less than this is left


@dataclass(slots=True, eq=False)
class Consumer:
    """One queue of a ConsumerTarget, registered at that queue's node as ``consumer_id``."""
    consumer_id: int
    queue: str
    node_id: str
    target: "ConsumerTarget"
    granted: int = 0          #: credit the node may still use
    draining: bool = False    #: a pull (drain) grant is outstanding
    has_work: bool = False    #: the node said WORK and no grant answered it yet
    interest_sent: bool = False  #: CREDIT(0) "tell me when you have work" is registered
    last_grant: int = 0       #: size of the last drain grant (to count empty pulls)
    turn: int = 0             #: its target's ``turns`` when it got its last drain grant
    unacked: int = 0          #: this queue's deliveries not yet acknowledged by the client
    stream: bool = False      #: its queue is a stream (the node's CONSUME answer says so)
    #: the CONSUME message (without req_id) that registered it: sent again to a quorum
    #: queue's new leader (router/quorum.py)
    request: list | None = None
    #: a CONSUME for it is on its way to its node: it is granted nothing until answered
    registering: bool = False
    #: its quorum queue's leader was announced meanwhile: register again once answered
    again: bool = False
    #: a stream's: the content header of its last delivery (its x-stream-offset says where
    #: to go on at a new leader: router/quorum.py)
    last_header: bytes | None = None


@dataclass(slots=True, eq=False)
class ConsumerTarget:
    """One ``basic.consume``: a consumer tag over one or more queues (``x-multiqueue``)."""
    tag: str
    channel_id: int
    vhost: str
    no_ack: bool
    consumers: list[Consumer] = field(default_factory=list)
    unacked: int = 0          #: deliveries not yet acknowledged by the client
    cancelled: bool = False
    #: Every node answered CONSUME. Until then no CREDIT may leave for the target: the link
    #: sends CREDIT ahead of queued requests, so it could reach a node before the CONSUME it
    #: belongs to, be dropped there (unknown consumer) and leave the consumer stalled.
    registered: bool = True
    rr: int = 0               #: round-robin start for pull grants (fairness)
    turns: int = 0            #: drain grants made to its consumers (their ``turn``)

    @property
    def granted(self) -> int:
        return sum(c.granted for c in self.consumers)

    @property
    def queues(self) -> list[str]:
        return [c.queue for c in self.consumers]


@dataclass(slots=True, eq=False)
class LinkTarget(ConsumerTarget):
    """An AMQP 1.0 receiving link (router/frontend/amqp10_client.py): the limit is the link
    credit the client gave (OASIS AMQP 1.0 part 2.6.7), not a prefetch count, and settling
    a delivery frees none. ``credit``: what the client's flow left, less what reached it
    (nodes' grants count against it); ``drain``: the client asked to drain; ``on_drained``
    is called with the target once every node returned its credit after a drain."""
    credit: int = 0
    drain: bool = False
    drain_sent: bool = False
    on_drained: Any = None
    #: AMQP 1.0 property filter expressions a stream's link applies (amqp10/filters.py)
    filters: Any = None
    #: the consumers a drain has yet to ask, in order (``_link_grants``)
    drain_todo: list = field(default_factory=list)
    #: pre-settled deliveries that came past the link's credit, waiting for more
    #: (router/frontend/amqp10_links.py ``deliver``)
    held: deque = field(default_factory=deque)


@dataclass(slots=True)
class CreditPool:
    """The qos state of one channel (spec 1.8.3.13)."""
    prefetch_count: int = 0     #: per consumer tag, 0 = unlimited
    global_prefetch: int = 0    #: per channel, 0 = unlimited
    unacked: int = 0            #: unacked deliveries of the channel's consumers
    paused: bool = False        #: client socket backed up: grant nothing
    targets: dict[str, ConsumerTarget] = field(default_factory=dict)  # by tag, in order
    rr: int = 0                 #: the consumer tag :func:`in_turn` starts from next

    @property
    def granted(self) -> int:
        return sum(t.granted for t in self.targets.values())


Grant = tuple[Consumer, list]  # (consumer, wire CREDIT message for its node)


def credit_messages(pool: CreditPool, t: ConsumerTarget) -> list[Grant]:
    """The CREDIT messages to send for target ``t`` now (possibly none).

    Call after anything that may free credit: an ack, a delivery to a no_ack consumer, a qos
    change, WORK, CREDIT_DRAINED, the socket draining. Never raises.
    """
    if t.cancelled or pool.paused or not t.registered:
        return []
    if type(t) is LinkTarget:
        return _link_grants(pool, t)
    if t.no_ack:        # no prefetch_count; a global limit, as RabbitMQ's limiter applies it
        limited = pool.global_prefetch > 0
    else:
        limited = pool.prefetch_count > 0 or pool.global_prefetch > 0
    if not limited:
        out = []
        for c in t.consumers:
            if c.granted < LOW_WATER and not c.registering:
                grant = CHUNK - c.granted
                c.granted += grant
                out.append((c, [TAG_CREDIT, c.consumer_id, grant, False]))
        return out
    if pool.global_prefetch == 0 and len(t.consumers) == 1:     # (not a no_ack target)
        c = t.consumers[0]
        room = pool.prefetch_count - t.unacked - c.granted
        if room > 0 and not c.registering:
            c.granted += room
            return [(c, [TAG_CREDIT, c.consumer_id, room, False])]
        return []
    return _pull(pool, t)


def in_turn(pool: CreditPool) -> list[ConsumerTarget]:
    """The channel's consumer tags in the order their credit is topped up: as declared, or,
    under a ``global`` limit, round robin from one call to the next. The limit's room then
    goes to each tag with work in turn, not always to the first (RabbitMQ's limiter serves
    the channel's consumers in turn: the Java client's QosTests.fairness and
    singleChannelAndQueueFairness, one tag per queue or two tags on one queue under
    ``global`` 1)."""
    targets = list(pool.targets.values())
    if pool.global_prefetch and len(targets) > 1:
        k = pool.rr % len(targets)
        pool.rr = k + 1
        targets = targets[k:] + targets[:k]
    return targets


def room(pool: CreditPool, t: ConsumerTarget) -> int:
    """How many more deliveries ``t`` may be granted without breaking the invariant."""
    if type(t) is LinkTarget:
        return t.credit - t.granted
    free = 1 << 62
    if pool.prefetch_count > 0 and not t.no_ack:
        free = pool.prefetch_count - t.unacked - t.granted
    if pool.global_prefetch > 0:
        free = min(free, pool.global_prefetch - pool.unacked - pool.granted)
    return free


def _pull(pool: CreditPool, t: ConsumerTarget) -> list[Grant]:
    out: list[Grant] = []
    for c in t.consumers:
        if not (c.draining or c.has_work or c.interest_sent or c.registering):
            c.interest_sent = True
            out.append((c, [TAG_CREDIT, c.consumer_id, 0, False]))
    free = room(pool, t)
    if free < 0 and pool.global_prefetch:
        return out + _reclaim(t)
    if free <= 0:
        return out
    limit = t.credit if type(t) is LinkTarget else \
        pool.global_prefetch if t.no_ack else pool.prefetch_count or pool.global_prefetch
    active = sum(1 for c in t.consumers if c.has_work or c.draining)
    fair = -(-limit // active) if active > 1 else 1 << 62
    n = len(t.consumers)
    order = t.consumers[t.rr % n:] + t.consumers[:t.rr % n]
    # A Consumer at its fair share keeps its work for a later grant, and so does one granted
    # since the oldest drain still outstanding was (one grant ahead of it at most).
    oldest = min((c.turn for c in t.consumers if c.draining), default=1 << 62)
    working = [c for c in order if c.has_work and not c.draining and not c.registering
               and c.granted + c.unacked < fair and c.turn < oldest]
    if not working:
        return out
    t.rr = (t.rr + 1) % n
    share = max(1, free // len(working))
    for c in working:
        if free <= 0:
            break
        grant = min(share, free, fair - c.granted - c.unacked)
        free -= grant
        c.granted += grant
        c.last_grant = grant
        t.turns += 1
        c.turn = t.turns
        c.draining = True
        c.has_work = False
        out.append((c, [TAG_CREDIT, c.consumer_id, grant, True]))
    return out


def _reclaim(t: ConsumerTarget) -> list[Grant]:
    """A channel's global limit set or lowered below what its consumers hold (their standing
    credit from before it, say): ask it back, a drain of 0 to each consumer holding credit
    and not draining already. Its node uses that credit on the messages it has ready then,
    as it would have anyway, and returns the rest with CREDIT_DRAINED (no later message is
    delivered on it); the pull then grants within the new limit. So the limit holds from
    the deliveries after those, as RabbitMQ's "eventually" (the Java client's QosTests).
    The limit is the channel's (spec 1.8.3.13, ``global``): RabbitMQ's limiter applies it
    to the next delivery of every consumer on the channel."""
    out: list[Grant] = []
    for c in t.consumers:
        if c.granted > 0 and not c.draining and not c.registering:
            c.draining = True
            c.last_grant = 0
            t.turns += 1
            c.turn = t.turns
            out.append((c, [TAG_CREDIT, c.consumer_id, 0, True]))
    return out


def _link_grants(pool: CreditPool, t: LinkTarget) -> list[Grant]:
    """An AMQP 1.0 link's grants: its free link credit as standing credit (one queue) or pull
    shares (several). A drain (part 2.6.7: use the credit on what is there, then give back
    the rest) goes to one queue at a time, those with work first: each gets all the credit
    left as a drain grant, and what its node gives back (CREDIT_DRAINED) goes to the next,
    so a multi-queue link empties every queue up to its credit (RabbitMQ 4 drains each
    queue in turn too), not an even split of it. A queue whose node still holds credit is
    drained with a grant of 0, to have it back. Once every queue was asked, the link's drain
    is over (``on_drained``)."""
    if t.drain:
        if any(c.draining for c in t.consumers):
            return []           # one at a time: its CREDIT_DRAINED comes first
        if not t.drain_sent:
            t.drain_sent = True
            t.drain_todo = sorted((c for c in t.consumers if not c.registering),
                                  key=lambda c: not c.has_work)
        free = max(0, t.credit - t.granted)
        while t.drain_todo:
            c = t.drain_todo.pop(0)
            if free == 0 and c.granted == 0:
                continue        # nothing to use there, nothing to give back
            c.granted += free
            c.last_grant = free
            c.draining = True
            c.has_work = False
            return [(c, [TAG_CREDIT, c.consumer_id, free, True])]
        t.drain = t.drain_sent = False
        if t.on_drained is not None:
            t.on_drained(t)
        return []
    if len(t.consumers) == 1:
        c = t.consumers[0]
        free = t.credit - t.granted
        if free > 0 and not c.registering:
            c.granted += free
            return [(c, [TAG_CREDIT, c.consumer_id, free, False])]
        return []
    return _pull(pool, t)


def on_registered(t: ConsumerTarget, available: list) -> None:
    """Every node answered CONSUME for ``t``, in ``t.consumers``' order, with its queue's
    AVAILABLE entries (None from an older node: WORK will tell; a stream answers
    ``[available, "stream"]``): credit may flow now, and each
    queue that has messages is pulled from at once, so that a multi-queue consumer starts on
    all of them together (seed 002 DG5) rather than on whichever node answers WORK first."""
    for c, n in zip(t.consumers, available):
        if type(n) is list:         # a stream's answer: [available, "stream"]
            c.stream = n[1:2] == ["stream"]
            n = n[0]
        if type(n) is int and n > 0:
            on_work(c)
    t.registered = True


def on_work(c: Consumer) -> None:
    """The node said WORK for ``c`` (its registration is used up)."""
    c.has_work = True
    c.interest_sent = False


def on_drained(c: Consumer, unused: int) -> None:
    """CREDIT_DRAINED: the node returned ``unused`` credit and holds none for ``c`` now.

    A drain that used everything may have left more work behind, so the consumer is treated as
    having work; one that returned credit found the queue empty and re-registers interest.
    """
    c.granted = 0
    c.draining = False
    c.has_work = unused == 0
    c.interest_sent = False


def on_delivered(pool: CreditPool, c: Consumer) -> None:
    """A DELIVER for ``c`` arrived: it used one credit."""
    if c.granted > 0:
        c.granted -= 1
    if not c.target.no_ack:
        c.unacked += 1
        c.target.unacked += 1
        pool.unacked += 1


def on_settled(pool: CreditPool, c: Consumer | None) -> None:
    """The client acked/nacked/rejected one of queue consumer ``c``'s deliveries (or it was
    requeued)."""
    if c is not None:
        c.unacked -= 1
        c.target.unacked -= 1
        pool.unacked -= 1


def multiqueue_names(value: Any) -> list[str]:
    """The ``x-multiqueue`` argument of basic.consume as a list of distinct queue names (order
    kept). Raises 406 PRECONDITION_FAILED when it is not a non-empty array of names."""
    if isinstance(value, (list, tuple)) and value:
        names = [v.decode() if isinstance(v, bytes) else v for v in value]
        if all(isinstance(n, str) and n for n in names):
            return list(dict.fromkeys(names))
    raise soft_error(PRECONDITION_FAILED,
                     "x-multiqueue must be a non-empty array of queue names")
