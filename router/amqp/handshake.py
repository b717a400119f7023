"""Connection negotiation pieces (spec 0-9-1 section 4.10 "Connection Negotiation"; RabbitMQ's
access control and capabilities): server properties, SASL responses, tune values.

Pure functions; :class:`.connection.AMQPConnection` sequences them.
"""
from __future__ import annotations

import platform
import struct
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version

from pamqp import decode

from shoal.shared.errors import ACCESS_REFUSED, NOT_ALLOWED, SYNTAX_ERROR, AMQPError, hard_error

from shoal.router.amqp.framing import pamqp_guard

MECHANISMS = "PLAIN AMQPLAIN"
LOCALES = "en_US"

#: What we tell clients we support (RabbitMQ's capability names).
SERVER_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
}


@lru_cache(maxsize=1)
def shoal_version() -> str:
    """The installed package version (single source: pyproject.toml)."""
    try:
        return version("shoal")
    except PackageNotFoundError:  # running from a tree that is not installed
        return "0+unknown"


def server_properties(extra: dict | None = None) -> dict:
    """The ``server-properties`` table of ``connection.start`` (spec 1.4.2.1), ``extra``
    merged over the defaults (a ``capabilities`` entry in ``extra`` is merged key by key)."""
    props = {
        "cluster_name": f"shoal@{platform.node() or 'localhost'}",   # as RabbitMQ's rabbit@host
        "product": "Shoal",
        "version": shoal_version(),
        "platform": f"Python {platform.python_version()}",
        "copyright": "Copyright the Shoal authors",
        "information": "Licensed under the Apache License 2.0",
        "capabilities": dict(SERVER_CAPABILITIES),
    }
    for key, value in (extra or {}).items():
        if key == "capabilities" and isinstance(value, dict):
            props["capabilities"].update(value)
        else:
            props[key] = value
    return props


def refused(mechanism: str) -> AMQPError:
    """403 ACCESS_REFUSED (hard: it closes the connection, as the
    ``authentication_failure_close`` capability promises), worded as RabbitMQ words it."""
    return hard_error(ACCESS_REFUSED, f"Login was refused using authentication mechanism "
                                      f"{mechanism[:40]}. For details see the broker logfile.")


def sasl_credentials(mechanism: str, response: str | bytes) -> tuple[str, str]:
    """``(username, password)`` from a ``connection.start-ok`` response.

    PLAIN (RFC 4616): ``authzid NUL authcid NUL passwd``. AMQPLAIN: a field table *without*
    its 4-octet length prefix, keys ``LOGIN`` and ``PASSWORD``.
    Raises 403 ACCESS_REFUSED (hard) for an unknown mechanism or a malformed response, 502
    SYNTAX_ERROR (hard) for an AMQPLAIN table that cannot be decoded.
    """
    raw = response.encode("utf-8") if isinstance(response, str) else bytes(response)
    if mechanism == "PLAIN":
        parts = raw.split(b"\x00")
        if len(parts) != 3:
            raise refused(mechanism)
        user, password = parts[1], parts[2]
    elif mechanism == "AMQPLAIN":
        _, table = pamqp_guard(decode.field_table, struct.pack(">I", len(raw)) + raw,
                               what="AMQPLAIN response", code=SYNTAX_ERROR)
        user, password = table.get("LOGIN"), table.get("PASSWORD")
        if user is None or password is None:
            raise refused(mechanism)
    else:
        raise refused(mechanism)
    try:
        return _text(user), _text(password)
    except UnicodeDecodeError:
        raise refused(mechanism) from None


def _text(value: str | bytes | bytearray) -> str:
    return value if isinstance(value, str) else bytes(value).decode("utf-8")


def negotiate(ours: int, theirs: int, name: str, minimum: int = 0) -> int:
    """A negotiated ``channel_max``/``frame_max`` (spec 1.4.2.6: 0 means no limit, so ours
    applies; the client may lower, never raise, our value). Raises 530 NOT_ALLOWED (hard) for
    a value above ours or below ``minimum`` (RabbitMQ's wording)."""
    if theirs == 0:
        return ours
    if theirs > ours:
        raise hard_error(NOT_ALLOWED, f"negotiated {name} = {theirs} is higher than the "
                                      f"maximum allowed value ({ours})")
    if theirs < minimum:
        raise hard_error(NOT_ALLOWED, f"negotiated {name} = {theirs} is lower than the "
                                      f"minimum allowed value ({minimum})")
    return theirs
