"""Deterministic cost of a quorum queue's message path: publish, deliver, ack over three
in-process nodes (tests/node/replication/test_quorum_nodes.py's sans-IO cluster, no sockets,
no clock), counted in Python bytecodes per message and per function, plus CPU per message.

    python tests/benchmarks/quorum_cost.py [--messages 3000] [--batch 60] [--top 25]

The bytecode counts (``sys.settrace`` opcode events) do not move with the machine's load, so
two trees compare exactly: run each tree's copy of this script with that tree on
``PYTHONPATH`` (performance.md, issue 44). The cost is marginal: a run of ``--messages``
minus a run of a third as many, divided by the difference, so the cluster's set-up and
elections cancel out. One consumer with credit 200 takes every message; the router's side
(credit back, acks in one SETTLE per batch) is the harness's. The leader's per-turn work is
overweighted against a real node: ``--batch`` publishes per turn (a loaded node sees 60-130).

Not collected by pytest (no ``test_`` prefix): a benchmark asserts no speed.
"""
from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.node.replication.test_quorum_nodes import HEADER, Cluster, declare  # noqa: E402
from shoal.shared.wire import OUTCOME_ACK, T  # noqa: E402


ROOT = str(Path(__file__).resolve().parents[2]) + "/"


def _short(path: str) -> str:
    """A source path relative to the tree (an installed or shimmed ``shoal/`` too)."""
    if path.startswith(ROOT):
        return path[len(ROOT):]
    return path.split("/shoal/", 1)[-1]


def run(messages: int, batch: int, counts: Counter | None) -> float:
    """Publish ``messages`` (in turns of ``batch``), deliver and ack them all; returns CPU
    seconds (with ``counts``: bytecodes per (file, function) added to it)."""
    c = Cluster(Path(tempfile.mkdtemp(prefix="quorum-cost-", dir="/dev/shm")))
    declare(c)
    leader = c.leader()
    c.request(leader, T.CONSUME, 5, "/", "q", "tag", 0, 0, {}, None)
    c.send(leader, T.CREDIT, 5, 200, False)
    shard = c.shards[leader]
    body = b"x" * 1024

    def settle() -> None:
        got = c.take(leader, T.DELIVER)
        c.take(leader, T.PUBLISH_RESULT)
        if got:
            shard.handle(b"router", [T.SETTLE, OUTCOME_ACK, [d[2] for d in got]], c.now)
            shard.handle(b"router", [T.CREDIT, 5, len(got), False], c.now)

    def loop() -> None:
        seq = 0
        while seq < messages:
            for _ in range(min(batch, messages - seq)):
                seq += 1
                shard.handle(b"router", [T.PUBLISH, seq, "/", ["q"], "", "q", HEADER, body,
                                         None], c.now)
            c.pump()
            settle()
            c.now += 1
        for _ in range(20):
            c.pump()
            settle()

    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)       # as node/cli.py
    t0 = time.process_time()
    if counts is None:
        loop()
    else:
        def tracer(frame, event, arg):
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
            co = frame.f_code
            key = f"{_short(co.co_filename)}:{co.co_name}"

            def local(frame, event, arg):
                if event == "opcode":
                    counts[key] += 1
                return local
            return local
        sys.settrace(tracer)
        try:
            loop()
        finally:
            sys.settrace(None)
    return time.process_time() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=3000)
    p.add_argument("--batch", type=int, default=60)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    small, big = Counter(), Counter()
    run(args.messages // 3, args.batch, small)
    run(args.messages, args.batch, big)
    n = args.messages - args.messages // 3
    per = {k: (big[k] - small[k]) / n for k in big}
    cpu = [run(args.messages, args.batch, None) / args.messages * 1e6 for _ in range(3)]
    print(f"bytecodes per message: {sum(per.values()):.0f}; CPU per message (3 runs, "
          f"untraced): {', '.join(f'{x:.1f}' for x in cpu)} µs")
    for k, v in sorted(per.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"{v:8.1f}  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
