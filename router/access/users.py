"""Access control: who may log in, open which virtual host, and use which resource.

RabbitMQ's model (https://www.rabbitmq.com/access-control.html): a user has, per virtual
host, three regular expressions, ``configure``, ``write`` and ``read``, matched against the
name of the exchange or queue an AMQP method touches. Which methods need which permission
on which resource is RabbitMQ's table ("How Permissions Work"), followed here:

============================  ==============  ==================  ==============
method                        configure       write               read
============================  ==============  ==================  ==============
exchange.declare              exchange        alternate exch.     exchange (AE)
exchange.declare passive      -               -                   -
exchange.delete               exchange        -                   -
queue.declare                 queue           dead-letter exch.   queue (DLX)
queue.declare passive         -               -                   -
queue.delete                  queue           -                   -
exchange.bind / unbind        -               destination exch.   source exch.
queue.bind / unbind           -               queue               exchange
basic.publish                 -               exchange            -
basic.get / consume           -               -                   queue
queue.purge                   -               -                   queue
============================  ==============  ==================  ==============

The default exchange is checked under the name ``amq.default``. Topic permissions add, for
topic exchanges, a ``write`` expression on the routing key of a publish and a ``read``
expression on the binding key of a queue.bind; an exchange with no topic permission for the
user is open. A refusal is 403 ACCESS_REFUSED (soft), worded as RabbitMQ words it: "access to
queue 'q' in vhost '/' refused for user 'u'".
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from shoal.shared.definitions import Definitions, Permission, User
from shoal.shared.errors import ACCESS_REFUSED, AMQPError, soft_error

log = logging.getLogger("shoal.router.access.users")

CONFIGURE, WRITE, READ = "configure", "write", "read"
_ALL = ".*"
_CACHE_MAX = 256   #: names remembered per VhostAccess and permission (publish's hot path)


def _compile(expr: str) -> re.Pattern:
    # RabbitMQ replaces "" with "^$": an empty expression grants nothing (but the empty name).
    return re.compile(expr or "^$")


@dataclass
class VhostAccess:
    """One user's permissions in one virtual host, for one connection. ``unrestricted`` is
    True when every expression is ``.*`` and no topic permission applies: checks are then
    skipped (the common case costs nothing on the publish path)."""

    user: str
    vhost: str
    permission: Permission
    topics: dict[str, tuple[str, str]] = field(default_factory=dict)  #: exchange -> (w, r)
    #: the user has the ``impersonator`` tag: its publishes may name another ``user_id``
    impersonator: bool = False

    def __post_init__(self) -> None:
        p = self.permission
        self._patterns = {CONFIGURE: _compile(p.configure), WRITE: _compile(p.write),
                          READ: _compile(p.read)}
        self._cache: dict[tuple[str, str], bool] = {}
        self.unrestricted = (p.configure == p.write == p.read == _ALL) and not self.topics

    def allowed(self, perm: str, name: str) -> bool:
        """Whether ``perm`` (configure/write/read) is granted on the resource ``name``."""
        key = (perm, name)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._patterns[perm].search(name) is not None
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def check(self, perm: str, kind: str, name: str) -> None:
        """Raise 403 ACCESS_REFUSED (soft) unless ``perm`` is granted on the ``kind``
        ("queue" or "exchange") named ``name`` ("" is the default exchange, amq.default)."""
        if self.unrestricted:
            return
        if kind == "exchange" and name == "":
            name = "amq.default"
        if not self.allowed(perm, name):
            raise refused(kind, name, self.vhost, self.user)

    def check_topic(self, perm: str, exchange: str, routing_key: str) -> None:
        """Raise 403 ACCESS_REFUSED (soft) unless the topic permission of ``exchange`` (a topic
        exchange) grants ``perm`` (write: publish, read: bind) on ``routing_key``. The
        expressions may use ``{username}`` and ``{vhost}``, as RabbitMQ's."""
        rule = self.topics.get(exchange)
        if rule is None:
            return
        expr = rule[0] if perm == WRITE else rule[1]
        expr = expr.replace("{username}", re.escape(self.user)).replace(
            "{vhost}", re.escape(self.vhost))
        if _compile(expr).search(routing_key) is None:
            raise soft_error(ACCESS_REFUSED, f"access to topic '{routing_key}' in exchange "
                                             f"'{exchange}' in vhost '{self.vhost}' refused "
                                             f"for user '{self.user}'")


def refused(kind: str, name: str, vhost: str, user: str) -> AMQPError:
    return soft_error(ACCESS_REFUSED, f"access to {kind} '{name}' in vhost '{vhost}' refused "
                                      f"for user '{user}'")


class UserStore:
    """The users, virtual hosts and permissions a router checks against, built from
    :class:`~shoal.shared.definitions.Definitions` (a definitions file, or the ``users``
    setting). ``loopback_users`` may only log in from a loopback address (RabbitMQ's
    ``loopback_users``, guest by default)."""

    def __init__(self, defs: Definitions, loopback_users: tuple[str, ...] = ("guest",)) -> None:
        self.users: dict[str, User] = dict(defs.users)
        self.vhosts: list[str] = list(defs.vhosts)
        self.permissions = dict(defs.permissions)
        self.topics: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}
        for t in defs.topic_permissions:
            self.topics.setdefault((t.user, t.vhost), {})[t.exchange] = (t.write, t.read)
        self.loopback_users = frozenset(loopback_users)

    def authenticate(self, user: str, password: str | None, peer: str, loopback: bool) -> bool:
        """Whether ``user`` logs in with ``password`` from ``peer``; ``password`` None means
        a verified TLS client certificate named the user (EXTERNAL), who must then exist. A
        refusal is logged with the peer address and the reason, never the password (RabbitMQ
        logs the same)."""
        u = self.users.get(user)
        if u is None or (password is not None and not u.check_password(password)):
            log.warning("login refused from %s: user '%s' - %s", peer, user,
                        "no such user" if password is None else "invalid credentials")
            return False
        if user in self.loopback_users and not loopback:
            log.warning("login refused from %s: user '%s' can only connect via localhost",
                        peer, user)
            return False
        return True

    def vhost_access(self, user: str, vhost: str) -> VhostAccess | None:
        """``user``'s permissions in ``vhost``, or None when it has none there (RabbitMQ then
        refuses connection.open with 530)."""
        perm = self.permissions.get((user, vhost))
        if perm is None:
            return None
        u = self.users.get(user)
        return VhostAccess(user, vhost, perm, dict(self.topics.get((user, vhost), {})),
                           u is not None and "impersonator" in u.tags)
