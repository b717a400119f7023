"""The queue's side of one consumer: :class:`QueueConsumer` (seed 002 "QueueConsumer").

A consumer lives in one router (``peer``) and pulls from one queue. The router turns
``basic.qos`` into ``credit``: the number of deliveries the node may still send it
(wire CREDIT). ``pointer`` is the seed-000 "last seen entry": the consumer walks forward from it
past entries that are acquired, dead or of no interest.
"""
from __future__ import annotations

from enum import IntEnum
from typing import Any


class ConsumerListState(IntEnum):
    """Which QueueConsumerManager list a consumer is in (besides ``All``), seed 002."""

    DETACHED = 0        # not registered with a queue
    NON_ACQUIRING = 1   # browsers: always notified
    NOT_INTERESTED = 2  # no credit
    INTERESTED = 3      # has credit, waits to be notified
    NOTIFIED = 4        # notified, pulling


class QueueConsumer:
    """One consumer on one queue.

    ``consumer_id``: int, unique within its router. ``peer``: the router's link state (has
    ``identity`` bytes). ``tag``: the AMQP consumer tag (str). ``credit``: deliveries still
    allowed (int >= 0). ``wants_work``: send one wire WORK when a message becomes available
    while credit is 0. ``priority``: ``x-priority`` (int, higher is served first).
    ``owner``: the consuming connection (no_local compares it with the publisher's).
    ``selector``: a compiled ``x-filter-jms-selector`` or None. ``acquires``: False for
    browsers (``x-filter-no-consume``); ``auto_close``: end the browse at the queue's end.
    ``timeout``: ``x-consumer-timeout`` ms or None. ``plain``: no filter of any kind.
    """

    __slots__ = ("consumer_id", "peer", "tag", "no_ack", "exclusive", "arguments", "priority",
                 "credit", "pointer", "wants_work", "queue", "list_state", "level", "acquires",
                 "owner", "no_local", "selector", "auto_close", "timeout", "seen", "plain")

    def __init__(self, consumer_id: int, peer: Any, tag: str = "", no_ack: bool = False,
                 exclusive: bool = False, arguments: dict | None = None,
                 priority: int = 0) -> None:
        self.consumer_id = consumer_id
        self.peer = peer
        self.tag = tag
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.arguments = arguments or {}
        self.priority = priority
        self.credit = 0
        self.pointer: Any = None          # set by Queue.add_consumer to the list head
        self.wants_work = False
        self.queue: Any = None
        self.list_state = ConsumerListState.DETACHED
        self.level: Any = None            # the QCM priority level it belongs to
        self.acquires = True              # False for browsers
        self.owner: str | None = None
        self.no_local = False
        self.selector: Any = None
        self.auto_close = False
        self.timeout: int | None = None
        self.seen: set[int] = set()       # browsers on ordered queues: entries already seen
        self.plain = True

    def configure(self, cc: Any, owner: str | None) -> None:
        """Apply checked consume arguments (node.queue_args.ConsumerConfig)."""
        self.owner = owner
        self.no_local = cc.no_local
        self.selector = cc.selector
        self.acquires = not cc.browse
        self.auto_close = cc.auto_close
        self.timeout = cc.timeout
        self.plain = not (cc.no_local or cc.selector is not None or cc.browse)

    def __repr__(self) -> str:
        return (f"QueueConsumer({self.consumer_id}, tag={self.tag!r}, credit={self.credit}, "
                f"{self.list_state.name})")
