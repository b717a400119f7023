"""The router-node link authenticated and encrypted with ZeroMQ CURVE (issue 22, point 2;
RFC 26 CurveZMQ, https://rfc.zeromq.org/spec/26/).

Keys are Z85 strings of 40 characters, as ``zmq.curve_keypair()`` (or ``shoal keygen``) makes
them. A node with ``link_curve_secret_key`` is a CURVE server: only routers whose public key is
in ``link_curve_clients`` get through (a ZAP handler refuses the others and logs them), and a
peer that does not speak CURVE cannot finish the handshake at all. A router with
``link_curve_server_key`` (the nodes' public key) connects as a CURVE client with its own
``link_curve_public_key`` and ``link_curve_secret_key``. In-process links (``inproc://``, the
embedded node) carry no security mechanism. Off by default: a local ``shoal serve`` talks over
``ipc://`` sockets in its own run directory.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    import zmq

log = logging.getLogger("shoal.link.auth")
KEY_LENGTH = 40   #: Z85 text of a 32-byte key


def check_keys(settings: Any) -> None:
    """Raise ConfigError naming the first CURVE setting that is not a Z85 key, or a
    half-configured pair."""
    names = ("link_curve_public_key", "link_curve_secret_key", "link_curve_server_key")
    for name in names:
        _check_key(name, getattr(settings, name))
    for key in settings.link_curve_clients:
        _check_key("link_curve_clients", key)
    if bool(settings.link_curve_public_key) != bool(settings.link_curve_secret_key):
        raise ConfigError("invalid setting 'link_curve_secret_key': link_curve_public_key and "
                          "link_curve_secret_key go together")
    if settings.link_curve_server_key and not settings.link_curve_secret_key:
        raise ConfigError("invalid setting 'link_curve_server_key': a router needs its own "
                          "link_curve_public_key and link_curve_secret_key too")


def _check_key(name: str, key: str) -> None:
    if not key:
        return
    # pyzmq here, not at the top: the settings import this module in every process, the
    # launcher and the CLI's commands too, which use no ZeroMQ (0.04 s)
    from zmq.utils import z85
    try:
        ok = len(key) == KEY_LENGTH and len(z85.decode(key.encode())) == 32
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise ConfigError(f"invalid setting '{name}': not a {KEY_LENGTH}-character Z85 CURVE "
                          f"key (make a pair with: shoal keygen)")


class CurveAuthenticator:
    """The ZAP handler of a CURVE node: admits the routers' public keys, refuses the rest."""

    def __init__(self, ctx: zmq.Context, allowed: list[str]) -> None:
        from zmq.auth.thread import ThreadAuthenticator
        self.allowed = frozenset(k.encode() for k in allowed)
        self._auth = ThreadAuthenticator(ctx, log=logging.getLogger("shoal.link.zap"))
        self._auth.start()
        self._auth.configure_curve_callback(domain="*", credentials_provider=self)

    def callback(self, domain: str, key: bytes) -> bool:
        """ZAP: whether the CURVE client with public ``key`` (Z85, as pyzmq's authenticator
        passes it) may connect."""
        from zmq.utils import z85
        text = key if len(key) == KEY_LENGTH else z85.encode(key)
        if text in self.allowed:
            return True
        log.warning("refused a router link: CURVE public key %s is not in "
                    "link_curve_clients", text.decode())
        return False

    def stop(self) -> None:
        self._auth.stop()


def serve_curve(sock: zmq.Socket, ctx: zmq.Context, settings: Any) -> CurveAuthenticator | None:
    """Make a node's ROUTER socket a CURVE server (before it binds) when the settings have
    its keys; returns the authenticator to stop with the node, or None."""
    if not settings.link_curve_secret_key:
        return None
    auth = CurveAuthenticator(ctx, settings.link_curve_clients)
    sock.curve_secretkey = settings.link_curve_secret_key.encode()
    sock.curve_publickey = settings.link_curve_public_key.encode()
    sock.curve_server = True
    return auth


def connect_curve(sock: zmq.Socket, endpoint: str, settings: Any) -> None:
    """Make a router's DEALER socket a CURVE client of the node (before it connects) when the
    settings name the nodes' public key; inproc endpoints stay plain."""
    if not settings.link_curve_server_key or endpoint.startswith("inproc://"):
        return
    sock.curve_serverkey = settings.link_curve_server_key.encode()
    sock.curve_publickey = settings.link_curve_public_key.encode()
    sock.curve_secretkey = settings.link_curve_secret_key.encode()
