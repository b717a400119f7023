"""The amqps listener's TLS: the server context, certificate reload, and who a client
certificate names (issue 22, point 2).

Settings follow RabbitMQ's ``ssl_options`` (https://www.rabbitmq.com/ssl.html): a certificate
chain and key, optional client-certificate verification against a CA bundle
(``verify_peer``, ``fail_if_no_peer_cert``), the protocol versions and the TLS 1.2 cipher list.
The certificate and key are read again when either file changes on disk (checked every
``RELOAD_CHECK_S``; a Kubernetes Secret or cert-manager renews them in place): new handshakes
use the new certificate, open connections keep theirs, and a pair that does not load is
logged and the old one kept.
"""
from __future__ import annotations

import asyncio
import logging
import os
import ssl

from shoal.shared.errors import ConfigError
from shoal.shared.settings import Settings

log = logging.getLogger("shoal.router.frontend.tls")

RELOAD_CHECK_S = 5.0
_VERSIONS = {"tlsv1": ssl.TLSVersion.TLSv1, "tlsv1.1": ssl.TLSVersion.TLSv1_1,
             "tlsv1.2": ssl.TLSVersion.TLSv1_2, "tlsv1.3": ssl.TLSVersion.TLSv1_3}


def server_context(s: Settings) -> ssl.SSLContext:
    """The SSLContext of the amqps listener. Raises ConfigError naming the setting whose file
    does not load."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = sorted(_VERSIONS[v] for v in s.tls_versions)
    ctx.minimum_version, ctx.maximum_version = versions[0], versions[-1]
    if s.tls_ciphers:
        try:
            ctx.set_ciphers(s.tls_ciphers)
        except ssl.SSLError as exc:
            raise ConfigError(f"invalid setting 'tls_ciphers': {exc}") from None
    _load_chain(ctx, s)
    if s.tls_verify == "verify_peer":
        try:
            ctx.load_verify_locations(cafile=s.tls_cacertfile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"invalid setting 'tls_cacertfile': cannot load "
                              f"{s.tls_cacertfile!r} ({exc})") from None
        ctx.verify_mode = ssl.CERT_REQUIRED if s.tls_fail_if_no_peer_cert \
            else ssl.CERT_OPTIONAL
    return ctx


def _load_chain(ctx: ssl.SSLContext, s: Settings) -> None:
    try:
        ctx.load_cert_chain(s.tls_certfile, s.tls_keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"invalid setting 'tls_certfile'/'tls_keyfile': cannot load "
                          f"{s.tls_certfile!r} with {s.tls_keyfile!r} ({exc})") from None


def _stamp(s: Settings) -> tuple:
    out = []
    for path in (s.tls_certfile, s.tls_keyfile):
        try:
            st = os.stat(path)
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append(None)
    return tuple(out)


async def reload_loop(ctx: ssl.SSLContext, s: Settings,
                      every: float = RELOAD_CHECK_S) -> None:
    """Reload the certificate chain into ``ctx`` whenever its files change (runs until
    cancelled)."""
    seen = _stamp(s)
    while True:
        await asyncio.sleep(every)
        now = _stamp(s)
        if now == seen or None in now:
            continue
        try:
            _load_chain(ctx, s)
        except ConfigError as exc:
            log.error("TLS certificate not reloaded, keeping the old one: %s", exc)
            continue   # try again at the next change
        finally:
            seen = now
        log.info("TLS certificate reloaded from %s", s.tls_certfile)


def peer_identity(ssl_object, login_from: str) -> str | None:
    """The user name a verified client certificate gives EXTERNAL: its subject as an
    RFC 4514 string, most specific first (``CN=alice,O=Example,C=DE``, RabbitMQ's
    ``distinguished_name``), or its common name (``common_name``). None without one."""
    if ssl_object is None:
        return None
    cert = ssl_object.getpeercert()
    if not cert:
        return None
    rdns = [pair for rdn in cert.get("subject", ()) for pair in rdn]
    if login_from == "common_name":
        names = [v for k, v in rdns if k == "commonName"]
        return names[-1] if names else None
    short = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU",
             "countryName": "C", "stateOrProvinceName": "ST", "localityName": "L",
             "domainComponent": "DC", "emailAddress": "emailAddress"}
    parts = [f"{short.get(k, k)}={_escape(v)}" for k, v in reversed(rdns)]
    return ",".join(parts) or None


def _escape(value: str) -> str:
    out = "".join("\\" + c if c in ',+"\\<>;=' else c for c in value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    return out[:-1] + "\\ " if out.endswith(" ") else out
