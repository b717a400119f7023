"""AMQP 1.0 addresses: RabbitMQ 4's v2 forms and RabbitMQ 3.x's v1 forms (RabbitMQ docs
"AMQP 1.0", section "Address"; rabbitmq_amqp1_0 plugin README for v1).

A target (where a client sends) resolves to an exchange and a routing key; a source (where a
client receives) to a queue, or to an exchange and binding key (v1 ``/exchange/X/K``: a
temporary queue bound to it). Names in v2 forms are percent-encoded (RFC 3986).

Errors: :class:`BadAddress` (the link is refused with ``amqp:invalid-field``).
"""
from __future__ import annotations

from typing import NamedTuple
from urllib.parse import quote, unquote


class BadAddress(ValueError):
    """An address of no known form."""


class Target(NamedTuple):
    exchange: str
    #: the routing key; None: each message's subject, or "" when it has none (the v1 forms
    #: ``/exchange/X`` and ``/queue``, RabbitMQ 4's ``lookup_routing_key``)
    routing_key: str | None
    #: the queue the address names (``/queues/q``): it must exist
    queue: str | None = None


class Source(NamedTuple):
    #: the queue to consume; None for ``/exchange/X/K`` (a temporary queue bound to X with K)
    queue: str | None
    exchange: str | None = None
    binding_key: str = ""
    #: v1 ``/queue/NAME``: declared (durable) when missing, as RabbitMQ 3.x's plugin does
    declare: bool = False


def _parts(address: str, prefix: str, count: int) -> list[str]:
    rest = address[len(prefix):]
    parts = rest.split("/") if rest else []
    if not 1 <= len(parts) <= count or parts[0] == "":
        raise BadAddress(f"address '{address}' is not of the form {prefix}...")
    return parts


def target(address: str | None) -> Target:
    """Where a message sent to ``address`` goes. Raises BadAddress."""
    if not isinstance(address, str) or not address:
        raise BadAddress("no target address (anonymous relay is resolved per message)")
    if address.startswith("/queues/"):
        (name,) = _parts(address, "/queues/", 1)
        name = unquote(name)
        return Target("", name, name)
    if address.startswith("/exchanges/"):
        parts = _parts(address, "/exchanges/", 2)
        exchange = unquote(parts[0])
        if exchange == "amq.default":
            raise BadAddress("the default exchange is addressed as /queues/NAME")
        # RabbitMQ 4 (parse_target_v2_string0): no key in a v2 address is the empty key
        return Target(exchange, unquote(parts[1]) if len(parts) == 2 else "")
    if address.startswith("/amq/queue/"):
        (name,) = _parts(address, "/amq/queue/", 1)
        return Target("", name, name)
    if address == "/queue":
        return Target("", None)
    if address.startswith("/queue/"):
        (name,) = _parts(address, "/queue/", 1)
        return Target("", name)
    if address.startswith("/exchange/"):
        parts = _parts(address, "/exchange/", 2)
        return Target(parts[0], parts[1] if len(parts) == 2 else None)
    if address.startswith("/topic/"):
        return Target("amq.topic", address[len("/topic/"):])
    raise BadAddress(f"address '{address}' is not of a known form: /queues/NAME, "
                     "/exchanges/NAME/KEY, /amq/queue/NAME, /queue/NAME, /exchange/NAME/KEY, "
                     "/topic/KEY")


def source(address: str | None) -> Source:
    """What a link receiving from ``address`` consumes. Raises BadAddress."""
    if not isinstance(address, str) or not address:
        raise BadAddress("no source address")
    if address.startswith("/queues/"):
        (name,) = _parts(address, "/queues/", 1)
        return Source(unquote(name))
    if address.startswith("/amq/queue/"):
        (name,) = _parts(address, "/amq/queue/", 1)
        return Source(name)
    if address.startswith("/queue/"):
        (name,) = _parts(address, "/queue/", 1)
        return Source(name, declare=True)
    if address.startswith("/exchange/"):
        parts = _parts(address, "/exchange/", 2)
        return Source(None, parts[0], parts[1] if len(parts) == 2 else "")
    if address.startswith("/topic/"):
        return Source(None, "amq.topic", address[len("/topic/"):])
    raise BadAddress(f"address '{address}' is not of a known form: /queues/NAME, "
                     "/amq/queue/NAME, /queue/NAME, /exchange/NAME/KEY, /topic/KEY")


def queue_address(name: str) -> str:
    """The v2 address of queue ``name`` (a dynamic node's address)."""
    return "/queues/" + quote(name, safe="")
