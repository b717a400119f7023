"""RabbitMQ definitions (users, virtual hosts, permissions, topology) and password hashes.

The format is RabbitMQ's (``rabbitmqctl export_definitions``, the management API's
``/api/definitions``; https://www.rabbitmq.com/definitions.html): a JSON object with ``users``
(``name``, ``password_hash``, ``hashing_algorithm``, ``tags``, ``limits``), ``vhosts``
(``name``), ``permissions`` (``user``, ``vhost``, ``configure``, ``write``, ``read``),
``topic_permissions`` (``user``, ``vhost``, ``exchange``, ``write``, ``read``), and ``queues``,
``exchanges``, ``bindings``, ``policies``, ``parameters``, ``global_parameters``. Every key is
optional, so a file with only users, vhosts and permissions is fine; keys Shoal does not use
(``rabbit_version``, ``policies``, ...) are read and ignored.

Password hashes are RabbitMQ's (``rabbit_password_hashing_sha256``, the default, ``_sha512`` and
``_md5``): base64 of a 4-byte random salt followed by ``H(salt + UTF-8 password)``
(RabbitMQ's ``rabbit_password:hash/2``), so users exported from RabbitMQ log in unchanged.

Both the router (which checks logins and permissions) and, later, the node (which stores the
definitions) read this module; it imports nothing of either.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

DEFAULT_HASHING = "rabbit_password_hashing_sha256"
#: RabbitMQ's hashing modules and the digest each uses.
HASHING_ALGORITHMS = {
    "rabbit_password_hashing_sha256": hashlib.sha256,
    "rabbit_password_hashing_sha512": hashlib.sha512,
    "rabbit_password_hashing_md5": hashlib.md5,
}
SALT_BYTES = 4   #: RabbitMQ's salt length (rabbit_password:generate_salt/0)
#: The user tags RabbitMQ's management plugin knows; others are kept and ignored.
KNOWN_TAGS = ("administrator", "monitoring", "policymaker", "management", "impersonator")


def hash_password(password: str, algorithm: str = DEFAULT_HASHING,
                  salt: bytes | None = None) -> str:
    """``password``'s hash in RabbitMQ's form: base64(salt + H(salt + UTF-8 password)), with a
    fresh 4-byte ``salt`` unless one is given. Raises ConfigError for an unknown algorithm."""
    digest = _digest(algorithm)
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    return base64.b64encode(salt + digest(salt + password.encode("utf-8")).digest()).decode()


def check_password(password: str, password_hash: str, algorithm: str = DEFAULT_HASHING) -> bool:
    """Whether ``password`` matches ``password_hash`` (RabbitMQ's form). An empty hash matches
    nothing: such a user cannot log in with a password (RabbitMQ's passwordless users)."""
    if not password_hash:
        return False
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except (binascii.Error, ValueError):
        return False
    salt, expected = raw[:SALT_BYTES], raw[SALT_BYTES:]
    actual = _digest(algorithm)(salt + password.encode("utf-8")).digest()
    return hmac.compare_digest(actual, expected)


def _digest(algorithm: str):
    try:
        return HASHING_ALGORITHMS[algorithm]
    except KeyError:
        raise ConfigError(f"unknown hashing_algorithm '{algorithm}' (known: "
                          f"{', '.join(HASHING_ALGORITHMS)})") from None


@dataclass(frozen=True)
class User:
    """One user: ``password_hash`` in RabbitMQ's form ("" = cannot log in with a password),
    ``tags`` such as ``administrator``, ``limits`` such as ``{"max-connections": 10}``."""

    name: str
    password_hash: str
    hashing_algorithm: str = DEFAULT_HASHING
    tags: tuple[str, ...] = ()
    limits: dict = field(default_factory=dict, compare=False)

    def check_password(self, password: str) -> bool:
        return check_password(password, self.password_hash, self.hashing_algorithm)


@dataclass(frozen=True)
class Permission:
    """A user's permissions in one virtual host: three regular expressions matched (searched,
    not anchored, as RabbitMQ's ``re:run``) against resource names; "" grants nothing."""

    user: str
    vhost: str
    configure: str
    write: str
    read: str


@dataclass(frozen=True)
class TopicPermission:
    """A user's topic permissions on one topic exchange of a virtual host: regular expressions
    matched against routing keys (``write``: publish) and binding keys (``read``: queue.bind)."""

    user: str
    vhost: str
    exchange: str
    write: str
    read: str


@dataclass
class Definitions:
    """What a definitions file holds. ``queues``, ``exchanges`` and ``bindings`` are kept as
    RabbitMQ writes them (lists of dicts)."""

    users: dict[str, User] = field(default_factory=dict)
    vhosts: list[str] = field(default_factory=list)
    permissions: dict[tuple[str, str], Permission] = field(default_factory=dict)
    topic_permissions: list[TopicPermission] = field(default_factory=list)
    #: vhost -> {"max-connections": n, "max-queues": n} (``parameters`` of component
    #: ``vhost-limits``, or a vhost's own ``limits``)
    vhost_limits: dict[str, dict] = field(default_factory=dict)
    #: vhost -> ``classic`` or ``quorum``: the type of a queue declared there without
    #: ``x-queue-type`` (a vhost's ``metadata.default_queue_type``, RabbitMQ 3.11+)
    default_queue_types: dict[str, str] = field(default_factory=dict)
    queues: list[dict] = field(default_factory=list)
    exchanges: list[dict] = field(default_factory=list)
    bindings: list[dict] = field(default_factory=list)


#: The queue types a vhost's ``default_queue_type`` may name.
DEFAULT_QUEUE_TYPES = ("classic", "quorum", "stream")


def from_settings(users: dict[str, str], vhosts: list[str]) -> Definitions:
    """The development users of the ``users`` setting (name: plain-text password), hashed on
    load, each tagged ``administrator`` with all permissions (``.*``) in every vhost, as
    RabbitMQ's default user has in its default vhost."""
    defs = Definitions(vhosts=list(vhosts))
    for name, password in users.items():
        defs.users[name] = User(name, hash_password(password), tags=("administrator",))
        for vhost in vhosts:
            defs.permissions[(name, vhost)] = Permission(name, vhost, ".*", ".*", ".*")
    return defs


def definitions_for(settings: Any) -> Definitions:
    """What a router starts with: the file named by the ``load_definitions`` setting (RabbitMQ's
    name; env ``SHOAL_LOAD_DEFINITIONS``, flag ``--definitions``) when set (then, as RabbitMQ
    does, the ``users`` and ``vhosts`` settings' defaults are not added), else the ``users``
    and ``vhosts`` settings (:func:`from_settings`). Raises ConfigError."""
    if settings.load_definitions:
        return load_definitions(settings.load_definitions)
    return from_settings(settings.users, settings.vhosts)


def load_definitions(path: str | os.PathLike) -> Definitions:
    """Read and check a definitions file. Raises ConfigError naming the file and the entry."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read definitions file {str(p)!r}: {exc.strerror}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"definitions file {str(p)!r} is not valid JSON: {exc}") from None
    return parse_definitions(data, str(p))


def parse_definitions(data: Any, source: str = "definitions") -> Definitions:
    """``data`` (a parsed definitions document) checked and converted. Raises ConfigError
    naming ``source`` and the first bad entry (a missing field, a bad regular expression, an
    unknown hashing algorithm, a permission for an unknown user or vhost)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: must hold a JSON object")
    defs = Definitions()

    def items(key: str) -> list[dict]:
        value = data.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise ConfigError(f"{source}: '{key}' must be a list of objects")
        return value

    def text(entry: dict, key: str, where: str, default: str | None = None) -> str:
        value = entry.get(key, default)
        if not isinstance(value, str):
            raise ConfigError(f"{source}: {where} needs a string '{key}' (got {value!r})")
        return value

    def regex(entry: dict, key: str, where: str) -> str:
        value = text(entry, key, where)
        try:
            re.compile(value)
        except re.error as exc:
            raise ConfigError(f"{source}: {where}: '{key}' is not a valid regular expression "
                              f"({exc})") from None
        return value

    for i, u in enumerate(items("users")):
        where = f"users[{i}]"
        name = text(u, "name", where)
        algorithm = text(u, "hashing_algorithm", f"user '{name}'", DEFAULT_HASHING)
        if algorithm not in HASHING_ALGORITHMS:
            raise ConfigError(f"{source}: user '{name}': unknown hashing_algorithm "
                              f"'{algorithm}' (known: {', '.join(HASHING_ALGORITHMS)})")
        tags = u.get("tags", [])
        if isinstance(tags, str):     # RabbitMQ before 3.10 writes "administrator,management"
            tags = [t for t in tags.split(",") if t]
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise ConfigError(f"{source}: user '{name}': 'tags' must be a list of strings")
        limits = _checked_limits(u.get("limits") or {}, f"{source}: user '{name}'")
        defs.users[name] = User(name, text(u, "password_hash", f"user '{name}'", ""),
                                algorithm, tuple(t.strip() for t in tags), limits)
    for i, v in enumerate(items("vhosts")):
        name = text(v, "name", f"vhosts[{i}]")
        if name not in defs.vhosts:
            defs.vhosts.append(name)
        limits = v.get("limits") or {}
        if isinstance(limits, list):      # RabbitMQ's export: [["max-queues", 1], ...]
            limits = dict(p for p in limits if isinstance(p, list) and len(p) == 2)
        if limits:
            defs.vhost_limits[name] = _checked_limits(limits, f"{source}: vhost '{name}'")
        meta = v.get("metadata") if isinstance(v.get("metadata"), dict) else {}
        qtype = meta.get("default_queue_type", v.get("default_queue_type"))
        if qtype not in (None, "", "undefined"):
            if qtype not in DEFAULT_QUEUE_TYPES:
                raise ConfigError(f"{source}: vhost '{name}': default_queue_type must be "
                                  f"one of {', '.join(DEFAULT_QUEUE_TYPES)} (got {qtype!r})")
            defs.default_queue_types[name] = qtype
    for i, p in enumerate(items("parameters")):
        if p.get("component") == "vhost-limits":
            vhost = text(p, "vhost", f"parameters[{i}]")
            defs.vhost_limits[vhost] = _checked_limits(p.get("value") or {},
                                                       f"{source}: parameters[{i}]")
    for i, p in enumerate(items("permissions")):
        where = f"permissions[{i}]"
        user, vhost = text(p, "user", where), text(p, "vhost", where)
        _known(defs, user, vhost, source, where)
        defs.permissions[(user, vhost)] = Permission(user, vhost, regex(p, "configure", where),
                                                     regex(p, "write", where),
                                                     regex(p, "read", where))
    for i, p in enumerate(items("topic_permissions")):
        where = f"topic_permissions[{i}]"
        user, vhost = text(p, "user", where), text(p, "vhost", where)
        _known(defs, user, vhost, source, where)
        defs.topic_permissions.append(TopicPermission(
            user, vhost, text(p, "exchange", where), regex(p, "write", where),
            regex(p, "read", where)))
    defs.queues, defs.exchanges, defs.bindings = \
        items("queues"), items("exchanges"), items("bindings")
    return defs


def _checked_limits(limits: Any, where: str) -> dict:
    """A ``limits`` object: names to integers (negative: no limit), as RabbitMQ stores them."""
    if not isinstance(limits, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in limits.values()):
        raise ConfigError(f"{where}: 'limits' must map limit names to integers (got "
                          f"{limits!r})")
    return dict(limits)


def _known(defs: Definitions, user: str, vhost: str, source: str, where: str) -> None:
    if user not in defs.users:
        raise ConfigError(f"{source}: {where}: no user '{user}' in the file")
    if vhost not in defs.vhosts:
        raise ConfigError(f"{source}: {where}: no vhost '{vhost}' in the file")


def access_document(defs: Definitions) -> dict:
    """The users, vhosts, permissions, topic permissions and vhost limits of ``defs`` as a
    RabbitMQ definitions document (what the first node stores; :func:`parse_definitions`
    reads it back)."""
    return {
        "users": [{"name": u.name, "password_hash": u.password_hash,
                   "hashing_algorithm": u.hashing_algorithm, "tags": list(u.tags),
                   "limits": dict(u.limits)} for u in defs.users.values()],
        "vhosts": [{"name": v, "metadata": {"default_queue_type": defs.default_queue_types[v]}}
                   if v in defs.default_queue_types else {"name": v} for v in defs.vhosts],
        "permissions": [{"user": p.user, "vhost": p.vhost, "configure": p.configure,
                         "write": p.write, "read": p.read} for p in defs.permissions.values()],
        "topic_permissions": [{"user": t.user, "vhost": t.vhost, "exchange": t.exchange,
                               "write": t.write, "read": t.read}
                              for t in defs.topic_permissions],
        "parameters": [{"vhost": v, "component": "vhost-limits", "name": "limits",
                        "value": dict(lim)} for v, lim in defs.vhost_limits.items()],
    }


def merge_access(base: Definitions, extra: Definitions) -> Definitions:
    """``base`` with ``extra``'s users, vhosts, permissions, topic permissions and vhost
    limits added; an entry of ``extra`` replaces ``base``'s of the same name (as importing
    definitions into RabbitMQ does). Topology is not merged."""
    out = Definitions(users={**base.users, **extra.users},
                      vhosts=list(dict.fromkeys(base.vhosts + extra.vhosts)),
                      permissions={**base.permissions, **extra.permissions},
                      vhost_limits={**base.vhost_limits, **extra.vhost_limits},
                      default_queue_types={**base.default_queue_types,
                                           **extra.default_queue_types})
    seen = {(t.user, t.vhost, t.exchange) for t in extra.topic_permissions}
    out.topic_permissions = [t for t in base.topic_permissions
                             if (t.user, t.vhost, t.exchange) not in seen] + \
        list(extra.topic_permissions)
    return out
