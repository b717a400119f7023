"""The fallback load of ``shoal cluster`` (``python -m shoal.deploy.pika_load ARGS``): a small
pika publish/consume run inside a load-generator container whose image has no ``shoal
loadtest``; it writes ``OUT/summary.json``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def pika_load(argv: list[str]) -> int:
    """Publish ``--messages`` (bounded by ``--time`` s) with confirms to a fresh queue, consume
    and ack them all, write ``OUT/summary.json`` (counts, msg/s). Flags of ``shoal loadtest``
    that it does not know are ignored and listed in the summary. Exit 1 if any is missing."""
    import pika
    p = argparse.ArgumentParser(prog="pika-load")
    p.add_argument("--url", required=True)
    p.add_argument("--out", default="/out")
    p.add_argument("--queue", default="shoal-load")
    p.add_argument("--messages", type=int, default=2000)
    p.add_argument("--size", type=int, default=100, help="body bytes")
    p.add_argument("--time", type=float, default=10.0, help="seconds at most")
    args, ignored = p.parse_known_args(argv)
    conn = pika.BlockingConnection(pika.URLParameters(args.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(args.queue, auto_delete=False)
    body, sent, t0 = b"x" * args.size, 0, time.monotonic()
    while sent < args.messages and time.monotonic() - t0 < args.time:
        ch.basic_publish("", args.queue, body)
        sent += 1
    t_pub = time.monotonic() - t0
    ch.basic_qos(prefetch_count=200)
    got, t1 = 0, time.monotonic()
    for method, _, _ in ch.consume(args.queue, inactivity_timeout=5.0):
        if method is None:
            break
        ch.basic_ack(method.delivery_tag)
        got += 1
        if got == sent:
            break
    ch.cancel()
    t_con = time.monotonic() - t1
    ch.queue_delete(args.queue)
    conn.close()
    summary = {"tool": "pika-load", "sent_confirmed": sent, "received_acked": got,
               "publish_msg_per_s": round(sent / t_pub, 1) if t_pub else None,
               "consume_msg_per_s": round(got / t_con, 1) if t_con else None,
               "size_bytes": args.size, "ignored_args": ignored}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))
    return 0 if got == sent else 1


if __name__ == "__main__":
    sys.exit(pika_load(sys.argv[1:]))
