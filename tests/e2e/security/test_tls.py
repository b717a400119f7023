"""amqps (issue 22, point 2): TLS with pika and aio-pika, client certificates and SASL
EXTERNAL, refused handshakes, and certificate reload without a restart. The CA and the
certificates are made by the test (tests/e2e/security/tls_ca.py)."""
from __future__ import annotations

import asyncio
import os
import socket
import ssl
import time

import pika
import pytest

from tests.conftest import EXTERNAL_URL, free_port, start_cluster, stop_cluster

from .tls_ca import TestCA

pytestmark = pytest.mark.e2e



@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    if EXTERNAL_URL:
        pytest.skip("needs a cluster started with its own TLS settings")
    d = tmp_path_factory.mktemp("shoal-tls")
    ca = TestCA(d / "pki")
    cert, key = ca.issue("server", "server-1", server=True)
    port = free_port()
    c = start_cluster(d / "cluster", 2, env={
        "SHOAL_TLS_PORT": str(port), "SHOAL_TLS_CERTFILE": str(cert),
        "SHOAL_TLS_KEYFILE": str(key), "SHOAL_TLS_CACERTFILE": str(ca.ca_file),
        "SHOAL_TLS_VERIFY": "verify_peer", "SHOAL_SSL_CERT_LOGIN_FROM": "common_name",
        "SHOAL_USERS": "guest:guest,tls-client:not-used-by-external"})
    c.tls_port, c.ca = port, ca
    yield c
    stop_cluster(c)


def client_context(ca: TestCA, cert=None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca.ca_file))
    if cert is not None:
        ctx.load_cert_chain(*cert)
    return ctx


def pika_tls(cluster, ctx, credentials=None) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", cluster.tls_port, ssl_options=pika.SSLOptions(ctx, "localhost"),
        credentials=credentials or pika.PlainCredentials("guest", "guest"),
        connection_attempts=1, socket_timeout=10))


def test_pika_publishes_and_gets_over_tls(tls_cluster, uid):
    conn = pika_tls(tls_cluster, client_context(tls_cluster.ca))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(f"tls-{uid}")
    ch.basic_publish("", f"tls-{uid}", b"over tls")
    m, _, body = ch.basic_get(f"tls-{uid}", auto_ack=True)
    assert body == b"over tls"
    ch.queue_delete(f"tls-{uid}")
    conn.close()


def test_aio_pika_over_tls(tls_cluster, uid):
    import aio_pika

    async def main() -> bytes:
        conn = await aio_pika.connect(host="127.0.0.1", port=tls_cluster.tls_port, ssl=True,
                                      ssl_context=client_context(tls_cluster.ca),
                                      login="guest", password="guest", timeout=10)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue(f"tls-aio-{uid}", auto_delete=False)
            await ch.default_exchange.publish(aio_pika.Message(b"aio over tls"), q.name)
            for _ in range(50):
                msg = await q.get(no_ack=True, fail=False)
                if msg is not None:
                    await q.delete()
                    return msg.body
                await asyncio.sleep(0.05)
            return b""
    assert asyncio.run(main()) == b"aio over tls"


def test_external_logs_in_as_the_certificates_common_name(tls_cluster):
    cert = tls_cluster.ca.issue("client", "tls-client", server=False)
    conn = pika_tls(tls_cluster, client_context(tls_cluster.ca, cert),
                    pika.credentials.ExternalCredentials())
    assert conn.is_open
    conn.channel().queue_declare("", exclusive=True)
    conn.close()


def test_external_for_a_certificate_of_no_user_is_refused(tls_cluster):
    cert = tls_cluster.ca.issue("stranger", "nobody-here", server=False)
    with pytest.raises(pika.exceptions.ProbableAuthenticationError, match="EXTERNAL"):
        pika_tls(tls_cluster, client_context(tls_cluster.ca, cert),
                 pika.credentials.ExternalCredentials())
    assert "user 'nobody-here' - no such user" in tls_cluster.log_path.read_text(
        errors="replace")


def test_external_is_not_offered_without_a_client_certificate(tls_cluster):
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika_tls(tls_cluster, client_context(tls_cluster.ca),
                 pika.credentials.ExternalCredentials())
    # and PLAIN still works over that same kind of connection
    pika_tls(tls_cluster, client_context(tls_cluster.ca)).close()


def test_a_certificate_from_another_ca_is_refused_and_the_broker_goes_on(tls_cluster,
                                                                           tmp_path):
    other = TestCA(tmp_path / "other", cn="Other CA")
    cert = other.issue("client", "tls-client", server=False)
    ctx = client_context(tls_cluster.ca, cert)
    with pytest.raises((pika.exceptions.AMQPConnectionError, ssl.SSLError, OSError)):
        pika_tls(tls_cluster, ctx, pika.credentials.ExternalCredentials())
    # a client that does not trust the server's CA fails its own handshake
    with pytest.raises((pika.exceptions.AMQPConnectionError, ssl.SSLError)):
        pika_tls(tls_cluster, ssl.create_default_context(cafile=str(other.ca_file)))
    pika_tls(tls_cluster, client_context(tls_cluster.ca)).close()
    pika.BlockingConnection(pika.URLParameters(tls_cluster.url)).close()   # plain port too


def _served_cn(cluster) -> str:
    ctx = client_context(cluster.ca)
    with socket.create_connection(("127.0.0.1", cluster.tls_port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            subject = dict(pair for rdn in s.getpeercert()["subject"] for pair in rdn)
            return subject["commonName"]


def test_a_renewed_certificate_is_served_without_a_restart(tls_cluster):
    assert _served_cn(tls_cluster) == "server-1"
    conn = pika_tls(tls_cluster, client_context(tls_cluster.ca))   # stays open throughout
    pki = tls_cluster.ca.dir
    new_cert, new_key = tls_cluster.ca.issue("server-new", "server-2", server=True)
    # as a Secret update does: both files replaced (the key first, then the chain)
    os.replace(new_key, pki / "server.key")
    os.replace(new_cert, pki / "server.pem")
    deadline = time.monotonic() + 30      # the router looks every 5 s
    while _served_cn(tls_cluster) != "server-2":
        assert time.monotonic() < deadline, "the new certificate was not served within 30 s"
        time.sleep(0.5)
    assert conn.is_open
    conn.channel().queue_declare("", exclusive=True)
    conn.close()


def _proton_tls(cluster, cert=None, mechs="PLAIN", **kw):
    """A python-qpid-proton (AMQP 1.0) connection over amqps (docs/amqp10.md)."""
    proton = pytest.importorskip("proton", reason="python-qpid-proton is a test dependency")
    from proton.utils import BlockingConnection
    domain = proton.SSLDomain(proton.SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(cluster.ca.ca_file))
    domain.set_peer_authentication(proton.SSLDomain.VERIFY_PEER)
    if cert is not None:
        domain.set_credentials(str(cert[0]), str(cert[1]), None)
    return BlockingConnection(f"amqps://127.0.0.1:{cluster.tls_port}", ssl_domain=domain,
                              allowed_mechs=mechs, timeout=10, **kw)


def test_amqp10_over_tls_with_plain(tls_cluster, uid):
    conn = _proton_tls(tls_cluster, user="guest", password="guest")
    queue = f"tls10-{uid}"
    with pika_tls(tls_cluster, client_context(tls_cluster.ca)) as p:
        p.channel().queue_declare(queue)
    from proton import Message
    conn.create_sender(f"/queues/{queue}").send(Message(body="over amqps"))
    assert conn.create_receiver(f"/queues/{queue}").receive(timeout=10).body == "over amqps"
    conn.close()


def test_amqp10_external_logs_in_as_the_certificates_common_name(tls_cluster):
    cert = tls_cluster.ca.issue("client10", "tls-client", server=False)
    conn = _proton_tls(tls_cluster, cert, mechs="EXTERNAL")
    receiver = conn.create_receiver(None, dynamic=True)     # a temporary queue: logged in
    assert receiver.link.remote_source.address.startswith("/queues/amq.gen-")
    conn.close()


def test_amqp10_external_for_a_certificate_of_no_user_is_refused(tls_cluster):
    from proton import ConnectionException
    cert = tls_cluster.ca.issue("stranger10", "nobody-here-10", server=False)
    with pytest.raises(ConnectionException, match="unauthorized-access"):
        _proton_tls(tls_cluster, cert, mechs="EXTERNAL")
