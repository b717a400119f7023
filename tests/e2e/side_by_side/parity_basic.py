"""Parity scenarios (see :mod:`.parity`): acknowledgements, headers exchange routing,
consumer and publish errors, queue.delete/purge/bind errors, transactions. pika only."""
from __future__ import annotations

import time

import pika

from ..amqp_raw import method_frame
from .parity import FAIL, Rec, _ch_steps, scenario


def _filled(rec: Rec, n: int, tag: str = "q"):
    """A connection, a confirm-mode channel and a queue holding m1..mn (confirmed)."""
    q = rec.q(tag)
    c = rec.conn()
    ch = rec.channel(c, confirm=True)
    ch.queue_declare(q)
    for i in range(1, n + 1):
        ch.basic_publish("", q, f"m{i}".encode())
    return c, ch, q


@scenario
def queue_exclusive(rec: Rec) -> None:
    """An exclusive queue: same connection may redeclare it exclusive; redeclare with
    exclusive=False from the same connection; from another connection passive declare,
    declare, get, consume, purge, bind and delete are 405 RESOURCE_LOCKED (channel), while a
    publish through the default exchange is delivered."""
    q = rec.q()
    owner = rec.conn()
    ch = owner.channel()
    rec.do("declare-exclusive", ch.queue_declare, q, exclusive=True)
    _ch_steps(rec, [
        ("other-passive", lambda c: c.queue_declare(q, passive=True)),
        ("other-declare", lambda c: c.queue_declare(q, exclusive=True)),
        ("other-get", lambda c: c.basic_get(q)),
        ("other-consume", lambda c: c.basic_consume(q, lambda *a: None)),
        ("other-purge", lambda c: c.queue_purge(q)),
        ("other-bind", lambda c: c.queue_bind(q, "amq.direct", "k")),
        ("other-delete", lambda c: c.queue_delete(q)),
        ("other-publish", lambda c: c.basic_publish("", q, b"from-other")),
    ])
    for label, kw in (("same-redeclare-exclusive", dict(exclusive=True)),
                      ("same-redeclare-nonexclusive", dict(exclusive=False)),
                      ("same-passive", dict(passive=True))):
        c2 = owner.channel() if owner.is_open else rec.channel()
        rec.do(label, c2.queue_declare, q, **kw)
    rec.get(owner.channel() if owner.is_open else rec.channel(), q, "owner-get")
    if owner.is_open:
        owner.close()
    time.sleep(0.5)          # the owner is gone: the queue goes with it
    rec.do("after-owner-closed", rec.channel().queue_declare, q, passive=True)


# ---- 4. basic.get ------------------------------------------------------------------------------
@scenario
def basic_get_empty_and_missing(rec: Rec) -> None:
    """basic.get on an empty queue is get-empty; on a missing queue 404 (channel)."""
    q = rec.q()
    ch = rec.channel()
    ch.queue_declare(q)
    rec.get(ch, q)
    rec.get(ch, rec.q("gone"))


# ---- 5. acknowledgements -----------------------------------------------------------------------
@scenario
def ack_unknown_tag(rec: Rec) -> None:
    """basic.ack / reject / nack of a tag never delivered: 406 PRECONDITION_FAILED (channel);
    ack with multiple=True of a tag above every outstanding one: 406; ack 0 multiple=True
    with nothing outstanding: ok."""
    c, _, q = _filled(rec, 2)
    for label, call in (("ack", lambda ch: ch.basic_ack(99)),
                        ("reject", lambda ch: ch.basic_reject(99)),
                        ("nack", lambda ch: ch.basic_nack(99)),
                        ("ack-0-multiple-none-outstanding",
                         lambda ch: ch.basic_ack(0, multiple=True))):
        ch = c.channel()
        rec.do(label, call, ch, sync=ch)
    ch = c.channel()
    rec.get(ch, q, no_ack=False)
    rec.get(ch, q, no_ack=False)
    rec.do("ack-5-multiple", ch.basic_ack, 5, multiple=True, sync=ch)
    rec.drain(rec.channel(), q)


@scenario
def ack_twice(rec: Rec) -> None:
    """A tag acked twice: the second ack is 406 (channel) and the message stays acked."""
    c, _, q = _filled(rec, 1)
    ch = c.channel()
    m = rec.get(ch, q, no_ack=False)
    rec.do("ack", ch.basic_ack, m.delivery_tag, sync=ch)
    rec.do("ack-again", ch.basic_ack, m.delivery_tag, sync=ch)
    rec.drain(c.channel(), q)


@scenario
def nack_multiple_requeue(rec: Rec) -> None:
    """nack(tag 3, multiple=True, requeue=True) after getting m1..m4 requeues m1..m3 (to the
    head, original order, redelivered=True); m4 stays unacked until the channel closes."""
    c, _, q = _filled(rec, 4)
    ch = c.channel()
    for _ in range(4):
        rec.get(ch, q, no_ack=False)
    rec.do("nack-3-multiple", ch.basic_nack, 3, multiple=True, requeue=True, sync=ch)
    rec.drain(c.channel(), q, "after-nack")
    rec.do("close-channel", ch.close)
    rec.drain(c.channel(), q, "after-close")


@scenario
def reject_requeue(rec: Rec) -> None:
    """basic.reject requeue=False drops the message; requeue=True puts it back
    redelivered."""
    c, _, q = _filled(rec, 2)
    ch = c.channel()
    m1 = rec.get(ch, q, no_ack=False)
    m2 = rec.get(ch, q, no_ack=False)
    rec.do("reject-drop", ch.basic_reject, m1.delivery_tag, requeue=False, sync=ch)
    rec.do("reject-requeue", ch.basic_reject, m2.delivery_tag, requeue=True, sync=ch)
    rec.drain(ch, q)


@scenario
def recover_requeue_true(rec: Rec) -> None:
    """basic.recover requeue=True requeues every unacked message of the channel
    (redelivered=True on the next get)."""
    c, _, q = _filled(rec, 2)
    ch = c.channel()
    rec.get(ch, q, no_ack=False)
    rec.get(ch, q, no_ack=False)
    rec.do("recover", ch.basic_recover, requeue=True)
    rec.drain(ch, q)


@scenario
def recover_requeue_false(rec: Rec) -> None:
    """basic.recover requeue=False (redeliver to the original recipient): RabbitMQ answers
    540 NOT_IMPLEMENTED? (recorded as is)."""
    c, _, q = _filled(rec, 1)
    ch = c.channel()
    rec.get(ch, q, no_ack=False)
    rec.do("recover", ch.basic_recover, requeue=False)
    rec.drain(rec.channel(), q)


@scenario
def recover_with_consumer(rec: Rec) -> None:
    """basic.recover requeue=True with a consumer holding unacked deliveries: they come back
    to that consumer redelivered."""
    c, _, q = _filled(rec, 2)
    ch = c.channel()
    got = []
    ch.basic_consume(q, lambda _ch, m, _p, body: got.append((body.decode(), m.redelivered)))
    _pump(c, lambda: len(got) >= 2)
    rec.do("recover", ch.basic_recover, requeue=True)
    _pump(c, lambda: len(got) >= 4)
    rec.add("delivered", got)


def _pump(c, done, limit: float = 3.0) -> None:
    deadline = time.monotonic() + limit
    while not done() and time.monotonic() < deadline:
        c.process_data_events(0.05)


@scenario
def reject_after_channel_closed(rec: Rec) -> None:
    """A message got unacked on channel 1; channel 1 closes (the message is requeued); a
    reject of that tag on channel 2 is 406 unknown delivery tag (channel); the message comes
    back redelivered."""
    c, _, q = _filled(rec, 1)
    ch1 = c.channel()
    m = rec.get(ch1, q, no_ack=False)
    rec.do("close-ch1", ch1.close)
    ch2 = c.channel()
    rec.do("reject-on-ch2", ch2.basic_reject, m.delivery_tag, sync=ch2)
    rec.drain(c.channel(), q)


# ---- 7. headers exchange -----------------------------------------------------------------------
BINDINGS = {
    "all": {"x-match": "all", "a": "1", "b": "2"},
    "any": {"x-match": "any", "a": "1", "b": "2"},
    "default": {"a": "1", "b": "2"},
    "all-only-x": {"x-match": "all", "x-k": "v"},
    "any-only-x": {"x-match": "any", "x-k": "v"},
    "all-with-x": {"x-match": "all-with-x", "x-k": "v", "a": "1"},
    "any-with-x": {"x-match": "any-with-x", "x-k": "v"},
    "void": {"x-match": "all", "a": None},
    "int": {"x-match": "all", "n": 1},
    "str": {"x-match": "all", "n": "1"},
    "bool": {"x-match": "all", "t": True},
    "empty-str": {"x-match": "all", "e": ""},
    "all-no-keys": {"x-match": "all"},
    "any-no-keys": {"x-match": "any"},
}
MESSAGES = {
    "a1b2": {"a": "1", "b": "2"}, "a1": {"a": "1"}, "b2c3": {"b": "2", "c": "3"},
    "xk": {"x-k": "v"}, "xk-a1": {"x-k": "v", "a": "1"}, "xk-a1b2": {"x-k": "v", "a": "1",
                                                                         "b": "2"},
    "a-void": {"a": None}, "a-other": {"a": "zz"}, "n-int": {"n": 1}, "n-str": {"n": "1"},
    "n-long": {"n": 1 << 40}, "t-true": {"t": True}, "t-int": {"t": 1}, "e-empty": {"e": ""},
    "a1-b-int": {"a": "1", "b": 2}, "none": None,
}


@scenario
def headers_matching(rec: Rec) -> None:
    """A headers exchange with one queue per binding (x-match all/any/default/all-with-x/
    any-with-x, x- keys, void values, int vs string vs bool, empty string, no keys); each
    message labelled by its headers. Records which messages reach each binding's queue."""
    ex = rec.x("hdr")
    c = rec.conn()
    ch = rec.channel(c, confirm=True)
    ch.exchange_declare(ex, "headers")
    queues = {}
    for label, args in BINDINGS.items():
        queues[label] = q = rec.q(f"h-{label}")
        ch.queue_declare(q)
        rec.do(f"bind {label}", ch.queue_bind, q, ex, "", arguments=args, ok=False)
    for label, headers in MESSAGES.items():
        rec.do(f"publish {label}", ch.basic_publish, ex, "", label.encode(),
               pika.BasicProperties(headers=headers), ok=False)
    get = c.channel()
    for label, q in queues.items():
        got = []
        while (res := get.basic_get(q, auto_ack=True))[0] is not None:
            got.append(res[2].decode())
        rec.add(label, got)


@scenario
def headers_bad_x_match(rec: Rec) -> None:
    """A headers binding with an invalid x-match value ("foo", an integer): RabbitMQ 3.10
    closes the channel with 406 PRECONDITION_FAILED? (recorded); the binding is not made."""
    ex, q = rec.x("hdr"), rec.q()
    c = rec.conn()
    ch = c.channel()
    ch.exchange_declare(ex, "headers")
    ch.queue_declare(q)
    _ch_steps(rec, [
        ("bind x-match=foo", lambda ch: ch.queue_bind(q, ex, "", arguments={"x-match": "foo",
                                                                             "a": "1"})),
        ("bind x-match=1", lambda ch: ch.queue_bind(q, ex, "", arguments={"x-match": 1})),
        ("bind x-match=ALL", lambda ch: ch.queue_bind(q, ex, "", arguments={"x-match": "ALL"})),
    ])
    ch = rec.channel(confirm=True)
    ch.basic_publish(ex, "", b"probe", pika.BasicProperties(headers={"a": "1"}))
    rec.drain(ch, q)


# ---- 11. consumers and publishing --------------------------------------------------------------
@scenario
def consume_errors(rec: Rec) -> None:
    """basic.consume on a missing queue (404 channel); an exclusive consumer when another
    consumer exists (403 ACCESS_REFUSED channel) and a consumer when an exclusive one exists
    (403); basic.qos prefetch_size != 0 (RabbitMQ: 540 NOT_IMPLEMENTED, connection?)."""
    q = rec.q()
    c = rec.conn()
    first = c.channel()
    first.queue_declare(q)
    first.basic_consume(q, lambda *a: None)
    q2 = rec.q("q2")
    first.queue_declare(q2)
    first.basic_consume(q2, lambda *a: None, exclusive=True)
    _ch_steps(rec, [
        ("consume-missing", lambda ch: ch.basic_consume(rec.q("gone"), lambda *a: None)),
        ("exclusive-when-consumed", lambda ch: ch.basic_consume(q, lambda *a: None,
                                                                exclusive=True)),
        ("consume-when-exclusive", lambda ch: ch.basic_consume(q2, lambda *a: None)),
        ("qos-prefetch-size", lambda ch: ch.basic_qos(prefetch_size=1)),
        ("qos-global", lambda ch: ch.basic_qos(prefetch_count=5, global_qos=True)),
    ])


@scenario
def publish_errors(rec: Rec) -> None:
    """Publish to a missing exchange: 404 (channel); to an internal exchange: 403; mandatory
    and unroutable: basic.return 312 NO_ROUTE (the text is part of the contract) with the
    exchange and routing key, then the confirm."""
    internal = rec.x("int")
    c = rec.conn()
    c.channel().exchange_declare(internal, "fanout", internal=True)
    _ch_steps(rec, [
        ("publish-missing-exchange", lambda ch: ch.basic_publish(rec.x("gone"), "k", b"x")),
        ("publish-internal", lambda ch: ch.basic_publish(internal, "k", b"x")),
    ])
    ch = c.channel()
    returned = []
    ch.add_on_return_callback(lambda _c, m, _p, body: returned.append(
        (m.reply_code, m.reply_text, m.exchange, m.routing_key, body)))
    rec.do("publish-mandatory", ch.basic_publish, "amq.direct", rec.name("rk"), b"r1",
           mandatory=True, sync=ch)
    rec.do("publish-mandatory-default", ch.basic_publish, "", rec.name("nq"), b"r2",
           mandatory=True, sync=ch)
    _pump(c, lambda: len(returned) >= 2, 2.0)
    rec.add("returned", returned)
    ch = rec.channel(c, confirm=True)
    rec.do("confirmed-mandatory", ch.basic_publish, "amq.direct", rec.name("rk2"), b"r3",
           mandatory=True)


# ---- 12. queue.delete / purge / bind errors ----------------------------------------------------
@scenario
def queue_ops_errors(rec: Rec) -> None:
    """queue.delete if_unused with a consumer and if_empty with a message: 406 (channel);
    delete of a missing queue: ok; purge of a missing queue: 404; bind to a missing
    exchange / of a missing queue: 404; unbind of a binding that does not exist: ok; unbind
    from a missing exchange; purge-ok / delete-ok message counts."""
    c, ch, q = _filled(rec, 2)
    busy = rec.q("busy")
    cons = c.channel()
    cons.queue_declare(busy)
    cons.basic_consume(busy, lambda *a: None)
    _ch_steps(rec, [
        ("delete-if-unused", lambda ch: ch.queue_delete(busy, if_unused=True)),
        ("delete-if-empty", lambda ch: ch.queue_delete(q, if_empty=True)),
        ("delete-missing", lambda ch: ch.queue_delete(rec.q("gone"))),
        ("purge-missing", lambda ch: ch.queue_purge(rec.q("gone2"))),
        ("bind-missing-exchange", lambda ch: ch.queue_bind(q, rec.x("nx"), "k")),
        ("bind-missing-queue", lambda ch: ch.queue_bind(rec.q("nq"), "amq.direct", "k")),
        ("unbind-missing-binding", lambda ch: ch.queue_unbind(q, "amq.direct", "nokey")),
        ("unbind-missing-exchange", lambda ch: ch.queue_unbind(q, rec.x("nx2"), "k")),
        ("unbind-missing-queue", lambda ch: ch.queue_unbind(rec.q("nq2"), "amq.direct", "k")),
    ])
    ch = rec.channel()
    ok = rec.do("purge", ch.queue_purge, q, ok=False)
    rec.add("purge-ok", ok.method.message_count if ok is not FAIL else None)
    ch.basic_publish("", q, b"m3")
    ch.queue_declare(q, passive=True)
    ok = rec.do("delete", ch.queue_delete, q, ok=False)
    rec.add("delete-ok", ok.method.message_count if ok is not FAIL else None)


# ---- 13. transactions --------------------------------------------------------------------------
@scenario
def tx_errors(rec: Rec) -> None:
    """tx.commit / tx.rollback without tx.select: 406 (channel); confirm.select after
    tx.select and tx.select after confirm.select: 406; tx.select twice is fine."""
    c = rec.conn()

    def tx_then_confirm(ch):
        ch.tx_select()
        ch.confirm_delivery()

    def confirm_then_tx(ch):
        ch.confirm_delivery()
        ch.tx_select()

    _ch_steps(rec, [
        ("commit-without-select", lambda ch: ch.tx_commit()),
        ("rollback-without-select", lambda ch: ch.tx_rollback()),
        ("confirm-after-tx", tx_then_confirm),
        ("tx-after-confirm", confirm_then_tx),
        ("select-twice", lambda ch: ch.tx_select() or ch.tx_select()),
    ])
    del c


@scenario
def tx_publish_ack(rec: Rec) -> None:
    """Publishes and acks inside a transaction take effect at tx.commit; tx.rollback
    discards publishes and leaves the rolled-back ack's message unacked."""
    c, _, q = _filled(rec, 1)
    ch = c.channel()
    ch.tx_select()
    ch.basic_publish("", q, b"t1")
    rec.do("rollback", ch.tx_rollback)
    ch.basic_publish("", q, b"t2")
    rec.do("commit", ch.tx_commit)
    m = rec.get(ch, q, no_ack=False)
    ch.basic_ack(m.delivery_tag)
    rec.do("rollback-ack", ch.tx_rollback)
    rec.do("close", ch.close)
    rec.drain(c.channel(), q)


@scenario
def consumer_cancel_notify(rec: Rec) -> None:
    """A consumer (client announces consumer_cancel_notify) whose queue is deleted receives
    basic.cancel from the broker."""
    q = rec.q()
    c = rec.conn()
    ch = c.channel()
    ch.queue_declare(q)
    cancelled = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume(q, lambda *a: None)
    rec.do("delete", c.channel().queue_delete, q)
    _pump(c, lambda: bool(cancelled), 3.0)
    rec.add("cancelled", [t == tag for t in cancelled])


@scenario
def queue_max_length(rec: Rec) -> None:
    """x-max-length 2 (default overflow drop-head) keeps the newest two; with x-overflow
    reject-publish the third publish is nacked (pika NackError on a confirm channel)."""
    c = rec.conn()
    ch = rec.channel(c, confirm=True)
    for label, extra in (("drop-head", {}), ("reject-publish", {"x-overflow": "reject-publish"})):
        q = rec.q(label)
        ch.queue_declare(q, arguments={"x-max-length": 2, **extra})
        for i in (1, 2, 3):
            rec.do(f"{label} publish m{i}", ch.basic_publish, "", q, f"m{i}".encode())
        rec.drain(ch, q, label)


@scenario
def priority_queue(rec: Rec) -> None:
    """x-max-priority 10: messages come out highest priority first (FIFO within one
    priority; priorities above the maximum count as the maximum; none counts as 0)."""
    c, ch, q = _filled(rec, 0)
    q = rec.q("prio")
    ch.queue_declare(q, arguments={"x-max-priority": 10})
    for body, prio in (("p1", 1), ("p5", 5), ("none", None), ("p5b", 5), ("p200", 200),
                       ("p10", 10), ("p0", 0)):
        ch.basic_publish("", q, body.encode(), pika.BasicProperties(priority=prio))
    rec.drain(ch, q)


@scenario
def prefetch_limits(rec: Rec) -> None:
    """basic.qos prefetch_count=2 on a consumer of 5 messages: 2 delivered until an ack,
    then one more per ack; basic.get ignores the prefetch window."""
    c, _, q = _filled(rec, 5)
    ch = c.channel()
    ch.basic_qos(prefetch_count=2)
    got = []
    ch.basic_consume(q, lambda _c, m, _p, body: got.append((m.delivery_tag, body.decode())))
    _pump(c, lambda: len(got) > 2, 1.0)
    rec.add("delivered", [b for _, b in got])
    ch.basic_ack(got[0][0])
    _pump(c, lambda: len(got) > 3, 1.0)
    rec.add("after one ack", [b for _, b in got])
    ch.basic_ack(got[-1][0], multiple=True)
    _pump(c, lambda: len(got) > 5, 1.5)
    rec.add("after ack multiple", [b for _, b in got])


@scenario
def auto_delete(rec: Rec) -> None:
    """An auto-delete queue survives until it had a consumer and the last one is cancelled;
    an auto-delete exchange goes when its last binding is removed."""
    q, ex = rec.q("adq"), rec.x("adx")
    c = rec.conn()
    ch = c.channel()
    ch.queue_declare(q, auto_delete=True)
    ch.exchange_declare(ex, "fanout", auto_delete=True)
    rec.do("q before consume", c.channel().queue_declare, q, passive=True)
    tag = ch.basic_consume(q, lambda *a: None)
    ch.basic_cancel(tag)
    time.sleep(0.3)
    rec.do("q after cancel", c.channel().queue_declare, q, passive=True)
    q2 = rec.q("bound")
    ch = c.channel()
    ch.queue_declare(q2)
    ch.queue_bind(q2, ex)
    ch.queue_unbind(q2, ex)
    time.sleep(0.3)
    rec.do("x after unbind", c.channel().exchange_declare, ex, passive=True)


@scenario
def direct_reply_to(rec: Rec) -> None:
    """Direct reply-to (amq.rabbitmq.reply-to): a requester consuming the pseudo-queue
    (no-ack) publishes with it as reply_to; the responder sees a reply_to of the form
    ``amq.rabbitmq.reply-to.*`` and its reply on the default exchange reaches the requester.
    Consuming it with acks, twice on a channel, or publishing with it before consuming are
    406 (channel)."""
    q = rec.q()
    c = rec.conn()
    ch = c.channel()
    ch.queue_declare(q)
    got: list = []
    rec.do("consume-reply", ch.basic_consume, "amq.rabbitmq.reply-to",
           lambda c_, m, p, b: got.append(b), auto_ack=True)
    rec.do("publish-request", ch.basic_publish, "", q, b"ping",
           pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id="c1"),
           sync=ch)
    responder = rec.channel()
    m, props, body = responder.basic_get(q, auto_ack=True)
    rec.add("request", body, props.correlation_id,
            (props.reply_to or "").startswith("amq.rabbitmq.reply-to."))
    if props.reply_to:
        rec.do("reply", responder.basic_publish, "", props.reply_to, b"pong", sync=responder)
    for _ in range(50):
        if got:
            break
        c.process_data_events(time_limit=0.1)
    rec.add("replies", got)
    rec.do("consume-reply-again", ch.basic_consume, "amq.rabbitmq.reply-to",
           lambda *a: None, auto_ack=True, sync=ch)
    rec.do("consume-reply-with-acks", rec.channel().basic_consume, "amq.rabbitmq.reply-to",
           lambda *a: None, auto_ack=False)
    other = rec.channel()
    rec.do("publish-without-reply-consumer", other.basic_publish, "", q, b"x",
           pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"), sync=other)


@scenario
def sender_selected_distribution(rec: Rec) -> None:
    """RabbitMQ's sender-selected distribution: a publish's ``CC`` and ``BCC`` headers (arrays
    of strings) are routing keys too, on a direct, a topic and the default exchange; a queue
    matched by several keys gets one copy; ``BCC`` is taken out of the message, ``CC`` stays;
    the delivery's routing key is the publish's. A ``CC`` that is not an array closes the
    channel (recorded: 406?); non-string items of the array are ignored."""
    ex, tx = rec.x("ssd"), rec.x("ssd-topic")
    c = rec.conn()
    ch = rec.channel(c, confirm=True)
    ch.exchange_declare(ex, "direct")
    ch.exchange_declare(tx, "topic")
    qs = {k: rec.q(f"ssd-{k}") for k in ("one", "two", "three", "four", "t")}
    for k, q in qs.items():
        ch.queue_declare(q)
        if k == "t":
            ch.queue_bind(q, tx, "a.*")
        else:
            ch.queue_bind(q, ex, k)
    ch.basic_publish(ex, "one", b"cc", pika.BasicProperties(
        headers={"CC": ["two", "three"], "BCC": ["four"], "other": 1}))
    ch.basic_publish(ex, "one", b"cc-dup", pika.BasicProperties(headers={"CC": ["one", "one"]}))
    ch.basic_publish(ex, "nowhere", b"bcc-only", pika.BasicProperties(headers={"BCC": ["two"]}))
    ch.basic_publish(ex, "one", b"cc-mixed", pika.BasicProperties(headers={"CC": ["three", 5]}))
    ch.basic_publish(tx, "b.x", b"topic", pika.BasicProperties(headers={"CC": ["a.y"]}))
    ch.basic_publish("", qs["one"], b"default", pika.BasicProperties(headers={"CC": [qs["two"]]}))
    get = c.channel()
    for k, q in qs.items():
        got = []
        while (res := get.basic_get(q, auto_ack=True))[0] is not None:
            m, props, body = res
            got.append((body.decode(), m.routing_key, sorted((props.headers or {}).items())))
        rec.add(k, got)
    bad = rec.channel()
    rec.do("CC a string", bad.basic_publish, ex, "one", b"bad",
           pika.BasicProperties(headers={"CC": "two"}), sync=bad)
    bad = rec.channel()
    rec.do("BCC a table", bad.basic_publish, ex, "one", b"bad",
           pika.BasicProperties(headers={"BCC": {"a": "b"}}), sync=bad)
    rec.drain(c.channel(), qs["two"], "after bad")


@scenario
def publish_property_checks(rec: Rec) -> None:
    """RabbitMQ's channel checks of a publish's properties: a ``user_id`` other than the
    connection's user closes the channel (406, "Validated User-ID"); the connection's own is
    accepted. An ``expiration`` that is not a decimal integer of ms, at least 0, closes it
    too (406 "invalid expiration"); a sign and a zero are accepted."""
    q = rec.q()
    c = rec.conn()
    c.channel().queue_declare(q)
    cases = [("user_id own", {"user_id": rec.user}), ("user_id other", {"user_id": "mallory"}),
             ("user_id empty", {"user_id": ""})]
    cases += [(f"expiration {e!r}", {"expiration": e})
              for e in ("-1", "foo", "1000foo", "", " 5", "+50000", "0", "50000", "1.5")]
    for label, props in cases:
        ch = rec.channel(c, confirm=True)
        rec.do(label, ch.basic_publish, "", q, label.encode(), pika.BasicProperties(**props))
    rec.drain(rec.channel(c), q)


@scenario
def declare_rules_rabbitmq_keeps(rec: Rec) -> None:
    """Rules of RabbitMQ's channel a client library's own suite checks (the Java client's):
    CR and LF are taken out of declared, deleted and bound names; queue.bind with no queue
    and no routing key binds the last declared queue by its own name (spec 1.7.2.3); a
    redeclare with another alternate-exchange is 406, as is one with another x-message-ttl;
    an application's own x- argument is not compared. (A TTL of 10.0 against 10, also 406 on
    RabbitMQ, is not here: pika cannot send a float; node tests have it.)"""
    base, x = rec.q("crlf"), rec.x("ae")
    r = rec.raw()                   # pamqp and pika refuse such names themselves
    r.open_channel(1)
    split = (base[:8] + "\r\n" + base[8:] + "\n").encode()
    r.send(method_frame(1, 50, 10, b"\0\0" + bytes((len(split),)) + split + b"\0" + bytes(4)))
    ok = rec.reply(r, "declare with CR LF")
    rec.add("declared as", getattr(ok, "queue", None))
    xsplit = (x[:5] + "\n" + x[5:]).encode()
    r.send(method_frame(1, 40, 10, b"\0\0" + bytes((len(xsplit),)) + xsplit + b"\x06direct"
                        + b"\0" + bytes(4)))
    rec.reply(r, "exchange with LF")
    c = rec.conn()
    ch = c.channel()
    rec.do("passive without", ch.queue_declare, base, passive=True)
    rec.do("exchange passive", ch.exchange_declare, x, passive=True)
    ch.queue_bind(base, x, "k")
    last = rec.q("mrdq")
    ch.queue_declare(last)
    rec.do("bind shortcut", ch.queue_bind, "", x, "")
    cch = rec.channel(c, confirm=True)
    cch.basic_publish(x, last, b"by-name")
    cch.basic_publish(x, "", b"by-empty")
    rec.drain(cch, last, "last")
    ax = rec.x("aeq")
    ch.exchange_declare(ax, "direct", arguments={"alternate-exchange": "one"})
    rec.do("same alternate", ch.exchange_declare, ax, "direct",
           arguments={"alternate-exchange": "one"})
    rec.do("other alternate", ch.exchange_declare, ax, "direct",
           arguments={"alternate-exchange": "two"})
    ch = c.channel()
    rec.do("no alternate", ch.exchange_declare, ax, "direct")
    q = rec.q("ttl-type")
    ch = c.channel()
    ch.queue_declare(q, arguments={"x-message-ttl": 10, "x-custom": 1})
    rec.do("ttl 10 again", ch.queue_declare, q, arguments={"x-message-ttl": 10, "x-custom": 1})
    rec.do("custom 2", ch.queue_declare, q, arguments={"x-message-ttl": 10, "x-custom": 2})
    rec.do("ttl 11", ch.queue_declare, q, arguments={"x-message-ttl": 11, "x-custom": 1})
