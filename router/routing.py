"""The router's topology cache and exchange routing (AMQP 0-9-1 spec section 3.1.3).

Each exchange is owned by one node (``shoal.shared.placement.owner(..., kind="e")``), which
stores it and its bindings and feeds every router a change stream (``TOPOLOGY_EVENT``). This
module keeps the router's copy and answers "which queues does this publish reach?" locally, so
routing never waits on a node.

Exchange types: direct, fanout, topic (``*`` one word, ``#`` zero or more words; the bindings
in a trie of their words, topic.py), headers
(``x-match`` = all | any; ``all-with-x`` / ``any-with-x`` also compare ``x-`` headers) and
``x-consistent-hash`` (one destination by a hash of the routing key: consistent_hash.py) and
``x-local-random`` (RabbitMQ 4: one of its queues at random, among those ``Topology.usable``
admits).
Exchange-to-exchange bindings are followed, each exchange visited once per publish.
A binding with ``x-filter-jms-selector`` (Qpid, seed 003 "bindings with selectors") routes only
messages its selector accepts (shoal.shared.selector); properties are decoded only when the
exchange has such bindings. An exchange's ``alternate-exchange`` argument (RabbitMQ, Qpid)
receives what the exchange could not route anywhere.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable

from shoal.router import consistent_hash
from shoal.router.topic import TopicTrie
from shoal.shared import wire
from shoal.shared.errors import PRECONDITION_FAILED, AMQPError, soft_error
from shoal.shared.selector import Selector, check_arguments, selector_fields
from shoal.shared.topology import BUILTIN_EXCHANGES, CONSISTENT_HASH, LOCAL_RANDOM
from shoal.shared.topology import freeze as _freeze


@dataclass(slots=True)
class Binding:
    """One binding from an exchange to a queue (``dest_kind`` "q") or exchange ("e")."""
    dest_kind: str
    destination: str
    routing_key: str
    arguments: dict
    selector: Selector | None = None  # x-filter-jms-selector

    @property
    def key(self) -> tuple:
        return (self.dest_kind, self.destination, self.routing_key, _freeze(self.arguments))


@dataclass(slots=True)
class Exchange:
    """An exchange as the router sees it. ``bindings`` keyed by :attr:`Binding.key`."""
    vhost: str
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict = field(default_factory=dict)
    bindings: dict[tuple, Binding] = field(default_factory=dict)
    # direct exchanges: routing key -> bindings, for O(1) routing
    by_key: dict[str, list[Binding]] = field(default_factory=dict)
    # topic exchanges: the bindings by the words of their keys (topic.py)
    topic: TopicTrie = field(default_factory=TopicTrie)
    selectors: int = 0      # bindings with a selector (properties are decoded when > 0)
    #: a consistent-hash exchange's ring, built at its next publish after a binding changed
    ring: Any = None


def headers_match(arguments: dict, headers: dict | None) -> bool:
    """Headers exchange match (spec 3.1.3.4; RabbitMQ's all-with-x / any-with-x).

    ``x-match`` defaults to ``all``. A binding argument with a void (None) value matches on
    presence of the header alone.
    """
    headers = headers or {}
    mode = arguments.get("x-match", "all")
    if isinstance(mode, bytes):
        mode = mode.decode(errors="replace")
    if not isinstance(mode, str):       # refused at bind (check_x_match); never crash here
        mode = "all"
    with_x = mode.endswith("-with-x")
    wanted = [(k, v) for k, v in arguments.items()
              if k != "x-match" and (with_x or not str(k).startswith("x-"))]
    if mode.startswith("any"):
        return any(k in headers and (v is None or _equal(v, headers[k])) for k, v in wanted)
    return all(k in headers and (v is None or _equal(v, headers[k])) for k, v in wanted)


def _equal(want, got) -> bool:
    """Header values compare by value and kind, as RabbitMQ's Erlang terms do: ``true`` is
    not ``1`` (Python's ``True == 1`` is), while ``1`` matches ``1.0``."""
    return want == got and isinstance(want, bool) == isinstance(got, bool)


X_MATCH_VALUES = ("all", "any", "all-with-x", "any-with-x")


def check_x_match(arguments: dict | None) -> None:
    """A headers-exchange binding's ``x-match`` must be a string naming one of
    :data:`X_MATCH_VALUES` (or be absent: all). Raises 406 PRECONDITION_FAILED (soft) with
    RabbitMQ's wording (rabbit_exchange_type_headers ``validate_binding``)."""
    if not arguments or "x-match" not in arguments:
        return
    mode = arguments["x-match"]
    if isinstance(mode, (bytes, bytearray)):
        mode = bytes(mode).decode(errors="replace")
    if not isinstance(mode, str):
        raise soft_error(PRECONDITION_FAILED, f"Invalid x-match field type "
                                              f"{type(mode).__name__} (value {mode!r}); "
                                              f"expected longstr")
    if mode not in X_MATCH_VALUES:
        raise soft_error(PRECONDITION_FAILED, f"Invalid x-match field value '{mode}'; expected "
                                              f"all, any, all-with-x, or any-with-x")


class Topology:
    """The router's cache of every exchange and binding, kept fresh by node change feeds."""

    def __init__(self, vhosts: list[str]) -> None:
        self.exchanges: dict[tuple[str, str], Exchange] = {}
        #: whether a local-random exchange may pick queue (vhost, name): the broker admits a
        #: classic queue whose node this router reaches (router/broker.py)
        self.usable: Callable[[str, str], bool] = lambda vhost, name: True
        for vhost in vhosts:
            self.add_builtins(vhost)

    def add_builtins(self, vhost: str) -> None:
        for name, type_ in BUILTIN_EXCHANGES.items():
            self.exchanges.setdefault((vhost, name), Exchange(vhost, name, type_))

    def get(self, vhost: str, name: str) -> Exchange | None:
        return self.exchanges.get((vhost, name))

    # ---- change feed ----------------------------------------------------------------------
    def apply(self, event: int, data: list) -> list[tuple[str, str]]:
        """Apply one TOPOLOGY_EVENT. Returns queues removed, as ``[(vhost, name)]``."""
        if event == wire.EV_EXCHANGE_ADDED:
            vhost, name, type_, durable, auto_delete, internal, arguments = data
            old = self.exchanges.get((vhost, name))
            ex = Exchange(vhost, name, type_, durable, auto_delete, internal, arguments or {})
            if old is not None:
                ex.bindings, ex.by_key, ex.selectors = old.bindings, old.by_key, old.selectors
                ex.topic = old.topic        # the ring is built again (ex.ring None)
            self.exchanges[(vhost, name)] = ex
        elif event == wire.EV_EXCHANGE_REMOVED:
            vhost, name = data
            if name not in BUILTIN_EXCHANGES:
                self.exchanges.pop((vhost, name), None)
        elif event == wire.EV_BINDING_ADDED:
            self.add_binding(*data)
        elif event == wire.EV_BINDING_REMOVED:
            self.remove_binding(*data)
        elif event == wire.EV_QUEUE_REMOVED:
            vhost, name = data
            self.remove_destination(vhost, wire.DEST_QUEUE, name)
            return [(vhost, name)]
        return []

    def load_snapshot(self, exchanges: list[list], bindings: list[list]) -> None:
        """Apply a node's TOPOLOGY_SNAPSHOT payload (its exchanges, then its bindings)."""
        for data in exchanges:
            self.apply(wire.EV_EXCHANGE_ADDED, data)
        for data in bindings:
            self.apply(wire.EV_BINDING_ADDED, data)

    def forget_owned(self, is_owned: Callable[[str, str], bool]) -> None:
        """Drop the exchanges (and their bindings) a node owned, when it restarts empty."""
        for key, ex in list(self.exchanges.items()):
            if is_owned(*key):
                if ex.name in BUILTIN_EXCHANGES:
                    ex.bindings.clear()
                    ex.by_key.clear()
                    ex.topic = TopicTrie()
                    ex.selectors = 0
                    ex.ring = None
                else:
                    del self.exchanges[key]

    def add_binding(self, vhost: str, exchange: str, dest_kind: str, destination: str,
                    routing_key: str, arguments: dict | None) -> None:
        ex = self.exchanges.get((vhost, exchange))
        if ex is None:
            return
        b = Binding(dest_kind, destination, routing_key, arguments or {})
        if b.key in ex.bindings:
            return
        try:
            b.selector = check_arguments(b.arguments)
        except AMQPError:        # refused at queue.bind; a stored bad one matches nothing
            b.selector = Selector("FALSE", lambda f: False)
        if b.selector is not None:
            ex.selectors += 1
        ex.bindings[b.key] = b
        ex.ring = None
        ex.by_key.setdefault(routing_key, []).append(b)
        if ex.type == "topic":
            ex.topic.add(routing_key, b)

    def remove_binding(self, vhost: str, exchange: str, dest_kind: str, destination: str,
                       routing_key: str, arguments: dict | None) -> None:
        ex = self.exchanges.get((vhost, exchange))
        if ex is None:
            return
        key = (dest_kind, destination, routing_key, _freeze(arguments or {}))
        b = ex.bindings.pop(key, None)
        if b is not None:
            ex.ring = None
            if b.selector is not None:
                ex.selectors -= 1
            lst = ex.by_key.get(routing_key, [])
            if b in lst:
                lst.remove(b)
            if not lst:
                ex.by_key.pop(routing_key, None)
            if ex.type == "topic":
                ex.topic.remove(routing_key, b)

    def remove_destination(self, vhost: str, dest_kind: str, destination: str) -> None:
        for (v, _), ex in self.exchanges.items():
            if v != vhost:
                continue
            for key, b in list(ex.bindings.items()):
                if b.dest_kind == dest_kind and b.destination == destination:
                    self.remove_binding(vhost, ex.name, dest_kind, destination, b.routing_key,
                                        b.arguments)

    # ---- routing -----------------------------------------------------------------------------
    def route(self, vhost: str, exchange: str, routing_key: str,
              headers: Callable[[], dict | None] | None, header: bytes | None = None,
              also: tuple[str, ...] = ()) -> set[str]:
        """Queue names a publish reaches. ``headers`` is called at most once, lazily, when a
        headers exchange needs the message's headers (None: decoded from ``header``, the
        content-header payload, which selector bindings also read). ``also``: more routing
        keys (a publish's CC and BCC, router/sender_selected.py), each routed as the key is,
        on every exchange the publish passes through. The exchange must exist (the caller
        checks and raises 404). Unroutable: the exchange's alternate-exchange."""
        if exchange == "":
            return {routing_key, *also} if also else {routing_key}
        props: list = []

        def get_props() -> Any:
            if not props:
                props.append(_properties(header))
            return props[0]

        if headers is None:
            def headers() -> dict | None:
                p = get_props()
                return p.headers if p is not None else None
        cached: list = []

        def get_headers() -> dict | None:
            if not cached:
                cached.append(headers())
            return cached[0]

        tried: set[str] = set()
        while True:
            out = self._route_from(vhost, exchange, routing_key, get_headers, get_props, also)
            tried.add(exchange)
            ex = self.exchanges.get((vhost, exchange))
            ae = ex.arguments.get("alternate-exchange") if ex is not None else None
            if isinstance(ae, bytes):
                ae = ae.decode("utf-8", "replace")
            if out or not isinstance(ae, str) or not ae or ae in tried:
                return out
            exchange = ae

    def _route_from(self, vhost: str, exchange: str, routing_key: str,
                    get_headers: Callable[[], dict | None], get_props: Callable[[], Any],
                    also: tuple[str, ...] = ()) -> set[str]:
        out: set[str] = set()
        seen: set[str] = set()
        todo = [exchange]

        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            ex = self.exchanges.get((vhost, name))
            if ex is None:
                continue
            matched = self._matches(ex, routing_key, get_headers, get_props)
            if also and ex.type in _BY_KEY:
                matched = list(matched)
                for key in also:
                    matched.extend(self._matches(ex, key, get_headers, get_props))
            if ex.selectors and matched:
                fields = selector_fields(get_props())
                matched = [b for b in matched if b.selector is None or b.selector.matches(fields)]
            for b in matched:
                if b.dest_kind == wire.DEST_QUEUE:
                    out.add(b.destination)
                else:
                    todo.append(b.destination)
        return out

    def _matches(self, ex: Exchange, routing_key: str, headers: Callable[[], dict | None],
                 props: Callable[[], Any]):
        if ex.type == "direct":
            return ex.by_key.get(routing_key, ())
        if ex.type == "fanout":
            return ex.bindings.values()
        if ex.type == "topic":
            return ex.topic.match(routing_key)
        if ex.type == "headers":
            if not ex.bindings:
                return ()
            h = headers()
            return [b for b in ex.bindings.values() if headers_match(b.arguments, h)]
        if ex.type == CONSISTENT_HASH:
            return consistent_hash.route(ex, routing_key, headers, props)
        if ex.type == LOCAL_RANDOM:
            return self._local_random(ex)
        return ()

    def _local_random(self, ex: Exchange) -> list[Binding]:
        """One binding of local-random exchange ``ex`` at random, among its bindings to
        queues that :attr:`usable` admits; none when there is no such queue (unroutable).
        RabbitMQ 4 picks among the bound classic queues on the publishing connection's node
        (rabbit_exchange_type_local_random ``route``); a router owns no queues and reaches
        every node's in one hop, so here every reachable classic queue is local."""
        usable = self.usable
        found = [b for b in ex.bindings.values()
                 if b.dest_kind == wire.DEST_QUEUE and usable(ex.vhost, b.destination)]
        return [random.choice(found)] if found else []


#: the exchange types whose routing reads the routing key, and so a CC's or BCC's keys too
#: (a consistent-hash exchange hashes the publish's own key, as RabbitMQ's does)
_BY_KEY = frozenset(("direct", "topic"))


def _properties(header: bytes | None) -> Any:
    """Decoded ``basic`` properties of a content-header payload, or None (none given, or
    undecodable: routed as if it had no properties)."""
    if not header:
        return None
    from shoal.router.amqp.fastpath import parse_properties
    try:
        return parse_properties(header)
    except AMQPError:
        return None
