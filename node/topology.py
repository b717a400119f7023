"""Exchanges and bindings this node owns (design.md section 1, "topology lives on the nodes").

The router sends EXCHANGE_DECLARE/DELETE/BIND/UNBIND for an exchange to the node that owns it
(shared.placement). The node only *stores* topology and reports every change through ``emit``
(the shard turns that into wire TOPOLOGY_EVENTs for every router); routing is done by routers.
Built-in exchanges (:data:`BUILTIN_EXCHANGES`) exist implicitly in every vhost and are not
stored. Errors are AMQPErrors with RabbitMQ's reply codes and texts.
"""
from __future__ import annotations

from typing import Any, Callable

from shoal.shared.errors import ACCESS_REFUSED, NOT_FOUND, PRECONDITION_FAILED, soft_error
from shoal.shared.wire import (DEST_EXCHANGE, EV_BINDING_ADDED, EV_BINDING_REMOVED,
                               EV_EXCHANGE_ADDED, EV_EXCHANGE_REMOVED)

from shoal.shared.topology import BUILTIN_EXCHANGES, freeze  # noqa: F401 (re-exported)
from shoal.shared.topology import (CONSISTENT_HASH, LOCAL_RANDOM, check_hash_arguments,
                                   check_local_random_binding, hash_weight)

Emit = Callable[[int, list], None]


def amqp_bool(value: Any) -> str:
    """RabbitMQ's rendering of a value in 'inequivalent arg' texts."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "none"
    return str(value)


def _table_value(value: Any) -> str:
    """RabbitMQ's rendering of a table value when the other side has none ("the value '10'
    of type 'signedint'"), with the field type the usual client (pika) sends for it."""
    if isinstance(value, bool):
        kind = "bool"
    elif isinstance(value, int):
        kind = "signedint" if -2**31 <= value < 2**31 else "long"
    elif isinstance(value, float):
        kind = "double"
    elif isinstance(value, dict):
        kind = "table"
    elif isinstance(value, list):
        kind = "array"
    else:
        kind = "longstr"
    return f"the value '{amqp_bool(value)}' of type '{kind}'"


#: what check_equivalent compares that is a declare's property, not a table argument
_PROPERTIES = frozenset(("type", "durable", "auto_delete", "internal", "exclusive"))


def _type_class(value: Any) -> type:
    """RabbitMQ compares table values by type class and value (rabbit_misc
    ``assert_args_equivalence``): every integer type is one class, float and double
    another, so a TTL of 10 is not equivalent to one of 10.0."""
    if isinstance(value, bool):
        return bool
    if isinstance(value, int):
        return int
    return type(value)


def check_equivalent(kind: str, vhost: str, name: str,
                     checks: list[tuple[str, Any, Any]]) -> None:
    """A redeclare must match what exists (spec 1.6.2.1 / 1.7.2.1 "equivalent"): ``checks``
    are ``(argument, received, current)``; the first that differs raises 406
    PRECONDITION_FAILED with RabbitMQ's text ("inequivalent arg 'durable' for queue 'q' in
    vhost '/': received 'true' but current is 'false'"; an ``x-`` argument given on one side
    only: "received none but current is the value '10' of type 'signedint'")."""
    for arg, received, current in checks:
        if received != current or _type_class(received) != _type_class(current):
            if arg not in _PROPERTIES and (received is None or current is None):
                got = "none" if received is None else _table_value(received)
                now = "none" if current is None else _table_value(current)
            else:
                got, now = f"'{amqp_bool(received)}'", f"'{amqp_bool(current)}'"
            raise soft_error(PRECONDITION_FAILED,
                             f"inequivalent arg '{arg}' for {kind} '{name}' in vhost "
                             f"'{vhost}': received {got} but current is {now}")


class Exchange:
    """A declared exchange. ``type``: direct, fanout, topic or headers (router validated)."""

    __slots__ = ("vhost", "name", "type", "durable", "auto_delete", "internal", "arguments")

    def __init__(self, vhost: str, name: str, type: str, durable: bool, auto_delete: bool,
                 internal: bool, arguments: dict | None) -> None:
        self.vhost = vhost
        self.name = name
        self.type = type
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = arguments or {}

    def event_data(self) -> list:
        """EV_EXCHANGE_ADDED data: [vhost, name, type, durable, auto_delete, internal, args]."""
        return [self.vhost, self.name, self.type, self.durable, self.auto_delete,
                self.internal, self.arguments]


class Topology:
    """The exchanges and bindings of one node.

    ``emit(event, data)`` is called for every change (EV_* from shared.wire), in order.
    Bindings are identified by (vhost, exchange, dest_kind, destination, routing_key,
    arguments); their data lists are the EV_BINDING_* data.
    """

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.exchanges: dict[tuple[str, str], Exchange] = {}
        # (vhost, exchange) -> {(dest_kind, destination, routing_key, frozen args): data}
        self.bindings: dict[tuple[str, str], dict[tuple, list]] = {}
        # (vhost, dest_kind, destination) -> {(exchange, binding key)}
        self.by_destination: dict[tuple[str, str, str], set[tuple[str, tuple]]] = {}

    def exists(self, vhost: str, name: str) -> bool:
        return name in BUILTIN_EXCHANGES or (vhost, name) in self.exchanges

    def _check_exists(self, vhost: str, name: str) -> None:
        if not self.exists(vhost, name):
            raise soft_error(NOT_FOUND, f"no exchange '{name}' in vhost '{vhost}'")

    # --- exchanges ---
    def declare_exchange(self, vhost: str, name: str, type: str, passive: bool, durable: bool,
                         auto_delete: bool, internal: bool, arguments: dict | None) -> None:
        """``exchange.declare`` (spec 1.6.2.1). Raises 404 (passive, missing) or 406
        (inequivalent type/durable/auto_delete/internal/alternate-exchange; a
        consistent-hash exchange's bad
        ``hash-header``/``hash-property``, shared.topology ``check_hash_arguments``)."""
        if name in BUILTIN_EXCHANGES:
            return
        ex = self.exchanges.get((vhost, name))
        if ex is None:
            if passive:
                self._check_exists(vhost, name)
            if type == CONSISTENT_HASH:
                check_hash_arguments(arguments)
            ex = Exchange(vhost, name, type, durable, auto_delete, internal, arguments)
            self.exchanges[(vhost, name)] = ex
            self.emit(EV_EXCHANGE_ADDED, ex.event_data())
            return
        if passive:
            return
        check_equivalent("exchange", vhost, name, [
            ("type", type, ex.type), ("durable", bool(durable), bool(ex.durable)),
            ("auto_delete", bool(auto_delete), bool(ex.auto_delete)),
            ("internal", bool(internal), bool(ex.internal)),
            # the one argument RabbitMQ compares (rabbit_exchange assert_args_equivalence)
            ("alternate-exchange", (arguments or {}).get("alternate-exchange"),
             (ex.arguments or {}).get("alternate-exchange"))])

    def delete_exchange(self, vhost: str, name: str, if_unused: bool) -> None:
        """``exchange.delete`` (spec 1.6.2.3). Missing: success (idempotent, as RabbitMQ).
        Raises 406 "in use" (if_unused and it is a binding source), 403 for built-ins."""
        if name in BUILTIN_EXCHANGES:
            raise soft_error(ACCESS_REFUSED,
                             f"operation not permitted on exchange '{name}' in vhost '{vhost}'")
        if (vhost, name) not in self.exchanges:
            return
        if if_unused and self.bindings.get((vhost, name)):
            raise soft_error(PRECONDITION_FAILED,
                             f"exchange '{name}' in vhost '{vhost}' in use")
        self._remove_exchange(vhost, name)

    def _remove_exchange(self, vhost: str, name: str) -> None:
        for key in list(self.bindings.get((vhost, name), ())):
            self._remove_binding(vhost, name, key, auto_delete=False)
        self.bindings.pop((vhost, name), None)
        del self.exchanges[(vhost, name)]
        self.emit(EV_EXCHANGE_REMOVED, [vhost, name])
        # bindings on this node whose destination is the removed exchange
        self.unbind_destination(vhost, DEST_EXCHANGE, name)

    # --- bindings ---
    def bind(self, vhost: str, exchange: str, dest_kind: str, destination: str,
             routing_key: str, arguments: dict | None) -> None:
        """``queue.bind`` / ``exchange.bind``: idempotent. Raises 404 if the source exchange
        is missing (built-ins always exist), 406 for a consistent-hash binding whose key is
        not a weight (shared.topology ``hash_weight``) and a local-random one with a key or
        to an exchange (``check_local_random_binding``; the router checks the queue's type,
        which this node may not know)."""
        self._check_exists(vhost, exchange)
        ex = self.exchanges.get((vhost, exchange))
        if ex is not None and ex.type == CONSISTENT_HASH:
            hash_weight(routing_key)
        elif ex is not None and ex.type == LOCAL_RANDOM:
            check_local_random_binding(dest_kind, routing_key)
        key = (dest_kind, destination, routing_key, freeze(arguments or {}))
        per_ex = self.bindings.setdefault((vhost, exchange), {})
        if key in per_ex:
            return
        data = [vhost, exchange, dest_kind, destination, routing_key, arguments or {}]
        per_ex[key] = data
        self.by_destination.setdefault((vhost, dest_kind, destination), set()).add(
            (exchange, key))
        self.emit(EV_BINDING_ADDED, data)

    def unbind(self, vhost: str, exchange: str, dest_kind: str, destination: str,
               routing_key: str, arguments: dict | None) -> None:
        """``queue.unbind`` / ``exchange.unbind``. Raises 404 if the exchange is missing; a
        missing binding is a success."""
        self._check_exists(vhost, exchange)
        key = (dest_kind, destination, routing_key, freeze(arguments or {}))
        if key in self.bindings.get((vhost, exchange), ()):
            self._remove_binding(vhost, exchange, key, auto_delete=True)

    def unbind_destination(self, vhost: str, dest_kind: str, destination: str) -> None:
        """Drop every binding of this node to a deleted queue ("q") or exchange ("e")."""
        refs = self.by_destination.get((vhost, dest_kind, destination))
        if not refs:
            return
        for exchange, key in sorted(refs, key=repr):
            if key in self.bindings.get((vhost, exchange), ()):
                self._remove_binding(vhost, exchange, key, auto_delete=True)

    def _remove_binding(self, vhost: str, exchange: str, key: tuple, auto_delete: bool) -> None:
        per_ex = self.bindings[(vhost, exchange)]
        data = per_ex.pop(key)
        dkey = (vhost, key[0], key[1])
        refs = self.by_destination.get(dkey)
        if refs is not None:
            refs.discard((exchange, key))
            if not refs:
                del self.by_destination[dkey]
        self.emit(EV_BINDING_REMOVED, data)
        if not per_ex:
            del self.bindings[(vhost, exchange)]
            ex = self.exchanges.get((vhost, exchange))
            if auto_delete and ex is not None and ex.auto_delete:
                self._remove_exchange(vhost, exchange)

    def snapshot(self) -> list:
        """TOPOLOGY_SNAPSHOT payload: [exchanges, bindings] as EV_*_ADDED data lists."""
        return [[ex.event_data() for ex in self.exchanges.values()],
                [data for per_ex in self.bindings.values() for data in per_ex.values()]]
