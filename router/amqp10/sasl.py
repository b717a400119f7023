"""The SASL layer of an AMQP 1.0 connection (OASIS AMQP 1.0 part 5.3; RFC 4616 PLAIN, RFC 4422
EXTERNAL, RFC 4505 ANONYMOUS), sans-IO.

The server offers its mechanisms in ``sasl-mechanisms``, takes the client's ``sasl-init`` and
answers ``sasl-outcome``: code 0 ok, 1 auth (bad credentials, or a mechanism not offered).
Who may log in is decided by the ``login`` callback, as for AMQP 0-9-1 (router/access/users.py).
"""
from __future__ import annotations

from typing import Callable

from shoal.router.amqp10.codec import symbols
from shoal.router.amqp10.frames import (FRAME_SASL, SaslInit, SaslMechanisms, SaslOutcome,
                                        frame)

OK, AUTH, SYS = 0, 1, 2       #: sasl-code (part 5.3.3.6)

#: ``login(mechanism, response, hostname)``: the user name, or None when refused
Login = Callable[[str, bytes, str | None], "str | None"]


def mechanisms_frame(mechanisms: list[str]) -> bytes:
    """The ``sasl-mechanisms`` frame offering ``mechanisms`` (in preference order)."""
    return frame(0, SaslMechanisms(symbols(mechanisms)), kind=FRAME_SASL)


def outcome_frame(code: int) -> bytes:
    return frame(0, SaslOutcome(code), kind=FRAME_SASL)


def plain_credentials(response: bytes) -> tuple[str, str] | None:
    """``authzid NUL authcid NUL passwd`` (RFC 4616) as ``(user, password)``; None when the
    response is not in that form."""
    parts = bytes(response).split(b"\x00")
    if len(parts) != 3:
        return None
    try:
        return parts[1].decode("utf-8"), parts[2].decode("utf-8")
    except UnicodeDecodeError:
        return None


def handle_init(init: SaslInit, offered: list[str], login: Login) -> tuple[str | None, int]:
    """The user a ``sasl-init`` logs in, and the sasl-outcome code (OK, or AUTH with no user)."""
    mechanism = str(init.mechanism or "")
    if mechanism not in offered:
        return None, AUTH
    response = init.initial_response
    if not isinstance(response, (bytes, bytearray)):
        response = b""
    hostname = init.hostname if isinstance(init.hostname, str) else None
    user = login(mechanism, bytes(response), hostname)
    return (user, OK) if user is not None else (None, AUTH)
