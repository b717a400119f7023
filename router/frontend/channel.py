"""One AMQP channel on the router: its methods, delivery tags, qos and publisher confirms.

Methods that need a node's answer (declares, binds, consume, get, ...) run as tasks; while one
runs, later frames of the same channel wait in a backlog so that a channel's methods take effect
in the order the client sent them (AMQP 0-9-1 spec 2.3.5.2 "Channels"). Publishes and acks are
handled inline on the hot path when nothing waits. The methods of the exchange and queue
classes are in :mod:`.topology_methods`, those of the tx class and what a transactional channel
holds back in :mod:`.transactions`.
"""
from __future__ import annotations

import asyncio
import datetime
import logging
import re
import secrets
from collections import deque
from typing import Any

from pamqp import commands as C

from shoal.shared import wire
from shoal.shared.errors import (ACCESS_REFUSED, INTERNAL_ERROR, NO_ROUTE, NOT_ALLOWED,
                                 NOT_FOUND, NOT_IMPLEMENTED, PRECONDITION_FAILED, AMQPError, InjectedFault,
                                 hard_error, injected_faults, soft_error)
from shoal.shared.wire import T, TAG_SETTLE

from shoal.router import consumers as credit
from shoal.router.frontend import direct_reply, publish_rules, topology_methods, transactions
from shoal.router.access.users import READ, WRITE
from shoal.router.amqp10.whole import for_091
from shoal.router.amqp.events import MessagePublished
from shoal.router.broker import Broker
from shoal.router.consumers import Consumer, ConsumerTarget, CreditPool
from shoal.router.session import ChannelClient, Delivery
from shoal.router.frontend.topology_methods import queue_name
from shoal.router.frontend.transactions import Transaction
from shoal.router.sender_selected import header_routes

log = logging.getLogger("shoal.router.frontend.channel")


class Channel:
    """Channel ``number`` of one client connection."""

    #: whether a publish's CC and BCC headers route it (router/sender_selected.py): 0-9-1's
    SENDER_SELECTED = True
    #: the reply code of a publish whose user_id is not the connection's user
    #: (router/frontend/publish_rules.py): RabbitMQ 3.10's 406 over 0-9-1
    USER_ID_REFUSAL = PRECONDITION_FAILED

    def __init__(self, client: ChannelClient, number: int, broker: Broker) -> None:
        self.client = client
        self.broker = broker
        self.number = number
        self.vhost = client.vhost
        self.pool = CreditPool()
        self.unacked: dict[int, Delivery] = {}
        self.next_tag = 1
        self.confirm = False
        self.publish_seq = 0
        self._unconfirmed: deque[int] = deque()   # confirm seqs in publish order
        self._confirmed: dict[int, bool] = {}      # finished this turn: seq -> ack (else nack)
        self._confirm_sent: set[int] = set()       # confirmed out of order, still in the deque
        #: when its leased publishes' confirms may wait (router/lease.py), once it has one
        self.lease_pace: Any = None
        self.tx: Transaction | None = None         # tx.select: publishes/acks wait for commit
        self.last_queue = ""
        #: queues this channel is deleting -> the basic.cancel notifications held until its
        #: queue.delete-ok has gone (topology_methods.on_queue_delete; broker.server_cancel)
        self.deleting: dict[str, list[Any]] = {}
        self.reply_queue: str | None = None      # direct reply-to (direct_reply.py)
        self.closed = False
        self._busy = False
        self._backlog: deque = deque()

    # ---- dispatch --------------------------------------------------------------------------
    def handle_method(self, method: Any) -> None:
        if self._busy:
            self._backlog.append(method)
            return
        self._dispatch(method)

    def handle_publish(self, ev: Any) -> None:
        if self._busy:
            self._backlog.append(ev)
            return
        try:                # _guard, inline: once per message
            self.publish(ev)
        except AMQPError as err:
            self.client.fail(self.number, _with_method(err, ev))
        except Exception:   # noqa: BLE001 - a bug costs this connection, never the router
            self._internal_error("basic.publish")

    def _dispatch(self, item: Any) -> None:
        if isinstance(item, MessagePublished):
            self._guard(self.publish, item)
            return
        entry = _HANDLERS.get(type(item))
        if entry is None:
            entry = _HANDLERS[type(item)] = _handler_for(item)
        fn, is_async = entry
        if fn is None:
            self.client.fail(self.number, hard_error(
                NOT_IMPLEMENTED, f"method {item.name} is not implemented"))
            return
        if is_async:
            self._busy = True
            asyncio.ensure_future(self._run(fn(self, item), item))
        else:
            self._guard(fn.__get__(self), item)

    def _guard(self, fn, arg) -> None:
        try:
            fn(arg)
        except AMQPError as err:
            self.client.fail(self.number, _with_method(err, arg))
        except Exception:   # noqa: BLE001 - a bug costs this connection, never the router
            self._internal_error(getattr(arg, "name", type(arg).__name__))

    async def _run(self, coro, method: Any) -> None:
        try:
            await coro
        except AMQPError as err:
            if not self.closed:
                self.client.fail(self.number, _with_method(err, method))
        except Exception:   # noqa: BLE001 - a task must never die unseen, leaving a client
            self._internal_error(method.name)  # waiting for its -ok forever
        finally:
            self._busy = False
        while self._backlog and not self._busy and not self.closed:
            self._dispatch(self._backlog.popleft())
        self.client.flush()

    def _internal_error(self, what: str) -> None:
        """An unexpected exception while handling ``what`` (a method name): log it with its
        traceback and close the connection with 541 INTERNAL_ERROR, a connection exception
        (spec 1.2; RabbitMQ closes the connection when a channel process crashes). Called
        from an ``except`` block."""
        what = what.lower()
        log.exception("internal error handling %s on channel %d of connection %s", what,
                      self.number, self.client.owner)
        err = hard_error(INTERNAL_ERROR, f"internal error handling {what} on channel "
                                         f"{self.number}; see the broker log")
        self.client.fail(self.number, err)
        self.client.flush()

    def check_access(self, perm: str, kind: str, name: str) -> None:
        """403 ACCESS_REFUSED (soft) unless the connection's user has ``perm`` (configure,
        write, read) on the ``kind`` ("queue", "exchange") ``name`` (router/access/users.py)."""
        acc = self.client.access
        if acc is not None:
            acc.check(perm, kind, name)

    def send(self, method: Any) -> None:
        if not self.closed:
            self.client.amqp.send_method(self.number, method)

    # ---- publishing --------------------------------------------------------------------------
    def on_confirm_select(self, m: C.Confirm.Select) -> None:
        if self.tx is not None:
            raise soft_error(PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
        self.confirm = True
        if not m.nowait:
            self.send(C.Confirm.SelectOk())

    def publish(self, ev: Any, also: tuple[str, ...] = ()) -> None:
        """Route one basic.publish (spec 1.8.3.7) and forward it to the nodes of its queues.
        ``also``: more routing keys (an AMQP 1.0 message's ``x-cc``; a 0-9-1 publish's come
        from its CC and BCC headers, router/sender_selected.py).

        Raises 403 (no write permission on the exchange, or topic permission on the routing
        key; router/access/users.py), 404 (no such exchange), 403 (internal exchange), 406
        (a user_id not the connection's user, a bad expiration: router/frontend/
        publish_rules.py; a CC or BCC header that is not an array, router/sender_selected.py), 540
        (immediate=true, as RabbitMQ). Confirms: basic.ack once every target node accepted it, basic.nack if one
        failed; mandatory and unroutable: basic.return 312 NO_ROUTE before the confirm.
        """
        b = self.broker
        b.stats["received"] += 1
        if direct_reply.MARK in ev.header:     # reply_to amq.rabbitmq.reply-to: the queue
            direct_reply.rewrite(self, ev)
        seq = self.next_confirm_seq() if self.confirm else 0
        if ev.immediate:
            raise hard_error(NOT_IMPLEMENTED, "immediate=true")
        acc = self.client.access
        if acc is not None and not acc.unrestricted:   # 403 before 404, as RabbitMQ
            acc.check(WRITE, "exchange", ev.exchange)
        ex = b.topology.get(self.vhost, ev.exchange)
        if ex is None:
            raise soft_error(NOT_FOUND, f"no exchange '{ev.exchange}' in vhost '{self.vhost}'")
        if acc is not None and ex.type == "topic" and acc.topics:
            acc.check_topic(WRITE, ev.exchange, ev.routing_key)
        if ex.internal:
            raise soft_error(ACCESS_REFUSED,
                             f"cannot publish to internal exchange '{ev.exchange}'")
        header = ev.header
        if header[12] & 0x01 or header[13] & 0x10:      # expiration or user_id (inline
            publish_rules.check(header, acc, self.USER_ID_REFUSAL)   # publish_rules.announced)
        if b"CC" in header and self.SENDER_SELECTED:
            also, header = header_routes(header)
            ev.header = header
        queues = b.topology.route(self.vhost, ev.exchange, ev.routing_key,
                                  None, header, also)  # headers decoded once, if needed
        if self.tx is not None:
            self.tx.publishes.append((ev, queues))
            return
        b.publish(self, seq, ev, queues)

    def next_confirm_seq(self) -> int:
        """The confirm sequence number of the publish being handled (spec 1.8.3: from 1)."""
        self.publish_seq += 1
        self._unconfirmed.append(self.publish_seq)
        return self.publish_seq

    @property
    def unconfirmed_count(self) -> int:
        """Publishes of this channel whose confirm is not written yet."""
        return len(self._unconfirmed)

    def confirmed(self, seq: int, ack: bool) -> None:
        """Publish ``seq`` is settled (every target queue accepted it, or one failed)."""
        self._confirmed[seq] = ack
        self.broker.stats["confirmed"] += ack
        self.broker.mark_dirty(self.client)

    def returned(self, ev: Any) -> None:
        """A mandatory publish reached no queue: basic.return 312 NO_ROUTE (spec 1.8.3.9),
        sent before its confirm."""
        self.client.amqp.send_return(self.number, NO_ROUTE, "NO_ROUTE", ev.exchange,
                                     ev.routing_key, ev.header, ev.body)

    def flush_confirms(self) -> None:
        """Write this turn's confirms: the run of acks at the front of the unconfirmed
        sequence as ONE ``basic.ack multiple=true``; the rest singly (spec 1.8.3.2 confirms may
        come in any order)."""
        q, done, sent = self._unconfirmed, self._confirmed, self._confirm_sent
        top = count = 0
        while q:
            seq = q[0]
            if seq in sent:
                q.popleft()
                sent.discard(seq)
                continue
            if done.get(seq) is not True:
                break
            q.popleft()
            del done[seq]
            top, count = seq, count + 1
        amqp = self.client.amqp
        if count:
            amqp.send_confirm(self.number, top, count > 1, True)
        for seq, ack in done.items():
            amqp.send_confirm(self.number, seq, False, ack)
            sent.add(seq)
        done.clear()

    # ---- consuming ---------------------------------------------------------------------------
    def on_basic_qos(self, m: C.Basic.Qos) -> None:
        if m.prefetch_size:
            raise hard_error(NOT_IMPLEMENTED, "prefetch_size is not supported; use "
                                              "prefetch_count")
        if m.global_:
            self.pool.global_prefetch = m.prefetch_count
        else:
            self.pool.prefetch_count = m.prefetch_count
        self.send(C.Basic.QosOk())
        self.broker.replenish_channel(self)

    async def on_basic_consume(self, m: C.Basic.Consume) -> None:
        """basic.consume (spec 1.8.3.3) on one queue, or on several with the Qpid argument
        ``x-multiqueue`` (an array of queue names; the queue field is then ignored): one
        consumer tag, one stream of deliveries, one credit pool across the queues' nodes.

        Raises 403 (no read permission on a queue), 404 (a queue is missing: the channel
        closes and no part stays registered), 405/403 from the queues' nodes, 406
        (x-multiqueue is not an array of names), 530 (consumer tag reused, or the channel
        holds ``consumer_max_per_channel`` consumers; hard, as RabbitMQ).
        """
        b = self.broker
        args = dict(m.arguments or {})
        if m.no_local:  # spec 1.8.3.3: the node skips messages this connection published
            args["x-no-local"] = True
        offset = args.get("x-stream-offset")
        if isinstance(offset, datetime.datetime):   # a timestamp, not an offset (the wire
            # carries datetimes as ints): node/streams/offsets.py
            args["x-stream-offset"] = {"timestamp": int(offset.timestamp())}
        multi = args.pop("x-multiqueue", None)
        if multi is not None:
            queues = credit.multiqueue_names(multi)
        elif m.queue == direct_reply.PSEUDO_QUEUE:     # direct reply-to: the channel's own
            queues = [await direct_reply.consume_queue(self, m.no_ack)]
        else:
            queues = [queue_name(self, m.queue)]
        for q in queues:
            if q != self.reply_queue:
                self.check_access(READ, "queue", q)
        tag = m.consumer_tag or "amq.ctag-" + secrets.token_urlsafe(16)
        if tag in self.pool.targets:
            raise hard_error(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
        t = ConsumerTarget(tag, self.number, self.vhost, m.no_ack, registered=False)
        await self.consume(t, queues, m.exclusive, args,
                           [self.pool.prefetch_count, self.pool.global_prefetch])
        if self.closed or t.cancelled:
            return
        if not m.nowait:
            self.send(C.Basic.ConsumeOk(tag))
        b.replenish(self, t)

    async def consume(self, t: ConsumerTarget, queues: list[str], exclusive: bool,
                      args: dict, qos: list | None = None) -> None:
        """Register target ``t`` (a basic.consume, or an AMQP 1.0 receiving link) with the
        node of each of ``queues``; credit may flow once this returns. ``qos``: a 0-9-1
        channel's ``[consumer prefetch, global prefetch]``, which a stream checks (CONSUME,
        shared/wire.py). Raises 530 (hard) when the channel holds
        ``consumer_max_per_channel`` consumers, and whatever a node answers (404, 405, 403,
        406 and 540 from a stream; no part stays registered then)."""
        b = self.broker
        tag = t.tag
        cap = b.settings.consumer_max_per_channel
        if cap and len(self.pool.targets) >= cap:     # RabbitMQ's consumer_max_per_channel
            raise hard_error(NOT_ALLOWED, f"reached maximum ({cap}) of consumers per channel")
        for q in queues:
            link = b.queue_link(self.vhost, q)
            t.consumers.append(Consumer(b.new_consumer_id(), q, link.node_id, t))
        self.pool.targets[tag] = t  # reserve the tag while the nodes answer
        for c in t.consumers:
            b.consumers[c.consumer_id] = (self, c)
        results = await asyncio.gather(*(
            b.consume_request(c, self.vhost, [T.CONSUME, c.consumer_id, self.vhost, c.queue,
                                              tag, t.no_ack, exclusive, args,
                                              self.client.owner,
                                              *(() if qos is None else (qos,))])
            for c in t.consumers), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            self.broker.cancel_consumer(self, t)
            for err in errors:
                if isinstance(err, AMQPError):
                    raise err
            raise errors[0]
        if self.closed or t.cancelled:
            return
        credit.on_registered(t, results)

    async def on_basic_cancel(self, m: C.Basic.Cancel) -> None:
        """basic.cancel (spec 1.8.3.5): cancel-ok once every node forgot the consumer, so
        that whatever it delivered before reaches the client first."""
        t = self.pool.targets.get(m.consumer_tag)
        if t is not None:
            replies = self.broker.cancel_consumer(self, t)
            if replies:
                await asyncio.gather(*replies, return_exceptions=True)
        if not m.nowait:
            self.send(C.Basic.CancelOk(m.consumer_tag))

    async def on_basic_get(self, m: C.Basic.Get) -> None:
        queue = queue_name(self, m.queue)
        self.check_access(READ, "queue", queue)
        node, payload = await self.broker.get_request(
            self.vhost, queue, [T.GET, self.vhost, queue, m.no_ack, self.client.owner])
        link = self.broker.links[node]
        if payload is None:
            self.send(C.Basic.GetEmpty())
            return
        delivery_id, redelivered, exchange, routing_key, header, body, count = payload
        if self.closed:  # closed while the node answered: give the message back
            if not m.no_ack:
                link.send([TAG_SETTLE, wire.OUTCOME_REQUEUE, [delivery_id]])
            return
        tag = self.next_tag
        self.next_tag += 1
        if not m.no_ack:
            self.unacked[tag] = Delivery(link.node_id, delivery_id, None)
        header, body = for_091(header, body)        # an AMQP 1.0 message kept whole
        self.client.amqp.send_get_ok(self.number, tag, redelivered, exchange, routing_key,
                                     count, header, body)

    def deliver(self, c: Consumer, delivery_id: int, redelivered: bool, exchange: str,
                routing_key: str, header: bytes, body: bytes) -> None:
        """Write one basic.deliver for queue consumer ``c`` (its node acquired the message)."""
        t = c.target
        tag = self.next_tag
        self.next_tag += 1
        credit.on_delivered(self.pool, c)
        if not t.no_ack:
            self.unacked[tag] = Delivery(c.node_id, delivery_id, c)
        header, body = for_091(header, body)        # an AMQP 1.0 message kept whole
        self.client.amqp.send_deliver(self.number, t.tag, tag, redelivered, exchange,
                                      routing_key, header, body)
        pool = self.pool
        if t.no_ack or not (pool.prefetch_count or pool.global_prefetch):
            self.broker.replenish(self, t)      # standing credit: used up by deliveries

    # ---- settlement --------------------------------------------------------------------------
    def _take(self, delivery_tag: int, multiple: bool) -> list[tuple[int, Delivery]]:
        if multiple:
            if delivery_tag == 0:
                tags = list(self.unacked)
            else:
                if delivery_tag not in self.unacked:
                    raise soft_error(PRECONDITION_FAILED, f"unknown delivery tag {delivery_tag}")
                tags = []
                for t in self.unacked:
                    if t > delivery_tag:
                        break
                    tags.append(t)
        else:
            if delivery_tag not in self.unacked:
                raise soft_error(PRECONDITION_FAILED, f"unknown delivery tag {delivery_tag}")
            tags = [delivery_tag]
        return [(t, self.unacked.pop(t)) for t in tags]

    def settle(self, deliveries: list[tuple[int, Delivery]], outcome: int,
               annotations: bytes = b"") -> None:
        """Settle ``(tag, delivery)`` pairs now, or at tx.commit on a transactional channel
        (``annotations``: see Broker.settle; AMQP 1.0 only, which has no transactions)."""
        if self.tx is not None and not self.closed:
            self.tx.settles.append((outcome, deliveries))
            return
        self.broker.settle(self, [d for _, d in deliveries], outcome, annotations)

    def on_basic_ack(self, m: C.Basic.Ack) -> None:
        self.settle(self._take(m.delivery_tag, m.multiple), wire.OUTCOME_ACK)

    def handle_acks(self, acks: list[tuple[int, bool]]) -> None:
        """A run of ``basic.ack`` (spec 1.8.3.13) read in one go, settled as ONE batch: one
        SETTLE per node and one credit top-up instead of one per ack (the hot path; design.md
        section 4). The same as :meth:`on_basic_ack` for each in turn: an unknown delivery tag
        settles the acks before it and closes the channel with 406 PRECONDITION_FAILED; the
        acks after it are dropped, as the channel is closing (spec 2.2.3). ``acks``:
        ``(delivery_tag, multiple)`` pairs (:class:`~.amqp.events.AcksReceived`)."""
        if self._busy:
            self._backlog.extend(C.Basic.Ack(tag, multiple) for tag, multiple in acks)
            return
        taken: list[tuple[int, Delivery]] = []
        try:
            for tag, multiple in acks:
                taken += self._take(tag, multiple)
        except AMQPError as err:
            if taken:
                self.settle(taken, wire.OUTCOME_ACK)
            self.client.fail(self.number, err)
            return
        self.settle(taken, wire.OUTCOME_ACK)

    def on_basic_nack(self, m: C.Basic.Nack) -> None:
        self.settle(self._take(m.delivery_tag, m.multiple),
                    wire.OUTCOME_REQUEUE if m.requeue else wire.OUTCOME_REJECT)

    def on_basic_reject(self, m: C.Basic.Reject) -> None:
        self.settle(self._take(m.delivery_tag, False),
                    wire.OUTCOME_REQUEUE if m.requeue else wire.OUTCOME_REJECT)

    def on_basic_recover(self, m: Any) -> None:
        """basic.recover (spec 1.8.3.16): every unacked delivery is requeued and redelivered.
        Raises 540 NOT_IMPLEMENTED (hard) for requeue=false, as RabbitMQ 3.10 does."""
        self.on_basic_recover_async(m)
        self.send(C.Basic.RecoverOk())

    def on_basic_recover_async(self, m: Any) -> None:
        if not m.requeue:
            raise hard_error(NOT_IMPLEMENTED, "requeue=false")
        self.settle(self._take(0, True), wire.OUTCOME_REQUEUE)

    # ---- teardown ----------------------------------------------------------------------------
    def close(self) -> None:
        """The channel is gone: cancel its consumers, requeue its unacked deliveries."""
        if self.closed:
            return
        self.closed = True
        self._backlog.clear()
        for t in list(self.pool.targets.values()):
            self.broker.cancel_consumer(self, t)
        if self.tx is not None:   # uncommitted acks roll back: requeue those too
            self.tx.undo(self.unacked)
        self.settle(self._take(0, True), wire.OUTCOME_REQUEUE)


#: pamqp method class -> (handler taking the Channel first, or None; is it a coroutine function)
_HANDLERS: dict[type, tuple[Any, bool]] = {}


def _handler_for(method: Any) -> tuple[Any, bool]:
    """The handler for a pamqp method (cached by class): ``Channel.on_<class>_<method>``, or
    the function of that name in :mod:`.topology_methods` (the exchange and queue classes) or
    :mod:`.transactions` (the tx class).
    A method named in ``SHOAL_INJECT_FAULTS`` (``router:queue.purge``; tests only) gets a
    handler of the same kind that raises InjectedFault."""
    name = "on_" + _SNAKE.sub("_", method.name.replace(".", "_")).lower()  # RecoverAsync
    fn = (getattr(Channel, name, None) or getattr(topology_methods, name, None)
          or getattr(transactions, name, None))
    is_async = fn is not None and asyncio.iscoroutinefunction(fn)
    if fn is not None and method.name.lower() in _FAULTS:
        fn = _faulty_async if is_async else _faulty
    return fn, is_async


_FAULTS = injected_faults("router")
_SNAKE = re.compile(r"(?<=[a-z])(?=[A-Z])")


def _faulty(ch: Channel, m: Any) -> None:
    raise InjectedFault(f"fault injected into {m.name} (SHOAL_INJECT_FAULTS)")


async def _faulty_async(ch: Channel, m: Any) -> None:
    await asyncio.sleep(0)
    _faulty(ch, m)


def _with_method(err: AMQPError, method: Any) -> AMQPError:
    """The error, naming the failing method's class and method ids in the close (spec
    1.5.2.5) unless it names one already."""
    index = getattr(method, "index", 0)
    if not err.class_id and index:
        err.class_id, err.method_id = index >> 16, index & 0xFFFF
    return err

