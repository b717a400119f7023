"""router/frontend/tls.py without sockets: the server context from settings, and the user name a
client certificate gives EXTERNAL (issue 22, point 2)."""
from __future__ import annotations

import ssl

import pytest

from shoal.router.frontend.tls import peer_identity, server_context
from shoal.shared.errors import ConfigError
from shoal.shared.settings import load_settings
from tests.e2e.security.tls_ca import TestCA


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    ca = TestCA(tmp_path_factory.mktemp("pki"))
    cert, key = ca.issue("server", "server-1", server=True)
    return ca, cert, key


def settings(pki, **kw):
    ca, cert, key = pki
    base = {"tls_port": 5671, "tls_certfile": str(cert), "tls_keyfile": str(key),
            "tls_cacertfile": str(ca.ca_file)}
    return load_settings(env={}, overrides={**base, **kw})


def test_versions_and_verification_follow_the_settings(pki):
    ctx = server_context(settings(pki, tls_versions=["tlsv1.3"]))
    assert ctx.minimum_version == ctx.maximum_version == ssl.TLSVersion.TLSv1_3
    assert ctx.verify_mode == ssl.CERT_NONE
    ctx = server_context(settings(pki, tls_verify="verify_peer"))
    assert ctx.verify_mode == ssl.CERT_OPTIONAL
    ctx = server_context(settings(pki, tls_verify="verify_peer",
                                  tls_fail_if_no_peer_cert=True))
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2


@pytest.mark.parametrize("kw, words", [
    ({"tls_certfile": "/nonexistent.pem"}, "invalid setting 'tls_certfile'/'tls_keyfile'"),
    ({"tls_ciphers": "NOT-A-CIPHER"}, "invalid setting 'tls_ciphers'"),
    ({"tls_verify": "verify_peer", "tls_cacertfile": "/nonexistent-ca.pem"},
     "invalid setting 'tls_cacertfile'"),
])
def test_files_and_ciphers_that_do_not_load_name_the_setting(pki, kw, words):
    with pytest.raises(ConfigError, match=words.replace("'", ".")):
        server_context(settings(pki, **kw))


@pytest.mark.parametrize("kw, words", [
    ({"tls_certfile": ""}, "needs tls_certfile and tls_keyfile"),
    ({"tls_versions": ["sslv3"]}, "'tls_versions'"),
    ({"tls_verify": "yes"}, "'tls_verify'"),
    ({"ssl_cert_login_from": "email"}, "'ssl_cert_login_from'"),
])
def test_bad_tls_settings_are_refused(pki, kw, words):
    with pytest.raises(ConfigError, match=words):
        settings(pki, **kw)


class FakeSSL:
    def __init__(self, subject):
        self.subject = subject

    def getpeercert(self):
        return {"subject": self.subject} if self.subject is not None else {}


def test_identity_from_a_certificate_subject():
    subject = ((("countryName", "DE"),), (("organizationName", "Acme, Inc"),),
               (("commonName", "alice"),))
    assert peer_identity(FakeSSL(subject), "common_name") == "alice"
    # RFC 4514: most specific first, special characters escaped (RabbitMQ's default)
    assert peer_identity(FakeSSL(subject), "distinguished_name") == \
        "CN=alice,O=Acme\\, Inc,C=DE"
    assert peer_identity(FakeSSL(None), "common_name") is None
    assert peer_identity(None, "common_name") is None
