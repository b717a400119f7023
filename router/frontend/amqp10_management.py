"""RabbitMQ 4's AMQP 1.0 management node: "HTTP over AMQP" requests on a link pair to
``/management`` (RabbitMQ docs "AMQP 1.0 client libraries", HTTP over AMQP 1.0 WD 06; read in
rabbitmq-server's ``rabbit_amqp_management.erl`` and ``rabbit_amqp_session.erl``).

A client attaches a sending link with target ``/management`` and a receiving link with source
``/management``, both under one link name with the property ``paired: true``, both pre-settled.
Each request is a message whose ``subject`` is the HTTP method, ``to`` the request target (a
percent-encoded path and query), ``reply-to`` ``$me`` and ``message-id`` its id; its body an
amqp-value (a map for PUT and POST, null else). The answer goes on the receiving link, in
request order: ``subject`` the status code ("200"), ``correlation-id`` the request's
message-id, application property ``http:response`` "1.1", body an amqp-value (a map, a list,
null, or the error text). Routes, status codes and texts: docs/amqp10.md's table.

Each operation is the 0-9-1 channel method's own code (router/frontend/topology_methods.py),
so permissions, queue types and quorum queues behave as over 0-9-1. As RabbitMQ: a refused
permission ends the session (``amqp:unauthorized-access``), not a status. Where RabbitMQ ends
the session for a malformed request (an unknown path or method, a body of the wrong type),
Shoal answers 400, 404 or 405 with a text saying what was wrong. The message and path
formats are router/amqp10/http_over_amqp.py's.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from pamqp import commands as C

from shoal.shared import wire
from shoal.shared.errors import AMQPError
from shoal.shared.topology import EXCHANGE_TYPES
from shoal.shared.wire import T

from shoal.router.amqp10 import http_over_amqp as hoa
from shoal.router.amqp10.codec import Symbol, Typed
from shoal.router.amqp10.convert import from_field
from shoal.router.amqp10.frames import SND_SETTLED
from shoal.router.amqp10.http_over_amqp import HttpError, args_hash
from shoal.router.frontend import topology_methods as tm

log = logging.getLogger("shoal.router.frontend.amqp10")

ADDRESS = "/management"
CREDIT = 8                      #: request credit, topped up at half (as RabbitMQ's)

class Half:
    """The context of one link of a pair: ``requests`` (the client sends) or replies."""
    __slots__ = ("pair", "requests")

    def __init__(self, pair: "Pair", requests: bool) -> None:
        self.pair, self.requests = pair, requests


class Pair:
    """One link pair: its two links, the requests waiting, the answers waiting for credit."""

    def __init__(self) -> None:
        self.requests: Any = None       #: the client's sending link
        self.replies: Any = None        #: the client's receiving link
        self.waiting: deque[bytes] = deque()
        self.answers: deque[bytes] = deque()
        self.busy = False


def attach_error(link: Any, requests: bool, pairs: dict[str, Pair]) -> tuple[str, str] | None:
    """Why the management half ``link`` is refused (condition, text), as RabbitMQ's
    session, or None: it joins its pair."""
    props = link.properties
    if props.get(Symbol("paired")) is not True and props.get("paired") is not True:
        return "amqp:invalid-field", "Link property 'paired' is not set to boolean value 'true'"
    if requests and link.attach.snd_settle_mode != SND_SETTLED:
        return "amqp:invalid-field", "the management node takes pre-settled requests " \
                                     "(snd-settle-mode settled)"
    pair = pairs.get(link.name)
    if pair is not None and (pair.requests if requests else pair.replies) is not None:
        return "amqp:precondition-failed", f"received invalid attach for management link " \
                                           f"pair '{link.name}'"
    return None


class ManagementNode:
    """The management node of one AMQP 1.0 session (``ch``: its LinkChannel)."""

    def __init__(self, ch: Any) -> None:
        self.ch = ch
        self.pairs: dict[str, Pair] = {}

    # ---- links -------------------------------------------------------------------------------
    def attach(self, link: Any, requests: bool) -> None:
        """The client attached a half of a pair (``requests``: its sending link)."""
        err = attach_error(link, requests, self.pairs)
        if err is not None:
            link.session.refuse_link(link, *err)
            return
        pair = self.pairs.setdefault(link.name, Pair())
        link.context = Half(pair, requests)
        if requests:
            pair.requests = link
            link.session.accept_link(link, credit=CREDIT)
        else:
            pair.replies = link
            link.settled_mode = True            # answers are pre-settled
            link.session.accept_link(link)
        self.ch.client.flush()

    def detached(self, link: Any) -> None:
        half: Half = link.context
        pair = half.pair
        if half.requests:
            pair.requests = None
        else:
            pair.replies = None
        if pair.requests is None and pair.replies is None:
            self.pairs.pop(link.name, None)

    def credit(self, link: Any) -> None:
        """The client gave the replies link credit: send what waited for it."""
        self._send(link.context.pair)

    # ---- requests ----------------------------------------------------------------------------
    def request(self, link: Any, payload: bytes) -> None:
        """A whole request message on a pair's requests link; answered in order."""
        pair: Pair = link.context.pair
        pair.waiting.append(payload)
        if link.credit <= CREDIT // 2:
            link.session.give_credit(link, CREDIT)
        if not pair.busy:
            pair.busy = True
            asyncio.ensure_future(self._serve(pair))

    async def _serve(self, pair: Pair) -> None:
        try:
            while pair.waiting and not self.ch.closed:
                payload = pair.waiting.popleft()
                answer = await self._answer(payload)
                if answer is None:          # the session was ended
                    return
                pair.answers.append(answer)
                self._send(pair)
        finally:
            pair.busy = False

    def _send(self, pair: Pair) -> None:
        link = pair.replies
        if link is None or link.detached:
            return
        while pair.answers and link.credit > 0:
            link.session.send_message(link, pair.answers.popleft())
        self.ch.client.flush()

    async def _answer(self, payload: bytes) -> bytes | None:
        """The encoded answer to one request; None when the session was ended instead: a
        refused permission (``amqp:unauthorized-access``, RabbitMQ's rule) or an unexpected
        error (``amqp:internal-error``, the traceback logged)."""
        msg_id: Any = None
        try:
            msg_id, method, target, body = hoa.read_request(payload)
            status, out = await self._route(method, target, body)
        except HttpError as err:
            status, out = err.status, err.text
            log.warning("management request failed: %s %s", status, err.text)
        except AMQPError as err:
            if _refused(err):
                self.ch.session.end("amqp:unauthorized-access", err.text)
                self.ch.client.flush()
                return None
            status, out = _status_of(err), err.text
        except Exception:  # noqa: BLE001 - ends the session, logged (as RabbitMQ's crash)
            log.exception("internal error in a management request")
            self.ch.session.end("amqp:internal-error", "internal error; see the broker log")
            self.ch.client.flush()
            return None
        return hoa.response(status, msg_id, out)

    async def _route(self, method: str, target: str, body: Any) -> tuple[str, Any]:
        path, query = hoa.parse_target(target)
        kind = path[0] if path else ""
        if kind == "queues" and len(path) in (2, 3):
            name = hoa.segment(path[1])
            if len(path) == 3:
                if path[2] != "messages":
                    raise HttpError("404", f"no route for '{target}'")
                hoa.allow(method, "DELETE")
                return "200", {"message_count": Typed("ulong", await self._purge(name))}
            if method == "GET":
                return "200", await self._queue_info(name)
            if method == "PUT":
                return await self._declare_queue(name, body)
            hoa.allow(method, "GET", "PUT", "DELETE")
            return "200", {"message_count": Typed("ulong", await self._delete_queue(name))}
        if kind == "exchanges" and len(path) == 2:
            name = hoa.segment(path[1])
            if method == "PUT":
                await self._declare_exchange(name, body)
            else:
                hoa.allow(method, "PUT", "DELETE")
                await self._delete_exchange(name)
            return "204", None
        if kind == "bindings" and len(path) == 1:
            if method == "GET":
                return "200", self._list_bindings(query)
            hoa.allow(method, "GET", "POST")
            await self._bind(body)
            return "204", None
        if kind == "bindings" and len(path) == 2:
            hoa.allow(method, "DELETE")
            await self._unbind(path[1])
            return "204", None
        raise HttpError("404", f"no route for '{target}': /queues/NAME, /queues/NAME/messages, "
                               "/exchanges/NAME, /bindings, /bindings/src=...")

    # ---- queues ------------------------------------------------------------------------------
    async def _queue_info(self, name: str) -> dict:
        """GET /queues/NAME: any of configure, write, read on it (RabbitMQ's rule)."""
        ch = self.ch
        refusal: AMQPError | None = None
        for perm in ("read", "write", "configure"):
            try:
                ch.check_access(perm, "queue", name)
                refusal = None
                break
            except AMQPError as err:
                refusal = err
        if refusal is not None:
            raise refusal
        return await self._info(name)

    async def _info(self, name: str) -> dict:
        """The queue's map as RabbitMQ's ``encode_queue``; 404 when it does not exist."""
        b, vhost = self.ch.broker, self.ch.vhost
        try:
            node, rows = await b.get_request(vhost, name, [T.QUEUE_LIST, vhost])
        except AMQPError as err:
            raise HttpError("404" if err.reply_code == 404 else "400", err.text) from None
        row = next((r for r in rows if r[1] == name), None)
        if row is None:
            raise HttpError("404", f"queue '{name}' in vhost '{vhost}' not found")
        _, _, durable, exclusive, auto_delete, args, ready, consumers, *rest = row
        replica = rest[2] if len(rest) > 2 and rest[2] else None
        if isinstance(replica, dict) or not replica:    # a stream (one member) or classic
            leader, members = node, [node]
        else:                                           # a quorum queue's [.., leader, .., members]
            leader, members = replica[2], replica[4]
        out: dict = {}
        if leader:
            out["leader"] = leader
        out.update(message_count=Typed("ulong", ready), consumer_count=Typed("uint", consumers),
                   name=name, vhost=vhost, durable=bool(durable), auto_delete=bool(auto_delete),
                   exclusive=bool(exclusive), type=str(args.get("x-queue-type", "classic")),
                   arguments={str(k): from_field(v) for k, v in args.items()},
                   replicas=Typed("array", ("string", [str(m) for m in members])))
        return out

    async def _declare_queue(self, name: str, body: Any) -> tuple[str, dict]:
        """PUT /queues/NAME: 201 when created, 200 when it existed and is equivalent (409
        when not: RabbitMQ's inequivalent-arg text)."""
        flags = hoa.fields(body, "queue", {"durable": True, "exclusive": False,
                                        "auto_delete": False}, {"arguments"})
        if name == "":
            raise HttpError("400", "declare queue with empty name not allowed")
        _check_name(name)
        vhost = self.ch.vhost
        if name.startswith("amq."):
            raise HttpError("403", f"queue '{name}' in vhost '{vhost}' starts with reserved "
                                   "prefix 'amq.'")
        try:
            await self._info(name)
            existed = True
        except HttpError:
            existed = False
        ch = self.ch
        await tm.on_queue_declare(ch, C.Queue.Declare(
            queue=name, durable=flags["durable"], exclusive=flags["exclusive"],
            auto_delete=flags["auto_delete"], nowait=True,
            arguments=hoa.arguments(flags.get("arguments"))))
        return ("200" if existed else "201"), await self._info(name)

    async def _purge(self, name: str) -> int:
        try:
            await tm.on_queue_purge(self.ch, C.Queue.Purge(queue=name))
        except AMQPError as err:
            if err.reply_code == 404:
                raise HttpError("404", err.text) from None
            raise
        return self.ch.answer.message_count

    async def _delete_queue(self, name: str) -> int:
        _check_name(name)
        try:
            await tm.on_queue_delete(self.ch, C.Queue.Delete(queue=name))
        except AMQPError as err:
            if err.reply_code == 404:           # deleting what is not there: done
                return 0
            raise
        return self.ch.answer.message_count

    # ---- exchanges ---------------------------------------------------------------------------
    async def _declare_exchange(self, name: str, body: Any) -> None:
        flags = hoa.fields(body, "exchange", {"durable": True, "auto_delete": False,
                                           "internal": False}, {"arguments", "type"})
        type_ = flags.get("type", "direct")
        if not isinstance(type_, str) or type_ not in EXCHANGE_TYPES:
            raise HttpError("400", f"unknown exchange type '{type_}'")
        vhost = self.ch.vhost
        if name == "":
            raise HttpError("403", "operation not permitted on the default exchange")
        if self.ch.broker.topology.get(vhost, name) is None:
            _check_name(name)
            if name.startswith("amq."):
                raise HttpError("403", f"exchange '{name}' in vhost '{vhost}' starts with "
                                       "reserved prefix 'amq.'")
        await tm.on_exchange_declare(self.ch, C.Exchange.Declare(
            exchange=name, exchange_type=type_, durable=flags["durable"],
            auto_delete=flags["auto_delete"], internal=flags["internal"], nowait=True,
            arguments=hoa.arguments(flags.get("arguments"))))

    async def _delete_exchange(self, name: str) -> None:
        _check_name(name)
        vhost = self.ch.vhost
        if name == "":
            raise HttpError("403", "operation not permitted on the default exchange")
        if name.startswith("amq."):
            raise HttpError("403", f"exchange '{name}' in vhost '{vhost}' starts with "
                                   "reserved prefix 'amq.'")
        try:
            await tm.on_exchange_delete(self.ch, C.Exchange.Delete(exchange=name, nowait=True))
        except AMQPError as err:
            if err.reply_code != 404:           # deleting what is not there: done
                raise

    # ---- bindings ----------------------------------------------------------------------------
    async def _bind(self, body: Any) -> None:
        """POST /bindings: ``source``, ``destination_queue`` or ``destination_exchange``,
        ``binding_key``, ``arguments``."""
        if not isinstance(body, dict):
            raise HttpError("400", "a binding is a map: source, destination_queue or "
                                   "destination_exchange, binding_key, arguments")
        for k, v in body.items():
            if type(k) is not str or (k != "arguments" and type(v) is not str) or \
                    k not in ("source", "destination_queue", "destination_exchange",
                              "binding_key", "arguments"):
                raise HttpError("400", f"bad binding field {k!r}: {v!r}")
        missing = [k for k in ("source", "binding_key", "arguments") if k not in body]
        if missing or not ("destination_queue" in body or "destination_exchange" in body):
            raise HttpError("400", f"a binding needs source, binding_key, arguments and a "
                                   f"destination; missing {missing or ['destination']}")
        await self._binding(T.BIND, body["source"], *_destination(body),
                            body["binding_key"], hoa.arguments(body["arguments"]))

    async def _binding(self, tag: int, source: str, queue: bool, dest: str, key: str,
                       args: dict) -> None:
        ch = self.ch
        _check_name(source)
        _check_name(dest)
        if queue:
            m: Any = (C.Queue.Bind if tag == T.BIND else C.Queue.Unbind)(
                queue=dest, exchange=source, routing_key=key, arguments=args)
            run = tm.on_queue_bind if tag == T.BIND else tm.on_queue_unbind
        else:
            m = (C.Exchange.Bind if tag == T.BIND else C.Exchange.Unbind)(
                destination=dest, source=source, routing_key=key, arguments=args)
            run = tm.on_exchange_bind if tag == T.BIND else tm.on_exchange_unbind
        try:
            await run(ch, m)
        except AMQPError as err:
            if _refused(err):
                raise
            raise HttpError("403" if err.reply_code == 403 else "400", err.text) from None

    def _list_bindings(self, query: dict) -> list:
        """GET /bindings?src=X&dstq=Q|dste=E&key=K: those bindings, each with its
        ``location`` (the path that deletes it)."""
        if "src" not in query or "key" not in query:
            raise HttpError("400", f"GET /bindings needs src, key and dstq or dste in its "
                                   f"query: {query}")
        if "dste" in query:
            queue, dest = False, query["dste"]
        elif "dstq" in query:
            queue, dest = True, query["dstq"]
        else:
            raise HttpError("400", f"missing 'dste' or 'dstq' in query: {query}")
        ch = self.ch
        src, key = query["src"], query["key"]
        kind = wire.DEST_QUEUE if queue else wire.DEST_EXCHANGE
        ch.check_access("write", "queue" if queue else "exchange", dest)
        ch.check_access("read", "exchange", src)
        ex = ch.broker.topology.get(ch.vhost, src)
        out = []
        for b in (ex.bindings.values() if ex is not None else ()):
            if b.dest_kind == kind and b.destination == dest and b.routing_key == key:
                args = b.arguments or {}
                out.append({"source": src,
                            ("destination_queue" if queue else "destination_exchange"): dest,
                            "binding_key": key,
                            "arguments": {str(k): from_field(v) for k, v in args.items()},
                            "location": hoa.location(src, queue, dest, key, args)})
        return out

    async def _unbind(self, segment: str) -> None:
        """DELETE /bindings/src=..;dstq=..;key=..;args=..: the binding whose arguments hash
        to ``args`` (none: empty); 204 whether or not there was one."""
        m = hoa.BINDING.match(segment)
        if m is None:
            raise HttpError("400", f"bad binding path segment '{segment}'")
        src, kind, dest, key, hashed = m.groups()
        src, dest, key = hoa.segment(src), hoa.segment(dest), hoa.segment(key)
        queue = kind == "q"
        ch = self.ch
        ex = ch.broker.topology.get(ch.vhost, src)
        kind_w = wire.DEST_QUEUE if queue else wire.DEST_EXCHANGE
        for b in list(ex.bindings.values()) if ex is not None else ():
            if b.dest_kind == kind_w and b.destination == dest and b.routing_key == key \
                    and args_hash(b.arguments or {}) == hashed:
                await self._binding(T.UNBIND, src, queue, dest, key, b.arguments or {})
                return
        ch.check_access("write", "queue" if queue else "exchange", dest)
        ch.check_access("read", "exchange", src)


def _destination(body: dict) -> tuple[bool, str]:
    if "destination_queue" in body:
        return True, body["destination_queue"]
    return False, body["destination_exchange"]


def _check_name(name: str) -> None:
    if "\r" in name or "\n" in name:
        raise HttpError("400", f"Bad name '{name}': line feed and carriage return characters "
                               "not allowed")






def _status_of(err: AMQPError) -> str:
    """An AMQP 0-9-1 refusal as RabbitMQ's management status: 404 not found, 409 an
    inequivalent redeclare, 403 a reserved name, 400 anything else."""
    return {404: "404", 406: "409", 403: "403"}.get(err.reply_code, "400")


def _refused(err: AMQPError) -> bool:
    """A refused permission (ends the session, RabbitMQ's rule), not a reserved name's 403."""
    return err.reply_code == 403 and " refused for user " in err.text
