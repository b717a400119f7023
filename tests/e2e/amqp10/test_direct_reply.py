"""Direct reply-to (issue 45; router/frontend/direct_reply.py): RPC over ``amq.rabbitmq.reply-to``
with requesters and responders of both protocols, pika (AMQP 0-9-1, RabbitMQ 3's form) and
proton (AMQP 1.0, RabbitMQ 4.2's dynamic receiver with ``rabbitmq:volatile-queue``), and
RabbitMQ's refusals with its texts. Here beside the other AMQP 1.0 tests because two of the
four pairs mix the protocols."""
from __future__ import annotations

import threading

import pika
import pytest

pytest.importorskip("proton", reason="python-qpid-proton is not installed "
                    "(pip install -e '.[test]')")

from proton import Data, Message  # noqa: E402
from proton.reactor import LinkOption  # noqa: E402

from .helpers import TIMEOUT, body, declare, pika_channel, proton_conn, queue_addr  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PSEUDO = "amq.rabbitmq.reply-to"


class _Volatile(LinkOption):
    """RabbitMQ 4.2's direct reply-to receiver: a dynamic source, capability
    ``rabbitmq:volatile-queue``, pre-settled (as RabbitMQ's AMQP 1.0 clients attach it)."""

    def apply(self, link) -> None:
        link.snd_settle_mode = 1
        link.source.dynamic = True
        caps = link.source.capabilities
        caps.put_array(False, Data.SYMBOL)
        caps.enter()
        caps.put_symbol("rabbitmq:volatile-queue")
        caps.exit()


def pika_responder(cluster, q: str, ready: threading.Event, done: threading.Event) -> None:
    """Answer one request on ``q``: publish ``pong:BODY`` to its reply_to on the default
    exchange, with its correlation id."""
    with pika_channel(cluster) as ch:
        ch.basic_qos(prefetch_count=1)
        ready.set()
        for method, props, payload in ch.consume(q, inactivity_timeout=TIMEOUT):
            if method is None:
                break
            ch.basic_publish("", props.reply_to, b"pong:" + payload,
                             pika.BasicProperties(correlation_id=props.correlation_id))
            ch.basic_ack(method.delivery_tag)
            break
        ch.cancel()
    done.set()


def start_responder(cluster, q: str) -> threading.Event:
    """A pika responder on ``q`` in a thread of its own, consuming once this returns; the
    event is set when it has answered."""
    ready, done = threading.Event(), threading.Event()
    threading.Thread(target=pika_responder, args=(cluster, q, ready, done), daemon=True).start()
    assert ready.wait(TIMEOUT)
    return done


def test_0_9_1_requester_and_responder(cluster, names):
    q = declare(cluster, names())
    done = start_responder(cluster, q)
    with pika_channel(cluster) as ch:
        got = []
        ch.basic_consume(PSEUDO, lambda c, m, p, b: got.append((p.correlation_id, b)),
                         auto_ack=True)
        ch.basic_publish("", q, b"ping", pika.BasicProperties(reply_to=PSEUDO,
                                                              correlation_id="c-1"))
        ch.connection.process_data_events(time_limit=0)
        for _ in range(int(TIMEOUT * 10)):
            if got:
                break
            ch.connection.process_data_events(time_limit=0.1)
    assert got == [("c-1", b"pong:ping")]
    assert done.wait(TIMEOUT)


@pytest.mark.parametrize("case, text", [
    ("ack", "reply consumer cannot acknowledge"),
    ("twice", "reply consumer already set"),
    ("no consumer", "fast reply consumer does not exist")])
def test_0_9_1_refusals_as_rabbitmq(cluster, names, case, text):
    q = declare(cluster, names())
    with pika_channel(cluster) as ch:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            if case == "ack":
                ch.basic_consume(PSEUDO, lambda *a: None, auto_ack=False)
            elif case == "twice":
                ch.basic_consume(PSEUDO, lambda *a: None, auto_ack=True)
                ch.basic_consume(PSEUDO, lambda *a: None, auto_ack=True)
            else:
                ch.basic_publish("", q, b"x", pika.BasicProperties(reply_to=PSEUDO))
                ch.queue_declare(q, passive=True)       # the channel error arrives
    assert err.value.reply_code == 406 and text in err.value.reply_text


def test_1_0_requester_and_0_9_1_responder(cluster, names):
    q = declare(cluster, names())
    done = start_responder(cluster, q)
    with proton_conn(cluster) as c:
        replies = c.create_receiver(None, credit=1, options=_Volatile())
        address = replies.link.remote_source.address
        assert address.startswith("/queues/amq.rabbitmq.reply-to.")
        c.create_sender(queue_addr(q)).send(Message(body=b"ping", inferred=True,
                                                    reply_to=address, correlation_id="c-2"))
        reply = replies.receive(timeout=TIMEOUT)
    assert (body(reply), reply.correlation_id) == (b"pong:ping", "c-2")
    assert done.wait(TIMEOUT)


def test_0_9_1_requester_and_1_0_responder(cluster, names):
    q = declare(cluster, names())
    with pika_channel(cluster) as ch, proton_conn(cluster) as c:
        got = []
        ch.basic_consume(PSEUDO, lambda c_, m, p, b: got.append((p.correlation_id, b)),
                         auto_ack=True)
        ch.basic_publish("", q, b"ping", pika.BasicProperties(reply_to=PSEUDO,
                                                              correlation_id="c-3"))
        requests = c.create_receiver(queue_addr(q), credit=1)
        request = requests.receive(timeout=TIMEOUT)
        requests.accept()
        assert request.reply_to.startswith("/queues/amq.rabbitmq.reply-to.")  # RabbitMQ 4
        c.create_sender(request.reply_to).send(Message(
            body=b"pong:" + body(request), inferred=True,
            correlation_id=request.correlation_id))
        for _ in range(int(TIMEOUT * 10)):
            if got:
                break
            ch.connection.process_data_events(time_limit=0.1)
    assert got == [("c-3", b"pong:ping")]


def test_1_0_requester_and_responder(cluster, names):
    q = declare(cluster, names())
    with proton_conn(cluster) as c:
        replies = c.create_receiver(None, credit=1, options=_Volatile())
        address = replies.link.remote_source.address
        c.create_sender(queue_addr(q)).send(Message(body=b"ping", inferred=True,
                                                    reply_to=address, correlation_id="c-4"))
        requests = c.create_receiver(queue_addr(q), credit=1)
        request = requests.receive(timeout=TIMEOUT)
        requests.accept()
        assert request.reply_to == address                 # kept whole
        c.create_sender(request.reply_to).send(Message(
            body=b"pong:" + body(request), inferred=True,
            correlation_id=request.correlation_id))
        reply = replies.receive(timeout=TIMEOUT)
    assert (body(reply), reply.correlation_id) == (b"pong:ping", "c-4")
