"""An AMQP 1.0 session as the broker sees it: a :class:`LinkChannel`, the Channel subclass whose
links publish and consume (docs/amqp10.md).

The broker talks to channels (router/session.py's BrokerChannel); a 1.0 session is one, so
publishing, routing, confirms, consuming, credit and settlement are the 0-9-1 channel's own
code. What differs is the protocol's side, here:

* a client's sending link publishes: an unsettled transfer is confirmed (settled
  ``accepted``) once its queues' nodes have it, ``released`` when it reached no queue
  (RabbitMQ 4), ``rejected`` when a node refused it; a pre-settled one is fire-and-forget;
* a client's receiving link consumes through a :class:`~shoal.router.consumers.LinkTarget`:
  its link credit is the node consumers' credit (OASIS AMQP 1.0 part 2.6.7), drain included;
* outcomes (part 3.4) settle deliveries: accepted = ack, released = requeue not counted as a
  delivery attempt, rejected = reject (dead-letter), modified with delivery-failed = requeue
  counted toward the queue's delivery limit.
"""
from __future__ import annotations

import logging
import secrets
from typing import Any

from pamqp import commands as C

from shoal.shared import wire
from shoal.shared.errors import ACCESS_REFUSED, AMQPError

from shoal.router import consumers as credit, dead_letters
from shoal.router.amqp.events import MessagePublished
from shoal.router.amqp10 import address, convert, filters, whole
from shoal.router.amqp10.codec import DecodeError, Described, Symbol, Timestamp
from shoal.router.amqp10.engine import Link
from shoal.router.amqp10.frames import (Accepted, Modified, Rejected, Released, Source, Target,
                                        error)
from shoal.router.access.users import READ, WRITE
from shoal.router.consumers import LinkTarget
from shoal.router.frontend import direct_reply, topology_methods
from shoal.router.frontend.amqp10_management import ADDRESS as MANAGEMENT, Half, ManagementNode
from shoal.router.frontend.channel import Channel
from shoal.router.session import Delivery

log = logging.getLogger("shoal.router.frontend.amqp10")

PUBLISH_CREDIT = 256        #: credit a client's sending link gets at a time (messages)
#: AMQP 0-9-1 reply code -> AMQP 1.0 error condition (part 2.8.15, 3.x plugin's choices)
CONDITIONS = {311: "amqp:link:message-size-exceeded", 312: "amqp:not-found",
              403: "amqp:unauthorized-access", 404: "amqp:not-found",
              405: "amqp:resource-locked", 406: "amqp:precondition-failed",
              506: "amqp:resource-limit-exceeded", 530: "amqp:not-allowed",
              540: "amqp:not-implemented", 541: "amqp:internal-error"}
#: the JMS selector filter's descriptor (Apache Qpid's, AMQP filters registry)
SELECTOR_FILTER = (Symbol("apache.org:selector-filter:string"), 0x0000468C00000004)
#: RabbitMQ's stream filters (rabbit_amqp_session.erl ``parse_filters``; docs/streams.md)
STREAM_OFFSET = "rabbitmq:stream-offset-spec"
STREAM_FILTER = "rabbitmq:stream-filter"
STREAM_UNFILTERED = "rabbitmq:stream-match-unfiltered"


def condition(err: AMQPError) -> str:
    return CONDITIONS.get(err.reply_code, "amqp:internal-error")


class PublishLink:
    """A client's sending link: where its messages go (None: each message's ``to``)."""
    __slots__ = ("target", "settled")

    def __init__(self, target: address.Target | None) -> None:
        self.target = target
        self.settled: list[tuple[int, Any]] = []     #: (delivery id, state) this turn


def modified_annotations(annotations: Any) -> bytes:
    """A modified outcome's message annotations (AMQP 1.0 3.4.5) as the encoded 0-9-1 field
    table nodes merge into the message (``b""``: none). Raises ValueError for a key that
    does not start with ``x-``: "all symbolic keys except those beginning with x- are
    reserved" (3.2.10; RabbitMQ 4 takes only those too)."""
    if not annotations:
        return b""
    if not isinstance(annotations, dict):
        raise ValueError("the modified outcome's message-annotations are not a map")
    for k in annotations:
        if not isinstance(k, str) or not k.startswith("x-"):
            raise ValueError(f"message annotation {k!r} of a modified outcome is reserved: "
                             f"keys start with 'x-' (AMQP 1.0 3.2.10)")
    return convert.field_table({str(k): convert.to_field(v) for k, v in annotations.items()})


class LinkChannel(Channel):
    """AMQP 1.0 session ``number`` of a client connection (router/frontend/amqp10_client.py)."""

    #: an application property named CC routes nothing: a 1.0 message's more keys are its
    #: ``x-cc`` annotation (RabbitMQ 4; :meth:`publish_message`)
    SENDER_SELECTED = False
    #: a user-id that is not the connection's user: RabbitMQ 4 detaches the link with
    #: amqp:unauthorized-access (rabbit_amqp_session ``check_user_id``), as for 403
    USER_ID_REFUSAL = ACCESS_REFUSED

    def __init__(self, client: Any, number: int, broker: Any, session: Any) -> None:
        super().__init__(client, number, broker)
        self.session = session
        self.confirm = True
        self._publishing: tuple[Link, int] | None = None   #: the transfer being published
        self._by_seq: dict[int, tuple[Link, int]] = {}
        self._returned = False
        self.links: dict[str, Link] = {}                    #: consumer tag -> receiving link
        self.dirty: set[Link] = set()                       #: links with settlements to send
        self.management: ManagementNode | None = None       #: its /management link pairs
        #: the 0-9-1 answer a topology method sent last (what the management node reads)
        self.answer: Any = None

    # ---- publishing --------------------------------------------------------------------------
    def next_confirm_seq(self) -> int:
        self.publish_seq += 1
        self._by_seq[self.publish_seq] = self._publishing
        return self.publish_seq

    def returned(self, ev: Any) -> None:
        self._returned = True       # the confirm that follows settles it released

    def confirmed(self, seq: int, ack: bool) -> None:
        link, did = self._by_seq.pop(seq, (None, 0))
        state = (Released() if self._returned else Accepted()) if ack else \
            Rejected(error("amqp:internal-error", "a queue's node could not take the message"))
        self._returned = False
        self.broker.stats["confirmed"] += ack
        if link is not None and not link.detached:
            link.context.settled.append((did, state))
            self.dirty.add(link)
            self.broker.mark_dirty(self.client)

    def flush_confirms(self) -> None:
        """Send this turn's settlements of published transfers: one disposition per run."""
        for link in self.dirty:
            by_state: dict[Any, list[int]] = {}
            states: dict[Any, Any] = {}
            for did, state in link.context.settled:
                key = type(state)
                by_state.setdefault(key, []).append(did)
                states[key] = state
            link.context.settled.clear()
            for key, ids in by_state.items():
                link.session.settle_received(link, ids, states[key])
            self._top_up(link)
        self.dirty.clear()

    def _top_up(self, link: Link) -> None:
        """More credit for a client's sending link running low, unless the broker pushes
        back (a node congested, a resource alarm)."""
        b = self.broker
        if not link.detached and link.credit < PUBLISH_CREDIT // 2 and not b.congested \
                and b.blocked_reason is None:
            link.session.give_credit(link, PUBLISH_CREDIT)

    def top_up_publishers(self) -> None:
        for link in list(self.session.links.values()):
            if isinstance(link.context, PublishLink):
                self._top_up(link)

    def publish_message(self, link: Link, delivery_id: int, settled: bool,
                        payload: bytes) -> None:
        """A whole message from a client's sending link: convert, route, publish."""
        try:
            msg = convert.to_091(payload)
        except DecodeError as exc:
            self._settle_now(link, delivery_id, settled,
                             Rejected(error("amqp:decode-error", str(exc))))
            return
        target = link.context.target
        if target is None:                       # anonymous relay: the message's "to"
            try:
                target = address.target(msg.to)
            except address.BadAddress as exc:
                self._settle_now(link, delivery_id, settled,
                                 Rejected(error("amqp:invalid-field", str(exc))))
                return
        key = target.routing_key
        if key is None:             # a v1 address without a key: the subject, else ""
            key = msg.subject or ""
        if msg.cc is None:          # RabbitMQ 4's rabbit_amqp_session: invalid-field
            self._settle_now(link, delivery_id, settled, Rejected(error(
                "amqp:invalid-field", "bad value for 'x-cc' message-annotation: it must be "
                                      "a list of strings")))
            return
        ev = MessagePublished(self.number, target.exchange, key, not settled, False,
                              msg.header, msg.body)
        self.confirm = not settled
        self._publishing = (link, delivery_id)
        try:
            self.publish(ev, msg.cc)
        except AMQPError as err:
            if not settled:
                self._by_seq.pop(self.publish_seq, None)
            self._settle_now(link, delivery_id, settled,
                             Rejected(error(condition(err), err.text)))
            # as RabbitMQ 4: a link whose target fails is detached; through the anonymous
            # relay only that message is rejected
            if err.reply_code in (403, 404) and link.context.target is not None:
                link.session.detach(link, condition(err), err.text)
        finally:
            self._publishing = None
        if settled:
            self._top_up(link)

    def _settle_now(self, link: Link, delivery_id: int, settled: bool, state: Any) -> None:
        if not settled:
            link.context.settled.append((delivery_id, state))
            self.dirty.add(link)
            self.broker.mark_dirty(self.client)

    # ---- consuming ---------------------------------------------------------------------------
    def deliver(self, c: credit.Consumer, delivery_id: int, redelivered: bool, exchange: str,
                routing_key: str, header: bytes, body: bytes) -> None:
        """One delivery for link target ``c.target``: a transfer on its link.

        Past the link's credit (the client lowered it while the nodes' grants were on their
        way, OASIS AMQP 1.0 part 2.6.7: a receiver may reduce its credit at any time) an
        unsettled delivery is released to its queue. A pre-settled one cannot be: its node
        let it go when it sent it (no_ack). It waits in ``t.held``, in order, for the
        client's next credit (:meth:`credit_changed`), and goes back to its queue if the
        link ends first (:meth:`_give_back`); so does one that arrives after its link
        detached (the node sent it before the consumer's CANCEL reached it)."""
        t = c.target
        link = self.links.get(t.tag)
        credit.on_delivered(self.pool, c)
        if t.no_ack:
            if link is None or link.detached:       # it left: its CANCEL crossed this
                dead_letters.give_back(self.broker, c, exchange, routing_key, header, body)
                return
            if link.credit <= 0 or t.held:
                t.held.append((c, redelivered, exchange, routing_key, header, body))
                return
        tag = self.next_tag
        self.next_tag += 1
        if not t.no_ack:
            self.unacked[tag] = Delivery(c.node_id, delivery_id, c)
        if link is None or link.detached or link.credit <= 0:
            # past the link's credit, or the link is gone: back to the queue
            self.settle([(tag, self.unacked.pop(tag))], wire.OUTCOME_RELEASE)
            return
        self._transfer(link, t, tag, redelivered, exchange, routing_key, header, body)

    def _transfer(self, link: Link, t: LinkTarget, tag: int, redelivered: bool, exchange: str,
                  routing_key: str, header: bytes, body: bytes) -> None:
        """Send delivery ``tag`` on ``link`` (which has credit for it)."""
        try:                                    # published over AMQP 1.0: as it was sent
            payload = whole.to_amqp10(header, body, exchange, routing_key, redelivered)
        except DecodeError:                     # a 0-9-1 publisher's: as convert.py says
            payload = None
        if payload is None:
            payload = convert.to_amqp10(header, body, exchange, routing_key, redelivered)
        if t.filters is not None and not filters.matches(t.filters, payload):
            # a stream's message this link's filter expressions leave out: settled here,
            # which gives the credit back (RabbitMQ evaluates them in its session alike)
            if not t.no_ack:
                self.settle([(tag, self.unacked.pop(tag))], wire.OUTCOME_ACK)
            else:
                self.broker.replenish(self, t)
            return
        link.session.send_message(link, payload, tag)
        t.credit = link.credit

    def _send_held(self, link: Link, t: LinkTarget) -> None:
        """The pre-settled deliveries that came past the link's credit, as far as its new
        credit goes (:meth:`deliver`)."""
        held = t.held
        while held and link.credit > 0:
            _, redelivered, exchange, routing_key, header, body = held.popleft()
            tag = self.next_tag
            self.next_tag += 1
            self._transfer(link, t, tag, redelivered, exchange, routing_key, header, body)

    def _give_back(self, t: LinkTarget) -> None:
        """The link ended with pre-settled deliveries still held (:meth:`deliver`): each goes
        back to its queue (router/dead_letters.py ``give_back``)."""
        while t.held:
            c, _, exchange, routing_key, header, body = t.held.popleft()
            dead_letters.give_back(self.broker, c, exchange, routing_key, header, body)

    def settle_deliveries(self, pairs: list, state: Any) -> None:
        """The client settled deliveries (``(delivery id, delivery tag)`` pairs) with
        ``state`` (an outcome, part 3.4)."""
        t = type(state)
        table = b""
        if t is Accepted:
            outcome = wire.OUTCOME_ACK
        elif t is Rejected:
            outcome = wire.OUTCOME_REJECT
        elif t is Modified:
            # RabbitMQ 4 (rabbit_fifo modify): undeliverable-here discards (dead-letters),
            # delivery-failed returns it counted, else uncounted; its annotations merge in
            if state.undeliverable_here:
                outcome = wire.OUTCOME_REJECT
            elif state.delivery_failed:
                outcome = wire.OUTCOME_REQUEUE
            else:
                outcome = wire.OUTCOME_RELEASE
            try:
                table = modified_annotations(state.message_annotations)
            except ValueError as exc:
                self.session.end("amqp:invalid-field", str(exc))
                return
        elif t is Released:
            outcome = wire.OUTCOME_RELEASE
        else:                   # received (not an outcome): nothing to do yet
            return
        taken = [(tag, self.unacked.pop(tag)) for _, tag in pairs if tag in self.unacked]
        if taken:
            self.settle(taken, outcome, table)

    def credit_changed(self, link: Link) -> None:
        t = link.context
        if not isinstance(t, LinkTarget):
            if isinstance(t, Half) and self.management is not None:
                self.management.credit(link)
            return
        t.credit = link.credit
        if t.held:
            self._send_held(link, t)
        if link.drain and not t.drain:
            t.drain = True
            t.drain_sent = False
        self.broker.replenish(self, t)

    def _drained(self, t: LinkTarget) -> None:
        link = self.links.get(t.tag)
        if link is not None and not link.detached:
            link.session.drained(link)
            t.credit = 0
            self.broker.mark_dirty(self.client)

    async def attach_receiver(self, link: Link) -> None:
        """A client's receiving link: consume its source (a queue, a dynamic queue, an
        exchange through a temporary queue, or ``x-multiqueue``'s queues)."""
        src = link.source if isinstance(link.source, Source) else Source()
        if src.address == MANAGEMENT:
            self.manager().attach(link, False)
            return
        try:
            queues, addr = await self._source_queues(link, src)
            for q in queues:
                self.check_access(READ, "queue", q)
            args, honoured, expressions = _consume_args(link, src)
        except address.BadAddress as exc:
            link.session.refuse_link(link, "amqp:invalid-field", str(exc))
            return
        except AMQPError as err:
            link.session.refuse_link(link, condition(err), err.text)
            return
        tag = f"amq.ctag-{secrets.token_urlsafe(12)}"
        t = LinkTarget(tag, self.number, self.vhost, link.settled_mode, registered=False,
                       credit=link.credit, on_drained=self._drained)
        link.context = t
        self.links[tag] = link
        try:
            await self.consume(t, queues, False, args)
        except AMQPError as err:
            self.links.pop(tag, None)
            link.session.refuse_link(link, condition(err), err.text)
            self.client.flush()
            return
        if link.detached or self.closed:
            self.broker.cancel_consumer(self, t)
            return
        if t.consumers and all(c.stream for c in t.consumers):
            if expressions:
                t.filters = [parsed for _, parsed in expressions]
                honoured = {**(honoured or {}), **{k: src.filter[k] for k, _ in expressions}}
            if honoured and "x-filter-jms-selector" in args:    # a stream applies none
                honoured = {k: v for k, v in honoured.items() if not (
                    isinstance(v, Described) and v.descriptor in SELECTOR_FILTER)}
        source = Source(addr, src.durable, src.expiry_policy, src.timeout, src.dynamic,
                        None, None, honoured, src.default_outcome, src.outcomes,
                        src.capabilities)
        link.session.accept_link(link, source=source)
        t.credit = link.credit
        self.broker.replenish(self, t)
        self.client.flush()

    async def _source_queues(self, link: Link, src: Source) -> tuple[list[str], str | None]:
        multi = link.properties.get(Symbol("x-multiqueue")) or link.properties.get("x-multiqueue")
        if multi is not None:
            return credit.multiqueue_names(multi), src.address
        if src.dynamic:
            if direct_reply.wants_volatile(src.capabilities):    # RabbitMQ 4.2's reply-to
                name = await direct_reply.declare(self)
            else:
                name = await self._declare("", exclusive=True, auto_delete=True)
            return [name], address.queue_address(name)
        where = address.source(src.address)
        if where.queue is None:         # v1 /exchange/X/K, /topic/K: a temporary queue
            name = await self._declare("", exclusive=True, auto_delete=True)
            await topology_methods.on_queue_bind(self, C.Queue.Bind(
                queue=name, exchange=where.exchange, routing_key=where.binding_key,
                nowait=True))
            return [name], src.address
        if where.declare:       # v1 /queue/NAME: the queue as it is, or a new durable one
            try:
                await self._declare(where.queue, passive=True)
            except AMQPError as err:
                if err.reply_code != 404:
                    raise
                await self._declare(where.queue, durable=True)
        return [where.queue], src.address

    async def _declare(self, name: str, **flags: Any) -> str:
        await topology_methods.on_queue_declare(self, C.Queue.Declare(
            queue=name, nowait=True, **flags))
        return self.last_queue

    async def attach_sender(self, link: Link) -> None:
        """A client's sending link: check its target (exchange, queue) and give credit."""
        if link.target is not None and not isinstance(link.target, Target):
            link.session.refuse_link(link, "amqp:not-implemented",
                               "transactions (coordinator links) are not supported")
            return
        tgt = link.target if isinstance(link.target, Target) else Target()
        if tgt.address == MANAGEMENT:
            self.manager().attach(link, True)
            return
        try:
            where = None if tgt.address is None else address.target(tgt.address)
            if where is not None:
                if self.broker.topology.get(self.vhost, where.exchange) is None:
                    link.session.refuse_link(link, "amqp:not-found",
                                       f"no exchange '{where.exchange}' in vhost '{self.vhost}'")
                    return
                acc = self.client.access
                if acc is not None:
                    acc.check(WRITE, "exchange", where.exchange)
                if where.queue is not None:
                    try:
                        await topology_methods.on_queue_declare(self, C.Queue.Declare(
                            queue=where.queue, passive=True, nowait=True))
                    except AMQPError as err:    # another connection's exclusive queue (a
                        if err.reply_code != 405:  # reply-to) exists, and takes messages
                            raise
        except address.BadAddress as exc:
            link.session.refuse_link(link, "amqp:invalid-field", str(exc))
            return
        except AMQPError as err:
            link.session.refuse_link(link, condition(err), err.text)
            return
        if link.detached:
            return
        link.context = PublishLink(where)
        b = self.broker
        link.session.accept_link(link, credit=0 if b.congested or b.blocked_reason is not None
                           else PUBLISH_CREDIT)
        self.client.flush()

    def manager(self) -> ManagementNode:
        """The session's management node (made at its first link pair)."""
        if self.management is None:
            self.management = ManagementNode(self)
        return self.management

    def link_detached(self, link: Link) -> None:
        """The link is gone: a consumer is cancelled and its unsettled deliveries requeued."""
        t = link.context
        if isinstance(t, Half) and self.management is not None:
            self.management.detached(link)
            return
        if isinstance(t, LinkTarget):
            self.links.pop(t.tag, None)
            self.broker.cancel_consumer(self, t)
            self._give_back(t)
            back = [(tag, d) for tag, d in self.unacked.items()
                    if d.consumer is not None and d.consumer.target is t]
            for tag, _ in back:
                del self.unacked[tag]
            if back:
                self.settle(back, wire.OUTCOME_REQUEUE)

    def close(self) -> None:
        """The session ended (or its connection): as a channel's close, and what its links
        held goes back to the queues once its consumers are cancelled (:meth:`_give_back`)."""
        targets = [t for t in self.pool.targets.values() if isinstance(t, LinkTarget)]
        super().close()
        for t in targets:
            self._give_back(t)

    def send(self, method: Any) -> None:
        """The broker cancelled a consumer (its queue deleted, its node lost): detach its
        link with amqp:resource-deleted, as RabbitMQ 4 does. Other 0-9-1 methods have no
        AMQP 1.0 form and are dropped."""
        self.answer = method
        if isinstance(method, C.Basic.Cancel) and not self.closed:
            link = self.links.pop(method.consumer_tag, None)
            if link is not None:
                link.session.detach(link, "amqp:resource-deleted",
                                          "the queue was deleted or its node is unreachable")


def _consume_args(link: Link, src: Source) -> tuple[dict, dict | None, list]:
    """basic.consume arguments from the link, the source's filters as honoured (the
    attach's answer names only those, as RabbitMQ 4's ``parse_filter``), and its property
    filter expressions (``(key, parsed)``: amqp10/filters.py; a stream's link applies them,
    and only then are they honoured). The arguments: a JMS selector
    filter (x-filter-jms-selector); RabbitMQ's stream filters ``rabbitmq:stream-offset-spec``
    (x-stream-offset: first, last, next, a duration, an offset, a timestamp in ms),
    ``rabbitmq:stream-filter`` (x-stream-filter: a string or a list of them),
    ``rabbitmq:stream-match-unfiltered`` (x-stream-match-unfiltered), described or not
    (RabbitMQ's ``amqp_filter_set_bug``; docs/streams.md); ``rabbitmq:priority``
    (x-priority)."""
    args: dict = {}
    honoured: dict | None = None
    expressions: list = []
    if isinstance(src.filter, dict):
        honoured = {}
        for key, value in src.filter.items():
            inner = value.value if isinstance(value, Described) else value
            name = value.descriptor if isinstance(value, Described) else key
            if isinstance(value, Described) and value.descriptor in SELECTOR_FILTER:
                if not isinstance(value.value, str):
                    raise address.BadAddress("the selector filter is not a string")
                args["x-filter-jms-selector"] = value.value
            elif name == STREAM_OFFSET and isinstance(inner, Timestamp):
                args["x-stream-offset"] = {"timestamp": int(inner) // 1000}
            elif name == STREAM_OFFSET and isinstance(inner, str):
                args["x-stream-offset"] = str(inner)
            elif name == STREAM_OFFSET and type(inner) is int and inner >= 0:
                args["x-stream-offset"] = inner
            elif name == STREAM_FILTER and isinstance(inner, (str, list)):
                args["x-stream-filter"] = str(inner) if isinstance(inner, str) else \
                    [str(v) for v in inner if isinstance(v, str)]
            elif name == STREAM_UNFILTERED and isinstance(inner, bool):
                args["x-stream-match-unfiltered"] = inner
            else:
                parsed = filters.parse(value)
                if parsed is not None:      # applied on a stream only (attach_receiver)
                    expressions.append((key, parsed))
                continue
            honoured[key] = value
    prio = link.properties.get(Symbol("rabbitmq:priority"))
    if type(prio) is int:
        args["x-priority"] = prio
    return args, honoured, expressions
