"""Parity scenarios (see :mod:`.parity`) that need frames no client library sends, through
the raw socket of :mod:`.amqp_raw`: connection.tune-ok values, channel numbers and counts,
connection.update-secret, the server's capabilities, heartbeat timeouts, consumer tag reuse,
basic.publish immediate, basic.recover-async, channel.flow, content over the size limit."""
from __future__ import annotations

import struct
import time
import warnings
from typing import Any

from pamqp import commands as C
from pamqp import frame, header

from ..amqp_raw import PROTOCOL_HEADER, Closed, RawAMQP, method_frame, raw_frame
from .parity import Rec, scenario

HANDSHAKE_WAIT = 6.0   #: longer than RabbitMQ's 3 s silent-close delay after handshake errors


def handshake(rec: Rec, channel_max: int | None = None, frame_max: int | None = None,
              heartbeat: int = 0, password: str | None = None, vhost: str | None = None):
    """Protocol header .. connection.open with the tune-ok values given (None: echo the
    server's). Records the answer to start-ok (when not tune) and to open. Returns the
    socket, or None when the server closed."""
    r = rec.raw(open_=False)
    r.send(PROTOCOL_HEADER)
    r.expect(C.Connection.Start, 0)
    pw = rec.password if password is None else password
    r.send_frame(C.Connection.StartOk(
        client_properties={"product": "shoal-parity", "capabilities": {
            "authentication_failure_close": True, "consumer_cancel_notify": True}},
        mechanism="PLAIN", response=f"\0{rec.user}\0{pw}", locale="en_US"))
    # RabbitMQ closes the socket without connection.close 3 s after a handshake error
    tune = rec.reply(r, "start-ok", HANDSHAKE_WAIT, record=False)
    if not isinstance(tune, C.Connection.Tune):
        return None
    r.frame_max = frame_max or tune.frame_max
    r.send_frame(C.Connection.TuneOk(
        channel_max=tune.channel_max if channel_max is None else channel_max,
        frame_max=tune.frame_max if frame_max is None else frame_max, heartbeat=heartbeat))
    r.send_frame(C.Connection.Open(virtual_host=rec.vhost if vhost is None else vhost))
    ok = rec.reply(r, "open", HANDSHAKE_WAIT)
    return r if isinstance(ok, C.Connection.OpenOk) else None


def raw_get(rec: Rec, r: RawAMQP, q: str, label: str = "get", no_ack: bool = False,
            ch: int = 1) -> None:
    """basic.get on the raw socket: records ``(label, body, redelivered)`` or get-empty."""
    r.send_frame(C.Basic.Get(queue=q, no_ack=no_ack), ch)
    v = rec.reply(r, label, record=False)
    if isinstance(v, C.Basic.GetOk):
        r.expect(header.ContentHeader, ch)
        _, body = r.read_frame()
        rec.add(label, body.value, v.redelivered)
    elif isinstance(v, C.Basic.GetEmpty):
        rec.add(label, "get-empty")


def raw_sync(rec: Rec, r: RawAMQP, label: str, ch: int = 1) -> None:
    """A round trip (passive declare of amq.direct): records declare-ok or how it closed."""
    rec.raw_call(r, label, C.Exchange.Declare(exchange="amq.direct", passive=True), ch)


def _queue_with(rec: Rec, *bodies: bytes) -> str:
    q = rec.q()
    ch = rec.channel(confirm=True)
    ch.queue_declare(q)
    for b in bodies:
        ch.basic_publish("", q, b)
    return q


# ---- 8. tune-ok, channel_max, frame_max --------------------------------------------------------
def _tune_scenario(**tune):
    def fn(rec: Rec) -> None:
        r = handshake(rec, **tune)
        if r is not None:
            rec.raw_call(r, "channel.open 1", C.Channel.Open(), 1)
    return fn


for _name, _tune, _doc in (
        ("tune_channel_max_65535", dict(channel_max=65535),
         "tune-ok channel_max above the server's offer (2047): RabbitMQ 530 NOT_ALLOWED"),
        ("tune_channel_max_0", dict(channel_max=0),
         "tune-ok channel_max 0 ('no limit') while the server offered 2047"),
        ("tune_frame_max_0", dict(frame_max=0),
         "tune-ok frame_max 0 ('no limit') while the server offered 131072"),
        ("tune_frame_max_1024", dict(frame_max=1024),
         "tune-ok frame_max below the spec minimum 4096: 530 NOT_ALLOWED"),
        ("tune_frame_max_above_offer", dict(frame_max=1 << 20),
         "tune-ok frame_max above the server's offer: 530 NOT_ALLOWED"),
        ("tune_heartbeat_above_offer", dict(heartbeat=600),
         "tune-ok heartbeat above the server's offer (60): accepted")):
    _f = _tune_scenario(**_tune)
    _f.__name__, _f.__doc__ = _name, _doc
    scenario(_f)


@scenario
def channel_count_limit(rec: Rec) -> None:
    """tune-ok channel_max=3, then channels 1..4: the 4th exceeds the negotiated count
    (RabbitMQ: 530 NOT_ALLOWED "number of channels opened (3) has reached the negotiated
    channel_max (3)", connection)."""
    r = handshake(rec, channel_max=3)
    for n in (1, 2, 3, 4) if r else ():
        if not isinstance(rec.raw_call(r, f"channel.open {n}", C.Channel.Open(), n),
                          C.Channel.OpenOk):
            break


@scenario
def channel_number_above_max(rec: Rec) -> None:
    """Channel numbers above the negotiated channel_max: RabbitMQ counts channels, it does
    not bound their numbers, so channel 5 with channel_max=3 and channel 3000 with the
    default 2047 open fine (checked, recorded); 65535 too."""
    r = handshake(rec, channel_max=3)
    if r is not None:
        rec.raw_call(r, "channel.open 5 (max 3)", C.Channel.Open(), 5)
    r = handshake(rec)
    if r is not None:
        rec.raw_call(r, "channel.open 3000 (max 2047)", C.Channel.Open(), 3000)
        rec.raw_call(r, "channel.open 65535", C.Channel.Open(), 65535)


# ---- 9. connection.start, update-secret, authentication ----------------------------------------
@scenario
def server_capabilities(rec: Rec) -> None:
    """connection.start: protocol version, mechanisms, locales and the capabilities table
    (keys and values) of server-properties; which server-properties keys exist."""
    r = rec.raw(open_=False)
    r.send(PROTOCOL_HEADER)
    s = r.expect(C.Connection.Start, 0)
    rec.add("version", s.version_major, s.version_minor)
    rec.add("mechanisms", sorted(str(s.mechanisms).split()))
    rec.add("locales", str(s.locales))
    props = s.server_properties
    rec.add("capabilities", sorted(props.get("capabilities", {}).items()))
    rec.add("keys", sorted(props))


@scenario
def update_secret(rec: Rec) -> None:
    """connection.update-secret (10/70) with the same password, then with a wrong one; then
    whether the connection still opens channels."""
    r = handshake(rec)
    rec.raw_call(r, "update-secret same", C.Connection.UpdateSecret(
        new_secret=rec.password, reason="parity"), 0)
    rec.raw_call(r, "update-secret wrong", C.Connection.UpdateSecret(
        new_secret="wrong-" + rec.password, reason="parity"), 0)
    try:
        rec.raw_call(r, "channel.open", C.Channel.Open(), 1)
    except OSError:
        rec.add("channel.open", "socket-closed")


@scenario
def authentication_errors(rec: Rec) -> None:
    """A wrong password: 403 ACCESS_REFUSED connection.close (the client announced
    authentication_failure_close); a missing vhost: 530 NOT_ALLOWED at connection.open."""
    handshake(rec, password="wrong-password")
    handshake(rec, vhost=rec.name("vhost"))


# ---- 10. heartbeats ----------------------------------------------------------------------------
def _frames(data: bytes):
    while len(data) >= 8:
        kind, ch, size = struct.unpack(">BHI", data[:7])
        yield kind, ch, data[7:7 + size]
        data = data[8 + size:]


@scenario
def heartbeat_timeout(rec: Rec) -> None:
    """A raw client negotiates heartbeat=1, gets a message unacked, then stays silent: the
    broker closes the socket within 6 s (recorded: whether a connection.close frame came
    first, and its code); the message goes back to the queue redelivered."""
    q = _queue_with(rec, b"held")
    r = handshake(rec, heartbeat=1)
    rec.raw_call(r, "channel.open", C.Channel.Open(), 1)
    raw_get(rec, r, q)
    try:
        data = r.read_until_closed(6.0)
    except AssertionError:
        rec.add("silent client", "not closed within 6 s")
        r.close()
    else:
        closes = [struct.unpack(">HHH", p[:6])[2] for k, c, p in _frames(data)
                  if k == 1 and p[:4] == b"\x00\x0a\x00\x32"]
        rec.add("silent client", "socket closed", "connection.close" if closes else
                "no connection.close", *closes)
    ch = rec.channel()
    deadline = time.monotonic() + 4
    while (m := ch.basic_get(q, auto_ack=True))[0] is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if m[0] is None:
        rec.add("get", "get-empty")
    else:
        rec.add("get", m[2], m[0].redelivered)


# ---- 11. consumers, publish flags --------------------------------------------------------------
@scenario
def consumer_tags(rec: Rec) -> None:
    """An empty consumer tag gets a server-generated one (RabbitMQ ``amq.ctag-...``); the
    same tag on another channel is fine; basic.cancel of an unknown tag is cancel-ok;
    reusing a tag on the same channel is 530 NOT_ALLOWED (connection)."""
    q = _queue_with(rec)
    r = handshake(rec)
    for n in (1, 2):
        r.send_frame(C.Channel.Open(), n)
        r.expect(C.Channel.OpenOk, n)
    ok = rec.raw_call(r, "consume ''", C.Basic.Consume(queue=q, consumer_tag=""), 1)
    if isinstance(ok, C.Basic.ConsumeOk):
        rec.add("generated tag", ok.consumer_tag)
    rec.raw_call(r, "consume dup", C.Basic.Consume(queue=q, consumer_tag="dup"), 1)
    rec.raw_call(r, "consume dup ch2", C.Basic.Consume(queue=q, consumer_tag="dup"), 2)
    rec.raw_call(r, "cancel unknown", C.Basic.Cancel(consumer_tag="nope"), 1)
    rec.raw_call(r, "consume dup again", C.Basic.Consume(queue=q, consumer_tag="dup"), 1)


@scenario
def queue_delete_with_a_consumer_on_the_channel(rec: Rec) -> None:
    """queue.delete of a queue the same channel consumes from: delete-ok first, then the
    consumer's basic.cancel (consumer_cancel_notify), as RabbitMQ's channel answers its own
    method before the queue's notice (amqplib's own tests depend on it)."""
    q = rec.q()
    r = handshake(rec)
    r.send_frame(C.Channel.Open(), 1)
    r.expect(C.Channel.OpenOk, 1)
    rec.raw_call(r, "declare", C.Queue.Declare(queue=q, auto_delete=False), 1)
    rec.raw_call(r, "consume", C.Basic.Consume(queue=q, consumer_tag="c1"), 1)
    rec.raw_call(r, "delete", C.Queue.Delete(queue=q), 1)
    rec.reply(r, "then")


@scenario
def publish_immediate(rec: Rec) -> None:
    """basic.publish immediate=True (removed in RabbitMQ 3.0): RabbitMQ closes the
    connection with 540 NOT_IMPLEMENTED."""
    q = _queue_with(rec)
    r = handshake(rec)
    rec.raw_call(r, "channel.open", C.Channel.Open(), 1)
    r.send(frame.marshal(C.Basic.Publish(exchange="", routing_key=q, immediate=True), 1)
           + frame.marshal(header.ContentHeader(0, 1, C.Basic.Properties()), 1)
           + raw_frame(3, 1, b"i"))
    raw_sync(rec, r, "after publish immediate")


@scenario
def recover_async(rec: Rec) -> None:
    """basic.recover-async (60/100, deprecated) requeue=True requeues the unacked message (no
    reply); requeue=False: recorded."""
    q = _queue_with(rec, b"m1")
    r = handshake(rec)
    rec.raw_call(r, "channel.open", C.Channel.Open(), 1)
    raw_get(rec, r, q)
    with warnings.catch_warnings():     # pamqp warns: deprecated in 0-9-1 (that is the point)
        warnings.simplefilter("ignore", DeprecationWarning)
        on, off = C.Basic.RecoverAsync(requeue=True), C.Basic.RecoverAsync(requeue=False)
    r.send_frame(on, 1)
    raw_sync(rec, r, "recover-async requeue=True")
    raw_get(rec, r, q, "get after")
    r.send_frame(off, 1)
    raw_sync(rec, r, "recover-async requeue=False")


@scenario
def channel_errors(rec: Rec) -> None:
    """channel.open on an open channel and a method on a channel never opened: 504
    CHANNEL_ERROR (connection); channel.flow active=False / True: flow-ok or 540."""
    r = handshake(rec)
    rec.raw_call(r, "channel.open 1", C.Channel.Open(), 1)
    rec.raw_call(r, "channel.open 1 again", C.Channel.Open(), 1)
    r = handshake(rec)
    rec.raw_call(r, "queue.declare on channel 7", C.Queue.Declare(queue=rec.q()), 7)
    r = handshake(rec)
    rec.raw_call(r, "channel.open 1", C.Channel.Open(), 1)
    rec.raw_call(r, "flow active=False", C.Channel.Flow(active=False), 1)
    rec.raw_call(r, "flow active=True", C.Channel.Flow(active=True), 1)


def _oversize(rec: Rec, size: int) -> None:
    q = _queue_with(rec)
    r = handshake(rec)
    rec.raw_call(r, "channel.open", C.Channel.Open(), 1)
    r.send_frame(C.Basic.Publish(exchange="", routing_key=q), 1)
    r.send_frame(header.ContentHeader(0, size, C.Basic.Properties()), 1)
    chunk = b"x" * (r.frame_max - 8)
    try:
        for i in range(0, size, len(chunk)):
            r.send(raw_frame(3, 1, chunk[:size - i]))
    except OSError:
        rec.add("body", "send failed")
    raw_sync(rec, r, f"after {size} octets")
    try:
        rec.raw_call(r, "channel.open 2", C.Channel.Open(), 2)
        raw_sync(rec, r, "sync on 2", 2)
    except (OSError, Closed):
        rec.add("channel.open 2", "socket-closed")
    rec.add("queued", rec.channel().queue_declare(q, passive=True).method.message_count)


@scenario
def publish_over_rabbitmq_max_size(rec: Rec) -> None:
    """A body of 128 MiB + 1 (over RabbitMQ's default max_message_size 134217728): 406
    PRECONDITION_FAILED (channel); the connection stays usable."""
    _oversize(rec, 128 * 1024 * 1024 + 1)


@scenario
def publish_16mib_plus_1(rec: Rec) -> None:
    """A body of 16 MiB + 1: accepted by RabbitMQ (its limit is 128 MiB)."""
    _oversize(rec, 16 * 1024 * 1024 + 1)


# ---- 7 (cont.). headers: integer widths --------------------------------------------------------
@scenario
def headers_integer_widths(rec: Rec) -> None:
    """Bindings made with pika (1, 300, -1 -> 'I' signed 32, 1<<40 -> 'l') and messages from
    pamqp (1, -1 -> 'b' signed 8, 300 -> 's', 1<<40 -> 'l', 1.0 float 'f', "1", true):
    RabbitMQ 3.10 compares the decoded values with Erlang ``==``: numbers by value whatever
    their width or int/float, a boolean (an atom) never equals 1, a string never a number."""
    ex = rec.x("hdr")
    ch = rec.channel()
    ch.exchange_declare(ex, "headers")
    binds = {"one": 1, "three-hundred": 300, "big": 1 << 40, "minus-one": -1}
    for label, v in binds.items():
        q = rec.q(f"h-{label}")
        ch.queue_declare(q)
        ch.queue_bind(q, ex, "", arguments={"x-match": "all", "n": v})
    r = handshake(rec)
    rec.raw_call(r, "channel.open", C.Channel.Open(), 1)
    rec.raw_call(r, "confirm.select", C.Confirm.Select(), 1)
    for label, v in (("b-1", 1), ("s-300", 300), ("l-big", 1 << 40), ("b-minus-1", -1),
                     ("float-1.0", 1.0), ("str-1", "1"), ("bool-true", True)):
        r.send(r.publish(1, ex, "", label.encode(), props=C.Basic.Properties(
            headers={"n": v})))
        rec.reply(r, f"publish {label}", record=False)
    get = rec.channel()
    for label in binds:
        got = []
        q = next(n for n in rec.queues if f"h-{label}-" in n)
        while (res := get.basic_get(q, auto_ack=True))[0] is not None:
            got.append(res[2].decode())
        rec.add(label, got)



# ---- frame-level errors ------------------------------------------------------------------------
FRAME_ERRORS = {
    "bad frame-end": lambda r: raw_frame(1, 1, struct.pack(">HH", 60, 10) + b"\0" * 7,
                                         end=b"\0"),
    "unknown frame type 9": lambda r: raw_frame(9, 1, b"xx"),
    "frame over frame_max": lambda r: raw_frame(1, 1, b"x" * (r.frame_max + 10)),
    "truncated queue.declare": lambda r: method_frame(1, 50, 10, b"\0"),
    "body without publish": lambda r: raw_frame(3, 1, b"hello"),
    "header without publish": lambda r: frame.marshal(
        header.ContentHeader(0, 5, C.Basic.Properties()), 1),
    "method where header expected": lambda r: frame.marshal(
        C.Basic.Publish(exchange="", routing_key="x"), 1) + frame.marshal(
        C.Queue.Declare(queue=""), 1),
    "heartbeat on channel 1": lambda r: raw_frame(8, 1, b""),
    "connection method on channel 1": lambda r: frame.marshal(C.Connection.Open(), 1),
    "channel method on channel 0": lambda r: method_frame(0, 20, 10, b"\0"),
    "queue.declare on channel 0": lambda r: frame.marshal(C.Queue.Declare(queue=""), 0),
    "header class 50": lambda r: frame.marshal(C.Basic.Publish(exchange="", routing_key="x"), 1)
    + raw_frame(2, 1, struct.pack(">HHQH", 50, 0, 1, 0)),
}


#: Where RabbitMQ 3.10 does something no broker should copy (see test_parity.KNOWN): an
#: unknown class or method drops the socket without connection.close (the spec asks for
#: 503/540); a body frame running past the header's body-size is never noticed (the channel
#: waits forever for the size to come out exactly).
FRAME_QUIRKS = {
    "unknown class 99": lambda r: method_frame(1, 99, 10),
    "unknown basic method 999": lambda r: method_frame(1, 60, 999),
    "body longer than header size": lambda r: frame.marshal(
        C.Basic.Publish(exchange="", routing_key="x"), 1) + frame.marshal(
        header.ContentHeader(0, 2, C.Basic.Properties()), 1) + raw_frame(3, 1, b"12345"),
}


def _frame_cases(rec: Rec, cases: dict) -> None:
    for label, make in cases.items():
        r = handshake(rec)
        r.send_frame(C.Channel.Open(), 1)
        r.expect(C.Channel.OpenOk, 1)
        try:
            r.send(make(r))
        except OSError:
            rec.add(label, "socket-closed")
            continue
        rec.reply(r, label)
        r.close()


@scenario
def frame_errors(rec: Rec) -> None:
    """One connection per malformed input (channel 1 open): the reply code and side of the
    close (501 FRAME_ERROR, 503 COMMAND_INVALID, 504 CHANNEL_ERROR, 505 UNEXPECTED_FRAME
    as RabbitMQ answers each)."""
    _frame_cases(rec, FRAME_ERRORS)


@scenario
def frame_errors_rabbitmq_quirks(rec: Rec) -> None:
    """FRAME_QUIRKS: inputs where RabbitMQ 3.10's answer is not one to copy."""
    _frame_cases(rec, FRAME_QUIRKS)


def _headers(rec: Rec, *headers: bytes) -> None:
    for hdr in headers:
        r = rec.raw(open_=False)
        r.send(hdr)
        try:
            data = r.read_until_closed(6.0)
            rec.add(repr(hdr), repr(bytes(data[:8])), "socket-closed")
        except AssertionError:
            rec.add(repr(hdr), "not closed within 6 s")
        r.close()


@scenario
def protocol_header_errors(rec: Rec) -> None:
    """A wrong protocol header (0-9-2, 0-9 with the 0-8 layout, HTTP): the server answers
    with the header it supports (recorded) and closes. (AMQP 1.0's header is not wrong: both
    brokers speak 1.0 on this port, RabbitMQ with its rabbitmq_amqp1_0 plugin; its handshake
    is tested in tests/e2e/amqp10 and side by side in test_amqp10_parity.py.)"""
    _headers(rec, b"AMQP\x00\x00\x09\x02", b"AMQP\x00\x00\x08\x00",
             b"GET / HTTP/1.1\r\n\r\n")


def _publish_then_close(rec: Rec, close: Any, channel: int, last: str) -> None:
    """``basic.publish`` to a missing exchange, then to one that exists, each followed by
    ``close`` (sent on ``channel``) in the same write: records the frames the broker sends
    up to the ``last`` one (the close-ok), answering a ``channel.close`` of ours when the
    client's own close is a channel's."""
    for exchange in ("parity-missing-ex", "amq.direct"):
        r = rec.raw()
        r.open_channel(1)
        r.send(r.publish(1, exchange, "k", b"x") + frame.marshal(close, channel))
        got = []
        for _ in range(3):
            try:
                _, v = r.read_frame(2.0)
            except (AssertionError, Closed):
                break
            got.append((v.name, getattr(v, "reply_code", None)))
            if v.name == last:
                break
            if v.name == "Channel.Close" and channel:
                r.send_frame(C.Channel.CloseOk(), 1)
        rec.add(exchange, got)
        r.close()


@scenario
def publish_error_then_close_in_one_write(rec: Rec) -> None:
    """``basic.publish`` to a missing exchange and ``channel.close`` in one write (rabbitmq-c's
    amqp-publish does so): the 404 comes first, then the close-ok (RabbitMQ's channel
    answers in order); a good publish and close: the close-ok alone. Shoal answered the
    close-ok alone, and the error was lost, until the session of 2026-11-30, sixth."""
    _publish_then_close(rec, C.Channel.Close(200, "bye", 0, 0), 1, "Channel.CloseOk")


@scenario
def publish_error_then_connection_close_in_one_write(rec: Rec) -> None:
    """``basic.publish`` to a missing exchange and ``connection.close`` in one write: the
    channel's 404 comes first, then the connection's close-ok (RabbitMQ's reader answers
    once its channels have); a good publish and close: the close-ok alone. Shoal answered
    the close-ok alone, and the error was lost, until the session of 2026-11-30, seventh."""
    _publish_then_close(rec, C.Connection.Close(200, "bye", 0, 0), 0, "Connection.CloseOk")


@scenario
def protocol_header_amqp_0_9(rec: Rec) -> None:
    """AMQP 0-9's header ``AMQP 1 1 0 9`` (Perl's AnyEvent::RabbitMQ sends it): RabbitMQ
    serves it as 0-9-1 (rabbit_reader), with the same connection.start; Shoal answered with
    its own header and closed until the session of 2026-11-30, sixth."""
    hdr = b"AMQP\x01\x01\x00\x09"
    r = rec.raw(open_=False)
    r.send(hdr)
    try:
        _, start = r.read_frame(3.0)
        rec.add("first frame", type(start).__name__, getattr(start, "version_major", None),
                getattr(start, "version_minor", None))
    except Closed:
        rec.add("first frame", "socket-closed")
    r.close()
    try:
        r = rec.raw(header=hdr)
        r.open_channel(1)
        rec.add("opened, channel 1 open")
    except (AssertionError, Closed) as e:
        rec.add("open", type(e).__name__)


@scenario
def protocol_header_amqp_0_8(rec: Rec) -> None:
    """The AMQP 0-8 header ``AMQP 1 1 8 0``: RabbitMQ still speaks 0-8 (it answers with a
    0-8 connection.start); a 0-9-1-only broker answers with its header and closes."""
    _headers(rec, b"AMQP\x01\x01\x08\x00")
