"""The queue requests of a shard (AMQP 0-9-1 spec 1.7.2, with RabbitMQ 3.10's checks and texts):
QUEUE_DECLARE, QUEUE_DELETE, QUEUE_PURGE and CONNECTION_CLOSED, each a function
``on_x(shard, peer, msg)`` that :meth:`Shard.handle <shoal.node.shard.Shard.handle>` calls from
its dispatch table with the message checked for shape, as node/messages.py's handlers are.

Shape: a request's handler returns the REPLY payload (``[name, message_count,
consumer_count]``, ``[message_count]``, ``[purged]``); CONNECTION_CLOSED returns nothing.
Errors raise :class:`~shoal.shared.errors.AMQPError` (the shard turns it into a REPLY), soft
(channel) errors with RabbitMQ's wording (``rabbit_amqqueue``'s ``check_exclusive_access``,
``rabbit_misc:assert_args_equivalence``):

- 404 NOT_FOUND: a passive declare or a purge of a missing queue ("no queue 'q' in vhost '/'");
- 405 RESOURCE_LOCKED: another connection's exclusive queue, or a redeclare whose exclusivity
  differs from the original declaration's (RabbitMQ's strict check, made before the 406s);
- 406 PRECONDITION_FAILED: a redeclare with another ``durable``, ``auto_delete`` or ``x-``
  argument (node/topology.py's ``check_equivalent``), a delete with ``if_unused`` of a queue
  with consumers or ``if_empty`` of one with messages.

Exclusive queues belong to one connection (``owner``, prefixed "router_id/"); they go when it
closes (CONNECTION_CLOSED) or when its router does (the shard's ``_forget``). Making, keeping
and deleting queues (and journaling them) is the shard's: these functions use what
:class:`QueueHost` names of it.
"""
from __future__ import annotations

from typing import Any, Protocol

from shoal.shared.errors import (NOT_FOUND, NOT_IMPLEMENTED, PRECONDITION_FAILED,
                                 RESOURCE_LOCKED, hard_error, soft_error)

from shoal.node.durability.durable import DurableLog
from shoal.node.peers import DEFERRED, RouterPeer
from shoal.node.queues.args import QueueConfig, parse_queue_arguments
from shoal.node.replication import requests as replication
from shoal.node.queues.queue import Queue
from shoal.node.topology import check_equivalent


class QueueHost(Protocol):
    """What the queue requests use of the shard (node/shard.py's ``Shard``)."""

    queues: dict[tuple[str, str], Queue]
    durable: DurableLog | None
    settings: Any
    #: the quorum queues (node/replication/manager.py's Replication), or None
    replication: Any
    #: the streams (node/streams/hosting.py's Streams)
    streams: Any

    def new_queue(self, vhost: str, name: str, durable: bool, auto_delete: bool,
                  exclusive_owner: str | None, arguments: dict | None,
                  config: QueueConfig) -> Queue: ...

    def queue_for(self, vhost: str, name: str, owner: str | None) -> Queue: ...

    def delete_queue(self, q: Queue) -> None: ...

    def queue_added(self, q: Any) -> None: ...

    def queue_removed(self, vhost: str, name: str) -> None: ...


def check_owner(q: Queue, owner: str | None) -> None:
    """405 unless ``q`` is not exclusive or is ``owner``'s."""
    if q.exclusive_owner is not None and owner != q.exclusive_owner:
        raise soft_error(RESOURCE_LOCKED, f"cannot obtain exclusive access to locked queue "
                                          f"'{q.name}' in vhost '{q.vhost}'")


#: the queue arguments a redeclare must repeat: RabbitMQ 3.10's (rabbit_amqqueue
#: ``declare_args`` and the queue types' ``queue_arguments``: x-delivery-limit) and Shoal's
#: own x- ones; RabbitMQ compares no other, so an application's own ``x-custom`` may differ
COMPARED_ARGUMENTS = frozenset((
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
    "x-dead-letter-strategy", "x-max-length", "x-max-length-bytes", "x-max-in-memory-length",
    "x-max-in-memory-bytes", "x-max-priority", "x-overflow", "x-queue-mode", "x-queue-version",
    "x-single-active-consumer", "x-queue-type", "x-quorum-initial-group-size", "x-max-age",
    "x-stream-max-segment-size-bytes", "x-initial-cluster-size", "x-queue-leader-locator",
    "x-delivery-limit", "x-qpid-priorities", "x-qpid-maximum-delivery-count"))


def check_equivalent_queue(q: Any, durable: bool, auto_delete: bool, args: dict) -> None:
    """406 "inequivalent arg" as RabbitMQ: durable, auto_delete, the
    :data:`COMPARED_ARGUMENTS` (by type class and value: node/topology.py); exclusive is
    checked before (405)."""
    checks = [("durable", durable, q.durable), ("auto_delete", auto_delete, q.auto_delete)]
    keys = sorted(k for k in set(args) | set(q.arguments) if k in COMPARED_ARGUMENTS)
    checks += [(k, args.get(k), q.arguments.get(k)) for k in keys]
    check_equivalent("queue", q.vhost, q.name, checks)


def on_queue_declare(shard: QueueHost, state: RouterPeer, msg: list) -> list:
    """QUEUE_DECLARE (spec 1.7.2.1) -> [name, message_count, consumer_count]. Raises 404
    (passive, missing), 405 (exclusive to another owner; redeclared with another
    exclusivity, as RabbitMQ 3.10), 406 (inequivalent durable, auto_delete, x- args; bad
    arguments: node/queues/args.py)."""
    _, req_id, vhost, name, passive, durable, exclusive, auto_delete, args, owner = msg
    q = shard.queues.get((vhost, name))
    if q is None:
        plain_durable = bool(durable and not exclusive and not auto_delete)
        default_stream = shard.settings.default_queue_type == "stream" and \
            "x-queue-type" not in (args or {})
        s = shard.streams.streams.get((vhost, name))
        if s is not None:
            if not passive:
                if default_stream:      # the type it has (as quorum queues, below)
                    args = {**(args or {}), "x-queue-type": "stream"}
                check_equivalent_queue(s, bool(durable), bool(auto_delete), args or {})
            if s.replica is not None:   # tell the router where it is led
                shard.streams.members.announce(s.replica, state.identity)
            return [name, s.message_count, s.consumer_count]
        if passive:
            raise soft_error(NOT_FOUND, f"no queue '{name}' in vhost '{vhost}'")
        args = args or {}
        if default_stream and plain_durable:
            args = {**args, "x-queue-type": "stream"}
        if args.get("x-queue-type") == "stream":       # node/streams/hosting.py
            reply = replication.declare_answer(shard.replication, state.identity, req_id, name)

            def answer(moved: bool = False) -> None:    # once a leader is known (or, after
                made = shard.streams.streams.get((vhost, name))     # waiting for the other
                if not moved and made is not None and made.replica is None:    # nodes, alone)
                    shard.queue_added(made)
                reply(moved)
            s = shard.streams.declare(vhost, name, bool(durable), bool(exclusive),
                                      bool(auto_delete), args, answer)
            if s is None or s.replica is not None:  # several members: answered once one
                return DEFERRED                     # leads
            shard.queue_added(s)
            return [name, 0, 0]
        if is_quorum(shard, args, plain_durable):
            if "x-queue-type" not in args:
                args = {**args, "x-queue-type": "quorum"}
            replication.declare(shard.replication, state.identity, req_id, vhost, name, bool(durable),
                                      bool(exclusive), bool(auto_delete), args)
            return DEFERRED
        cfg = parse_queue_arguments(vhost, name, args)
        q = shard.new_queue(vhost, name, bool(durable), bool(auto_delete),
                            owner if exclusive else None, args, cfg)
        shard.queues[(vhost, name)] = q
        if durable and not exclusive and shard.durable is not None:
            shard.durable.declare_queue(q)
        shard.queue_added(q)
        return [name, 0, 0]
    if q.replica is not None:
        shard.replication.announce(q.replica, state.identity)
    if not passive and "x-queue-type" not in (args or {}) and \
            shard.settings.default_queue_type == "quorum" and "x-queue-type" in q.arguments:
        # with a default type, a redeclare that names none means the queue's own (RabbitMQ
        # 3.11+); without one, RabbitMQ 3.10's strict check holds (406 inequivalent arg)
        args = {**(args or {}), "x-queue-type": q.arguments["x-queue-type"]}
    elif not passive and "x-queue-type" not in q.arguments and (args or {}).get(
            "x-queue-type") == ("quorum" if q.replica is not None else "classic"):
        # a vhost's default type named by the router (router/broker.py with_default_type)
        # for a queue declared without one: the type it has
        args = {k: v for k, v in args.items() if k != "x-queue-type"}
    if passive:
        check_owner(q, owner)
        if q.replica is None:
            q.touch()   # RabbitMQ's stat (ensure_expiry_timer): a passive declare is a use too
    else:
        # RabbitMQ's strict check_exclusive_access: the redeclare's exclusivity must match
        # (same owner, or non-exclusive on both sides), else 405, before the 406 checks.
        if q.exclusive_owner != (owner if exclusive else None):
            raise soft_error(RESOURCE_LOCKED, f"cannot obtain exclusive access to locked "
                             f"queue '{name}' in vhost '{vhost}'. It could be originally "
                             f"declared on another connection or the exclusive property "
                             f"value does not match that of the original declaration.")
        if q.replica is None:
            q.touch()   # a redeclare is a use (x-expires); none is on a quorum queue
            # (rabbit_fifo counts gets and consumers only)
        check_equivalent_queue(q, bool(durable), bool(auto_delete), args or {})
    return [name, q.message_count, q.consumer_count]


def on_queue_delete(shard: QueueHost, state: RouterPeer, msg: list) -> list:
    """QUEUE_DELETE (spec 1.7.2.9) -> [message_count]. Missing: [0]. Raises 405, 406."""
    _, req_id, vhost, name, if_unused, if_empty, owner = msg
    q = shard.queues.get((vhost, name))
    if q is None:
        s = shard.streams.streams.get((vhost, name))
        if s is None:
            return [0]
        if if_unused and s.consumer_count:
            raise soft_error(PRECONDITION_FAILED, f"queue '{name}' in vhost '{vhost}' in use")
        if if_empty and s.message_count:
            raise soft_error(PRECONDITION_FAILED,
                             f"queue '{name}' in vhost '{vhost}' is not empty")
        count = shard.streams.delete(s)
        shard.queue_removed(vhost, name)
        return [count]
    check_owner(q, owner)
    g = q.replica
    if g is not None and not g.leading:
        replication.moved(shard.replication, state.identity, req_id, g)
        return DEFERRED
    if if_unused and q.consumer_count:
        raise soft_error(PRECONDITION_FAILED, f"queue '{name}' in vhost '{vhost}' in use")
    if if_empty and q.message_count:
        raise soft_error(PRECONDITION_FAILED,
                         f"queue '{name}' in vhost '{vhost}' is not empty")
    if g is not None:
        replication.delete(shard.replication, state.identity, req_id, g)
        return DEFERRED
    count = q.message_count
    shard.delete_queue(q)
    return [count]


def on_queue_purge(shard: QueueHost, state: RouterPeer, msg: list) -> list:
    """QUEUE_PURGE (spec 1.7.2.7) -> [purged count]. Raises 404, 405."""
    _, req_id, vhost, name, owner = msg
    if (vhost, name) in shard.streams.streams:      # rabbit_channel.erl's text
        raise hard_error(NOT_IMPLEMENTED, f"queue.purge not supported by stream queues "
                                          f"queue '{name}' in vhost '{vhost}'")
    q = shard.queue_for(vhost, name, owner)
    if q.replica is not None:
        if q.replica.leading:
            replication.purge(shard.replication, state.identity, req_id, q.replica)
        else:
            replication.moved(shard.replication, state.identity, req_id, q.replica)
        return DEFERRED
    return [q.purge()]


def is_quorum(shard: QueueHost, args: dict, plain_durable: bool) -> bool:
    """Whether a new queue with declare ``args`` is a quorum queue: ``x-queue-type: quorum``
    (a non-durable, exclusive or auto-delete one is then refused, 406), or no
    ``x-queue-type``, the ``default_queue_type`` setting says quorum (RabbitMQ's setting) and
    the queue is durable, not exclusive and not auto-delete (``plain_durable``; others stay
    classic). Without replication (a node that has none) it is classic."""
    if shard.replication is None:
        return False
    qtype = args.get("x-queue-type")
    if qtype is None:
        return plain_durable and shard.settings.default_queue_type == "quorum"
    return qtype == "quorum"


def on_connection_closed(shard: QueueHost, state: RouterPeer, msg: list) -> None:
    """CONNECTION_CLOSED [owner]: the connection's exclusive queues are deleted."""
    owner = msg[1]
    for q in [q for q in shard.queues.values() if q.exclusive_owner == owner]:
        shard.delete_queue(q)
