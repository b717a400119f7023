"""Access-control scenarios (issue 22, point 1): the same pika scripts run against RabbitMQ and
Shoal, both loaded with :data:`DEFINITIONS` (a RabbitMQ definitions document: users with
password hashes, vhosts, permissions, topic permissions).

``ACCESS_SCENARIOS[name](base_url, notes=None) -> record`` as :mod:`.parity`'s scenarios;
``base_url`` is the broker's ``amqp://host:port``, and each scenario logs in as the user it
needs. :mod:`.parity_access_expected` holds each scenario's record as RabbitMQ 3.10.8 gave it
(Debian's package, session 11), so that Shoal is held to it where no RabbitMQ runs (CI).
"""
from __future__ import annotations

import re
import time
import urllib.parse
from collections.abc import Callable

import pika.exceptions as px

from .parity import Rec, barrier, run

VHOST2 = "acc-vh"
LIMITED = "acc-limited-vh"   #: a vhost with limits (max-connections 1, max-queues 2)
PASSWORD = "acc-pw"
#: The user ``acc-rmq``'s hash as ``rabbitmqctl export_definitions`` wrote it (RabbitMQ
#: 3.10.8) for the password ``p``: an exported user must log in unchanged.
RABBITMQ_HASH = "o90CI7XlbxwUGU0OMErYYKsyCO2TsfHF4kbi5zkqgJcxubLw"
#: ``acc-pw`` hashed the same way (salt 01020304), written once, checked by test_access.py.
ACC_HASH = "AQIDBEbPYssvykerxbVIpizawe+pwY5lc/a1fOPMcVG/bGGx"

DEFINITIONS = {
    "users": [
        {"name": "acc-admin", "password_hash": ACC_HASH,
         "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["administrator"],
         "limits": {}},
        {"name": "acc-u", "password_hash": ACC_HASH,
         "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": [], "limits": {}},
        {"name": "acc-none", "password_hash": ACC_HASH,
         "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": "management"},
        {"name": "acc-rmq", "password_hash": RABBITMQ_HASH,
         "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": []},
        {"name": "acc-lim", "password_hash": ACC_HASH,
         "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": [],
         "limits": {"max-connections": 2, "max-channels": 3}},
    ],
    "vhosts": [{"name": "/"}, {"name": VHOST2}, {"name": LIMITED}],
    "parameters": [{"component": "vhost-limits", "vhost": LIMITED, "name": "limits",
                    "value": {"max-connections": 1, "max-queues": 2}}],
    "permissions": [
        {"user": "acc-admin", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
        {"user": "acc-admin", "vhost": VHOST2, "configure": ".*", "write": ".*", "read": ".*"},
        {"user": "acc-rmq", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
        {"user": "acc-lim", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
        {"user": "acc-lim", "vhost": LIMITED, "configure": ".*", "write": ".*", "read": ".*"},
        {"user": "acc-admin", "vhost": LIMITED, "configure": ".*", "write": ".*", "read": ".*"},
        {"user": "acc-u", "vhost": "/", "configure": "^acc-c-",
         "write": r"^acc-(c|w)-|^amq\.(default|topic)$",
         "read": r"^acc-(c|r)-|^amq\.(direct|topic)$"},
    ],
    # topology, declared at start (RabbitMQ: at boot; Shoal: by each router as it starts)
    "exchanges": [{"name": "acc-def-x", "vhost": "/", "type": "topic", "durable": True,
                   "auto_delete": False, "internal": False, "arguments": {}}],
    "queues": [{"name": "acc-def-q", "vhost": "/", "durable": True, "auto_delete": False,
                "arguments": {"x-max-length": 10}}],
    "bindings": [{"source": "acc-def-x", "vhost": "/", "destination": "acc-def-q",
                  "destination_type": "queue", "routing_key": "acc.#", "arguments": {}}],
    "topic_permissions": [
        {"user": "acc-u", "vhost": "/", "exchange": "amq.topic", "write": r"^acc\.w\.",
         "read": r"^acc\.r\."},
    ],
}

ACCESS_SCENARIOS: dict[str, Callable[..., list]] = {}


def _url(base: str, user: str, password: str = PASSWORD, vhost: str = "/") -> str:
    return f"{base}/{urllib.parse.quote(vhost, safe='')}".replace(
        "amqp://", f"amqp://{user}:{urllib.parse.quote(password)}@", 1)


def access_scenario(user: str = "acc-u", vhost: str = "/", password: str = PASSWORD):
    """Register ``fn(rec, admin)`` run as ``user``; ``admin`` is a Rec of ``acc-admin``
    whose queues and exchanges are deleted after the scenario."""
    def register(fn: Callable[[Rec, Rec], None]):
        def by_url(base: str, notes: list | None = None) -> list:
            admin = Rec(_url(base, "acc-admin"))

            def body(rec: Rec) -> None:
                admin._names = rec._names      # one table: names recorded as <tag>
                try:
                    fn(rec, admin)
                finally:
                    admin.cleanup()
            return run(body, _url(base, user, password, vhost), notes=notes)
        by_url.__doc__ = fn.__doc__
        ACCESS_SCENARIOS[fn.__name__] = by_url
        return fn
    return register


def _open(rec: Rec) -> None:
    """Open a connection; a refusal is recorded with its reply code."""
    _open_closed(rec, "open", rec.conn)


def _steps(rec: Rec, steps) -> None:
    """Each ``(label, fn(channel))`` on a fresh channel of one connection (a refusal closes
    only that channel); records ``ok`` or how the broker closed."""
    c = rec.conn()
    for label, fn in steps:
        ch = c.channel() if c.is_open else rec.conn().channel()
        rec.do(label, fn, ch)


# ---- logging in and opening a vhost -----------------------------------------------------------
@access_scenario(user="acc-rmq", password="p")
def login_with_rabbitmq_exported_hash(rec: Rec, admin: Rec) -> None:
    """A user whose password hash was exported from RabbitMQ logs in with its password."""
    _open(rec)


@access_scenario(password="wrong")
def login_wrong_password(rec: Rec, admin: Rec) -> None:
    """A wrong password: 403 ACCESS_REFUSED, connection closed."""
    _open(rec)


@access_scenario(user="acc-none")
def vhost_without_permissions(rec: Rec, admin: Rec) -> None:
    """A user with no permissions in the vhost: 530 NOT_ALLOWED on connection.open."""
    _open(rec)


@access_scenario(vhost=VHOST2)
def vhost_of_other_users(rec: Rec, admin: Rec) -> None:
    """A vhost that exists but where the user has no permissions: 530."""
    _open(rec)


@access_scenario(vhost="acc-no-such-vhost")
def vhost_missing(rec: Rec, admin: Rec) -> None:
    """A vhost that does not exist: 530."""
    _open(rec)


# ---- configure ---------------------------------------------------------------------------------
@access_scenario()
def configure_queues_and_exchanges(rec: Rec, admin: Rec) -> None:
    """queue.declare/delete and exchange.declare/delete need configure on the name; passive
    declares need nothing; an alternate exchange needs read on the exchange and write on the
    alternate; a dead-letter exchange needs read on the queue and write on the DLX."""
    other_q = admin.q("other-q", "acc-x-{hex}")
    admin.channel().queue_declare(other_q)
    cq = rec.q("cq", "acc-c-{hex}")
    cx = rec.name("cx", "acc-c-{hex}")
    rec.exchanges.append(cx)
    _steps(rec, [
        ("declare-configurable", lambda c: c.queue_declare(cq)),
        ("declare-not-configurable", lambda c: c.queue_declare(rec.name("xq", "acc-x-{hex}"))),
        ("passive-not-configurable", lambda c: c.queue_declare(other_q, passive=True)),
        ("delete-not-configurable", lambda c: c.queue_delete(other_q)),
        ("exchange-configurable", lambda c: c.exchange_declare(cx, "direct")),
        ("exchange-not-configurable",
         lambda c: c.exchange_declare(rec.name("xx", "acc-x-{hex}"), "direct")),
        ("exchange-passive-amq", lambda c: c.exchange_declare("amq.fanout", passive=True)),
        ("exchange-ae-not-writable", lambda c: c.exchange_declare(
            rec.name("ae", "acc-c-{hex}"), "fanout",
            arguments={"alternate-exchange": "amq.fanout"})),
        ("queue-dlx-not-writable", lambda c: c.queue_declare(
            rec.name("dq", "acc-c-{hex}"), arguments={"x-dead-letter-exchange": "amq.fanout"})),
        ("queue-dlx-writable", lambda c: c.queue_declare(
            rec.q("dq2", "acc-c-{hex}"), arguments={"x-dead-letter-exchange": "amq.topic"})),
        ("exchange-delete", lambda c: c.exchange_delete(cx)),
        ("queue-delete", lambda c: c.queue_delete(cq)),
    ])


# ---- write and read ----------------------------------------------------------------------------
@access_scenario()
def publish_needs_write(rec: Rec, admin: Rec) -> None:
    """basic.publish needs write on the exchange (the default exchange is amq.default);
    a refused publish closes the channel with 403 (seen by the next round trip)."""
    cq = rec.q("cq", "acc-c-{hex}")
    c = rec.conn()
    setup = c.channel()
    setup.queue_declare(cq)
    setup.queue_bind(cq, "amq.direct", cq)
    for label, exchange in (("default", ""), ("amq.direct", "amq.direct"),
                            ("missing", "acc-x-missing")):
        ch = c.channel()
        rec.do(f"publish-{label}", ch.basic_publish, exchange, cq, b"m", sync=ch)
    rec.get(c.channel(), cq)


@access_scenario()
def read_queue_methods(rec: Rec, admin: Rec) -> None:
    """basic.get, basic.consume and queue.purge need read on the queue."""
    rq, wq = admin.q("rq", "acc-r-{hex}"), admin.q("wq", "acc-w-{hex}")
    ach = admin.channel()
    for q in (rq, wq):
        ach.queue_declare(q)
        ach.basic_publish("", q, b"m")
    barrier(ach)
    _steps(rec, [
        ("get-readable", lambda c: rec.add("got", c.basic_get(rq, auto_ack=True)[2])),
        ("get-not-readable", lambda c: c.basic_get(wq)),
        ("consume-readable", lambda c: c.basic_consume(rq, lambda *a: None, auto_ack=True)),
        ("consume-not-readable", lambda c: c.basic_consume(wq, lambda *a: None)),
        ("purge-readable", lambda c: c.queue_purge(rq)),
        ("purge-not-readable", lambda c: c.queue_purge(wq)),
    ])


@access_scenario()
def bind_needs_write_on_destination_read_on_source(rec: Rec, admin: Rec) -> None:
    """queue.bind/unbind: write on the queue, read on the exchange (in that order);
    exchange.bind: write on the destination, read on the source."""
    cq, rq = rec.q("cq", "acc-c-{hex}"), admin.q("rq", "acc-r-{hex}")
    admin.channel().queue_declare(rq)
    cx = rec.name("cx", "acc-c-{hex}")
    rec.exchanges.append(cx)
    _steps(rec, [
        ("declare", lambda c: (c.queue_declare(cq), c.exchange_declare(cx, "direct"))),
        ("bind", lambda c: c.queue_bind(cq, "amq.direct", "k")),
        ("bind-source-not-readable", lambda c: c.queue_bind(cq, "amq.fanout", "k")),
        ("bind-queue-not-writable", lambda c: c.queue_bind(rq, "amq.direct", "k")),
        ("bind-neither", lambda c: c.queue_bind(rq, "amq.fanout", "k")),
        ("unbind", lambda c: c.queue_unbind(cq, "amq.direct", "k")),
        ("unbind-queue-not-writable", lambda c: c.queue_unbind(rq, "amq.direct", "k")),
        ("exchange-bind", lambda c: c.exchange_bind(cx, "amq.direct", "k")),
        ("exchange-bind-source-not-readable", lambda c: c.exchange_bind(cx, "amq.fanout", "k")),
        ("exchange-bind-destination-not-writable",
         lambda c: c.exchange_bind("amq.fanout", "amq.direct", "k")),
        ("exchange-unbind", lambda c: c.exchange_unbind(cx, "amq.direct", "k")),
    ])


@access_scenario()
def topic_permissions(rec: Rec, admin: Rec) -> None:
    """Topic permissions of amq.topic: publish needs write on the routing key, queue.bind
    read on the binding key."""
    cq = rec.q("cq", "acc-c-{hex}")
    c = rec.conn()
    c.channel().queue_declare(cq)
    _steps(rec, [
        ("bind-key-readable", lambda c: c.queue_bind(cq, "amq.topic", "acc.r.#")),
        ("bind-key-not-readable", lambda c: c.queue_bind(cq, "amq.topic", "acc.x.#")),
    ])
    for label, key in (("publish-key-writable", "acc.w.1"),
                       ("publish-key-not-writable", "acc.x.1")):
        ch = c.channel()
        rec.do(label, ch.basic_publish, "amq.topic", key, b"m", sync=ch)


_GENERATED_NAME = re.compile(r"acc-[a-z]-[0-9a-f]{12}|amq\.gen-[A-Za-z0-9_\-]+")


def normalized(notes: list) -> list:
    """``notes`` (reply texts) with the names a scenario generated replaced by ``<name>``."""
    return [tuple(_GENERATED_NAME.sub("<name>", v) if isinstance(v, str) else v for v in n)
            for n in notes]


@access_scenario(user="acc-admin")
def definitions_topology(rec: Rec, admin: Rec) -> None:
    """The exchange, queue (with its arguments) and binding of the definitions exist: a
    passive declare finds them, a publish to the exchange reaches the queue, and a redeclare
    as not durable is 406."""
    c = rec.conn()
    ch = c.channel()
    ch.confirm_delivery()
    rec.do("passive-exchange", ch.exchange_declare, "acc-def-x", passive=True)
    rec.do("passive-queue", ch.queue_declare, "acc-def-q", passive=True)
    rec.do("publish", ch.basic_publish, "acc-def-x", "acc.1", b"via definitions")
    rec.get(ch, "acc-def-q")
    rec.do("redeclare-not-durable", rec.channel(c).queue_declare, "acc-def-q",
           arguments={"x-max-length": 10})


# ---- limits (issue 22, point 3) ----------------------------------------------------------------
def _open_closed(rec: Rec, label: str, fn) -> None:
    """``fn()``; records ok, or the reply code of the connection.close it ends in (pika
    reports a refused open as ``Probable...Error`` wrapping the broker's connection.close)."""
    try:
        fn()
    except px.AMQPConnectionError as e:
        m = re.search(r"\((\d{3})\) ['\"](.*)['\"]", str(e))
        if m is None:
            rec.closed(label, e)
        else:
            rec.add(label, "connection-closed", int(m[1]))
            rec.notes.append((label, int(m[1]), m[2]))
        return
    rec.add(label, "ok")


@access_scenario(user="acc-lim")
def user_connection_limit(rec: Rec, admin: Rec) -> None:
    """A user with max-connections 2: the third connection is refused with 530; once one
    closes, a new one is admitted."""
    first = rec.conn()
    rec.conn()
    _open_closed(rec, "third", rec.conn)
    first.close()
    # RabbitMQ forgets a closed connection asynchronously (its connection tracking): a
    # connection opened at once may still be refused there (CI, stop 51). Ask again, bounded
    # (5 s), until admitted; a broker that never frees the slot still records 530.
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            rec.conn()
        except px.AMQPConnectionError:
            time.sleep(0.2)
            continue
        rec.add("after-close", "ok")
        return
    _open_closed(rec, "after-close", rec.conn)     # the last try: what it answers


@access_scenario(user="acc-lim")
def user_channel_limit(rec: Rec, admin: Rec) -> None:
    """A user with max-channels 3, counted over its connections: the fourth channel closes
    the connection with 530; channels of closed connections no longer count."""
    a, b = rec.conn(), rec.conn()
    a.channel(), a.channel(), b.channel()
    _open_closed(rec, "fourth", b.channel)
    for c in (a, b):
        if c.is_open:
            c.close()
    c = rec.conn()
    _open_closed(rec, "three-again", lambda: [c.channel() for _ in range(3)])


@access_scenario(user="acc-lim", vhost=LIMITED)
def vhost_connection_limit(rec: Rec, admin: Rec) -> None:
    """A vhost with max-connections 1: the second connection to it is refused with 530."""
    rec.conn()
    _open_closed(rec, "second", rec.conn)


@access_scenario(user="acc-admin", vhost=LIMITED)
def vhost_queue_limit(rec: Rec, admin: Rec) -> None:
    """A vhost with max-queues 2: a third queue is 406 (channel); redeclaring one that
    exists is fine; after a delete there is room again."""
    q1, q2, q3 = rec.q("q1", "acc-c-{hex}"), rec.q("q2", "acc-c-{hex}"), rec.q(
        "q3", "acc-c-{hex}")
    _steps(rec, [
        ("declare-1", lambda ch: ch.queue_declare(q1)),
        ("declare-2", lambda ch: ch.queue_declare(q2)),
        ("declare-3", lambda ch: ch.queue_declare(q3)),
        ("server-named", lambda ch: ch.queue_declare("", exclusive=True)),
        ("redeclare-1", lambda ch: ch.queue_declare(q1)),
        ("delete-1", lambda ch: ch.queue_delete(q1)),
        ("declare-3-again", lambda ch: ch.queue_declare(q3)),
    ])


def run_all(base_url: str) -> dict[str, tuple[list, list]]:
    """Every scenario against ``base_url``: ``{name: (record, notes)}``."""
    out = {}
    for name, fn in ACCESS_SCENARIOS.items():
        notes: list = []
        out[name] = (fn(base_url, notes=notes), notes)
    return out



