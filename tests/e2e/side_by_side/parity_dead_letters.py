"""Parity scenarios (see :mod:`.parity`): dead-lettering (RabbitMQ "Dead Letter Exchanges"):
the ``x-death`` history, ``x-first-death-*``, sender-selected keys in dead letters, cycles,
and the grouping of an ``x-death`` array written by an earlier RabbitMQ. pika only."""
from __future__ import annotations

import time

import pika

from .parity import Rec, scenario


@scenario
def dead_lettering(rec: Rec) -> None:
    """x-dead-letter-exchange (+ routing key): a message rejected with requeue=False and one
    dropped by x-max-length reach the dead-letter queue with an x-death entry (count,
    reason, queue, exchange, routing-keys; count is a long-long 'l', which pika decodes as
    ``long``) and x-first-death-* headers (RabbitMQ 3.10 has no x-last-death-*)."""
    dlx, dlq = rec.x("dlx"), rec.q("dlq")
    c = rec.conn()
    ch = rec.channel(c, confirm=True)
    ch.exchange_declare(dlx, "fanout")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx)
    q = rec.q("src")
    ch.queue_declare(q, arguments={"x-dead-letter-exchange": dlx, "x-max-length": 1})
    ch.basic_publish("", q, b"rejected")
    m = ch.basic_get(q)[0]
    rec.do("reject", ch.basic_reject, m.delivery_tag, requeue=False, sync=ch)
    ch.basic_publish("", q, b"dropped")
    ch.basic_publish("", q, b"kept")
    for _ in range(3):
        m, p, body = ch.basic_get(dlq, auto_ack=True)
        if m is None:
            rec.add("dlq", "get-empty")
            break
        h = dict(p.headers or {})
        deaths = [{k: (f"{type(v).__name__} {v}" if k == "count" else v)   # 'l' -> long
                   for k, v in d.items() if k != "time"} for d in h.pop("x-death", [])]
        rec.add("dlq", body, m.routing_key, m.exchange, deaths, sorted(h.items()))


@scenario
def sender_selected_dead_letters(rec: Rec) -> None:
    """Dead letters of messages published with ``CC``: without x-dead-letter-routing-key the
    copy is routed by the routing key and the CC keys, and x-death's routing-keys lists them;
    with one, by that key alone, and the CC header is gone (x-death still lists the CC keys).
    A BCC key is in neither (taken out at publish)."""
    src, dlx = rec.x("ssd-src"), rec.x("ssd-dlx")
    c = rec.conn()
    ch = rec.channel(c, confirm=True)
    ch.exchange_declare(src, "direct")
    ch.exchange_declare(dlx, "direct")
    dead = {k: rec.q(f"dl-{k}") for k in ("a", "cc", "k", "bcc")}
    for k, q in dead.items():
        ch.queue_declare(q)
        ch.queue_bind(q, dlx, k)
    plain, keyed = rec.q("ssd-plain"), rec.q("ssd-keyed")
    ch.queue_declare(plain, arguments={"x-dead-letter-exchange": dlx})
    ch.queue_declare(keyed, arguments={"x-dead-letter-exchange": dlx,
                                       "x-dead-letter-routing-key": "k"})
    ch.queue_bind(plain, src, "a")
    ch.queue_bind(keyed, src, "b")
    ch.basic_publish(src, "a", b"to-plain", pika.BasicProperties(headers={"CC": ["cc"]}))
    ch.basic_publish(src, "b", b"to-keyed", pika.BasicProperties(headers={"CC": ["cc"]}))
    for q in (plain, keyed):
        m = ch.basic_get(q)[0]
        rec.do(f"reject {q}", ch.basic_reject, m.delivery_tag, requeue=False, sync=ch)
    # dead-lettering is asynchronous on both brokers: wait (at most 3 s) for the three
    # copies RabbitMQ makes before reading, so a copy still on its way is not read as none
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and sum(
            ch.queue_declare(q, passive=True).method.message_count for q in dead.values()) < 3:
        time.sleep(0.05)
    for k, q in dead.items():
        got = []
        while (res := ch.basic_get(q, auto_ack=True))[0] is not None:
            m, p, body = res
            h = dict(p.headers or {})
            deaths = [(d.get("queue"), d.get("routing-keys")) for d in h.pop("x-death", [])]
            got.append((body.decode(), m.routing_key, deaths, sorted(h)))
        rec.add(k, got)


@scenario
def dead_letter_cycles(rec: Rec) -> None:
    """Dead-letter cycles (RabbitMQ's detect_cycles, at routing): a queue whose DLX routes
    back to it drops an expired message rather than loop; a rejected one comes back (a
    rejection breaks the cycle); a message carrying an earlier death in a queue that dies
    there again for another reason still reaches the dead-letter queue, with both deaths
    (the Java client's DeadLetterExchange ``republish``)."""
    dlx, loop, dlq, src = rec.x("cyc-dlx"), rec.q("cyc-loop"), rec.q("cyc-dlq"), rec.q("cyc-src")
    c = rec.conn()
    ch = rec.channel(c, confirm=True)
    ch.exchange_declare(dlx, "direct")
    ch.queue_declare(loop, arguments={"x-dead-letter-exchange": dlx})
    ch.queue_bind(loop, dlx, "loop")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx, src)        # a dead letter keeps its routing key: src's name
    ch.basic_publish("", loop, b"expires", pika.BasicProperties(expiration="1"))
    time.sleep(0.3)                 # it expires, and its copy is dropped or comes back
    ch.basic_publish(dlx, "loop", b"rejected")
    deadline = time.monotonic() + 3.0
    got = []
    while time.monotonic() < deadline and len(got) < 2:
        m, p, body = ch.basic_get(loop)
        if m is None:
            time.sleep(0.05)
            continue
        deaths = [(d.get("queue"), d.get("reason"))
                  for d in (p.headers or {}).get("x-death", [])]
        got.append((body.decode(), deaths))
        ch.basic_reject(m.delivery_tag, requeue=False)
    time.sleep(0.3)
    rec.add("loop", got, ch.queue_declare(loop, passive=True).method.message_count)
    ch.queue_declare(src, arguments={"x-dead-letter-exchange": dlx, "x-max-length": 0})
    earlier = [{"count": 1, "reason": "expired", "queue": src, "exchange": "",
                "routing-keys": [src]}]
    ch.basic_publish("", src, b"again", pika.BasicProperties(headers={"x-death": earlier}))
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and \
            ch.queue_declare(dlq, passive=True).method.message_count == 0:
        time.sleep(0.05)
    m, p, body = ch.basic_get(dlq, auto_ack=True)
    rec.add("dlq", None if m is None else (body.decode(), [
        (d.get("queue"), d.get("reason"), d.get("count"))
        for d in (p.headers or {}).get("x-death", [])]))


@scenario
def legacy_x_deaths_grouped(rec: Rec) -> None:
    """A message published with an ``x-death`` array that repeats a (queue, reason), as
    RabbitMQ before 3.5 wrote it (rabbitmq-server#78, #152), is dead-lettered with one entry
    per (queue, reason): the first of each, its ``count`` the number it stood for (kept when it
    had one), then the new death in front and each later one counted up (the Java client's
    ``XDeathHeaderGrowth``). Recorded: each entry's queue, reason, count and field names, and
    whether a death counted up keeps the time it had."""
    x1, x2 = rec.x("lx1"), rec.x("lx2")
    q1, q2, qz = rec.q("lq1"), rec.q("lq2"), rec.q("lqz")
    c = rec.conn()
    ch = rec.channel(c, confirm=True)
    for x in (x1, x2):
        ch.exchange_declare(x, "fanout")
    ch.queue_declare(q1, arguments={"x-dead-letter-exchange": x1, "x-message-ttl": 1,
                                    "x-dead-letter-routing-key": "k"})
    ch.queue_declare(q2, arguments={"x-dead-letter-exchange": x2, "x-message-ttl": 1,
                                    "x-dead-letter-routing-key": "k"})
    ch.queue_bind(q2, x1, "")
    ch.queue_declare(qz, arguments={"x-dead-letter-exchange": x2,
                                    "x-dead-letter-routing-key": "k"})
    ch.queue_bind(qz, x2, "")

    def old(q: str, **extra) -> dict:
        return {"reason": "expired", "queue": q, "exchange": "old-fanout",
                "routing-keys": ["rk-1", "rk-2"], "random": q + "-" + str(extra), **extra}
    earlier = [old("q97") for _ in range(3)] + [old("q98"), old("q98", count=7)] + \
        [old("q99", count=2), old("q99")] + [old("q97", reason="rejected")]
    ch.basic_publish("", q1, b"old", pika.BasicProperties(headers={"x-death": earlier}))
    got, times = [], []
    deadline = time.monotonic() + 6.0
    while time.monotonic() < deadline and len(got) < 3:
        m, p, body = ch.basic_get(qz)
        if m is None:
            time.sleep(0.05)
            continue
        deaths = (p.headers or {}).get("x-death", [])
        got.append([(d.get("queue"), d.get("reason"), d.get("count"), sorted(d))
                    for d in deaths])
        times.append(deaths[0].get("time"))
        if len(got) == 2:
            time.sleep(1.1)     # the second death in qz comes a second after its first
        ch.basic_reject(m.delivery_tag, requeue=False)    # to x2, and back to qz
    rec.add("x-death after each arrival", got)
    rec.add("a second death in qz keeps its first time", len(times) == 3 and times[1] == times[2])
