"""The fault loop (issue 22, point 5; issue 5's crash test made a campaign): kill -9 a random
node or router, round after round, under confirmed persistent load with consumers attached.

A publisher with confirms spreads numbered persistent messages over durable queues on distinct
nodes; a consumer per queue acks what it gets. Each round waits a random 0.5 to 3 s, kill -9s a
random node or router (the launcher restarts it) and waits until it is back; clients reconnect
and resume. A publish whose confirm was nacked or lost with the connection does not count as
confirmed and is published again with the same id. At the end every queue is drained and:

- every confirmed id was delivered at least once (lost must be 0);
- no id was delivered that was never published;
- a second copy of an id that was published once carries ``redelivered`` (a node that crashed
  marks every recovered message redelivered: it may have been delivered). Ids published more
  than once (a confirm lost in a crash, then republished) may arrive twice without it: the
  publisher sent two messages.

In CI: ``tests/e2e/faults/test_crash.py`` (10 rounds, ``SHOAL_FAULT_ROUNDS``). By hand, 100 rounds
with the figures for docs/reliability.md::

    python -m tests.e2e.faults.fault_loop --rounds 100 --nodes 3 --routers 2
"""
from __future__ import annotations

import argparse
import collections
import random
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pika
import pika.exceptions

from ..durability.test_durability import PERSISTENT, kill9, params, retry

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


@dataclass
class Report:
    """What one fault loop saw."""

    rounds: list[str] = field(default_factory=list)   #: the victim of each round
    published: int = 0          #: distinct ids published
    confirmed: int = 0
    republished: int = 0        #: publishes that failed and were sent again
    delivered: int = 0
    lost: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    duplicates: int = 0
    fresh_duplicates: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def line(self) -> str:
        return (f"fault loop: rounds={len(self.rounds)} "
                f"({dict(collections.Counter(self.rounds))}), published ids={self.published}, "
                f"confirmed={self.confirmed}, republished={self.republished}, "
                f"delivered={self.delivered}, lost={len(self.lost)}, "
                f"duplicates={self.duplicates} (without redelivered: "
                f"{len(self.fresh_duplicates)}), unknown={len(self.unknown)}, "
                f"{self.seconds:.0f} s")


def run(cl, rounds: int, seed: int | None = None) -> Report:
    """``rounds`` kill -9 rounds against the cluster ``cl`` (tests/conftest.py's Cluster)."""
    began = time.monotonic()
    queues = cl.queues_on_distinct_nodes(min(3, len(cl.node_ids)), "crash")

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
    rnd = random.Random(seed if seed is not None else time.time_ns())
    victims = list(cl.node_ids) + ([r.id for r in cl.routers] if len(cl.routers) > 1
                                   else ["router"])
    report = Report()
    for _ in range(rounds):
        time.sleep(rnd.uniform(0.5, 3.0))
        victim = rnd.choice(victims)
        kill9(cl, victim)
        report.rounds.append(victim)
    time.sleep(1.0)
    pub.stop.set()
    pub.join(60)
    assert not pub.is_alive(), "publisher stuck"
    time.sleep(3.0)             # let the consumers catch up, then take the rest with basic.get
    for c in consumers:
        c.stop.set()
    for c in consumers:
        c.join(30)
    for q in queues:
        drain_rest(cl, q, seen)

    counts = collections.Counter(mid for mid, _ in seen)
    firsts: set[str] = set()
    for mid, redelivered in seen:
        if mid in firsts:
            report.duplicates += 1
            if not redelivered and pub.published[mid] == 1:
                report.fresh_duplicates.append(mid)
        firsts.add(mid)
    report.published, report.confirmed = len(pub.published), len(pub.confirmed)
    report.republished, report.delivered = pub.failed, len(seen)
    report.lost = sorted(pub.confirmed - set(counts))
    report.unknown = sorted(set(counts) - set(pub.published))
    report.seconds = time.monotonic() - began
    return report


def main(argv: list[str] | None = None) -> int:
    from tests.conftest import start_cluster, stop_cluster
    p = argparse.ArgumentParser(prog="python -m tests.e2e.faults.fault_loop",
                                description="kill -9 rounds under confirmed persistent load")
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--routers", type=int, default=2)
    p.add_argument("--seed", type=int)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="shoal-fault-") as d:
        cl = start_cluster(Path(d) / "cluster", a.nodes, routers=a.routers)
        try:
            report = run(cl, a.rounds, a.seed)
        finally:
            stop_cluster(cl, require_clean_exit=False)
    print(report.line())
    ok = not (report.lost or report.unknown or report.fresh_duplicates)
    print("PASS" if ok else f"FAIL: lost {report.lost[:20]} unknown {report.unknown[:20]} "
                            f"fresh duplicates {report.fresh_duplicates[:20]}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
