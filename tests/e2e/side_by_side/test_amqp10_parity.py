"""AMQP 1.0 side by side (issue 37): the same proton scenarios against RabbitMQ 3.10 with its
``rabbitmq_amqp1_0`` plugin (the reference) and against Shoal; the two records must be equal.
Only what 3.10 knows is compared: the v1 addresses (``/amq/queue/NAME``,
``/exchange/amq.direct/KEY``), the outcomes accepted / released / rejected, a missing queue's
error condition, a wrong password. Records hold what a client sees (outcomes, bodies, counts,
condition names), never generated names or texts.

RabbitMQ is found as in test_parity.py (``SHOAL_PARITY_RABBITMQ_URL``, default guest/guest on
127.0.0.1:5672; skipped when nothing answers) and must have the plugin
(``rabbitmq-plugins enable rabbitmq_amqp1_0``; skipped, saying so, without it).

What RabbitMQ 3.10.8's plugin does differently from the contract (docs/amqp10.md), seen while
writing these tests (``KNOWN`` marks the scenarios below that show one; the others are
asserted in tests/e2e/amqp10 against Shoal only):

- Addresses: only the v1 forms; ``/queues/NAME`` and ``/exchanges/X/K`` are not understood.
- A missing queue (``/amq/queue/missing``): 3.10 never answers the attach; it ends the whole
  *session* with ``amqp:not-found``. The contract answers the attach, then detaches the link
  with ``amqp:not-found``; the session and connection go on. The condition name is the same.
- Closing a link (detach ``closed=true``) is answered with a detach without ``closed=true``, so
  proton's ``BlockingLink.close()`` waits forever (its timeout), and a new link with proton's
  default name (container-id + address) to the same address is refused with
  ``amqp:invalid-field`` "link name already attached".
- Dynamic receivers (``dynamic=true`` source): refused, session ended with
  ``amqp:not-implemented`` "Dynamic sources not supported".
- Anonymous relay (null target): the attach is never answered.
- Drain (flow ``drain=true``) on a classic queue: the session ends with
  ``amqp:internal-error`` (a ``function_clause`` in ``rabbit_classic_queue:handle_event``).
- ``modified`` with ``delivery-failed``: the message is not requeued to the next receiver
  (a later receiver gets nothing); the contract requeues it and counts the attempt.
- Unsettled deliveries of a detached link (the session still open) are not requeued to the
  next link; the contract requeues them.
- ``x-delivery-limit`` is refused on classic queues (406) by 3.10; Shoal takes it.
- ``/queue/NAME`` as a source consumes an existing non-durable queue in 3.10; Shoal (as it is
  now) re-declares it durable and detaches with ``amqp:precondition-failed``.
- ANONYMOUS: 3.10 logs it in as ``guest`` by default; the contract refuses it unless
  ``anonymous_login_user`` is set.
- A header without SASL (``AMQP 0 1 0 0``): 3.10 resets the socket without answering; the
  contract answers the SASL header, then closes.
- Message conversion (seen with 3.10.8): one data section reaches a pika consumer as its bytes
  (as in the contract), with ``type`` ``binary``; but application-properties do not become
  headers: 3.10 puts the encoded section in a header ``x-amqp-1.0-app-properties`` (and the
  properties section in ``x-amqp-1.0-properties``). The other way, a pika message's headers
  (``x-`` or not) reach a proton receiver nowhere: no application-properties, no annotations
  (contract: headers -> application-properties, ``x-`` headers -> message-annotations).
  ``interop_application_properties_to_headers`` and ``interop_headers_to_application_properties``
  show it (``KNOWN``). An amqp-value body reaches pika as the encoded section with ``type``
  ``amqp-1.0``, as in the contract.
- Open properties: 3.10 sends ``product`` ``RabbitMQ``, ``version`` ``3.10.8``; Shoal sends none
  (rabbitmq-amqp-python-client refuses both: it wants RabbitMQ >= 4.0.0).
"""
from __future__ import annotations

import types
import urllib.parse

import pika
import pytest

pytest.importorskip("proton", reason="python-qpid-proton is not installed "
                    "(pip install -e '.[test]')")

from proton import ConnectionException, Delivery, Message  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

from ..amqp10.helpers import (TIMEOUT, body, declare, detach, link_error,  # noqa: E402
                              pika_channel, pika_get_all, proton_conn, ready_count, recv,
                              send, uname)
from .test_parity import RABBITMQ_URL, rabbitmq_url  # noqa: E402,F401 - the fixture

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

KNOWN = {
    "interop_application_properties_to_headers": "RabbitMQ 3.10 keeps 1.0 application-"
    "properties in an encoded x-amqp-1.0-app-properties header; the contract (RabbitMQ 4) "
    "maps them to headers",
    "interop_headers_to_application_properties": "RabbitMQ 3.10 drops 0-9-1 headers on the "
    "way to 1.0; the contract (RabbitMQ 4) maps them to application-properties",
}

SCENARIOS = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def m(b: bytes, **kw) -> Message:
    return Message(body=b, inferred=True, **kw)


OUTCOME = {Delivery.ACCEPTED: "accepted", Delivery.RELEASED: "released",
           Delivery.REJECTED: "rejected", Delivery.MODIFIED: "modified"}


@scenario
def v1_amq_queue_send_receive(b):
    q = declare(b, uname())
    with proton_conn(b) as c:
        sent = [OUTCOME.get(s, s) for s in send(c, f"/amq/queue/{q}", m(b"one"), m(b"two"))]
        rcv = recv(c, f"/amq/queue/{q}", credit=5)
        got = [body(rcv.receive(timeout=TIMEOUT)) for _ in range(2)]
        rcv.settle(Delivery.ACCEPTED)
        rcv.settle(Delivery.ACCEPTED)
        detach(rcv)
    return [sent, got, ready_count(b, q)]


@scenario
def v1_exchange_amq_direct(b):
    q, key = uname(), uname("key")
    with pika_channel(b) as ch:
        ch.queue_declare(q)
        ch.queue_bind(q, "amq.direct", key)
    with proton_conn(b) as c:
        sent = [OUTCOME.get(s, s) for s in send(c, f"/exchange/amq.direct/{key}", m(b"routed"))]
        rcv = recv(c, f"/amq/queue/{q}", credit=1)
        got = body(rcv.receive(timeout=TIMEOUT))
        rcv.accept()
        detach(rcv)
    return [sent, got, ready_count(b, q)]


@scenario
def outcome_accept_removes(b):
    q = declare(b, uname())
    with proton_conn(b) as c:
        send(c, f"/amq/queue/{q}", m(b"x"))
        rcv = recv(c, f"/amq/queue/{q}", credit=1)
        rcv.receive(timeout=TIMEOUT)
        rcv.accept()
        detach(rcv)
    return [ready_count(b, q)]


@scenario
def outcome_release_redelivers(b):
    q = declare(b, uname())
    # The releasing receiver's connection is closed before the second receiver attaches:
    # RabbitMQ 3.10 may hand the released message straight back to the first receiver (its
    # credit topped up) and does not requeue a detached link's unsettled deliveries, only a
    # closed connection's.
    with proton_conn(b) as c:
        send(c, f"/amq/queue/{q}", m(b"again"))
        first = recv(c, f"/amq/queue/{q}", credit=1)
        a = body(first.receive(timeout=TIMEOUT))
        first.release(delivered=False)
    with proton_conn(b) as c:
        second = recv(c, f"/amq/queue/{q}", credit=1)
        again = second.receive(timeout=TIMEOUT)
        second.accept()
        detach(second)
    return [a, body(again), ready_count(b, q)]


@scenario
def outcome_reject_dead_letters(b):
    q, dlq = uname(), uname("dlq")
    declare(b, dlq)
    declare(b, q, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    with proton_conn(b) as c:
        send(c, f"/amq/queue/{q}", m(b"bad"))
        rcv = recv(c, f"/amq/queue/{q}", credit=1)
        rcv.receive(timeout=TIMEOUT)
        rcv.reject()
        detach(rcv)
        dead = recv(c, f"/amq/queue/{dlq}", credit=1)
        got = body(dead.receive(timeout=TIMEOUT))
        dead.accept()
        detach(dead)
    return [got, ready_count(b, q), ready_count(b, dlq)]


@scenario
def missing_queue_condition(b, notes=None):
    with proton_conn(b) as c:
        scope, cond = link_error(c, f"/amq/queue/{uname('missing')}")
    if notes is not None:
        notes.append(f"ended the {scope}")
    return [cond]


@scenario
def wrong_password(b):
    try:
        c = BlockingConnection(f"amqp://{b.user}:wrong-{uname()}@{b.host}:{b.port}",
                               timeout=TIMEOUT, allowed_mechs="PLAIN")
    except ConnectionException as e:
        return ["refused", "unauthorized-access" in str(e) or "Authentication failed" in str(e)]
    c.close()
    return ["opened"]


@scenario
def interop_data_body_to_pika(b):
    q = declare(b, uname())
    with proton_conn(b) as c:
        send(c, f"/amq/queue/{q}", m(b"raw", content_type="text/plain", id="m-1"))
    props, got = pika_get_all(b, q)[0]
    return [got, props.content_type, props.message_id]


@scenario
def interop_amqp_value_body_to_pika(b):
    q = declare(b, uname())
    with proton_conn(b) as c:
        send(c, f"/amq/queue/{q}", Message(body="hello"))
    props, got = pika_get_all(b, q)[0]
    return [got, props.type]


@scenario
def interop_pika_to_proton(b):
    q = declare(b, uname())
    with pika_channel(b) as ch:
        ch.basic_publish("", q, b"from-pika", pika.BasicProperties(
            expiration="60000", delivery_mode=2, priority=3, content_type="text/plain"))
    with proton_conn(b) as c:
        rcv = recv(c, f"/amq/queue/{q}", credit=1)
        got = rcv.receive(timeout=TIMEOUT)
        rcv.accept()
        detach(rcv)
    return [body(got), got.durable, got.ttl, got.priority, got.content_type]


@scenario
def interop_application_properties_to_headers(b):
    q = declare(b, uname())
    with proton_conn(b) as c:
        send(c, f"/amq/queue/{q}", m(b"raw", properties={"colour": "red"}))
    props, got = pika_get_all(b, q)[0]
    return [got, (props.headers or {}).get("colour")]


@scenario
def interop_headers_to_application_properties(b):
    q = declare(b, uname())
    with pika_channel(b) as ch:
        ch.basic_publish("", q, b"h", pika.BasicProperties(headers={"colour": "red"}))
    with proton_conn(b) as c:
        rcv = recv(c, f"/amq/queue/{q}", credit=1)
        got = rcv.receive(timeout=TIMEOUT)
        rcv.accept()
        detach(rcv)
    return [body(got), got.properties]


def broker(url: str):
    """What the helpers need of a broker: host, port, user, password, vhost, url."""
    u = urllib.parse.urlparse(url)
    return types.SimpleNamespace(host=u.hostname or "127.0.0.1", port=u.port or 5672,
                                 user=urllib.parse.unquote(u.username or "guest"),
                                 password=urllib.parse.unquote(u.password or "guest"),
                                 vhost="/", url=url)


@pytest.fixture(scope="session")
def rabbitmq_amqp10(rabbitmq_url):  # noqa: F811 - the fixture imported above
    b = broker(rabbitmq_url)
    try:
        c = BlockingConnection(f"amqp://{b.user}:{b.password}@{b.host}:{b.port}", timeout=5,
                               allowed_mechs="PLAIN")
        c.close()
    except Exception as e:  # noqa: BLE001 - any failure: no 1.0 on that RabbitMQ
        pytest.skip(f"RabbitMQ at {RABBITMQ_URL} does not speak AMQP 1.0 ({e!r}): "
                    "rabbitmq-plugins enable rabbitmq_amqp1_0")
    return b


def _params():
    for name in SCENARIOS:
        marks = [pytest.mark.xfail(reason=KNOWN[name], strict=False)] if name in KNOWN else []
        yield pytest.param(name, marks=marks, id=name)


def _run(name, b, notes):
    fn = SCENARIOS[name]
    if "notes" in fn.__code__.co_varnames:
        return fn(b, notes=notes)
    return fn(b)


@pytest.mark.parametrize("name", _params())
def test_amqp10_parity(name, rabbitmq_amqp10, cluster):
    notes_a, notes_b = [], []
    a = _run(name, rabbitmq_amqp10, notes_a)
    s = _run(name, broker(cluster.url), notes_b)
    assert s == a, f"{name}: RabbitMQ {a} ({notes_a}) != Shoal {s} ({notes_b})"
