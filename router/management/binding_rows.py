"""A binding as the management API shows it, and the ``properties_key`` that names one in a
path (RabbitMQ's ``rabbit_mgmt_format:pack_binding_props`` and ``rabbit_mgmt_wm_binding``'s
``unpack``).

A ``properties_key`` is the routing key, quoted as a query string is (``quote_plus``, ``~``
as ``%7E``), ``~`` for an empty key; a binding with arguments adds ``~`` and a hash of them,
so two bindings that differ only in their arguments (a headers exchange's) have two keys.
RabbitMQ's hash is Erlang's ``phash2`` of the arguments' term; Shoal's is the first 4 octets
of the SHA-256 of their JSON (keys sorted), in base64url as RabbitMQ's: the same shape, not
the same text, and the same on every router. A client reads the key from a listing and sends
it back in the path, percent-encoded once more.
"""
from __future__ import annotations

import base64
import hashlib
import json
from urllib.parse import quote_plus, unquote_plus

from shoal.shared import wire

from shoal.router.broker import Broker


def args_hash(arguments: dict) -> str:
    """A binding's arguments -> 6 characters of base64url (4 octets of SHA-256)."""
    canonical = json.dumps(arguments, sort_keys=True, default=repr).encode()
    return base64.urlsafe_b64encode(hashlib.sha256(canonical).digest()[:4]).decode().rstrip("=")


def _quote(text: str) -> str:
    return quote_plus(text, safe="").replace("~", "%7E")


def properties_key(routing_key: str, arguments: dict) -> str:
    """``"~"`` for an empty key and no arguments; the quoted key; or ``key~hash`` (``~hash``
    for an empty key with arguments)."""
    if not arguments:
        return _quote(routing_key) if routing_key else "~"
    return f"{_quote(routing_key)}~{_quote(args_hash(arguments))}"


def unpack(props: str) -> tuple[str, str | None] | None:
    """A path's ``properties_key`` -> ``(routing key, arguments' hash or None for none)``;
    None when it has more than two ``~``-separated parts (RabbitMQ: 400 too_many_tokens)."""
    key, _, rest = props.partition("~")
    if "~" in rest:
        return None
    return unquote_plus(key), (unquote_plus(rest) if rest else None)


def matches(row: dict, key: str, hashed: str | None) -> bool:
    """Whether a binding row is the one ``unpack``'s answer names."""
    if row["routing_key"] != key:
        return False
    if hashed is None:
        return not row["arguments"]
    return bool(row["arguments"]) and args_hash(row["arguments"]) == hashed


def binding_rows(broker: Broker, vhost: str | None) -> list[dict]:
    """Every explicit binding (of one vhost, or all), sorted by source exchange, as
    ``/api/bindings`` lists them (``rabbit_mgmt_format:binding``)."""
    rows = []
    for (vh, name), ex in sorted(broker.topology.exchanges.items()):
        if vhost is not None and vh != vhost:
            continue
        for b in ex.bindings.values():
            rows.append({"source": name, "vhost": vh, "destination": b.destination,
                         "destination_type": "queue" if b.dest_kind == wire.DEST_QUEUE
                         else "exchange", "routing_key": b.routing_key,
                         "arguments": b.arguments,
                         "properties_key": properties_key(b.routing_key, b.arguments)})
    return rows
