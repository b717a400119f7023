"""AMQP 1.0 messages kept whole through a real cluster (issue 45; router/amqp10/whole.py):
proton publishes and proton consumes, on classic and quorum queues, and gets every section
as sent, each application property with its AMQP type; a dead-lettered message is annotated
as RabbitMQ 4 annotates it (``x-opt-deaths``, ``x-first-death-*``); pika, on the same
queue, gets the 0-9-1 conversion. (rhea's round trip: test_rhea.py.)"""
from __future__ import annotations

import time
import uuid

import pytest

pytest.importorskip("proton", reason="python-qpid-proton is not installed "
                    "(pip install -e '.[test]')")

from proton import (Endpoint, Message, byte, char, decimal32, float32, int32, short, symbol,  # noqa: E402
                    timestamp, ubyte, uint, ulong, ushort)

from .helpers import (TIMEOUT, declare, detach, pika_get_all, proton_conn, queue_addr,  # noqa: E402
                      recv, send, settle_modified)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

EVERY_TYPE = {"null": None, "bool": False, "ubyte": ubyte(200), "ushort": ushort(60000),
              "uint": uint(4_000_000_000), "ulong": ulong(2 ** 63 + 5), "byte": byte(-100),
              "short": short(-30000), "int": int32(-7), "long": -2 ** 62,
              "float": float32(1.5), "double": 2.25, "char": char("é"),
              "timestamp": timestamp(1_700_000_000_123), "uuid": uuid.UUID(int=77),
              "binary": b"\x00\xff", "string": "text ü", "symbol": symbol("sym"),
              "decimal32": decimal32(7)}


def _sent(q: str, body) -> Message:
    return Message(body=body, inferred=isinstance(body, bytes), id=uuid.UUID(int=1),
                   correlation_id=ulong(99), content_type="text/plain", priority=7,
                   durable=True, reply_to="/queues/r", user_id=b"guest", group_id="g",
                   reply_to_group_id="rg", group_sequence=3, creation_time=1700000000.123,
                   subject="subj", address=queue_addr(q), properties=dict(EVERY_TYPE),
                   annotations={symbol("x-opt-u"): ulong(9), symbol("x-opt-s"): symbol("s")})


def _receive(cl, q: str, reject: bool = False) -> Message:
    with proton_conn(cl) as c:
        rcv = recv(c, queue_addr(q), credit=1)
        m = rcv.receive(timeout=TIMEOUT)
        rcv.reject() if reject else rcv.accept()
        return m


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
@pytest.mark.parametrize("body", [b"bytes", {"k": [1, "two"]}, ["a", 2]],
                         ids=["data", "amqp-value", "amqp-value list"])
def test_every_section_and_type_comes_back(cluster, names, queue_type, body):
    q = declare(cluster, names(), {"x-queue-type": queue_type}, durable=True)
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), _sent(q, body))
    got = _receive(cluster, q)
    assert got.body == body if not isinstance(body, bytes) else bytes(got.body) == body
    assert got.properties == EVERY_TYPE
    # each with its AMQP type (proton reads a binary as a memoryview)
    assert [bytes if type(got.properties[k]) is memoryview else type(got.properties[k])
            for k in EVERY_TYPE] == [type(v) for v in EVERY_TYPE.values()]
    assert (got.id, got.correlation_id, got.content_type, got.priority, got.durable) == \
        (uuid.UUID(int=1), 99, "text/plain", 7, True)
    assert (got.subject, got.address, got.user_id, got.group_id, got.reply_to_group_id,
            got.group_sequence, got.reply_to) == \
        ("subj", queue_addr(q), b"guest", "g", "rg", 3, "/queues/r")
    assert got.creation_time == 1700000000.123                # ms kept, not whole seconds
    ann = got.annotations
    assert (ann["x-opt-u"], type(ann["x-opt-u"]), ann["x-opt-s"], type(ann["x-opt-s"])) == \
        (9, ulong, "s", symbol)
    assert (ann["x-exchange"], ann["x-routing-key"]) == ("", q)


def test_a_0_9_1_consumer_gets_the_conversion(cluster, names):
    q = declare(cluster, names())
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), _sent(q, b"bytes"))
    props, got = pika_get_all(cluster, q)[0]
    assert got == b"bytes" and props.type is None
    assert (props.content_type, props.priority, props.app_id, props.correlation_id) == \
        ("text/plain", 7, "g", "99")
    assert props.headers["x-opt-u"] == 9 and props.headers["string"] == "text ü"


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_dead_letter_is_annotated_as_rabbitmq_4(cluster, names, queue_type):
    dlq = declare(cluster, names("dlq"), durable=True)
    q = declare(cluster, names(), {"x-queue-type": queue_type, "x-dead-letter-exchange": "",
                                   "x-dead-letter-routing-key": dlq}, durable=True)
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), _sent(q, b"bytes"))
    _receive(cluster, q, reject=True)
    got = _receive(cluster, dlq)
    assert got.properties == EVERY_TYPE and bytes(got.body) == b"bytes"
    ann = got.annotations
    assert "x-death" not in ann
    assert (ann["x-first-death-queue"], ann["x-first-death-reason"],
            ann["x-first-death-exchange"]) == (q, "rejected", "")
    (death,) = ann["x-opt-deaths"]
    assert (death["queue"], death["reason"], death["count"], death["exchange"],
            list(death["routing-keys"])) == (q, "rejected", 1, "", [q])
    assert death["first-time"] == death["last-time"] and death["first-time"] > 0
    assert (ann["x-exchange"], ann["x-routing-key"]) == ("", dlq)


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_modified_annotations_merge_into_the_returned_message(cluster, names, queue_type):
    q = declare(cluster, names(), {"x-queue-type": queue_type}, durable=True)
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), _sent(q, b"bytes"))
        rcv = recv(c, queue_addr(q), credit=1)
        rcv.receive(timeout=TIMEOUT)
        settle_modified(rcv, failed=False, annotations={symbol("x-opt-note"): "seen once",
                                                        symbol("x-opt-u"): ulong(10)})
        detach(rcv)
        rcv = recv(c, queue_addr(q), credit=1)
        again = rcv.receive(timeout=TIMEOUT)
        rcv.release()
    assert again.annotations["x-opt-note"] == "seen once"
    assert again.annotations["x-opt-u"] == 10               # replaced, as RabbitMQ 4
    assert again.properties == EVERY_TYPE and not again.first_acquirer
    deadline = time.monotonic() + TIMEOUT      # the release travels batched (lazy SETTLE)
    while not (got := pika_get_all(cluster, q)) and time.monotonic() < deadline:
        time.sleep(0.1)
    props, _ = got[0]
    assert props.headers["x-opt-note"] == "seen once"


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_modified_undeliverable_here_dead_letters_with_its_annotations(cluster, names,
                                                                       queue_type):
    """RabbitMQ 4 (rabbit_fifo ``modify``): undeliverable-here discards the message."""
    dlq = declare(cluster, names("dlq"), durable=True)
    q = declare(cluster, names(), {"x-queue-type": queue_type, "x-dead-letter-exchange": "",
                                   "x-dead-letter-routing-key": dlq}, durable=True)
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), _sent(q, b"bytes"))
        rcv = recv(c, queue_addr(q), credit=1)
        rcv.receive(timeout=TIMEOUT)
        settle_modified(rcv, failed=True, undeliverable=True,
                        annotations={symbol("x-opt-why"): "poison"})
    got = _receive(cluster, dlq)
    assert got.annotations["x-opt-why"] == "poison"
    assert got.annotations["x-first-death-reason"] == "rejected"


def test_a_reserved_annotation_key_ends_the_session(cluster, names):
    q = declare(cluster, names())
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), _sent(q, b"bytes"))
        rcv = recv(c, queue_addr(q), credit=1)
        rcv.receive(timeout=TIMEOUT)
        settle_modified(rcv, failed=False, annotations={symbol("reserved"): 1})
        session = rcv.link.session
        c.wait(lambda: session.state & Endpoint.REMOTE_CLOSED, timeout=TIMEOUT,
               msg="the session to end")
        assert session.remote_condition.name == "amqp:invalid-field"
        assert "'reserved'" in session.remote_condition.description
    assert len(pika_get_all(cluster, q)) == 1      # not lost: returned as the session ended
