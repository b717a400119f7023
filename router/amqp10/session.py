"""An AMQP 1.0 session and its links, server side (OASIS AMQP 1.0 part 2.5 "Sessions", 2.6
"Links"), sans-IO: the connection (engine.py) hands each session its frames and the session
writes through it.

A session keeps both windows (part 2.5.6): its incoming window is reopened as it fills, and
transfers beyond the client's incoming window wait in ``pending`` until the client's next
flow. A link keeps its credit and delivery-count (part 2.6.7); a delivery is split to the
client's max-frame-size, and a client's split transfer is joined.

Errors: a violation of the session's rules ends the session (``amqp:session:...``), of a
link's detaches it (``amqp:link:...``), of the connection's raises :class:`ProtocolError`.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from shoal.router.amqp10.frames import (
    RCV_FIRST, ROLE_RECEIVER, ROLE_SENDER, SND_SETTLED, SND_UNSETTLED, Accepted, Attach, Begin,
    Detach, Disposition, End, Flow, Performative, Transfer, error, transfer_frame)

HANDLE_MAX = 1023               #: links per session
INCOMING_WINDOW = 4096          #: transfers a client may send before we widen the window
MAX_WINDOW = (1 << 32) - 1


@dataclass(slots=True)
class LinkAttached:
    """The client attached ``link``: answer with Session.accept_link or refuse_link."""
    link: "Link"


@dataclass(slots=True)
class MessageReceived:
    """A whole message on a link the client sends on (its transfers joined)."""
    link: "Link"
    delivery_id: int
    settled: bool
    payload: bytes


@dataclass(slots=True)
class CreditChanged:
    """The client's flow changed the credit of a link we send on (``link.credit``,
    ``link.drain``)."""
    link: "Link"


@dataclass(slots=True)
class DeliveriesSettled:
    """The client settled deliveries we sent: ``(delivery_id, token)`` pairs, one outcome."""
    link: "Link"
    deliveries: list
    state: Any


@dataclass(slots=True)
class LinkDetached:
    link: "Link"
    error: Any


@dataclass(slots=True)
class SessionEnded:
    session: "Session"


class ProtocolError(Exception):
    """A peer's violation of the connection's rules: ``condition`` and text for the close."""

    def __init__(self, condition: str, text: str) -> None:
        super().__init__(text)
        self.condition, self.text = condition, text


class Ignore(Exception):
    """The frame was answered by ending its session: skip the rest of it."""


class Host(Protocol):
    """What a session uses of its connection (engine.py's Engine)."""
    max_message_size: int
    remote_max_frame_size: int

    def send(self, channel: int, perf: Performative, payload: bytes = b"") -> None: ...

    def write(self, data: bytes) -> None: ...

    def emit(self, event: Any) -> None: ...


class Link:
    """One attached link. ``role`` is OURS: ROLE_SENDER when the client receives."""
    __slots__ = ("session", "name", "handle", "remote_handle", "role", "attach", "source",
                 "target", "properties", "settled_mode", "delivery_count", "credit", "drain",
                 "partial", "partial_id", "partial_settled", "unsettled", "context",
                 "detached")

    def __init__(self, session: "Session", attach: Attach) -> None:
        self.session = session
        self.name = attach.name
        self.remote_handle = self.handle = attach.handle
        self.role = not attach.role      # their sender -> our receiver
        self.attach = attach
        self.source, self.target = attach.source, attach.target
        self.properties = attach.properties if isinstance(attach.properties, dict) else {}
        #: deliveries go pre-settled (the client asked for snd-settle-mode settled)
        self.settled_mode = attach.snd_settle_mode == SND_SETTLED
        self.delivery_count = 0 if self.role == ROLE_SENDER else \
            (attach.initial_delivery_count or 0)
        self.credit = 0
        self.drain = False
        self.partial: bytearray | None = None
        self.partial_id = 0
        self.partial_settled = False
        self.unsettled: dict[int, Any] = {}   #: our deliveries not settled: id -> token
        self.context: Any = None              #: the broker's object for this link
        self.detached = False


class Session:
    """One session, begun by the client on ``channel`` (we answer on the same number)."""
    __slots__ = ("_host", "channel", "next_outgoing_id", "next_incoming_id",
                 "incoming_window", "remote_incoming_window", "links", "by_handle", "pending",
                 "next_delivery_id", "sent", "context", "ended")

    def __init__(self, host: Host, channel: int, begin: Begin) -> None:
        self._host = host
        self.channel = channel
        self.next_outgoing_id = 0
        self.next_incoming_id = begin.next_outgoing_id or 0
        self.incoming_window = INCOMING_WINDOW
        self.remote_incoming_window = begin.incoming_window or 0
        self.links: dict[int, Link] = {}      #: by the client's handle
        self.by_handle: dict[int, Link] = {}  #: by our handle
        #: transfers (and flows behind them) waiting for the client's incoming window
        self.pending: deque[tuple[Link, Performative, bytes]] = deque()
        self.next_delivery_id = 0
        self.sent: dict[int, Link] = {}       #: our unsettled delivery id -> link
        self.context: Any = None
        self.ended = False

    def begin(self, refusal: str | None) -> None:
        """Answer the client's begin; a ``refusal`` (a channel limit) ends it at once."""
        self._host.send(self.channel, Begin(self.channel, self.next_outgoing_id,
                                            self.incoming_window, MAX_WINDOW, HANDLE_MAX))
        if refusal is not None:
            self.ended = True
            self._host.send(self.channel, End(error("amqp:resource-limit-exceeded", refusal)))

    def on_end(self) -> None:
        """The client ended the session (answered unless we ended it first)."""
        if not self.ended:
            self.close(None)
            self._host.send(self.channel, End())

    def close(self, err: Any) -> None:
        """The session is over: its links are detached."""
        self.ended = True
        for link in list(self.links.values()):
            if not link.detached:
                link.detached = True
                self._host.emit(LinkDetached(link, err))
        self._host.emit(SessionEnded(self))

    def end(self, condition: str, text: str) -> None:
        """End the session with an error (``amqp:session:unattached-handle`` ...)."""
        if self.ended:
            return
        self.close(None)
        self._host.send(self.channel, End(error(condition, text)))

    # ---- links -------------------------------------------------------------------------------
    def _link(self, handle: Any) -> Link:
        link = self.links.get(handle) if type(handle) is int else None
        if link is None:
            self.end("amqp:session:unattached-handle", f"no link on handle {handle}")
            raise Ignore
        return link

    def on_attach(self, a: Attach) -> None:
        if type(a.handle) is not int or not isinstance(a.name, str) or \
                not isinstance(a.role, bool):
            raise ProtocolError("amqp:invalid-field", "attach without a name, handle or role")
        if a.handle in self.links or a.handle > HANDLE_MAX:
            self.end("amqp:session:handle-in-use",
                     f"handle {a.handle} is in use or above handle-max {HANDLE_MAX}")
            return
        link = Link(self, a)
        self.links[a.handle] = link
        self.by_handle[link.handle] = link
        self._host.emit(LinkAttached(link))

    def accept_link(self, link: Link, source: Any = None, target: Any = None,
                    credit: int = 0) -> None:
        """Answer the client's attach; ``source``/``target`` as we hold them (a dynamic
        node's address filled in). A link the client sends on gets ``credit`` at once."""
        a = link.attach
        size = self._host.max_message_size or None
        source = source if source is not None else a.source
        target = target if target is not None else a.target
        if link.role == ROLE_SENDER:
            self._host.send(self.channel, Attach(
                link.name, link.handle, ROLE_SENDER,
                SND_SETTLED if link.settled_mode else SND_UNSETTLED, RCV_FIRST, source, target,
                None, None, 0, size))
        else:
            self._host.send(self.channel, Attach(
                link.name, link.handle, ROLE_RECEIVER, a.snd_settle_mode, RCV_FIRST, source,
                target, None, None, None, size))
            if credit:
                self.give_credit(link, credit)

    def refuse_link(self, link: Link, condition: str, text: str) -> None:
        """Refuse the client's attach (part 2.6.3: an attach with no source or target, then
        a detach with the error)."""
        ours = link.role
        self._host.send(self.channel, Attach(
            link.name, link.handle, ours, None, None,
            None if ours == ROLE_SENDER else link.source,
            None if ours == ROLE_RECEIVER else link.target))
        self.detach(link, condition, text)

    def detach(self, link: Link, condition: str | None = None, text: str = "") -> None:
        """Detach (close) ``link`` from our side, with an error or none."""
        if self.ended or link.handle not in self.by_handle:
            return
        self._host.send(self.channel, Detach(link.handle, True,
                                             error(condition, text) if condition else None))
        del self.by_handle[link.handle]
        if not link.detached:
            link.detached = True
            self._host.emit(LinkDetached(link, None))

    def on_detach(self, d: Detach) -> None:
        link = self._link(d.handle)
        del self.links[link.remote_handle]
        if link.handle in self.by_handle:       # the client detached first: answer
            del self.by_handle[link.handle]
            self._host.send(self.channel, Detach(link.handle, True))
        if not link.detached:
            link.detached = True
            self._host.emit(LinkDetached(link, d.error))

    # ---- flow --------------------------------------------------------------------------------
    def on_flow(self, f: Flow) -> None:
        if type(f.incoming_window) is int:
            nid = f.next_incoming_id if type(f.next_incoming_id) is int else 0
            self.remote_incoming_window = nid + f.incoming_window - self.next_outgoing_id
        if f.handle is None:
            if f.echo:
                self._session_flow()
            self._send_pending()
            return
        link = self._link(f.handle)
        if link.role == ROLE_SENDER:
            count = f.delivery_count if type(f.delivery_count) is int else 0
            credit = f.link_credit if type(f.link_credit) is int else 0
            link.credit = max(0, count + credit - link.delivery_count)   # part 2.6.7
            link.drain = bool(f.drain)
            self._send_pending()
            self._host.emit(CreditChanged(link))
        if f.echo:
            self._link_flow(link)

    def _session_flow(self) -> None:
        self._host.send(self.channel, Flow(self.next_incoming_id, self.incoming_window,
                                           self.next_outgoing_id, MAX_WINDOW))

    def _link_flow(self, link: Link, drain: bool = False) -> None:
        """Our flow for ``link``. Behind transfers still waiting for the client's session
        window it waits too: its delivery-count counts them (part 2.6.7)."""
        flow = Flow(self.next_incoming_id, self.incoming_window, self.next_outgoing_id,
                    MAX_WINDOW, link.handle, link.delivery_count, link.credit, None,
                    drain or link.drain)
        if self.pending:
            self.pending.append((link, flow, b""))
        else:
            self._host.send(self.channel, flow)

    def give_credit(self, link: Link, credit: int) -> None:
        """Let the client send ``credit`` more transfers on ``link`` (ours a receiver)."""
        link.credit = credit
        self.incoming_window = INCOMING_WINDOW
        self._link_flow(link)

    def drained(self, link: Link) -> None:
        """We have nothing more for a draining link: use up its credit (part 2.6.7)."""
        link.delivery_count = (link.delivery_count + link.credit) & 0xFFFFFFFF
        link.credit = 0
        self._link_flow(link, drain=True)
        link.drain = False

    # ---- transfers in ------------------------------------------------------------------------
    def on_transfer(self, t: Transfer, buf: Any, payload_at: int, end: int) -> None:
        link = self._link(t.handle)
        if self.incoming_window <= 0:
            self.end("amqp:session:window-violation",
                     "transfer beyond the session's incoming window")
            return
        self.incoming_window -= 1
        self.next_incoming_id = (self.next_incoming_id + 1) & 0xFFFFFFFF
        if link.role == ROLE_SENDER:
            raise ProtocolError("amqp:not-allowed", "transfer on a link the client receives on")
        if t.aborted:
            link.partial = None
            return
        if link.partial is None:
            if link.credit <= 0:
                self.detach(link, "amqp:link:transfer-limit-exceeded",
                            "transfer without link credit")
                return
            if type(t.delivery_id) is not int:
                raise ProtocolError("amqp:invalid-field", "first transfer without a delivery-id")
            link.credit -= 1
            link.delivery_count = (link.delivery_count + 1) & 0xFFFFFFFF
            link.partial_id = t.delivery_id
            link.partial_settled = bool(t.settled)
            if not t.more:                      # a message in one frame: one copy
                limit = self._host.max_message_size
                if limit and end - payload_at > limit:
                    self.detach(link, "amqp:link:message-size-exceeded",
                                f"message larger than max-message-size {limit}")
                    return
                self._received(link, bytes(buf[payload_at:end]))
                return
            link.partial = bytearray()
        elif t.settled:
            link.partial_settled = True
        link.partial += buf[payload_at:end]
        limit = self._host.max_message_size
        if limit and len(link.partial) > limit:
            link.partial = None
            self.detach(link, "amqp:link:message-size-exceeded",
                        f"message larger than max-message-size {limit}")
            return
        if t.more:
            return
        payload, link.partial = bytes(link.partial), None
        self._received(link, payload)

    def _received(self, link: Link, payload: bytes) -> None:
        """A whole message arrived on ``link``: the host gets it (MessageReceived)."""
        if self.incoming_window < INCOMING_WINDOW // 2:
            self.incoming_window = INCOMING_WINDOW
            self._session_flow()
        self._host.emit(MessageReceived(link, link.partial_id, link.partial_settled, payload))

    def settle_received(self, link: Link, delivery_ids: list[int], state: Performative) -> None:
        """Settle client transfers with ``state`` (accepted, released, rejected): one
        disposition per run of consecutive ids."""
        if self.ended or not delivery_ids:
            return
        ids = sorted(delivery_ids)
        first = last = ids[0]
        for i in ids[1:]:
            if i == last + 1:
                last = i
                continue
            self._host.send(self.channel, Disposition(ROLE_RECEIVER, first, last, True, state))
            first = last = i
        self._host.send(self.channel, Disposition(ROLE_RECEIVER, first, last, True, state))

    # ---- transfers out -----------------------------------------------------------------------
    def send_message(self, link: Link, payload: bytes, token: Any = None) -> int:
        """Send one message on ``link`` (ours a sender), split to the client's max-frame-size;
        ``token`` comes back in DeliveriesSettled. Uses one credit. Returns its delivery id."""
        did = self.next_delivery_id
        self.next_delivery_id = (did + 1) & 0xFFFFFFFF
        link.credit -= 1
        link.delivery_count = (link.delivery_count + 1) & 0xFFFFFFFF
        settled = link.settled_mode
        if not settled:
            link.unsettled[did] = token
            self.sent[did] = link
        room = self._host.remote_max_frame_size - 64   # frame header, transfer performative
        tag = did.to_bytes(4, "big")
        if len(payload) <= room:
            if self.pending or self.remote_incoming_window <= 0:
                self.pending.append((link, Transfer(link.handle, did, tag, 0, settled),
                                     payload))
            else:
                self.remote_incoming_window -= 1
                self.next_outgoing_id = (self.next_outgoing_id + 1) & 0xFFFFFFFF
                self._host.write(transfer_frame(self.channel, link.handle, did, tag, settled,
                                                False, payload))
            return did
        for at in range(0, len(payload), room):
            more = at + room < len(payload)
            t = Transfer(link.handle, did, tag, 0, settled, more) if at == 0 else \
                Transfer(link.handle, None, None, None, None, more)
            self.pending.append((link, t, payload[at:at + room]))
        self._send_pending()
        return did

    def _send_pending(self) -> None:
        pending = self.pending
        while pending and (self.remote_incoming_window > 0 or type(pending[0][1]) is Flow):
            link, t, payload = pending.popleft()
            if link.detached:
                continue
            if type(t) is not Flow:
                self.remote_incoming_window -= 1
                self.next_outgoing_id = (self.next_outgoing_id + 1) & 0xFFFFFFFF
            self._host.send(self.channel, t, payload)

    def on_disposition(self, d: Disposition) -> None:
        if type(d.first) is not int:
            raise ProtocolError("amqp:invalid-field", "disposition without first")
        last = d.last if type(d.last) is int else d.first
        if d.role != ROLE_RECEIVER:    # the client settling its own transfers: nothing held
            return
        if last - d.first > 1 << 20:
            raise ProtocolError("amqp:invalid-field", "disposition range too large")
        state = d.state
        if state is None and not d.settled:
            return
        by_link: dict[Link, list] = {}
        for did in range(d.first, last + 1):
            link = self.sent.pop(did, None)
            if link is not None:
                by_link.setdefault(link, []).append((did, link.unsettled.pop(did, None)))
        for link, pairs in by_link.items():
            if not d.settled:        # the client waits for us to settle (rcv-settle-mode)
                for did, _ in pairs:
                    self._host.send(self.channel,
                                    Disposition(ROLE_SENDER, did, did, True, state))
            self._host.emit(DeliveriesSettled(link, pairs, state or Accepted()))
