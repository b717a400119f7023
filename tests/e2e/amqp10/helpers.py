"""Helpers for the AMQP 1.0 end-to-end tests (issue 37); fixtures are in conftest.py.

The clients (python-qpid-proton, rabbitmq-amqp-python-client, Node's rhea) connect to the
session ``cluster`` on its AMQP port: the protocol header picks AMQP 1.0 there. Queues are
declared with pika (AMQP 0-9-1) on the same port, then used over 1.0.

``SHOAL_E2E_URL=amqp://guest:guest@127.0.0.1:5672/`` (tests/conftest.py) runs these tests
against another broker, e.g. RabbitMQ 3.10 with its rabbitmq_amqp1_0 plugin, to debug the
tests themselves; add ``SHOAL_AMQP10_ADDRESSES=v1`` there, since 3.10 knows only the v1
address forms (``/amq/queue/NAME``, ``/exchange/X/K``): :func:`queue_addr` and
:func:`exchange_addr` then give those instead of ``/queues/NAME`` and ``/exchanges/X/K``.

Every blocking call is bounded (``TIMEOUT``), so a broker that does not answer fails a test
instead of hanging it.
"""
from __future__ import annotations

import contextlib
import os
import urllib.parse
import uuid
from typing import Iterator

import pika

import proton
from proton import Delivery, Endpoint, Message, symbol
from proton.reactor import LinkOption
from proton.utils import BlockingConnection, BlockingReceiver, ConnectionClosed, LinkDetached


TIMEOUT = 10.0     #: bound of every blocking proton call (s)
V1_ONLY = os.environ.get("SHOAL_AMQP10_ADDRESSES", "").strip().lower() == "v1"


# ---------------------------------------------------------------- addresses and urls

def queue_addr(name: str) -> str:
    """The address of queue ``name`` (v2 ``/queues/NAME``, percent-encoded)."""
    if V1_ONLY:
        return f"/amq/queue/{name}"
    return "/queues/" + urllib.parse.quote(name, safe="")


def exchange_addr(exchange: str, key: str) -> str:
    """The address of exchange ``exchange`` with routing key ``key`` (v2 form)."""
    if V1_ONLY:
        return f"/exchange/{exchange}/{key}"
    return ("/exchanges/" + urllib.parse.quote(exchange, safe="") + "/"
            + urllib.parse.quote(key, safe=""))


def amqp10_url(cl, user: str | None = None, password: str | None = None) -> str:
    """The URL proton connects to (no vhost in it: 1.0 selects it by the open hostname)."""
    user = cl.user if user is None else user
    password = cl.password if password is None else password
    return (f"amqp://{urllib.parse.quote(user, safe='')}:{urllib.parse.quote(password, safe='')}"
            f"@{cl.host}:{cl.port}")


def connect(cl, user: str | None = None, password: str | None = None,
            **kwargs) -> BlockingConnection:
    """A proton BlockingConnection with SASL PLAIN (guest/guest unless told)."""
    kwargs.setdefault("allowed_mechs", "PLAIN")
    if cl.vhost != "/" and "virtual_host" not in kwargs:
        kwargs["virtual_host"] = f"vhost:{cl.vhost}"
    return BlockingConnection(amqp10_url(cl, user, password), timeout=TIMEOUT, **kwargs)


@contextlib.contextmanager
def proton_conn(cl, **kwargs) -> Iterator[BlockingConnection]:
    c = connect(cl, **kwargs)
    try:
        yield c
    finally:
        with contextlib.suppress(Exception):
            c.close()


# ---------------------------------------------------------------- pika side

@contextlib.contextmanager
def pika_channel(cl, url: str | None = None):
    conn = pika.BlockingConnection(pika.URLParameters(url or cl.url))
    try:
        yield conn.channel()
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def declare(cl, name: str, arguments: dict | None = None, durable: bool = False) -> str:
    with pika_channel(cl) as ch:
        ch.queue_declare(name, durable=durable, arguments=arguments)
    return name


def ready_count(cl, name: str) -> int:
    """Messages ready in queue ``name`` (passive declare's message-count)."""
    with pika_channel(cl) as ch:
        return ch.queue_declare(name, passive=True).method.message_count


def pika_get_all(cl, name: str, limit: int = 100) -> list:
    """Every message now in queue ``name`` as ``(properties, body)``, acked."""
    out = []
    with pika_channel(cl) as ch:
        for _ in range(limit):
            method, props, body = ch.basic_get(name, auto_ack=True)
            if method is None:
                break
            out.append((props, body))
    return out


# ---------------------------------------------------------------- proton helpers

def send(conn: BlockingConnection, address: str | None, *messages: Message) -> list:
    """Send each message unsettled on a new link; the remote outcomes (Delivery states)."""
    snd = conn.create_sender(address, name=link_name())
    try:
        return [snd.send(m, timeout=TIMEOUT).remote_state for m in messages]
    finally:
        detach(snd)


def detach(link) -> None:
    """Close (detach closed=true) a blocking link without waiting for the broker's detach:
    RabbitMQ 3.10 answers with a detach without closed=true, which proton's
    ``BlockingLink.close`` waits for in vain (see test_closing_a_link_is_answered)."""
    link.link.close()


def body(m: Message):
    """A message body as bytes when it is binary (proton may give a memoryview)."""
    b = m.body
    return bytes(b) if isinstance(b, (memoryview, bytearray)) else b


def receive_n(rcv: BlockingReceiver, n: int, settle=Delivery.ACCEPTED,
              timeout: float = TIMEOUT) -> list[Message]:
    out = []
    for _ in range(n):
        out.append(rcv.receive(timeout=timeout))
        if settle is not None:
            rcv.settle(settle)
    return out


def receive_none(rcv: BlockingReceiver, wait: float = 1.0) -> bool:
    """True when nothing arrives on ``rcv`` within ``wait`` s (credit is given for it)."""
    try:
        rcv.receive(timeout=wait)
    except proton.Timeout:
        return True
    return False


def settle_modified(rcv: BlockingReceiver, failed: bool = True,
                    undeliverable: bool = False, annotations: dict | None = None) -> None:
    """Settle the oldest unsettled delivery of ``rcv`` with ``modified`` (with message
    ``annotations`` to merge into the message, when given)."""
    d = rcv.fetcher.unsettled.popleft()
    d.local.failed = failed
    d.local.undeliverable = undeliverable
    if annotations is not None:
        d.local.annotations = annotations
    d.update(Delivery.MODIFIED)
    d.settle()


def link_error(conn: BlockingConnection, address: str | None, role: str = "receiver",
               wait: float = 5.0, **kw) -> tuple[str, str | None]:
    """Attach a ``role`` link to ``address`` and wait for the broker to end it:
    ``(scope, condition)``, scope ``link`` (detach), ``session`` (end), ``connection``
    (close) or ``none`` (the link stayed attached: condition None).

    The contract's way for a missing queue is an attach answered then a detach with the
    error; RabbitMQ 3.10 ends the session instead, which proton's blocking API never reports,
    so the link is made with the container and watched by hand."""
    make = conn.container.create_receiver if role == "receiver" else \
        conn.container.create_sender
    link = make(conn.conn, address, name=link_name(), **kw)
    session = link.session

    def ended() -> bool:
        return bool(link.state & Endpoint.REMOTE_CLOSED or session.state & Endpoint.REMOTE_CLOSED
                    or conn.conn.state & Endpoint.REMOTE_CLOSED)
    try:
        conn.wait(ended, timeout=wait)
    except LinkDetached as e:
        return "link", e.condition
    except ConnectionClosed as e:
        return "connection", e.condition
    except proton.Timeout:
        return "none", None
    except proton.ConnectionException as e:
        return "connection", str(e)
    for scope, ep in (("link", link), ("session", session), ("connection", conn.conn)):
        if ep.state & Endpoint.REMOTE_CLOSED:
            return scope, ep.remote_condition.name if ep.remote_condition else None
    return "none", None


def link_name() -> str:
    """A unique link name (proton's default, container-id + address, repeats for a second
    link to the same address while the first one is not yet freed)."""
    return f"e2e-link-{uuid.uuid4().hex}"


def recv(conn: BlockingConnection, address: str | None, credit: int | None = None,
         **kw) -> BlockingReceiver:
    """``conn.create_receiver`` with a unique link name."""
    return conn.create_receiver(address, credit=credit, name=link_name(), **kw)


class LinkProperties(LinkOption):
    """Sets the attach's link ``properties`` (keys as symbols)."""

    def __init__(self, props: dict) -> None:
        self.props = {symbol(k): v for k, v in props.items()}

    def apply(self, link) -> None:
        link.properties = self.props


def uname(prefix: str = "q") -> str:
    return f"e2e-a10-{prefix}-{uuid.uuid4().hex[:10]}"
