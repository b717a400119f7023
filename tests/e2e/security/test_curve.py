"""The router-node link with ZeroMQ CURVE (issue 22, point 2): a cluster whose processes hold
CURVE keys serves clients as before, and its nodes refuse a peer without CURVE or with a key
they do not know (shared/linkauth.py)."""
from __future__ import annotations

import pika
import pytest
import zmq

from shoal.shared import wire
from shoal.shared.errors import ConfigError
from shoal.shared.settings import load_settings
from tests.conftest import EXTERNAL_URL, start_cluster, stop_cluster

pytestmark = pytest.mark.e2e

KEYS = [k.decode() for k in zmq.curve_keypair()]


@pytest.fixture(scope="module")
def curve_cluster(tmp_path_factory):
    if EXTERNAL_URL:
        pytest.skip("needs a cluster started with its own CURVE keys")
    public, secret = KEYS
    # One pair for every process: nodes serve with it, routers connect with it, and the
    # nodes admit its public key.
    c = start_cluster(tmp_path_factory.mktemp("shoal-curve"), 2, env={
        "SHOAL_LOCAL_LINK": "zmq",     # CURVE is ZeroMQ's (a unix:// link cannot carry it)
        "SHOAL_LINK_CURVE_PUBLIC_KEY": public, "SHOAL_LINK_CURVE_SECRET_KEY": secret,
        "SHOAL_LINK_CURVE_SERVER_KEY": public, "SHOAL_LINK_CURVE_CLIENTS": public})
    yield c
    stop_cluster(c)


def test_clients_are_served_over_a_curve_link(curve_cluster, uid):
    conn = pika.BlockingConnection(pika.URLParameters(curve_cluster.url))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(4):                       # queues on both nodes
        ch.queue_declare(f"curve-{uid}-{i}")
        ch.basic_publish("", f"curve-{uid}-{i}", b"sealed")
        assert ch.basic_get(f"curve-{uid}-{i}", auto_ack=True)[2] == b"sealed"
        ch.queue_delete(f"curve-{uid}-{i}")
    conn.close()


def _hello_answered(endpoint: str, keys: tuple[str, str] | None) -> bool:
    """Whether a DEALER (CURVE client with ``keys``, or plain) gets HELLO_OK from the node
    within 3 s."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        sock.curve_serverkey = KEYS[0].encode()
        sock.curve_publickey, sock.curve_secretkey = keys[0].encode(), keys[1].encode()
    sock.connect(endpoint)
    try:
        sock.send(wire.encode_batch([[wire.T.HELLO, wire.WIRE_VERSION, "intruder", "node-1"]]))
        return sock.poll(3000) != 0
    finally:
        sock.close()
        ctx.term()


def test_a_node_refuses_a_peer_without_curve_or_with_an_unknown_key(curve_cluster):
    endpoint = next(n.endpoint for n in curve_cluster.nodes if n.id == "node-1")
    assert _hello_answered(endpoint, tuple(KEYS))             # the cluster's own key: admitted
    assert not _hello_answered(endpoint, None)                # no CURVE: no handshake
    stranger = tuple(k.decode() for k in zmq.curve_keypair())
    assert not _hello_answered(endpoint, stranger)            # CURVE, unknown key: refused
    log = curve_cluster.log_path.read_text(errors="replace")
    assert f"CURVE public key {stranger[0]} is not in link_curve_clients" in log


@pytest.mark.parametrize("env, words", [
    ({"SHOAL_LINK_CURVE_PUBLIC_KEY": "short"}, "'link_curve_public_key': not a 40-character"),
    ({"SHOAL_LINK_CURVE_PUBLIC_KEY": KEYS[0]}, "go together"),
    ({"SHOAL_LINK_CURVE_SERVER_KEY": KEYS[0]}, "needs its own"),
    ({"SHOAL_LINK_CURVE_CLIENTS": "not a key"}, "'link_curve_clients'"),
    ({"SHOAL_LOCAL_LINK": "unix", "SHOAL_LINK_CURVE_PUBLIC_KEY": KEYS[0],
      "SHOAL_LINK_CURVE_SECRET_KEY": KEYS[1]}, "'local_link': unix cannot carry"),
    ({"SHOAL_LOCAL_LINK": "tcp"}, "'local_link': must be zmq or unix"),
])
def test_bad_curve_settings_name_the_setting(env, words):
    with pytest.raises(ConfigError, match=words):
        load_settings(env=env)
