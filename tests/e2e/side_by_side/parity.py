"""Side-by-side conformance scenarios: the same client script run against two brokers
(RabbitMQ, the reference, and Shoal) gives a plain record of what the client saw.

A scenario is ``SCENARIOS[name](url) -> list`` of events such as ``("declare", "ok")``,
``("get", "m1", True, 0)`` (body, redelivered, message-count) or ``("ack", "channel-closed",
406)``. Records hold reply codes and which side was closed (``channel-closed`` /
``connection-closed`` / ``socket-closed``), never reply texts (they go to ``notes``), timings,
or generated names: the names a scenario makes are replaced by ``<tag>``, server-generated
queue names by ``<amq.gen>`` and consumer tags by ``<amq.ctag>``.

Most scenarios use pika (BlockingConnection); what no client library sends goes through the
raw socket of :mod:`tests.e2e.amqp_raw`. Each scenario runs in a worker thread bounded by
``SCENARIO_TIMEOUT``; its sockets are shut down when it overruns. Scenarios live in this
module (names, exchanges, queues), :mod:`.parity_basic` (acks, headers, consumers, tx),
:mod:`.parity_dead_letters` (x-death, cycles), :mod:`.parity_qos` (prefetch changed under
running consumers) and :mod:`.parity_raw` (frame-level: tune, channel_max, update-secret,
heartbeats).

``python -m tests.e2e.side_by_side.parity --a URL --b URL [--full] [NAME ...]`` prints a table.
"""
from __future__ import annotations

import argparse
import re
import socket
import threading
import urllib.parse
import uuid
from collections.abc import Callable

import pika
import pika.exceptions as px
from pamqp import commands as C

from ..amqp_raw import Closed, RawAMQP

TIMEOUT = 8.0            #: socket / handshake bound of every connection (s)
SCENARIO_TIMEOUT = 40.0  #: a whole scenario, cleanup included (s)
FAIL = object()          #: what ``Rec.do`` returns when the broker closed something
SCENARIOS: dict[str, Callable[[str], list]] = {}
GENERATED = [(re.compile(r"amq\.gen-[A-Za-z0-9_\-]+"), "<amq.gen>"),
             (re.compile(r"amq\.ctag-[A-Za-z0-9_\-]+"), "<amq.ctag>")]


class Rec:
    """One run of one scenario against one broker: its events, names and connections."""

    def __init__(self, url: str) -> None:
        self.url = url
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 5672
        self.user = urllib.parse.unquote(u.username or "guest")
        self.password = urllib.parse.unquote(u.password or "guest")
        self.vhost = urllib.parse.unquote(u.path[1:]) if u.path not in ("", "/") else "/"
        self.events: list = []
        self.notes: list = []     #: reply texts and other things not compared
        self._names: dict[str, str] = {}
        self.queues: list[str] = []
        self.exchanges: list[str] = []
        self._conns: list = []
        self._raws: list[RawAMQP] = []

    # -- names
    def name(self, tag: str, fmt: str = "parity-{tag}-{hex}") -> str:
        """A unique name, recorded as ``<tag>``."""
        n = fmt.format(tag=tag, hex=uuid.uuid4().hex[:12])
        self._names[n] = f"<{tag}>"
        return n

    def q(self, tag: str = "q", fmt: str = "parity-{tag}-{hex}") -> str:
        """A unique queue name, deleted after the scenario."""
        n = self.name(tag, fmt)
        self.queues.append(n)
        return n

    def x(self, tag: str = "x") -> str:
        n = self.name(tag)
        self.exchanges.append(n)
        return n

    def norm(self, v):
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        if isinstance(v, str):
            for n in sorted(self._names, key=len, reverse=True):
                v = v.replace(n, self._names[n])
            for rx, sub in GENERATED:
                v = rx.sub(sub, v)
            return v
        if isinstance(v, (list, tuple)):
            return type(v)(self.norm(i) for i in v)
        if isinstance(v, dict):
            return {self.norm(k): self.norm(i) for k, i in sorted(v.items())}
        return v

    def add(self, *event) -> None:
        self.events.append(self.norm(tuple(event)))

    # -- pika
    def conn(self) -> pika.BlockingConnection:
        p = pika.URLParameters(self.url)
        p.socket_timeout = p.stack_timeout = p.blocked_connection_timeout = TIMEOUT
        p.connection_attempts, p.retry_delay = 1, 0
        c = pika.BlockingConnection(p)
        self._conns.append(c)
        return c

    def channel(self, conn=None, confirm: bool = False):
        ch = (conn or self.conn()).channel()
        if confirm:
            ch.confirm_delivery()
        return ch

    def closed(self, label: str, e: BaseException) -> None:
        """Record how the broker closed (or what else went wrong)."""
        if isinstance(e, px.ChannelClosedByBroker):
            self.add(label, "channel-closed", e.reply_code)
            self.notes.append((label, e.reply_code, e.reply_text))
        elif isinstance(e, px.ConnectionClosedByBroker):
            self.add(label, "connection-closed", e.reply_code)
            self.notes.append((label, e.reply_code, e.reply_text))
        elif isinstance(e, (px.StreamLostError, px.AMQPConnectionError, Closed)):
            self.add(label, "socket-closed")
            self.notes.append((label, repr(e)))
        else:
            self.add(label, "error", type(e).__name__)
            self.notes.append((label, repr(e)))

    def do(self, label: str, fn, *args, ok: bool = True, sync=None, **kw):
        """``fn(*args, **kw)``; with ``sync`` (a channel) a round trip on it after, so that
        an asynchronous method's error surfaces. Records ``(label, "ok")`` when ``ok``;
        records how the broker closed and returns FAIL on an error."""
        try:
            out = fn(*args, **kw)
            if sync is not None:
                barrier(sync)
        except Exception as e:  # noqa: BLE001 - every outcome is a recorded event
            self.closed(label, e)
            return FAIL
        if ok:
            self.add(label, "ok")
        return out

    def get(self, ch, q: str, label: str = "get", no_ack: bool = True):
        """basic.get: records ``(label, body, redelivered, message_count)`` or get-empty."""
        res = self.do(label, ch.basic_get, q, auto_ack=no_ack, ok=False)
        if res is FAIL:
            return None
        m, _, body = res
        if m is None:
            self.add(label, "get-empty")
            return None
        self.add(label, body, m.redelivered, m.message_count)
        return m

    def drain(self, ch, q: str, label: str = "get", limit: int = 20) -> list:
        """basic.get (no-ack) until empty; records the bodies with their redelivered flags."""
        out = []
        for _ in range(limit):
            res = self.do(label, ch.basic_get, q, auto_ack=True, ok=False)
            if res is FAIL or res[0] is None:
                break
            out.append((res[2].decode("utf-8", "replace"), res[0].redelivered))
        self.add(label, out)
        return out

    # -- raw frames
    def raw(self, open_: bool = True, **kw) -> RawAMQP:
        r = RawAMQP(self.host, self.port, timeout=TIMEOUT)
        self._raws.append(r)
        if open_:
            r.open(user=self.user, password=self.password, vhost=self.vhost, **kw)
        return r

    def reply(self, r: RawAMQP, label: str, timeout: float = 3.0, record: bool = True):
        """Read the server's next frame; record its name or how the server closed. A
        channel.close / connection.close is answered with close-ok."""
        try:
            ch, v = r.read_frame(timeout)
        except Closed:
            self.add(label, "socket-closed")
            return None
        except AssertionError:
            self.add(label, "no-reply")
            return None
        if isinstance(v, (C.Connection.Close, C.Channel.Close)):
            side = "connection-closed" if isinstance(v, C.Connection.Close) else "channel-closed"
            self.add(label, side, v.reply_code)
            self.notes.append((label, v.reply_code, v.reply_text, v.class_id, v.method_id))
            try:
                r.send_frame(C.Connection.CloseOk() if side[0] == "c" and ch == 0
                             else C.Channel.CloseOk(), ch)
            except OSError:
                pass
            return v
        if record:
            self.add(label, getattr(v, "name", type(v).__name__))
        return v

    def raw_call(self, r: RawAMQP, label: str, method, channel: int = 1, timeout: float = 3.0):
        """Send one method and record the reply (``socket-closed`` when it cannot be sent)."""
        try:
            r.send_frame(method, channel)
        except OSError:
            self.add(label, "socket-closed")
            return None
        return self.reply(r, label, timeout)

    # -- lifecycle
    def abort(self) -> None:
        """Shut every socket down (a scenario overran): blocked reads return at once."""
        socks = [r.sock for r in self._raws]
        for c in self._conns:
            try:
                socks.append(c._impl._transport._sock)   # pika has no public handle
            except AttributeError:
                pass
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cleanup(self) -> None:
        for r in self._raws:
            r.close()
        for c in self._conns:
            if c.is_open:
                try:
                    c.close()
                except Exception:  # noqa: BLE001
                    pass
        if not (self.queues or self.exchanges):
            return
        try:
            c = self.conn()
            ch = c.channel()
            for kind, names in (("q", self.queues), ("x", self.exchanges)):
                for n in names:
                    try:
                        (ch.queue_delete if kind == "q" else ch.exchange_delete)(n)
                    except px.ChannelClosedByBroker:
                        ch = c.channel()
            c.close()
        except Exception:  # noqa: BLE001 - best effort
            pass


def barrier(ch) -> None:
    """A round trip on ``ch`` that every broker answers (passive declare of amq.direct)."""
    ch.exchange_declare("amq.direct", passive=True)


def run(fn: Callable[[Rec], None], url: str, timeout: float = SCENARIO_TIMEOUT,
        notes: list | None = None) -> list:
    """Run ``fn`` against ``url`` in a bounded worker thread; the record it made."""
    rec = Rec(url)

    def work():
        try:
            fn(rec)
        except Exception as e:  # noqa: BLE001 - an unexpected outcome is an event too
            rec.closed("scenario", e)
        finally:
            rec.cleanup()

    t = threading.Thread(target=work, daemon=True, name=f"parity-{fn.__name__}")
    t.start()
    t.join(timeout)
    if t.is_alive():
        rec.add("scenario-timeout")
        rec.abort()
        t.join(10)
    if notes is not None:
        notes.extend(rec.notes)
    return list(rec.events)


def scenario(fn: Callable[[Rec], None]) -> Callable[[Rec], None]:
    """Register ``fn(rec)`` as ``SCENARIOS[fn.__name__](url, notes=None) -> record``."""
    def by_url(url: str, notes: list | None = None) -> list:
        return run(fn, url, notes=notes)
    by_url.__doc__ = fn.__doc__
    by_url.__name__ = fn.__name__
    SCENARIOS[fn.__name__] = by_url
    return fn


def declare_publish_get(rec: Rec, name: str) -> None:
    """Declare ``name``, record declare-ok's fields, publish (confirmed) through the default
    exchange and get it back."""
    ch = rec.channel(confirm=True)
    ok = rec.do("declare", ch.queue_declare, name, ok=False)
    if ok is FAIL:
        rec.do("passive", rec.channel().queue_declare, name, passive=True)
        return
    got = ok.method.queue
    rec.queues.append(got)
    rec.add("declare-ok", "<same>" if got == name else got, ok.method.message_count,
            ok.method.consumer_count)
    rec.do("publish", ch.basic_publish, "", got, "body-ü".encode())
    rec.get(ch, got)


# ---- 1. queue names ----------------------------------------------------------------------------
@scenario
def queue_name_unicode(rec: Rec) -> None:
    """A non-ASCII queue name (shortstr is UTF-8 octets): declare-ok echoes it, messages
    route to it through the default exchange."""
    declare_publish_get(rec, rec.name("uni", "ünïcode-{hex}"))


@scenario
def queue_name_wildcards(rec: Rec) -> None:
    """``q#*`` characters are ordinary in queue names (only topic binding keys give them
    meaning)."""
    declare_publish_get(rec, rec.name("wild", "q#*.{hex}"))


@scenario
def queue_name_255_bytes(rec: Rec) -> None:
    """A 255-octet UTF-8 name (the shortstr maximum, multi-byte characters)."""
    base = rec.name("tmp", "{hex}-")
    name = base + "é" * ((255 - len(base)) // 2)
    name += "x" * (255 - len(name.encode()))
    assert len(name.encode()) == 255
    rec._names[name] = "<255>"
    declare_publish_get(rec, name)


@scenario
def queue_name_amq_reserved(rec: Rec) -> None:
    """``amq.`` names are reserved: declare -> 403 ACCESS_REFUSED (channel); a passive declare
    of such a missing name is just 404."""
    declare_publish_get(rec, rec.name("amq", "amq.foo-{hex}"))


@scenario
def queue_name_server_named(rec: Rec) -> None:
    """queue.declare "" makes a server-named queue (RabbitMQ: ``amq.gen-...``)."""
    ch = rec.channel(confirm=True)
    ok = rec.do("declare", ch.queue_declare, "", exclusive=True, ok=False)
    if ok is not FAIL:
        rec.add("declare-ok", ok.method.queue.startswith("amq.gen-"), ok.method.message_count)
        rec.do("publish", ch.basic_publish, "", ok.method.queue, b"m")
        rec.get(ch, ok.method.queue)


# ---- 2. exchanges ------------------------------------------------------------------------------
def _ch_steps(rec: Rec, steps) -> None:
    """Each ``(label, fn-of-channel)`` on a fresh channel of one connection."""
    c = rec.conn()
    for label, fn in steps:
        ch = c.channel() if c.is_open else rec.channel()
        rec.do(label, fn, ch, sync=ch)


@scenario
def exchange_declare_errors(rec: Rec) -> None:
    """Redeclare with another type (406 channel), passive on missing (404), ``amq.`` prefix
    (403), delete of amq.direct (403), passive with another type is fine (type is not
    checked). An unknown type: :func:`exchange_declare_unknown_type`."""
    ex, amqx = rec.x("ex"), rec.name("amqx", "amq.foo-{hex}")
    rec.exchanges.append(amqx)
    _ch_steps(rec, [
        ("declare", lambda ch: ch.exchange_declare(ex, "direct")),
        ("redeclare-fanout", lambda ch: ch.exchange_declare(ex, "fanout")),
        ("redeclare-durable", lambda ch: ch.exchange_declare(ex, "direct", durable=True)),
        ("passive-other-type", lambda ch: ch.exchange_declare(ex, "topic", passive=True)),
        ("passive-missing", lambda ch: ch.exchange_declare(rec.x("gone"), passive=True)),
        ("declare-amq", lambda ch: ch.exchange_declare(amqx, "direct")),
        ("delete-amq.direct", lambda ch: ch.exchange_delete("amq.direct")),
        ("delete-missing", lambda ch: ch.exchange_delete(rec.x("gone2"))),
        ("after", lambda ch: ch.exchange_declare(ex, passive=True)),
    ])


@scenario
def exchange_declare_unknown_type(rec: Rec) -> None:
    """An unknown exchange type: RabbitMQ 4 refuses it with 406 on the channel, 3.10 with
    503 COMMAND_INVALID on the connection (Shoal answers as RabbitMQ 4: KNOWN in
    test_parity.py); what the connection can do after."""
    ex = rec.x("ex")
    _ch_steps(rec, [
        ("declare-unknown-type", lambda ch: ch.exchange_declare(rec.x("odd"), "x-nonsense")),
        ("declare-after", lambda ch: ch.exchange_declare(ex, "direct")),
    ])


@scenario
def exchange_default_exchange(rec: Rec) -> None:
    """The default exchange: bind/unbind a queue to it (403), delete it (403), declare it
    passively, publish to a missing queue through it (silently dropped)."""
    q = rec.q()
    _ch_steps(rec, [
        ("declare-q", lambda ch: ch.queue_declare(q)),
        ("bind-default", lambda ch: ch.queue_bind(q, "", routing_key="k")),
        ("unbind-default", lambda ch: ch.queue_unbind(q, "", routing_key=q)),
        ("delete-default", lambda ch: ch.exchange_delete("")),
        ("passive-default", lambda ch: ch.exchange_declare("", passive=True)),
        ("publish-missing-q", lambda ch: ch.basic_publish("", rec.name("nq"), b"x")),
    ])


@scenario
def exchange_to_exchange(rec: Rec) -> None:
    """exchange.bind: a message published to the source reaches a queue bound to the
    destination; after exchange.unbind it does not; bind with a missing source or
    destination is 404 (channel); unbind of a missing binding is ok."""
    src, dst, q = rec.x("src"), rec.x("dst"), rec.q()
    c = rec.conn()
    ch = rec.channel(c, confirm=True)
    ch.exchange_declare(src, "topic")
    ch.exchange_declare(dst, "direct")
    ch.queue_declare(q)
    ch.queue_bind(q, dst, "a.b")
    rec.do("bind", ch.exchange_bind, dst, src, "a.*")
    rec.do("publish", ch.basic_publish, src, "a.b", b"via-e2e")
    rec.do("publish-nomatch", ch.basic_publish, src, "b.b", b"nomatch")
    rec.drain(ch, q)
    rec.do("unbind", ch.exchange_unbind, dst, src, "a.*")
    rec.do("publish", ch.basic_publish, src, "a.b", b"after-unbind")
    rec.drain(ch, q)
    _ch_steps(rec, [
        ("bind-missing-src", lambda ch: ch.exchange_bind(dst, rec.x("nosrc"), "k")),
        ("bind-missing-dst", lambda ch: ch.exchange_bind(rec.x("nodst"), src, "k")),
        ("unbind-missing-binding", lambda ch: ch.exchange_unbind(dst, src, "zz")),
        ("unbind-missing-src", lambda ch: ch.exchange_unbind(dst, rec.x("nosrc2"), "k")),
        ("delete-if-unused-src", lambda ch: ch.exchange_bind(dst, src, "k") or
         ch.exchange_delete(src, if_unused=True)),
        ("delete-if-unused-dst", lambda ch: ch.exchange_delete(dst, if_unused=True)),
    ])


# ---- 3. queue declare errors, exclusive queues -------------------------------------------------
@scenario
def queue_declare_errors(rec: Rec) -> None:
    """Passive on missing (404 channel); redeclare with other durable / auto_delete /
    arguments (406 channel); invalid arguments (406); passive with other properties is ok."""
    q = rec.q()
    _ch_steps(rec, [
        ("passive-missing", lambda ch: ch.queue_declare(rec.q("gone"), passive=True)),
        ("declare", lambda ch: ch.queue_declare(q, arguments={"x-max-length": 10})),
        ("redeclare-same", lambda ch: ch.queue_declare(q, arguments={"x-max-length": 10})),
        ("redeclare-durable", lambda ch: ch.queue_declare(q, durable=True,
                                                         arguments={"x-max-length": 10})),
        ("redeclare-auto-delete", lambda ch: ch.queue_declare(
            q, auto_delete=True, arguments={"x-max-length": 10})),
        ("redeclare-args", lambda ch: ch.queue_declare(q, arguments={"x-max-length": 11})),
        ("redeclare-no-args", lambda ch: ch.queue_declare(q)),
        ("passive-other", lambda ch: ch.queue_declare(q, passive=True, durable=True)),
        ("ttl-string", lambda ch: ch.queue_declare(rec.q("a1"),
                                                   arguments={"x-message-ttl": "abc"})),
        ("max-length-negative", lambda ch: ch.queue_declare(rec.q("a2"),
                                                            arguments={"x-max-length": -1})),
        ("queue-type-bogus", lambda ch: ch.queue_declare(rec.q("a3"),
                                                         arguments={"x-queue-type": "bogus"})),
        ("unknown-x-arg", lambda ch: ch.queue_declare(rec.q("a4"), arguments={"x-foo": 1})),
    ])


# ---- the table ---------------------------------------------------------------------------------
def short(record: list, width: int) -> str:
    s = "; ".join(" ".join(map(str, e)) for e in record)
    return s if len(s) <= width else s[:width - 1] + "…"


def main(argv: list[str] | None = None) -> int:
    from . import parity as lib  # the registry (this file may be running as __main__)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", default="amqp://guest:guest@127.0.0.1:5672/", help="RabbitMQ")
    ap.add_argument("--b", required=True, help="Shoal")
    ap.add_argument("--full", action="store_true", help="print full records and reply texts "
                    "of the scenarios that differ")
    ap.add_argument("--all", action="store_true", help="full records of every scenario")
    ap.add_argument("--width", type=int, default=60)
    ap.add_argument("names", nargs="*", help="scenarios (default: all)")
    args = ap.parse_args(argv)
    names = args.names or list(lib.SCENARIOS)
    rows, differ, allrec = [], [], []
    for n in names:
        na, nb = [], []
        a = lib.SCENARIOS[n](args.a, notes=na)
        b = lib.SCENARIOS[n](args.b, notes=nb)
        rows.append((n, short(a, args.width), short(b, args.width), "yes" if a == b else "NO"))
        allrec.append((n, a, b, na, nb))
        if a != b:
            differ.append((n, a, b, na, nb))
    w = max(len(r[0]) for r in rows)
    print(f"{'scenario':{w}} | {'RabbitMQ':{args.width}} | {'Shoal':{args.width}} | same?")
    for r in rows:
        print(f"{r[0]:{w}} | {r[1]:{args.width}} | {r[2]:{args.width}} | {r[3]}")
    print(f"\n{len(rows) - len(differ)} same, {len(differ)} differ")
    if args.full or args.all:
        for n, a, b, na, nb in (allrec if args.all else differ):
            print(f"\n== {n}{'' if a == b else '   (DIFFERS)'}")
            for i in range(max(len(a), len(b))):
                ea, eb = (a[i] if i < len(a) else "-"), (b[i] if i < len(b) else "-")
                print(f"  {'  ' if ea == eb else '≠ '}{ea!s:60} | {eb}")
            print(f"  notes A: {na}\n  notes B: {nb}")
    return 1 if differ else 0


from . import parity_basic, parity_dead_letters, parity_qos, parity_raw  # noqa: E402,F401 - they register their scenarios

if __name__ == "__main__":
    raise SystemExit(main())
