"""A small recorded load-test run folder, written with the loadtest schema's own writer, and
the expected aggregates computed independently with numpy (not Spark)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from shoal.pipeline.loadtest import schema as S
from shoal.pipeline.loadtest.writer import RunWriter

START_NS = 1_700_000_000_000_000_000


@dataclass
class Expected:
    sent: dict = field(default_factory=dict)            # queue -> sent
    received: dict = field(default_factory=dict)        # queue -> received (all seconds)
    received_window: dict = field(default_factory=dict)  # queue -> received, second < time
    redelivered: dict = field(default_factory=dict)     # queue -> redelivered
    lat_window: dict = field(default_factory=dict)      # queue -> latency_us samples (window)
    lost_by_producer: dict = field(default_factory=dict)
    dup_by_producer: dict = field(default_factory=dict)
    timeline_received: dict = field(default_factory=dict)  # second -> received


def make_run(path, label: str, seed: int, time_s: int = 5, nodes=("node-0", "node-1"),
             producers_queues=((0, ("qa",)), (1, ("qb",))), latency_scale_us: float = 800.0,
             copies: int = 1) -> Expected:
    """Write a run folder at ``path``; return what the report must find. Each producer
    publishes to the queues listed for it; queue ``i`` lives on ``nodes[i % len(nodes)]``.
    ``copies``: deliveries wanted per message (``params.copies``, a fanout's queues), so a
    lost seq loses that many."""
    rng = np.random.default_rng(seed)
    queues = sorted({q for _, qs in producers_queues for q in qs})
    node_of = {q: nodes[i % len(nodes)] for i, q in enumerate(queues)}
    exp = Expected()
    run_json = {"format_version": S.FORMAT_VERSION, "run_id": f"{seed:08x}", "label": label,
                "url": "amqp://guest@127.0.0.1:5672/%2F", "broker": "Shoal 0.1.0",
                "start_ns": START_NS, "start_iso": "2023-11-14T22:13:20Z",
                "params": {"producers": len(producers_queues), "consumers": 2,
                           "queues": len(queues), "size": 64, "time": time_s,
                           "sample_every": 1, "copies": copies},
                "queues": [{"queue": q, "node": node_of[q]} for q in queues]}
    w = RunWriter(path, run_json)
    per_second, samples, producer_rows, received_rows = [], [], [], []
    seconds = time_s + 2                                   # two seconds of drain
    for p, qs in producers_queues:
        seq = 0
        for q in qs:
            sent_q = 0
            for s in range(time_s):
                n = int(rng.integers(50, 150))
                sent_q += n
                per_second.append(_row(s, "producer", p, q, node_of[q], sent=n, confirmed=n))
            producer_rows.append({"producer": p, "queue": q, "node": node_of[q], "sent": sent_q,
                                  "confirmed": sent_q, "nacked": 0, "returned": 0})
            exp.sent[q] = exp.sent.get(q, 0) + sent_q
            seq += sent_q
        # RECEIVED: cover [0, seq): a lost run, a duplicated run, the rest once.
        lost = int(rng.integers(1, 10))
        dup = int(rng.integers(1, 10))
        received_rows += [(p, 0, seq - lost - dup, copies),
                          (p, seq - lost - dup, seq - lost, copies + 1), (p, seq - lost, seq, 0)]
        exp.lost_by_producer[p] = lost * copies
        exp.dup_by_producer[p] = dup
    for c, q in enumerate(queues):
        for s in range(seconds):
            n = int(rng.integers(40, 160))
            red = int(rng.integers(0, 5))
            lats = rng.lognormal(np.log(latency_scale_us), 0.6, size=int(rng.integers(5, 30)))
            lats = np.maximum(lats.astype(np.int64), 1)
            per_second.append(_row(s, "consumer", c, q, node_of[q], received=n, redelivered=red,
                                   p50=int(np.median(lats)), p99=int(np.percentile(lats, 99)),
                                   mx=int(lats.max())))
            exp.received[q] = exp.received.get(q, 0) + n
            exp.redelivered[q] = exp.redelivered.get(q, 0) + red
            exp.timeline_received[s] = exp.timeline_received.get(s, 0) + n
            if s < time_s:
                exp.received_window[q] = exp.received_window.get(q, 0) + n
                exp.lat_window.setdefault(q, []).extend(int(x) for x in lats)
            for i, lat in enumerate(lats):
                rcv = START_NS + s * 1_000_000_000 + int(rng.integers(0, 999_000_000))
                samples.append((0, s * 1000 + i, q, c, rcv - int(lat) * 1000, rcv, int(lat),
                                bool(i % 7 == 0)))
    w.add_per_second(per_second)
    w.add_samples(samples)
    w.close(producer_rows, received_rows, {"note": "made by tests/spark"})
    return exp


def _row(second, role, worker, queue, node, sent=0, confirmed=0, received=0, redelivered=0,
         p50=None, p99=None, mx=None) -> dict:
    return {"second": second, "time": (START_NS // 1000) + second * 1_000_000, "role": role,
            "worker": worker, "queue": queue, "node": node, "sent": sent,
            "confirmed": confirmed, "nacked": 0, "returned": 0, "received": received,
            "redelivered": redelivered, "foreign": 0, "latency_p50_us": p50,
            "latency_p99_us": p99, "latency_max_us": mx}
