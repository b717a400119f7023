"""The router's ConsumerTarget layer: turns basic.qos into credit granted to nodes (seed 002).

A :class:`ConsumerTarget` is the broker-side representation of one ``basic.consume``. Its queue
lives on one node; the node delivers only while the consumer has *credit* there (wire CREDIT).

The invariant (AMQP 0-9-1 spec 1.8.3.13 ``basic.qos``; issue "prefetch is never exceeded"):

* per consumer: ``unacked + granted <= prefetch_count`` when ``prefetch_count > 0``;
* per channel (``global`` qos): ``channel.unacked_count + sum(granted) <= global_prefetch``.

``granted`` is credit the node may still use. Two modes (the seeds' pull model across a process
boundary):

* **standing credit** (no global limit): the router tops up each consumer's credit as its
  deliveries are acknowledged; a steady stream never waits a round trip (seed 002 DG4).
* **pull** (a global limit is set): the pool is shared, so a consumer gets credit only after its
  node says it has WORK; the grant is a *drain* (use it now, return the rest with
  CREDIT_DRAINED), so unused credit flows back to where there is work.

Unlimited prefetch (0) and ``no_ack`` consumers get standing credit in chunks of
:data:`CHUNK`, topped up below :data:`LOW_WATER`, paused while the client's socket is backed up.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from shoal.shared.wire import T

CHUNK = 512       #: credit granted at a time when no prefetch limit applies (messages)
LOW_WATER = 128   #: top up unlimited credit when less than this is left


@dataclass(slots=True, eq=False)
class ConsumerTarget:
    """One consumer: where its queue is and how much credit it holds there."""
    consumer_id: int
    tag: str
    channel_id: int
    vhost: str
    queue: str
    node_id: str
    no_ack: bool
    unacked: int = 0       #: deliveries not yet acknowledged by the client
    granted: int = 0       #: credit the node may still use
    draining: bool = False  #: a pull (drain) grant is outstanding
    has_work: bool = False  #: the node said WORK and no grant answered it yet
    cancelled: bool = False
    interest_sent: bool = False  #: CREDIT(0) "tell me when you have work" is registered


@dataclass(slots=True)
class CreditPool:
    """The qos state of one channel (spec 1.8.3.13)."""
    prefetch_count: int = 0     #: per consumer, 0 = unlimited
    global_prefetch: int = 0    #: per channel, 0 = unlimited
    unacked: int = 0            #: unacked deliveries of the channel from consumers
    paused: bool = False        #: client socket backed up: grant nothing
    consumers: dict[str, ConsumerTarget] = field(default_factory=dict)  # by tag, in order

    @property
    def granted(self) -> int:
        return sum(c.granted for c in self.consumers.values())


def credit_messages(pool: CreditPool, c: ConsumerTarget) -> list[list]:
    """Wire CREDIT messages to send for consumer ``c`` now (possibly none).

    Call after anything that may free credit: an ack, a delivery to a no_ack consumer, a qos
    change, WORK, CREDIT_DRAINED, the socket draining. Never raises.
    """
    if c.cancelled or pool.paused:
        return []
    if pool.global_prefetch > 0 and not c.no_ack:
        return _pull(pool, c)
    if c.no_ack or pool.prefetch_count == 0:
        if c.granted < LOW_WATER:
            grant = CHUNK - c.granted
            c.granted += grant
            return [[T.CREDIT, c.consumer_id, grant, False]]
        return []
    room = pool.prefetch_count - c.unacked - c.granted
    if room > 0:
        c.granted += room
        return [[T.CREDIT, c.consumer_id, room, False]]
    return []


def _pull(pool: CreditPool, c: ConsumerTarget) -> list[list]:
    if c.draining:
        return []
    if not c.has_work:
        if c.interest_sent:
            return []
        c.interest_sent = True
        return [[T.CREDIT, c.consumer_id, 0, False]]
    room = pool.global_prefetch - pool.unacked - pool.granted
    if pool.prefetch_count > 0:
        room = min(room, pool.prefetch_count - c.unacked - c.granted)
    if room <= 0:
        return []
    c.granted += room
    c.draining = True
    c.has_work = False
    return [[T.CREDIT, c.consumer_id, room, True]]


def on_work(c: ConsumerTarget) -> None:
    """The node said WORK for ``c`` (its registration is used up)."""
    c.has_work = True
    c.interest_sent = False


def on_drained(c: ConsumerTarget, unused: int) -> None:
    """CREDIT_DRAINED: the node returned ``unused`` credit and holds none for ``c`` now.

    A drain that used everything may have left more work behind, so the consumer is treated as
    having work; one that returned credit found the queue empty and re-registers interest.
    """
    c.granted = 0
    c.draining = False
    c.has_work = unused == 0
    c.interest_sent = False


def on_delivered(pool: CreditPool, c: ConsumerTarget) -> None:
    """A DELIVER for ``c`` arrived: it used one credit."""
    if c.granted > 0:
        c.granted -= 1
    if not c.no_ack:
        c.unacked += 1
        pool.unacked += 1


def on_settled(pool: CreditPool, c: ConsumerTarget | None) -> None:
    """The client acked/nacked/rejected one of ``c``'s deliveries (or it was requeued)."""
    if c is not None:
        c.unacked -= 1
        pool.unacked -= 1
