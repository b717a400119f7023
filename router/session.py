"""What the broker and a channel use of the session layers above them: the Delivery and
PendingPublish records and the Protocols of a client connection and a channel.

A client connection (router/frontend/client.py) owns its channels (router/frontend/channel.py); a channel calls
on the broker (router/broker.py), which calls back into channels and connections: a delivery, a
confirm, a consumer cancelled, a node lost (design.md section 3, "Flow of a message"). Imports
only go down, client -> channel -> broker -> this module, so what a lower layer uses of a
higher one is named here as a Protocol, with exactly the members it uses.
"""
from __future__ import annotations

import asyncio
from typing import Any, Mapping, Protocol

from shoal.shared.errors import AMQPError
from shoal.shared.wire import OK

from shoal.router.access.users import VhostAccess
from shoal.router.amqp.connection import AMQPConnection
from shoal.router.consumers import Consumer, CreditPool


class Delivery:
    """An unacknowledged delivery: which node holds the message (``delivery_id`` there)."""
    __slots__ = ("node_id", "delivery_id", "consumer")

    def __init__(self, node_id: str | None, delivery_id: int, consumer: Consumer | None):
        self.node_id = node_id          # None once that node went down (settling is a no-op)
        self.delivery_id = delivery_id
        self.consumer = consumer        # the queue consumer that took it; None for basic.get


class PendingPublish:
    """A publish waiting for PUBLISH_RESULT from ``waiting`` nodes (confirms, mandatory,
    transactions: ``future`` is resolved with this object when every node answered)."""
    __slots__ = ("channel", "seq", "ev", "waiting", "routed", "failed", "future", "pid",
                 "sent", "extra")

    def __init__(self, channel: BrokerChannel, seq: int, ev: Any, waiting: set,
                 future: asyncio.Future | None = None) -> None:
        self.channel, self.seq, self.ev = channel, seq, ev
        #: node ids (and, for a quorum queue's publish sent again, its publish ids or
        #: ("parked", queue) while it waits for a leader: router/quorum.py) still to answer
        self.waiting = waiting
        self.pid = 0                    #: its publish id (the first one)
        #: what was sent: node id -> queue names; publish id -> (node id, queue names)
        self.sent: dict | None = None
        #: publish ids of sends again (router/quorum.py; a list once there is one)
        self.extra: Any = ()
        self.routed = 0
        self.failed = False
        self.future = future

    def answer(self, node_id: str, pid: int, code: int, routed: int) -> bool:
        """Take ``node_id``'s answer (PUBLISH_RESULT or PUBLISH_MOVED) to publish id ``pid``
        of this publish: ``routed`` queues took it, ``code`` not OK fails it. False, and
        nothing taken, when that answer is not awaited (an old leader's late one)."""
        key = node_id if pid == self.pid else pid
        if key not in self.waiting:
            return False
        self.routed += routed
        if code != OK:
            self.failed = True
        self.waiting.discard(key)
        return True


class BrokerChannel(Protocol):
    """What the broker uses of a channel (router/frontend/channel.py's ``Channel``)."""

    number: int
    vhost: str
    closed: bool
    pool: CreditPool
    unacked: dict[int, Delivery]
    lease_pace: Any                     #: router/lease.py's ConfirmPace, once it has one
    deleting: dict[str, list[Any]]      #: held basic.cancel per queue being deleted

    @property
    def client(self) -> BrokerClient: ...

    @property
    def unconfirmed_count(self) -> int: ...

    def send(self, method: Any) -> None: ...

    def confirmed(self, seq: int, ack: bool) -> None: ...

    def returned(self, ev: Any) -> None: ...

    def deliver(self, c: Consumer, delivery_id: int, redelivered: bool, exchange: str,
                routing_key: str, header: bytes, body: bytes) -> None: ...


class BrokerClient(Protocol):
    """What the broker uses of a client connection (router/frontend/client.py's ``ClientConnection``),
    and what the heartbeat clock and the shutdown (router/server.py) use of the connections
    the broker keeps in ``Broker.connections``."""

    owner: str
    amqp: AMQPConnection | None
    transport: asyncio.Transport | None
    capabilities: dict
    publisher: bool

    @property
    def channels(self) -> Mapping[int, BrokerChannel]: ...

    def set_reading(self, on: bool) -> None: ...

    def unblock(self) -> None: ...

    def flush(self) -> None: ...

    def tick(self, now: float) -> float | None:
        """The heartbeat clock at ``now`` (monotonic s); returns the seconds within which this
        connection needs the next tick, or None (router/frontend/client.py heartbeat_loop)."""
        ...

    def shutdown(self, code: int, text: str) -> None: ...


class ChannelClient(BrokerClient, Protocol):
    """What a channel uses of its client connection besides what the broker uses (a channel
    hands itself, and so its connection, to the broker)."""

    vhost: str
    exclusive_queues: set[str]
    access: VhostAccess | None   #: the user's permissions in ``vhost`` (router/access/users.py)

    def fail(self, channel: int, err: AMQPError) -> None: ...
