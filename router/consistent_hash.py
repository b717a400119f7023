"""Routing of a consistent-hash exchange (type ``x-consistent-hash``, RabbitMQ's
rabbitmq_consistent_hash_exchange plugin).

Each message goes to exactly one of the exchange's destinations (none without bindings),
chosen by a hash of its routing key; with the exchange argument ``hash-header``, of that
header's value; with ``hash-property``, of its ``message_id``, ``correlation_id`` or
``timestamp`` (in seconds). A binding's routing key is its weight, 1 to 10,000
(shared/topology.py ``hash_weight``, checked by the owning node): a queue bound with weight 2
gets about twice the share of one bound with 1. A destination counts once: a second binding
of it does not change its share (RabbitMQ ignores it alike, "already exists").

The choice is a ring of points (consistent hashing, Karger et al. 1997): a binding of weight W
puts W points on it, each at a hash (BLAKE2b, 64 bits) of its destination and the point's
number, and a message goes to the first point at or after its own value's hash. So the same
value always reaches the same queue while the bindings stay, through any router, whatever
order the bindings came in; a binding added or removed moves only the values on its own
points' arcs. RabbitMQ numbers buckets in binding order and picks one with jump consistent
hashing over ``erlang:phash2``: which queue a given key reaches differs from RabbitMQ's, as
it may between two RabbitMQ clusters with bindings made in another order.
"""
from __future__ import annotations

import datetime
import hashlib
from bisect import bisect_left
from typing import Any, Callable, Iterable

from shoal.shared.errors import AMQPError
from shoal.shared.topology import hash_arguments, hash_weight


def _hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class HashRing:
    """The points of an exchange's bindings, sorted: ``points`` (hashes) and ``bindings``
    (the binding of each point). A binding whose key is not a weight adds none (the node
    refuses such a binding; this guards a stored one)."""

    __slots__ = ("points", "bindings")

    def __init__(self, bindings: Iterable[Any]) -> None:
        seen: set[tuple[str, str]] = set()
        points: list[tuple[int, str, str, int, Any]] = []
        for b in bindings:
            dest = (b.dest_kind, b.destination)
            if dest in seen:
                continue
            try:
                weight = hash_weight(b.routing_key)
            except AMQPError:
                continue
            seen.add(dest)
            seed = f"{b.dest_kind}\0{b.destination}\0".encode()
            points += [(_hash(seed + str(i).encode()), b.dest_kind, b.destination, i, b)
                       for i in range(weight)]
        points.sort(key=lambda p: p[:4])
        self.points = [p[0] for p in points]
        self.bindings = [p[4] for p in points]

    def pick(self, value: bytes) -> Any:
        """The binding ``value`` goes to, or None when there is none."""
        if not self.points:
            return None
        i = bisect_left(self.points, _hash(value))
        return self.bindings[i if i < len(self.points) else 0]


def _as_bytes(value: Any) -> bytes:
    """A header or property value as the bytes hashed: text as UTF-8, a number in decimal,
    missing as nothing (every message without it goes to one queue)."""
    if value is None:
        return b""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if isinstance(value, datetime.datetime):    # AMQP timestamps are UTC; a naive one too
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return str(int(value.timestamp())).encode()
    return str(value).encode("utf-8", "replace")


def route(ex: Any, routing_key: str, headers: Callable[[], dict | None],
          props: Callable[[], Any]) -> list:
    """The binding (a list of at most one) a message published to consistent-hash exchange
    ``ex`` (router/routing.py ``Exchange``) reaches. ``headers`` and ``props`` give the
    message's headers and properties, decoded only when the exchange hashes on one."""
    if not ex.bindings:
        return []
    if ex.ring is None:
        ex.ring = HashRing(ex.bindings.values())
    header, prop = hash_arguments(ex.arguments)
    if isinstance(header, str):
        value = _as_bytes((headers() or {}).get(header))
    elif isinstance(prop, str):
        p = props()
        value = _as_bytes(getattr(p, prop, None) if p is not None else None)
    else:
        value = routing_key.encode("utf-8", "surrogateescape")
    b = ex.ring.pick(value)
    return [] if b is None else [b]
