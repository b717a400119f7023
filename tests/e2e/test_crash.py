"""Issue 5's crash test: a confirmed persistent message is never lost through kill -9.

A publisher with confirms spreads numbered persistent messages over three durable queues on
three nodes; a consumer per queue acks what it gets. Meanwhile the test repeatedly kill -9s a
random node or the router at a random moment (the launcher restarts it); clients reconnect and
resume. A publish whose confirm was nacked or lost with the connection does not count as
confirmed and is published again with the same id. At the end every queue is drained and:

- every confirmed id was delivered at least once (lost must be 0);
- no id was delivered that was never published;
- a second copy of an id that was published once carries ``redelivered`` (a node that crashed
  marks every recovered message redelivered: it may have been delivered). Ids published more
  than once (a confirm lost in a crash, then republished) may arrive twice without it: the
  publisher sent two messages.

Bounded: ``SHOAL_CRASH_SECONDS`` (default 45) of killing, then the drain.
"""
from __future__ import annotations

import collections
import os
import random
import threading
import time

import pika
import pika.exceptions
import pytest

from .test_durability import PERSISTENT, kill9, params, retry

pytestmark = pytest.mark.e2e

KILL_SECONDS = float(os.environ.get("SHOAL_CRASH_SECONDS", "45"))
ERRORS = (pika.exceptions.AMQPError, OSError)


class Publisher(threading.Thread):
    def __init__(self, cluster, queues: list[str]) -> None:
        super().__init__(daemon=True)
        self.cluster, self.queues = cluster, queues
        self.stop = threading.Event()
        self.published: collections.Counter[str] = collections.Counter()  # id -> attempts
        self.confirmed: set[str] = set()
        self.failed = 0

    def run(self) -> None:
        n = 0
        conn = ch = None
        while not self.stop.is_set():
            mid = f"m{n}"
            try:
                if ch is None:
                    conn = pika.BlockingConnection(params(self.cluster))
                    ch = conn.channel()
                    ch.confirm_delivery()
                self.published[mid] += 1
                ch.basic_publish("", self.queues[n % len(self.queues)], mid.encode(),
                                 PERSISTENT)          # returns once acked; raises if nacked
                self.confirmed.add(mid)
                n += 1
            except ERRORS:
                self.failed += 1                     # not confirmed: same id again
                if conn is None or not conn.is_open or ch is None or not ch.is_open:
                    if conn is not None and conn.is_open:
                        try:
                            conn.close()
                        except ERRORS:
                            pass
                    conn = ch = None
                time.sleep(0.1)
        if conn is not None and conn.is_open:
            try:
                conn.close()
            except ERRORS:
                pass


class Consumer(threading.Thread):
    def __init__(self, cluster, queue: str, seen: list) -> None:
        super().__init__(daemon=True)
        self.cluster, self.queue, self.seen = cluster, queue, seen
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            conn = None
            try:
                conn = pika.BlockingConnection(params(self.cluster))
                ch = conn.channel()
                ch.basic_qos(prefetch_count=20)
                cancelled = []
                ch.add_on_cancel_callback(lambda frame: cancelled.append(frame))

                def on_message(ch, method, props, body):
                    self.seen.append((body.decode(), method.redelivered))
                    ch.basic_ack(method.delivery_tag)
                ch.basic_consume(self.queue, on_message)
                while not self.stop.is_set() and not cancelled:
                    conn.process_data_events(0.2)
            except ERRORS:
                time.sleep(0.2)
            finally:
                if conn is not None and conn.is_open:
                    try:
                        conn.close()
                    except ERRORS:
                        pass


def drain_rest(cluster, queue: str, seen: list) -> None:
    """basic.get (ack) until the queue is empty."""
    def go() -> None:
        conn = pika.BlockingConnection(params(cluster))
        try:
            ch = conn.channel()
            while True:
                method, _props, body = ch.basic_get(queue, auto_ack=False)
                if method is None:
                    return
                seen.append((body.decode(), method.redelivered))
                ch.basic_ack(method.delivery_tag)
        finally:
            if conn.is_open:
                conn.close()
    retry(go, 60)


@pytest.mark.parametrize("own_cluster", [3], indirect=True)
def test_confirmed_messages_survive_repeated_kill_9(own_cluster):
    cl = own_cluster
    queues = cl.queues_on_distinct_nodes(3, "crash")

    def declare() -> None:
        conn = pika.BlockingConnection(params(cl))
        ch = conn.channel()
        for q in queues:
            ch.queue_declare(q, durable=True)
        conn.close()
    retry(declare)
    seen: list[tuple[str, bool]] = []
    pub = Publisher(cl, queues)
    consumers = [Consumer(cl, q, seen) for q in queues]
    for t in [pub, *consumers]:
        t.start()
    rnd = random.Random(int(os.environ.get("SHOAL_CRASH_SEED", str(time.time_ns()))))
    victims = cl.node_ids + ["router"]
    iterations = []
    end = time.monotonic() + KILL_SECONDS
    while time.monotonic() < end:
        time.sleep(rnd.uniform(0.5, 3.0))
        victim = rnd.choice(victims)
        kill9(cl, victim)
        iterations.append(victim)
    time.sleep(1.0)
    pub.stop.set()
    pub.join(60)
    assert not pub.is_alive(), "publisher stuck"
    # let the consumers catch up, then take what is left with basic.get
    time.sleep(3.0)
    for c in consumers:
        c.stop.set()
    for c in consumers:
        c.join(30)
    for q in queues:
        drain_rest(cl, q, seen)

    counts = collections.Counter(mid for mid, _ in seen)
    published = set(pub.published)
    lost = sorted(pub.confirmed - set(counts))
    unknown = sorted(set(counts) - published)
    fresh_dups = []          # a second copy without redelivered of an id published once
    dups = 0
    firsts: set[str] = set()
    for mid, redelivered in seen:
        if mid in firsts:
            dups += 1
            if not redelivered and pub.published[mid] == 1:
                fresh_dups.append(mid)
        firsts.add(mid)
    print(f"\ncrash test: iterations={len(iterations)} "
          f"({collections.Counter(iterations)}), published ids={len(published)}, "
          f"confirmed={len(pub.confirmed)}, publish failures (republished)={pub.failed}, "
          f"delivered={len(seen)}, lost={len(lost)}, duplicates={dups} "
          f"(without redelivered: {len(fresh_dups)}), unknown={len(unknown)}")
    assert len(iterations) >= 3
    assert len(pub.confirmed) > 100, "too few confirms to mean anything"
    assert not lost, f"confirmed but never delivered: {lost[:20]}"
    assert not unknown, f"delivered but never published: {unknown[:20]}"
    assert not fresh_dups, f"duplicates without redelivered: {fresh_dups[:20]}"
