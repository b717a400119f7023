"""RabbitMQ 4's AMQP 1.0 management node (issue 45): RabbitMQ's own Python client's
``Management`` declares, inspects, binds, purges, unbinds and deletes through ``/management``
on a real cluster; raw requests (python-qpid-proton) check the status codes, bodies and texts
of RabbitMQ 4's ``rabbit_amqp_management.erl`` where the client does not show them."""
from __future__ import annotations

import contextlib
import uuid

import pytest

rmq = pytest.importorskip("rabbitmq_amqp_python_client",
                          reason="rabbitmq-amqp-python-client is not installed "
                          "(pip install -e '.[test]')")

from proton import Endpoint, Message as PMessage, symbol  # noqa: E402
from proton.reactor import LinkOption  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402
from rabbitmq_amqp_python_client import (  # noqa: E402
    AddressHelper, ClassicQueueSpecification, Environment, ExchangeSpecification,
    ExchangeToQueueBindingSpecification, Message, QuorumQueueSpecification, QueueType)
from rabbitmq_amqp_python_client.exceptions import ValidationCodeException  # noqa: E402
from rabbitmq_amqp_python_client.qpid.proton._utils import SendException  # noqa: E402

from .helpers import TIMEOUT  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def uri(cl) -> str:
    return f"amqp://{cl.user}:{cl.password}@{cl.host}:{cl.port}/"


@pytest.fixture
def env(cluster):
    e = Environment(uri=uri(cluster))
    yield e
    with contextlib.suppress(Exception):
        e.close()


def test_the_getting_started_flow_through_the_management_node(env, names):
    """The client's getting-started example, step by step, with what each answer says."""
    conn = env.connection()
    conn.dial()
    mgmt = conn.management()
    ex, q, key = names("x"), names("q"), "k.1"
    mgmt.declare_exchange(ExchangeSpecification(name=ex))
    mgmt.declare_queue(QuorumQueueSpecification(name=q))
    info = mgmt.queue_info(q)
    assert (info.name, info.queue_type, info.is_durable, info.message_count) == \
        (q, QueueType.quorum, True, 0)
    assert info.leader in info.members
    path = mgmt.bind(ExchangeToQueueBindingSpecification(source_exchange=ex,
                                                        destination_queue=q, binding_key=key))
    publisher = conn.publisher(AddressHelper.exchange_address(ex, key))
    for i in range(3):
        publisher.publish(Message(body=f"m{i}".encode()))
    publisher.close()
    assert mgmt.queue_info(q).message_count == 3
    assert mgmt.purge_queue(q) == 3
    mgmt.unbind(path)
    publisher = conn.publisher(AddressHelper.exchange_address(ex, key))
    with pytest.raises(SendException):          # released: it reached no queue (RabbitMQ 4)
        publisher.publish(Message(body=b"unrouted"))
    publisher.close()
    assert mgmt.queue_info(q).message_count == 0            # the binding is gone
    mgmt.delete_queue(q)
    mgmt.delete_exchange(ex)
    with pytest.raises(ValidationCodeException, match="404"):
        mgmt.queue_info(q)
    mgmt.close()
    conn.close()


def test_a_classic_queue_and_an_inequivalent_redeclare(env, names):
    conn = env.connection()
    conn.dial()
    mgmt = conn.management()
    q = names("q")
    mgmt.declare_queue(ClassicQueueSpecification(name=q, max_len=10))
    mgmt.declare_queue(ClassicQueueSpecification(name=q, max_len=10))      # 200: the same
    info = mgmt.queue_info(q)
    assert (info.queue_type, info.arguments.get("x-max-length")) == (QueueType.classic, 10)
    with pytest.raises(ValidationCodeException, match="ErrPreconditionFailed"):   # 409
        mgmt.declare_queue(ClassicQueueSpecification(name=q, max_len=20))
    mgmt.delete_queue(q)
    mgmt.delete_queue(q)                    # deleting what is not there: 200 as RabbitMQ
    mgmt.close()
    conn.close()


class _Pair(LinkOption):
    """The management link pair's attach: pre-settled, ``paired: true``."""

    def __init__(self, sender: bool) -> None:
        self.sender = sender

    def apply(self, link) -> None:
        link.source.address = "/management"
        link.target.address = "/management"
        link.snd_settle_mode = 1
        link.properties = {symbol("paired"): True}

    def test(self, link) -> bool:
        return bool(link.is_sender) == self.sender


def open_pair(cl, user: str | None = None, password: str | None = None, vhost: str = "/"):
    """(connection, ``ask(method, path, body)`` -> (status, body)) over a raw proton link
    pair to /management."""
    conn = BlockingConnection(f"{cl.host}:{cl.port}", timeout=TIMEOUT,
                              user=user or cl.user, password=password or cl.password,
                              virtual_host=f"vhost:{vhost}")
    name = f"pair-{uuid.uuid4().hex[:8]}"
    snd = conn.create_sender("/management", name=name, options=_Pair(True))
    rcv = conn.create_receiver("/management", name=name, options=_Pair(False))

    def ask(method: str, path: str, body=None, answered: bool = True):
        mid = uuid.uuid4().hex
        snd.send(PMessage(id=mid, address=path, subject=method, reply_to="$me", body=body,
                          inferred=False))
        if not answered:
            return None
        reply = rcv.receive(TIMEOUT)            # pre-settled: nothing to accept
        assert reply.correlation_id == mid
        assert reply.properties == {"http:response": "1.1"}
        return reply.subject, reply.body
    return conn, ask


@pytest.fixture
def raw(cluster):
    conn, ask = open_pair(cluster)
    yield ask
    with contextlib.suppress(Exception):
        conn.close()


def test_status_codes_and_texts_as_rabbitmq_4(raw, names):
    q, ex = names("q"), names("x")
    status, body = raw("PUT", f"/queues/{q}", {"durable": True, "arguments": {}})
    assert status == "201"
    assert (body["name"], body["type"], body["message_count"], body["consumer_count"]) == \
        (q, "classic", 0, 0)
    assert raw("PUT", f"/queues/{q}", {"durable": True})[0] == "200"
    assert raw("PUT", f"/queues/{q}", {"durable": True, "bogus": 1}) == \
        ("400", "bad queue property 'bogus': 1")
    assert raw("PUT", "/queues/amq.x", {}) == \
        ("403", "queue 'amq.x' in vhost '/' starts with reserved prefix 'amq.'")
    assert raw("PUT", "/queues/", {}) == ("400", "declare queue with empty name not allowed")
    assert raw("GET", f"/queues/{q}-missing") == \
        ("404", f"queue '{q}-missing' in vhost '/' not found")
    assert raw("PUT", f"/exchanges/{ex}", {"type": "fanout"}) == ("204", None)
    assert raw("PUT", f"/exchanges/{ex}", {"type": "nope"}) == \
        ("400", "unknown exchange type 'nope'")
    status, text = raw("PUT", f"/exchanges/{ex}", {"type": "direct"})
    assert status == "409" and "inequivalent arg 'type'" in text
    assert raw("POST", "/bindings", {"source": ex, "destination_queue": q, "binding_key": "",
                                     "arguments": {}}) == ("204", None)
    status, listed = raw("GET", f"/bindings?src={ex}&dstq={q}&key=")
    assert status == "200"
    assert listed == [{"source": ex, "destination_queue": q, "binding_key": "",
                       "arguments": {}, "location": f"/bindings/src={ex};dstq={q};key=;args="}]
    assert raw("DELETE", listed[0]["location"]) == ("204", None)
    assert raw("GET", f"/bindings?src={ex}&dstq={q}&key=") == ("200", [])
    assert raw("DELETE", "/bindings/nonsense") == \
        ("400", "bad binding path segment 'nonsense'")
    assert raw("DELETE", f"/queues/{q}/messages") == ("200", {"message_count": 0})
    assert raw("DELETE", f"/queues/{q}") == ("200", {"message_count": 0})
    assert raw("DELETE", f"/exchanges/{ex}") == ("204", None)
    assert raw("DELETE", "/exchanges/amq.fanout") == \
        ("403", "exchange 'amq.fanout' in vhost '/' starts with reserved prefix 'amq.'")
    # where RabbitMQ ends the session, Shoal answers with what was wrong
    assert raw("GET", "/nowhere")[0] == "404"
    assert raw("PATCH", f"/queues/{q}")[0] == "405"


@pytest.mark.parametrize("qtype", ["classic", "quorum"])
def test_a_detached_links_unsettled_deliveries_are_counted_at_once(cluster, names, qtype):
    """The requeue of a detached link's unsettled deliveries reaches the node behind the
    consumer's cancel (router/broker.py ``settle``), so a count or a purge on the same
    connection right after sees them all. Before, it overtook the cancel: the node
    delivered some to the leaving consumer again, and a quorum queue read 44 of 50 (RabbitMQ's
    AMQP 1.0 client's test_fifo_consumer_without_presettled)."""
    q = names("q")
    conn, ask = open_pair(cluster)
    try:
        assert ask("PUT", f"/queues/{q}", {"durable": True,
                                           "arguments": {"x-queue-type": qtype}})[0] == "201"
        snd = conn.create_sender(f"/queues/{q}", name=names("snd"))
        for i in range(50):
            snd.send(PMessage(body=f"m{i}"), timeout=TIMEOUT)
        rcv = conn.create_receiver(f"/queues/{q}", credit=10, name=names("rcv"))
        for _ in range(50):                     # never settled; the credit stays topped up
            rcv.receive(TIMEOUT)
        rcv.link.close()
        assert ask("GET", f"/queues/{q}")[1]["message_count"] == 50
        assert ask("DELETE", f"/queues/{q}/messages")[1] == {"message_count": 50}
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def test_names_are_percent_encoded(raw):
    name = f"a/b c-{uuid.uuid4().hex[:6]}"
    encoded = "a%2Fb%20c-" + name[6:]
    status, body = raw("PUT", f"/queues/{encoded}", {})
    assert (status, body["name"]) == ("201", name)
    assert raw("DELETE", f"/queues/{encoded}") == ("200", {"message_count": 0})


def test_a_refused_permission_ends_the_session_as_in_rabbitmq(access_cluster, names):
    """As RabbitMQ 4: no status code, the session ends with amqp:unauthorized-access and
    the 0-9-1 text; what the user may do is answered."""
    from .test_proton import _mgmt
    vh, user = names("vh"), names("user")
    _mgmt(access_cluster, "PUT", f"/vhosts/{vh}", {})
    _mgmt(access_cluster, "PUT", f"/users/{user}", {"password": "pw", "tags": ""})
    _mgmt(access_cluster, "PUT", f"/permissions/{vh}/{user}",
          {"configure": "^mine-.*", "write": ".*", "read": ".*"})
    conn, ask = open_pair(access_cluster, user, "pw", vh)
    try:
        assert ask("PUT", "/queues/mine-1", {})[0] == "201"
        session = conn.conn.session_head(0)
        ask("PUT", "/queues/theirs-1", {}, answered=False)     # no answer: the session ends
        conn.wait(lambda: bool(session.state & Endpoint.REMOTE_CLOSED), timeout=TIMEOUT)
        assert session.remote_condition.name == "amqp:unauthorized-access"
        assert session.remote_condition.description == \
            f"access to queue 'theirs-1' in vhost '{vh}' refused for user '{user}'"
    finally:
        with contextlib.suppress(Exception):
            conn.close()
