"""User and virtual-host limits (issue 22, point 3), with RabbitMQ's names, reply codes and
texts (https://www.rabbitmq.com/docs/user-limits, /docs/vhosts#limits).

- user limits (a definitions file's ``users[].limits``): ``max-connections`` and
  ``max-channels`` (channels over all of the user's connections);
- vhost limits (``parameters`` of component ``vhost-limits``, or ``vhosts[].limits``):
  ``max-connections`` and ``max-queues``.

A negative value, or none, means no limit; 0 refuses every connection (or queue). Connection
and channel counts are this router's: with several routers each enforces the limits over the
connections it holds (docs/security.md). The queue count is the cluster's, asked of the nodes
(router/frontend/topology_methods.py).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from shoal.shared.definitions import Definitions


def _limit(limits: dict, key: str) -> int | None:
    value = limits.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


class Limits:
    """This router's connection and channel counts, checked against the definitions' limits.
    The ``admit_*`` methods return None to admit, or the 530 NOT_ALLOWED reply text."""

    def __init__(self, defs: Definitions) -> None:
        self.user_limits = {name: dict(u.limits) for name, u in defs.users.items() if u.limits}
        self.vhost_limits = {v: dict(lim) for v, lim in defs.vhost_limits.items() if lim}
        self.connections_by_user: Counter[str] = Counter()
        self.connections_by_vhost: Counter[str] = Counter()

    def admit_connection(self, user: str, vhost: str) -> str | None:
        """connection.open of ``user`` to ``vhost``: the vhost's limit first, then the
        user's, as RabbitMQ's rabbit_reader checks them."""
        cap = _limit(self.vhost_limits.get(vhost, {}), "max-connections")
        if cap is not None and self.connections_by_vhost[vhost] >= cap:
            return (f"access to vhost '{vhost}' refused for user '{user}': connection limit "
                    f"({cap}) is reached")
        cap = _limit(self.user_limits.get(user, {}), "max-connections")
        if cap is not None and self.connections_by_user[user] >= cap:
            return f"connection refused for user '{user}': user connection limit ({cap}) is " \
                   f"reached"
        return None

    def connection_opened(self, user: str, vhost: str) -> None:
        self.connections_by_user[user] += 1
        self.connections_by_vhost[vhost] += 1

    def connection_closed(self, user: str, vhost: str) -> None:
        _down(self.connections_by_user, user)
        _down(self.connections_by_vhost, vhost)

    def admit_channel(self, user: str, open_channels: Callable[[], int]) -> str | None:
        """channel.open by ``user``: its ``max-channels`` over all its connections
        (``open_channels()`` counts them, asked only when the user has that limit)."""
        cap = _limit(self.user_limits.get(user, {}), "max-channels")
        if cap is not None and open_channels() >= cap:
            return f"number of channels opened for user '{user}' has reached the maximum " \
                   f"allowed user limit of ({cap})"
        return None

    def max_queues(self, vhost: str) -> int | None:
        """The vhost's ``max-queues``, or None."""
        return _limit(self.vhost_limits.get(vhost, {}), "max-queues")


def _down(counter: Counter, key: str) -> None:
    left = counter[key] - 1
    if left > 0:
        counter[key] = left
    else:
        counter.pop(key, None)
