"""Who may open a connection or a channel, for both protocols' client connections (0-9-1's
connection.open and channel.open, AMQP 1.0's open and begin): RabbitMQ's order of checks and
refusal texts (router/access/limits.py holds the limits, router/access/users.py the
permissions)."""
from __future__ import annotations

import ipaddress
from typing import Any


def is_loopback(peer: Any) -> bool:
    """Whether a socket's peer address (``(host, port, ...)``) is a loopback address."""
    try:
        return ipaddress.ip_address(peer[0]).is_loopback
    except (TypeError, ValueError, IndexError):
        return False


def refuse_connection(broker: Any, user: str, vhost: str) -> str | None:
    """None, or why ``user`` may not open a connection to ``vhost`` (0-9-1: 530; RabbitMQ's
    order: the vhost's connection limit, the user's, then the user's permissions there)."""
    refusal = broker.limits.admit_connection(user, vhost)
    if refusal is None and broker.users.vhost_access(user, vhost) is None:
        refusal = f"access to vhost '{vhost}' refused for user '{user}'"
    return refusal


def refuse_channel(broker: Any, user: str) -> str | None:
    """None, or why ``user`` may not open one more channel (an AMQP 1.0 session counts as
    one): its ``max-channels`` over all its connections on this router."""
    def open_channels() -> int:
        return sum(c.amqp.open_channels for c in broker.connections
                   if c.amqp is not None and c.amqp.user == user)
    return broker.limits.admit_channel(user, open_channels)
