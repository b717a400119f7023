"""Topology facts the router and the nodes must agree on (AMQP 0-9-1 spec 3.1.3).

* :data:`BUILTIN_EXCHANGES`: the exchanges every virtual host has, by name, with their type
  (RabbitMQ adds ``amq.match`` as a second headers exchange). They cannot be declared
  differently or deleted.
* :data:`EXCHANGE_TYPES`: the exchange types Shoal routes.
* :func:`check_hash_arguments`, :func:`hash_arguments`, :func:`hash_weight`: what a
  consistent-hash exchange (``x-consistent-hash``) and its bindings accept (the owning node
  refuses the rest) and what it hashes on.
* :func:`check_local_random_binding`: what a local-random exchange (``x-local-random``)
  may be bound to.
* :func:`freeze`: the identity of a binding's arguments table, so that the same binding is the
  same on every router, on the owning node and in its journal.
"""
from __future__ import annotations

import re
from typing import Any

from shoal.shared.errors import PRECONDITION_FAILED, soft_error

BUILTIN_EXCHANGES: dict[str, str] = {
    "": "direct",
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.topic": "topic",
    "amq.headers": "headers",
    "amq.match": "headers",
}

#: RabbitMQ's rabbitmq_consistent_hash_exchange plugin's type (router/consistent_hash.py)
CONSISTENT_HASH = "x-consistent-hash"

#: RabbitMQ 4's local-random exchange type (router/routing.py; rabbit_exchange_type_local_random)
LOCAL_RANDOM = "x-local-random"

EXCHANGE_TYPES = frozenset({"direct", "fanout", "topic", "headers", CONSISTENT_HASH,
                            LOCAL_RANDOM})

#: the largest weight (binding key) of a consistent-hash binding (RabbitMQ's
#: ``MAX_BINDING_WEIGHT``)
MAX_HASH_WEIGHT = 10_000
#: Erlang's list_to_integer: an optional sign, ASCII digits (not Python's "1_000" or " 5")
_INTEGER = re.compile(r"[+-]?[0-9]+")
#: what ``hash-property`` may name
HASH_PROPERTIES = ("correlation_id", "message_id", "timestamp")


def check_hash_arguments(arguments: dict | None) -> None:
    """A consistent-hash exchange's arguments: ``hash-header`` (a header's name) or
    ``hash-property`` (one of :data:`HASH_PROPERTIES`), not both. Raises 406
    PRECONDITION_FAILED (soft) with RabbitMQ's texts (rabbit_exchange_type_consistent_hash
    ``validate``)."""
    header, prop = hash_arguments(arguments)
    if header is not None and prop is not None:
        raise soft_error(PRECONDITION_FAILED,
                         "hash-header and hash-property are mutually exclusive")
    if header is not None and not isinstance(header, str):
        # RabbitMQ 3.10 crashes here (541 INTERNAL_ERROR); a clear refusal instead
        raise soft_error(PRECONDITION_FAILED,
                         f"hash-header must be a string, not {header!r}")
    if prop is not None and prop not in HASH_PROPERTIES:
        raise soft_error(PRECONDITION_FAILED, f"Unsupported property: {prop}")


def hash_arguments(arguments: dict | None) -> tuple[Any, Any]:
    """A consistent-hash exchange's ``hash-header`` and ``hash-property`` (None where
    absent), a binary value read as UTF-8 text; not checked (:func:`check_hash_arguments`
    does, at declare)."""
    args = arguments or {}
    header, prop = args.get("hash-header"), args.get("hash-property")
    if isinstance(header, (bytes, bytearray)):
        header = bytes(header).decode("utf-8", "replace")
    if isinstance(prop, (bytes, bytearray)):
        prop = bytes(prop).decode("utf-8", "replace")
    return header, prop


def _erlang_binary(text: str) -> str:
    """``text`` as RabbitMQ's error texts print a binary (Erlang's ``~p``): ``<<"abc">>``
    when every octet is printable ASCII, else its octets, ``<<239,188,149>>``."""
    raw = text.encode("utf-8", "surrogateescape")
    if all(32 <= b < 127 for b in raw):
        return '<<"' + text.replace("\\", "\\\\").replace('"', '\\"') + '">>'
    return "<<" + ",".join(str(b) for b in raw) + ">>"


def hash_weight(routing_key: str) -> int:
    """A consistent-hash binding's weight: its routing key, an integer from 1 to
    :data:`MAX_HASH_WEIGHT`. Raises 406 PRECONDITION_FAILED (soft) with RabbitMQ's texts
    (rabbit_exchange_type_consistent_hash ``validate_binding``; checked against RabbitMQ
    3.10.8, which has no maximum: that is RabbitMQ 4's)."""
    weight = int(routing_key) if _INTEGER.fullmatch(routing_key) else None
    if weight is None:
        raise soft_error(PRECONDITION_FAILED,
                         f"The binding key must be an integer: {_erlang_binary(routing_key)}")
    if weight < 1:
        raise soft_error(PRECONDITION_FAILED, "The binding key must be greater than 0")
    if weight > MAX_HASH_WEIGHT:
        raise soft_error(PRECONDITION_FAILED,
                         f"The binding key must not exceed {MAX_HASH_WEIGHT}")
    return weight


def check_local_random_binding(dest_kind: str, routing_key: str,
                               queue_type: str = "classic") -> None:
    """A local-random exchange's binding: to a classic queue (``dest_kind`` "q",
    ``queue_type`` "classic"), with the empty routing key. Raises 406 PRECONDITION_FAILED
    (soft) with RabbitMQ 4's texts and in its order: the key, then the destination
    (rabbit_exchange_type_local_random ``validate_binding``, since RabbitMQ 4.0; an exchange
    is a destination it does not find). ``queue_type`` is "classic", "quorum" or "stream"."""
    if routing_key != "":
        raise soft_error(PRECONDITION_FAILED,
                         f"Non empty binding '{routing_key}' key not permitted")
    if dest_kind != "q":
        raise soft_error(PRECONDITION_FAILED, "Destination not found")
    if queue_type != "classic":
        raise soft_error(PRECONDITION_FAILED,
                         f"Queue type rabbit_{queue_type}_queue not valid for this exchange type")


def freeze(value: Any) -> Any:
    """A hashable, order-independent form of an AMQP table value (binding identity)."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value
