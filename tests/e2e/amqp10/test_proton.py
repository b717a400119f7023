"""AMQP 1.0 with python-qpid-proton (issue 37, /tmp/work/amqp10-contract.md): the blocking API
(``proton.utils.BlockingConnection``) and the event API (``proton.reactor.Container`` with a
``MessagingHandler``) against Shoal's cluster port, SASL PLAIN guest/guest.

Covers the v2 addresses (``/queues/NAME``, ``/exchanges/X/K``) and the v1 ones
(``/amq/queue/NAME``, ``/queue/NAME``, ``/exchange/X/K``), the four outcomes (accepted,
released, rejected, modified), pre-settled receivers, credit and drain, dynamic receivers for
request/reply, split transfers, and the errors a client sees (missing queue, bad password,
unknown vhost, missing permission)."""
from __future__ import annotations

import contextlib
import socket
import time

import pytest

pytest.importorskip("proton", reason="python-qpid-proton is not installed "
                    "(pip install -e '.[test]')")

import proton  # noqa: E402
from proton import ConnectionException, Delivery, Endpoint, Message  # noqa: E402
from proton.handlers import MessagingHandler  # noqa: E402
from proton.reactor import AtMostOnce, Container  # noqa: E402
from proton.utils import BlockingConnection, ConnectionClosed, SendException  # noqa: E402

from .helpers import (TIMEOUT, amqp10_url, body, connect, declare, detach,  # noqa: E402
                      exchange_addr, link_error, link_name, pika_channel, pika_get_all,
                      proton_conn, queue_addr, ready_count, receive_n, receive_none, recv,
                      send, settle_modified, uname)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ACCEPTED = Delivery.ACCEPTED


def msg(b: bytes | str, **kw) -> Message:
    """A message whose body is one data section (bytes) or an amqp-value (str)."""
    return Message(body=b, inferred=isinstance(b, bytes), **kw)


# ---------------------------------------------------------------- blocking API

def test_blocking_send_and_receive_on_a_queue(cluster, names):
    q = declare(cluster, names())
    with proton_conn(cluster) as c:
        assert send(c, queue_addr(q), msg(b"one"), msg("two"), msg(b"three")) == [ACCEPTED] * 3
        rcv = recv(c, queue_addr(q), credit=10)
        got = receive_n(rcv, 3)
        assert [body(m) for m in got] == [b"one", "two", b"three"]
        detach(rcv)
    assert ready_count(cluster, q) == 0          # accepted: gone


def test_blocking_send_to_an_exchange_with_a_bound_queue(cluster, names):
    q, key = names(), names("key")
    with pika_channel(cluster) as ch:
        ch.queue_declare(q)
        ch.queue_bind(q, "amq.direct", key)
    with proton_conn(cluster) as c:
        assert send(c, exchange_addr("amq.direct", key), msg(b"routed")) == [ACCEPTED]
        rcv = recv(c, queue_addr(q), credit=5)
        assert body(receive_n(rcv, 1)[0]) == b"routed"
    assert ready_count(cluster, q) == 0


@pytest.mark.parametrize("form", ["/amq/queue/{q}", "/queue/{q}"])
def test_v1_queue_addresses_send_and_receive(cluster, names, form):
    q = declare(cluster, names())
    with proton_conn(cluster) as c:
        assert send(c, form.format(q=q), msg(b"v1")) == [ACCEPTED]
        assert ready_count(cluster, q) == 1
        rcv = recv(c, form.format(q=q), credit=5)
        assert body(receive_n(rcv, 1)[0]) == b"v1"
        detach(rcv)
    assert ready_count(cluster, q) == 0


def test_v1_exchange_address(cluster, names):
    q, key = names(), names("key")
    with pika_channel(cluster) as ch:
        ch.queue_declare(q)
        ch.queue_bind(q, "amq.direct", key)
    with proton_conn(cluster) as c:
        assert send(c, f"/exchange/amq.direct/{key}", msg(b"v1-routed")) == [ACCEPTED]
        rcv = recv(c, f"/amq/queue/{q}", credit=5)
        assert body(receive_n(rcv, 1)[0]) == b"v1-routed"


def test_an_exchange_address_without_a_key(cluster, names):
    """RabbitMQ 4 (rabbit_amqp_session): the v2 ``/exchanges/NAME`` routes with the empty
    key, whatever the subject; the v1 ``/exchange/NAME`` with the subject, or the empty key
    without one. Unroutable is released. Before, Shoal routed the v2 form by the subject and
    rejected a message without one, which RabbitMQ's JavaScript client's tests caught."""
    x, no_key, by_subject = names("x"), names(), names()
    with pika_channel(cluster) as ch:
        ch.exchange_declare(x, "direct")
        for q, key in ((no_key, ""), (by_subject, "s")):
            ch.queue_declare(q)
            ch.queue_bind(q, x, key)
    v2 = "/exchanges/" + x
    with proton_conn(cluster) as c:
        assert send(c, v2, msg(b"v2 subject s", subject="s"), msg(b"v2 no subject")) \
            == [ACCEPTED] * 2
        assert send(c, f"/exchange/{x}", msg(b"v1 subject s", subject="s"),
                    msg(b"v1 no subject")) == [ACCEPTED] * 2
        with pytest.raises(SendException) as refused:       # proton raises on released
            send(c, "/exchanges/amq.direct", msg(b"nowhere", subject=no_key))
        assert refused.value.state == Delivery.RELEASED
    assert sorted(b for _, b in pika_get_all(cluster, no_key)) == \
        [b"v1 no subject", b"v2 no subject", b"v2 subject s"]
    assert [b for _, b in pika_get_all(cluster, by_subject)] == [b"v1 subject s"]


# ---------------------------------------------------------------- outcomes

def test_release_redelivers_to_the_next_receiver(cluster, names):
    q = declare(cluster, names())
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), msg(b"again"))
        first = recv(c, queue_addr(q), credit=1)
        assert body(first.receive(timeout=TIMEOUT)) == b"again"
        first.release(delivered=False)                      # released
        detach(first)
        second = recv(c, queue_addr(q), credit=1)
        assert body(second.receive(timeout=TIMEOUT)) == b"again"
        second.accept()
        detach(second)
    assert ready_count(cluster, q) == 0


def test_reject_dead_letters(cluster, names):
    q, dlq = names(), names("dlq")
    declare(cluster, dlq)
    declare(cluster, q, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), msg(b"bad"))
        rcv = recv(c, queue_addr(q), credit=1)
        assert body(rcv.receive(timeout=TIMEOUT)) == b"bad"
        rcv.reject()
        dead = recv(c, queue_addr(dlq), credit=1)
        assert body(dead.receive(timeout=TIMEOUT)) == b"bad"
        dead.accept()
        detach(dead)
        detach(rcv)
    assert ready_count(cluster, q) == 0 and ready_count(cluster, dlq) == 0


#: the settlement rules hold on both queue types (on a quorum queue the count is replicated:
#: ``requeue`` and ``release`` entries, node/replication/machine.py)
QUEUE_TYPES = pytest.mark.parametrize("qtype", ["classic", "quorum"])


@QUEUE_TYPES
def test_modified_delivery_failed_counts_toward_the_delivery_limit(cluster, names, qtype):
    """x-delivery-limit 1: the first modified{delivery-failed} requeues, the second
    dead-letters."""
    q, dlq = names(), names("dlq")
    declare(cluster, dlq)
    declare(cluster, q, {"x-delivery-limit": 1, "x-dead-letter-exchange": "",
                         "x-dead-letter-routing-key": dlq, "x-queue-type": qtype},
            durable=qtype == "quorum")
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), msg(b"flaky"))
        for _ in range(2):
            rcv = recv(c, queue_addr(q), credit=1)
            assert body(rcv.receive(timeout=TIMEOUT)) == b"flaky"
            settle_modified(rcv, failed=True)
            detach(rcv)
        dead = recv(c, queue_addr(dlq), credit=1)
        assert body(dead.receive(timeout=TIMEOUT)) == b"flaky"
        dead.accept()
    assert ready_count(cluster, q) == 0


def test_modified_failed_redelivery_carries_the_delivery_count(cluster, names):
    q = declare(cluster, names())
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), msg(b"counted"))
        rcv = recv(c, queue_addr(q), credit=1)
        first = rcv.receive(timeout=TIMEOUT)
        assert first.delivery_count == 0
        settle_modified(rcv, failed=True)
        detach(rcv)
        rcv = recv(c, queue_addr(q), credit=1)
        again = rcv.receive(timeout=TIMEOUT)
        assert body(again) == b"counted" and again.delivery_count == 1
        rcv.accept()


@QUEUE_TYPES
def test_released_and_plain_modified_are_not_counted(cluster, names, qtype):
    """released and modified without delivery-failed requeue without counting: three of each
    on a queue with x-delivery-limit 1 and the message is still there."""
    q, dlq = names(), names("dlq")
    declare(cluster, dlq)
    declare(cluster, q, {"x-delivery-limit": 1, "x-dead-letter-exchange": "",
                         "x-dead-letter-routing-key": dlq, "x-queue-type": qtype},
            durable=qtype == "quorum")
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), msg(b"patient"))
        for i in range(6):
            rcv = recv(c, queue_addr(q), credit=1)
            assert body(rcv.receive(timeout=TIMEOUT)) == b"patient"
            if i % 2:
                rcv.release(delivered=False)
            else:
                settle_modified(rcv, failed=False)
            detach(rcv)
    # the last settlement reaches the queue's node (a quorum queue's leader, through its
    # log) on its own way: ask until it is back, bounded (CI, stop 51)
    deadline = time.monotonic() + TIMEOUT
    while ready_count(cluster, q) != 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ready_count(cluster, q) == 1 and ready_count(cluster, dlq) == 0


def test_pre_settled_receiver_is_no_ack(cluster, names):
    q = declare(cluster, names())
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), msg(b"a"), msg(b"b"))
        rcv = recv(c, queue_addr(q), credit=10, options=AtMostOnce())
        got = receive_n(rcv, 2, settle=None)
        assert [body(m) for m in got] == [b"a", b"b"]
        assert len(rcv.fetcher.unsettled) == 0              # they came settled
        detach(rcv)
    assert ready_count(cluster, q) == 0                     # nothing to requeue


def test_unsettled_deliveries_requeue_when_the_link_detaches(cluster, names):
    q = declare(cluster, names())
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), msg(b"kept"))
        rcv = recv(c, queue_addr(q), credit=1)
        assert body(rcv.receive(timeout=TIMEOUT)) == b"kept"
        detach(rcv)                                         # never settled
        rcv = recv(c, queue_addr(q), credit=1)
        assert body(rcv.receive(timeout=TIMEOUT)) == b"kept"
        rcv.accept()


# ---------------------------------------------------------------- credit and drain

def test_credit_one_gets_exactly_one_message(cluster, names):
    q = declare(cluster, names())
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), msg(b"1"), msg(b"2"), msg(b"3"))
        rcv = recv(c, queue_addr(q), credit=0)   # no credit, no auto top-up
        assert rcv.fetcher.has_message == 0
        rcv.link.flow(1)
        c.wait(lambda: rcv.fetcher.has_message >= 1, timeout=TIMEOUT)
        with contextlib.suppress(proton.Timeout):
            c.wait(lambda: rcv.fetcher.has_message > 1, timeout=1.0)
        assert rcv.fetcher.has_message == 1 and rcv.link.credit == 0
        rcv.link.flow(2)
        c.wait(lambda: rcv.fetcher.has_message == 3, timeout=TIMEOUT)
        got = []
        while rcv.fetcher.has_message:
            got.append(body(rcv.fetcher.pop()))
            rcv.accept()
        assert got == [b"1", b"2", b"3"]


def test_drain_returns_what_is_there_and_uses_up_the_credit(cluster, names):
    q = declare(cluster, names())
    with proton_conn(cluster) as c:
        send(c, queue_addr(q), msg(b"x"), msg(b"y"))
        rcv = recv(c, queue_addr(q), credit=0)
        rcv.link.drain(10)
        c.wait(lambda: rcv.link.credit == 0, timeout=TIMEOUT)   # the broker's drain answer
        assert rcv.fetcher.has_message == 2
        assert [body(rcv.fetcher.pop()) for _ in range(2)] == [b"x", b"y"]
        rcv.settle(ACCEPTED)                                    # one delivery each
        rcv.settle(ACCEPTED)
        rcv.link.drain(5)                                       # empty queue: back at once
        c.wait(lambda: rcv.link.credit == 0, timeout=TIMEOUT)
        assert rcv.fetcher.has_message == 0
    assert ready_count(cluster, q) == 0


def grant_then_lower(cl, c, rcv, granted: int, lowered: int) -> None:
    """``rcv`` grants ``granted`` credit (the router passes it on to the queue's node), then
    lowers it to ``lowered`` (part 2.6.7: a receiver may, at any time). The router takes a
    connection's frames in order, so a publish on ``c`` answered after each flow shows the
    router handled that flow, with no wait for a time."""
    scratch = queue_addr(declare(cl, uname("scratch")))
    rcv.link.flow(granted)
    send(c, scratch, msg(b"after the grant"))
    rcv.link.flow(lowered - granted)
    send(c, scratch, msg(b"after the lowering"))


def lowered_credit_receiver(cl, c, q: str, granted: int, lowered: int):
    """A pre-settled receiver on ``q``, empty, that grants ``granted`` and lowers it to
    ``lowered`` (:func:`grant_then_lower`); then ``granted`` messages are sent to ``q``.
    The node delivers them all, the link's credit takes ``lowered``."""
    rcv = recv(c, queue_addr(q), credit=0, options=AtMostOnce())
    grant_then_lower(cl, c, rcv, granted, lowered)
    send(c, queue_addr(q), *(msg(f"m{i}") for i in range(granted)))
    c.wait(lambda: rcv.fetcher.has_message >= lowered, timeout=TIMEOUT)
    return rcv


@pytest.mark.parametrize("qtype", ["classic", "quorum"])
def test_a_pre_settled_receiver_that_lowers_its_credit_gets_the_rest_with_more(cluster, names,
                                                                               qtype):
    """The deliveries past the lowered credit wait at the router (their node let them go
    when it sent them) and come, in order, with the next credit. They were lost before
    (found with RabbitMQ's own client, whose flows lower the credit it granted at attach)."""
    q = declare(cluster, names(), {"x-queue-type": qtype}, durable=True)
    with proton_conn(cluster) as c:
        rcv = lowered_credit_receiver(cluster, c, q, 20, 5)
        with contextlib.suppress(proton.Timeout):
            c.wait(lambda: rcv.fetcher.has_message > 5, timeout=0.5)
        assert rcv.fetcher.has_message == 5 and rcv.link.credit == 0    # as its credit says
        rcv.link.flow(15)
        c.wait(lambda: rcv.fetcher.has_message == 20, timeout=TIMEOUT)
        got = [rcv.fetcher.pop().body for _ in range(20)]
        assert got == [f"m{i}" for i in range(20)]
    assert ready_count(cluster, q) == 0


@pytest.mark.parametrize("qtype", ["classic", "quorum"])
@pytest.mark.parametrize("end", ["detach", "close the connection"])
def test_a_pre_settled_receiver_that_ends_with_deliveries_held_gives_them_back(cluster, names,
                                                                               qtype, end):
    """Each goes back to the queue, in order (an empty queue's tail here), once: when the
    link detaches, and when its connection closes (the session's end)."""
    q = declare(cluster, names(), {"x-queue-type": qtype}, durable=True)
    with proton_conn(cluster) as c:
        rcv = lowered_credit_receiver(cluster, c, q, 20, 5)
        got = [rcv.fetcher.pop().body for _ in range(5)]
        if end == "detach":
            detach(rcv)
    assert got == [f"m{i}" for i in range(5)]
    with proton_conn(cluster) as c:
        rcv = recv(c, queue_addr(q), credit=20)
        rest = [m.body for m in receive_n(rcv, 15)]
        assert rest == [f"m{i}" for i in range(5, 20)]
        assert receive_none(rcv, wait=0.5)


@pytest.mark.parametrize("qtype", ["classic", "quorum"])
@pytest.mark.parametrize("end", ["detach, then close", "close the connection"])
def test_a_pre_settled_receiver_that_ends_as_deliveries_come_loses_none(cluster, names, qtype,
                                                                        end):
    """Its queue's node holds credit for 20 (the link's is lowered to none) when 20
    messages arrive and the link ends at once: each is held past the credit, or reaches the
    router after the link detached or its session ended, and every one goes back to the
    queue, once. On a quorum queue most came after the connection's close, and were lost
    (12 of 20 in most runs) until such a void no-ack delivery went back to its queue too."""
    q = declare(cluster, names(), {"x-queue-type": qtype}, durable=True)
    with proton_conn(cluster) as c:
        rcv = recv(c, queue_addr(q), credit=0, options=AtMostOnce())
        grant_then_lower(cluster, c, rcv, 20, 0)
        with pika_channel(cluster) as ch:
            for i in range(20):
                ch.basic_publish("", q, f"m{i}".encode())
        if end.startswith("detach"):
            detach(rcv)
        assert rcv.fetcher.has_message == 0
    deadline = time.monotonic() + TIMEOUT
    while ready_count(cluster, q) < 20 and time.monotonic() < deadline:
        time.sleep(0.1)
    rest = [b for _, b in pika_get_all(cluster, q)]
    assert sorted(rest) == sorted(f"m{i}".encode() for i in range(20))


# ---------------------------------------------------------------- dynamic, relay, big

def test_dynamic_receiver_as_reply_to(cluster, names):
    requests = declare(cluster, names("requests"))
    with proton_conn(cluster) as client, proton_conn(cluster) as server:
        replies = recv(client, None, dynamic=True, credit=5)
        reply_to = replies.link.remote_source.address
        assert reply_to
        send(client, queue_addr(requests),
             msg(b"ping", reply_to=reply_to, correlation_id="c-1"))
        srv = recv(server, queue_addr(requests), credit=1)
        req = srv.receive(timeout=TIMEOUT)
        srv.accept()
        assert req.reply_to == reply_to
        assert send(server, req.reply_to, msg(b"pong", correlation_id=req.correlation_id)
                    ) == [ACCEPTED]
        answer = replies.receive(timeout=TIMEOUT)
        replies.accept()
        assert body(answer) == b"pong" and answer.correlation_id == "c-1"


def test_anonymous_relay_sends_by_the_to_property(cluster, names):
    q = declare(cluster, names())
    with proton_conn(cluster) as c:
        assert send(c, None, msg(b"relayed", address=queue_addr(q))) == [ACCEPTED]
        rcv = recv(c, queue_addr(q), credit=1)
        assert body(rcv.receive(timeout=TIMEOUT)) == b"relayed"
        rcv.accept()


def test_split_transfers_carry_a_1mb_body(cluster, names):
    q = declare(cluster, names())
    big = bytes(range(256)) * 4096                              # 1 MiB
    with proton_conn(cluster, max_frame_size=4096) as c:
        assert send(c, queue_addr(q), msg(big)) == [ACCEPTED]
        rcv = recv(c, queue_addr(q), credit=1)
        got = rcv.receive(timeout=30)
        rcv.accept()
        assert body(got) == big


# ---------------------------------------------------------------- errors

def test_attach_to_a_missing_queue_is_not_found(cluster, names):
    missing = names("missing")
    with proton_conn(cluster) as c:
        assert link_error(c, queue_addr(missing)) \
            == ("link", "amqp:not-found")
    with proton_conn(cluster) as c:
        assert link_error(c, queue_addr(missing), "sender") == ("link", "amqp:not-found")


def test_closing_a_link_is_answered_with_a_closing_detach(cluster, names):
    """proton's BlockingLink.close waits for the broker's detach with closed=true."""
    q = declare(cluster, names())
    with proton_conn(cluster) as c:
        c.create_sender(queue_addr(q), name=link_name()).close()
        recv(c, queue_addr(q), credit=1).close()


def test_the_connection_survives_a_link_error(cluster, names):
    q = declare(cluster, names())
    with proton_conn(cluster) as c:
        assert link_error(c, queue_addr(names("missing"))) \
            == ("link", "amqp:not-found")
        assert send(c, queue_addr(q), msg(b"still here")) == [ACCEPTED]


def test_wrong_password_fails_sasl(cluster):
    with pytest.raises(ConnectionException) as exc:
        c = connect(cluster, password="not-the-password")
        c.close()
    assert "unauthorized-access" in str(exc.value) or "Authentication failed" in str(exc.value)


def test_anonymous_is_refused_when_not_configured(cluster):
    with pytest.raises(ConnectionException):
        c = BlockingConnection(f"amqp://{cluster.host}:{cluster.port}", timeout=TIMEOUT,
                               allowed_mechs="ANONYMOUS")
        c.close()


def test_a_header_without_sasl_is_answered_with_the_sasl_header_then_closed(cluster):
    with socket.create_connection((cluster.host, cluster.port), timeout=TIMEOUT) as s:
        s.sendall(b"AMQP\x00\x01\x00\x00")
        got = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    assert got[:8] == b"AMQP\x03\x01\x00\x00"


# ---------------------------------------------------------------- event API (Container)

class SendReceive(MessagingHandler):
    """Sends ``count`` messages to ``address``, receives them back, closes; bounded."""

    def __init__(self, url: str, address: str, count: int, **connect_kw):
        super().__init__()
        self.url, self.address, self.count, self.kw = url, address, count, connect_kw
        self.sent = self.accepted = 0
        self.received: list = []
        self.errors: list = []
        self.timed_out = False

    def on_start(self, event):
        self.timer = event.container.schedule(TIMEOUT, self)
        self.conn = event.container.connect(self.url, allowed_mechs="PLAIN", reconnect=False,
                                            **self.kw)
        event.container.create_sender(self.conn, self.address)

    def on_sendable(self, event):
        while event.sender.credit and self.sent < self.count:
            event.sender.send(Message(body=f"m{self.sent}".encode(), inferred=True))
            self.sent += 1

    def on_accepted(self, event):
        self.accepted += 1
        if self.accepted == self.count:
            event.sender.close()
            event.container.create_receiver(self.conn, self.address)

    def on_message(self, event):
        self.received.append(bytes(event.message.body))
        if len(self.received) == self.count:
            self.done()

    def done(self):
        self.timer.cancel()
        self.conn.close()

    def on_timer_task(self, event):
        self.timed_out = True
        self.conn.close()

    def on_link_error(self, event):
        self.errors.append(event.link.remote_condition)
        self.done()

    def on_session_error(self, event):
        self.errors.append(event.session.remote_condition)
        self.done()

    def on_connection_error(self, event):
        self.errors.append(event.connection.remote_condition)
        self.done()

    def on_transport_error(self, event):
        self.errors.append(event.transport.condition)
        self.timer.cancel()


def test_container_sends_and_receives(cluster, names):
    q = declare(cluster, names())
    h = SendReceive(amqp10_url(cluster), queue_addr(q), 20)
    Container(h).run()
    assert not h.errors and not h.timed_out
    assert h.accepted == 20
    assert h.received == [f"m{i}".encode() for i in range(20)]
    assert ready_count(cluster, q) == 0


def test_container_with_a_missing_queue_gets_a_link_error(cluster, names):
    h = SendReceive(amqp10_url(cluster), queue_addr(names("missing")), 1)
    Container(h).run()
    assert not h.timed_out
    assert [e.name for e in h.errors if e] == ["amqp:not-found"]


def test_container_wrong_password_is_a_transport_error(cluster, names):
    q = declare(cluster, names())
    h = SendReceive(amqp10_url(cluster, password="nope"), queue_addr(q), 1)
    Container(h).run()
    assert h.errors and h.errors[0] is not None
    assert h.errors[0].name == "amqp:unauthorized-access"
    assert h.sent == 0 or h.accepted == 0


# ---------------------------------------------------------------- vhosts and permissions

def _mgmt(cl, method, path, body=None):
    from tests.e2e.management.test_management import call
    status, data, _ = call(cl, method, path, body)
    assert status in (200, 201, 204), (method, path, status, data)
    return data


def open_error(cl, **kw) -> str | None:
    """The condition a connection gets while opening or on its first link, or None."""
    try:
        c = connect(cl, **kw)
    except ConnectionClosed as e:
        return e.condition
    except ConnectionException as e:
        return str(e)
    try:
        c.wait(lambda: bool(c.conn.state & Endpoint.REMOTE_CLOSED), timeout=3)
    except ConnectionClosed as e:
        return e.condition
    except ConnectionException as e:
        return str(e)
    except proton.Timeout:
        return None
    finally:
        with contextlib.suppress(Exception):
            c.close()
    return None


@pytest.fixture
def vhost(access_cluster, names):
    vh = names("vh")
    _mgmt(access_cluster, "PUT", f"/vhosts/{vh}", {})
    _mgmt(access_cluster, "PUT", f"/permissions/{vh}/guest",
          {"configure": ".*", "write": ".*", "read": ".*"})
    return vh


def _vhost_pika_url(cl, vh, user="guest", password="guest"):
    return f"amqp://{user}:{password}@{cl.host}:{cl.port}/{vh}"


def test_vhost_hostname_selects_the_vhost(access_cluster, vhost, names):
    q = names()
    with pika_channel(access_cluster, _vhost_pika_url(access_cluster, vhost)) as ch:
        ch.queue_declare(q)
    with proton_conn(access_cluster, virtual_host=f"vhost:{vhost}") as c:
        assert send(c, queue_addr(q), msg(b"in the vhost")) == [ACCEPTED]
    with proton_conn(access_cluster) as c:                  # default vhost: no such queue
        assert link_error(c, queue_addr(q)) \
            == ("link", "amqp:not-found")
    with pika_channel(access_cluster, _vhost_pika_url(access_cluster, vhost)) as ch:
        method, _, got = ch.basic_get(q, auto_ack=True)
        assert got == b"in the vhost"


def test_container_virtual_host_selects_the_vhost(access_cluster, vhost, names):
    q = names()
    with pika_channel(access_cluster, _vhost_pika_url(access_cluster, vhost)) as ch:
        ch.queue_declare(q)
    h = SendReceive(amqp10_url(access_cluster), queue_addr(q), 3,
                    virtual_host=f"vhost:{vhost}")
    Container(h).run()
    assert not h.errors and not h.timed_out
    assert h.received == [b"m0", b"m1", b"m2"]


def test_unknown_vhost_is_refused(access_cluster, names):
    cond = open_error(access_cluster, virtual_host=f"vhost:{names('nowhere')}")
    assert cond is not None
    assert "amqp:unauthorized-access" in cond or "amqp:not-found" in cond


def test_a_user_without_read_permission_is_refused_on_attach(access_cluster, vhost, names):
    user, q = names("user"), names()
    _mgmt(access_cluster, "PUT", f"/users/{user}", {"password": "pw", "tags": ""})
    _mgmt(access_cluster, "PUT", f"/permissions/{vhost}/{user}",
          {"configure": "", "write": ".*", "read": "^$"})
    with pika_channel(access_cluster, _vhost_pika_url(access_cluster, vhost)) as ch:
        ch.queue_declare(q)
    with proton_conn(access_cluster, user=user, password="pw",
                     virtual_host=f"vhost:{vhost}") as c:
        assert send(c, queue_addr(q), msg(b"may write")) == [ACCEPTED]
        assert link_error(c, queue_addr(q)) \
            == ("link", "amqp:unauthorized-access")


def test_a_user_without_permission_on_the_vhost_is_refused(access_cluster, vhost, names):
    user = names("user")
    _mgmt(access_cluster, "PUT", f"/users/{user}", {"password": "pw", "tags": ""})
    cond = open_error(access_cluster, user=user, password="pw", virtual_host=f"vhost:{vhost}")
    assert cond is not None and "amqp:unauthorized-access" in cond


def test_anonymous_logs_in_as_the_configured_user(access_cluster, names):
    q = declare(access_cluster, names())
    c = BlockingConnection(f"amqp://{access_cluster.host}:{access_cluster.port}",
                           timeout=TIMEOUT, allowed_mechs="ANONYMOUS")
    try:
        assert send(c, queue_addr(q), msg(b"anon")) == [ACCEPTED]
    finally:
        c.close()
    assert [b for _, b in pika_get_all(access_cluster, q)] == [b"anon"]
