"""Micro-benchmark of the AMQP hot path (design.md section 4: measure before and after).

Run: ``python tests/router/bench_amqp_fastpath.py``. Prints µs per message for publish
(method + header + body frames in, MessagePublished out), client ack, deliver and confirm.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from pamqp import commands  # noqa: E402

from amqp_testkit import content, m, open_channel, open_conn, publish  # noqa: E402


def bench(label: str, n: int, fn) -> None:
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    print(f"{label:<28} {best / n * 1e6:6.2f} µs/msg")


def main(n: int = 20000) -> None:
    conn = open_conn()
    open_channel(conn, 1)
    pubs = publish(1, b"x" * 100) * n
    acks = m(commands.Basic.Ack(5, False), 1) * n
    hdr, body = content(1, b"x" * 100)[0], b"x" * 100
    bench("publish (100 B, 1 chunk)", n, lambda: conn.receive_data(pubs))
    bench("basic.ack in", n, lambda: conn.receive_data(acks))

    def deliver():
        for i in range(n):
            conn.send_deliver(1, "ctag-1", i, False, "ex", "rk", hdr, body)
        conn.data_to_send()

    def confirm():
        for i in range(n):
            conn.send_confirm(1, i, False, True)
        conn.data_to_send()
    bench("basic.deliver out", n, deliver)
    bench("confirm out", n, confirm)


if __name__ == "__main__":
    main()
