"""What a channel checks of a publish's properties before routing it, as RabbitMQ's
``rabbit_channel`` does (3.10: ``check_user_id_header``, ``check_expiration_header``).

- **Validated user ID** (RabbitMQ's "Validated User-ID"): a ``user_id`` property must name the
  connection's user, unless that user has the ``impersonator`` tag.
- **Expiration**: a per-message TTL must be a decimal integer of milliseconds, at least 0
  (``rabbit_basic:parse_expiration``: an optional sign and digits, nothing after them).

Both are read from the raw content header (router/amqp/properties.py), and only when its
property flags announce one of them: the common publish pays two bit tests.
"""
from __future__ import annotations

import re

from shoal.shared.errors import PRECONDITION_FAILED, soft_error

from shoal.router.access.users import VhostAccess
from shoal.router.amqp.properties import EXPIRATION, USER_ID, shortstr_property

_INTEGER = re.compile(rb"[+-]?[0-9]+")


def announced(header: bytes) -> bool:
    """Whether the header's flags announce an expiration or a user id (the cheap test)."""
    return bool(header[12] & (EXPIRATION >> 8) or header[13] & USER_ID)


def check(header: bytes, access: VhostAccess | None, user_id_code: int) -> None:
    """Raise AMQPError (soft) when the publish breaks a rule above: ``user_id_code`` for a
    user id that is not the connection's (406 PRECONDITION_FAILED over AMQP 0-9-1, RabbitMQ's
    text "user_id property set to 'X' but authenticated user was 'Y'"), 406 for a bad
    expiration ("invalid expiration '-1': {value_negative,-1}", ``no_integer``,
    ``{leftover_string,"s"}``, as RabbitMQ formats them)."""
    claimed = shortstr_property(header, USER_ID)
    if claimed is not None and access is not None and not access.impersonator:
        name = claimed.decode("utf-8", "replace")
        if name != access.user:
            raise soft_error(user_id_code, f"user_id property set to '{name}' but "
                                           f"authenticated user was '{access.user}'")
    expiration = shortstr_property(header, EXPIRATION)
    if expiration is not None:
        why = _expiration_error(expiration)
        if why is not None:
            raise soft_error(PRECONDITION_FAILED, "invalid expiration "
                             f"'{expiration.decode('utf-8', 'replace')}': {why}")


def _expiration_error(value: bytes) -> str | None:
    m = _INTEGER.match(value)
    if m is None:
        return "no_integer"
    if m.end() != len(value):
        return '{leftover_string,"%s"}' % value[m.end():].decode("utf-8", "replace")
    n = int(m.group())
    return f"{{value_negative,{n}}}" if n < 0 else None
