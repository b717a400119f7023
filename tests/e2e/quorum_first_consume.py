"""Fresh clusters, a quorum queue declared and consumed as soon as the router is ready (issue
48): a consumer whose CONSUME was on its way while the queue's first leader was announced was
registered twice, and the node closed the client's connection with 503 "consumer id 1 already
in use".

Each run starts a fresh 3-node ``shoal serve``; right after its ready line a consumer
connection and a producer connection (pika, in two threads, as ``shoal loadtest`` does) both
declare the quorum queue; the consumer consumes with prefetch 200 and acks, the producer
publishes ``MESSAGES`` persistent messages with confirms. A run fails when a connection is
closed or a message does not arrive within ``DEADLINE_S``.

``python -m tests.e2e.quorum_first_consume --runs 200`` runs it by hand and prints the count
of failed runs; ``tests/e2e/test_quorum_queues.py`` runs a few in CI.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import pika

from tests.conftest import start_cluster, stop_cluster

QUEUE = "qq-1"
MESSAGES = 50
DEADLINE_S = 20.0
QQ = {"x-queue-type": "quorum"}


def _consume(url: str, got: list, errors: list, done: threading.Event) -> None:
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.queue_declare(QUEUE, durable=True, arguments=QQ)
        ch.basic_qos(prefetch_count=200)

        def on_message(ch_, method, _props, body):
            got.append(body)
            ch_.basic_ack(method.delivery_tag)
        ch.basic_consume(QUEUE, on_message)
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < MESSAGES and time.monotonic() < deadline and not done.is_set():
            conn.process_data_events(time_limit=0.05)
        conn.close()
    except Exception as exc:  # noqa: BLE001 - the run's finding
        errors.append(f"consumer: {exc!r}")


def _produce(url: str, errors: list) -> None:
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.queue_declare(QUEUE, durable=True, arguments=QQ)
        ch.confirm_delivery()
        for i in range(MESSAGES):
            ch.basic_publish("", QUEUE, b"m%d" % i, pika.BasicProperties(delivery_mode=2))
        conn.close()
    except Exception as exc:  # noqa: BLE001 - the run's finding
        errors.append(f"producer: {exc!r}")


def one_run(data_dir: Path) -> str | None:
    """One fresh cluster; returns what went wrong, or None."""
    cluster = start_cluster(data_dir, 3)
    got: list[bytes] = []
    errors: list[str] = []
    done = threading.Event()
    try:
        threads = [threading.Thread(target=_consume, args=(cluster.url, got, errors, done)),
                   threading.Thread(target=_produce, args=(cluster.url, errors))]
        for t in threads:
            t.start()
        threads[1].join(DEADLINE_S + 10)
        if errors:
            done.set()
        threads[0].join(DEADLINE_S + 10)
        if not errors and sorted(got) != sorted(b"m%d" % i for i in range(MESSAGES)):
            errors.append(f"consumer got {len(got)} of {MESSAGES} messages")
    finally:
        stop_cluster(cluster, require_clean_exit=False)
    return "; ".join(errors) or None


def runs(count: int, root: Path) -> list[str]:
    """``count`` fresh-cluster runs under ``root``; the failures' descriptions."""
    failures = []
    for i in range(count):
        why = one_run(root / f"run-{i}")
        if why is not None:
            failures.append(f"run {i}: {why}")
    return failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="shoal-first-consume-") as tmp:
        failures = runs(args.runs, Path(tmp))
    for why in failures:
        print(why)
    print(f"{args.runs} runs, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
