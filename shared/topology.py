"""Topology facts the router and the nodes must agree on (AMQP 0-9-1 spec 3.1.3).

* :data:`BUILTIN_EXCHANGES`: the exchanges every virtual host has, by name, with their type
  (RabbitMQ adds ``amq.match`` as a second headers exchange). They cannot be declared
  differently or deleted.
* :data:`EXCHANGE_TYPES`: the exchange types Shoal routes.
* :func:`freeze`: the identity of a binding's arguments table, so that the same binding is the
  same on every router, on the owning node and in its journal.
"""
from __future__ import annotations

from typing import Any

BUILTIN_EXCHANGES: dict[str, str] = {
    "": "direct",
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.topic": "topic",
    "amq.headers": "headers",
    "amq.match": "headers",
}

EXCHANGE_TYPES = frozenset({"direct", "fanout", "topic", "headers"})


def freeze(value: Any) -> Any:
    """A hashable, order-independent form of an AMQP table value (binding identity)."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value
