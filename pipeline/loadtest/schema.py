"""The output format of ``shoal loadtest``: one folder per run (the contract for reports).

Single source of truth: the writer (``shoal.pipeline.loadtest.writer``) builds every file from the
schemas below, and ``docs/loadtest-format.md`` points here. ``FORMAT_VERSION`` is stored in
``run.json``; it changes when a column is removed or changes meaning (adding a column does not).

Folder layout (``--out RUN_DIR``)::

    RUN_DIR/run.json            run metadata + parameters + summary (JSON object, see below)
    RUN_DIR/per_second.parquet  PER_SECOND: counters per second, per worker, per queue
    RUN_DIR/latency.parquet     LATENCY: sampled per-message latencies (1 in --sample-every)
    RUN_DIR/producers.parquet   PRODUCERS: exact totals per producer and queue
    RUN_DIR/received.parquet    RECEIVED: run-length encoded receive counts per (producer, seq)

Time: all ``*_ns`` columns are wall-clock nanoseconds since the Unix epoch
(``time.time_ns()``, CLOCK_REALTIME; producers and consumers run on the same host, so their
difference is a latency). ``second`` is the whole number of seconds since the run's start
(``run.json`` ``start_ns``): 0 is the first second of sending; seconds ``>= time_s`` belong to
the drain phase (producers stopped, consumers still receiving). Timestamps meant for Spark are
``timestamp[us, UTC]`` (Spark does not read nanosecond timestamps by default).

Message body: every message body starts with ``BODY_HEADER`` (24 bytes, little-endian
``run_token u32, producer u32, sent_ns i64, seq u64``) padded with zero bytes to ``--size``.
``seq`` counts from 0 per producer, over all the producer's queues, without gaps: producer ``p``
sent exactly the seqs ``0 .. sent-1`` (``PRODUCERS``). Messages whose ``run_token`` is not this
run's (left in a queue by an earlier run) count as ``foreign``, never as ``received``.

run.json (object)
    ``format_version`` int; ``run_id`` str (hex); ``label`` str (``--label``, default
    host:port); ``url`` str (the AMQP URL with the password removed); ``broker`` str (the
    server's ``product`` and ``version`` from connection.start, e.g. ``"RabbitMQ 3.10.8"``);
    ``start_ns`` int (wall clock of second 0); ``start_iso`` str (UTC, ISO 8601);
    ``host`` {``hostname``, ``nproc``, ``cpu_model``}; ``params`` object (every flag, by its
    long name with ``_`` for ``-``: ``producers``, ``consumers``, ``queues``, ``queue_pattern``,
    ``size``, ``rate``, ``time``, ``confirm``, ``qos``, ``multi_ack_every``, ``persistent``,
    ``durable``, ``queue_args``, ``mandatory``, ``sample_every``, ``nodes``, ...);
    ``queues`` list of {``queue``, ``node``}; ``placement`` str (where those nodes come from:
    ``"management"``, the management API; ``"nodes"``, the hash over ``--nodes``; ``""``
    unknown); ``summary`` object (written at the end, see
    ``shoal.pipeline.loadtest.runner.Runner.summarize``: totals, rates in msg/s, latency
    percentiles in ms over the sending window, ``lost``, ``duplicates``; ``{"aborted": true}`` after a failed or
    interrupted run, whose Parquet files then hold what was flushed and PRODUCERS/RECEIVED are
    missing).

``PER_SECOND`` (one row per second, worker and queue that had any activity; zero rows omitted)
    =============  ==================  =====  =================================================
    column         type                unit   meaning
    =============  ==================  =====  =================================================
    second         int32               s      seconds since ``start_ns`` (floor)
    time           timestamp[us, UTC]  -      start of that second (wall clock)
    role           string              -      ``"producer"`` or ``"consumer"``
    worker         int32               -      producer or consumer index (0-based, per role)
    queue          string              -      queue name
    node           string              -      node holding the queue: the management
                                              API's ``node`` (``--management-url``), else
                                              ``shoal.shared.placement.owner`` over
                                              ``--nodes``; ``""`` when neither is known
    sent           int64               msgs   basic.publish frames written (producer rows)
    confirmed      int64               msgs   basic.ack received from the broker (confirms)
    nacked         int64               msgs   basic.nack received from the broker (confirms)
    returned       int64               msgs   basic.return received (only with --mandatory)
    received       int64               msgs   basic.deliver of this run (consumer rows)
    redelivered    int64               msgs   of ``received``, with redelivered=true
    foreign        int64               msgs   deliveries not of this run (acked, not counted)
    latency_p50_us int64 (nullable)    µs     consumer rows: median latency that second
    latency_p99_us int64 (nullable)    µs     consumer rows: 99th percentile that second
    latency_max_us int64 (nullable)    µs     consumer rows: maximum that second
    =============  ==================  =====  =================================================

    Counters of a producer row count events that happened during that second (a confirm
    is counted in the second it arrived). Totals over all seconds equal ``PRODUCERS``.

``LATENCY`` (sampled: messages with ``seq % sample_every == 0``, every delivery of them)
    ============  =======  =====  ====================================================
    producer      int32    -      producer index that sent it
    seq           int64    -      the producer's sequence number
    queue         string   -      queue it was delivered from (routing key)
    consumer      int32    -      consumer index that received it
    sent_ns       int64    ns     wall clock when the producer stamped the body
    received_ns   int64    ns     wall clock when the consumer parsed the basic.deliver
    latency_us    int64    µs     ``(received_ns - sent_ns) // 1000``
    redelivered   bool     -      the redelivered flag of the basic.deliver
    ============  =======  =====  ====================================================

``PRODUCERS`` (one row per producer and queue; exact totals, flushed at the end)
    ============  =======  =====  ====================================================
    producer      int32    -      producer index
    queue         string   -      queue name
    node          string   -      as in PER_SECOND
    sent          int64    msgs   messages published to that queue (handed to the kernel:
                                  publishes dropped unsent from the producer's
                                  buffer at the end are not counted)
    confirmed     int64    msgs   confirmed by basic.ack
    nacked        int64    msgs   refused by basic.nack
    returned      int64    msgs   returned by basic.return
    ============  =======  =====  ====================================================

``RECEIVED`` (exact loss and duplicates; run-length encoded over seq, merged over consumers)
    ============  =======  =====  ====================================================
    producer      int32    -      producer index
    seq_start     int64    -      first seq of the run (inclusive)
    seq_end       int64    -      end of the run (exclusive)
    count         int32    msgs   times each seq in ``[seq_start, seq_end)`` was
                                  received, over all consumers (saturates at 255)
    ============  =======  =====  ====================================================

    For each producer the rows cover ``[0, sent)`` without gaps or overlap, where ``sent`` is
    the producer's total in ``PRODUCERS`` (rows with ``count = 0`` are the lost seqs). Each
    seq should be received ``c = params.copies`` times (run.json; 1, or the number of queues
    of a fanout exchange: ``--exchange-type fanout``), hence, in deliveries,
    ``lost = Σ (c - count) * (seq_end - seq_start) where count < c`` and
    ``duplicates = Σ (count - c) * (seq_end - seq_start) where count > c``. A run without
    ``params.copies`` (written before it existed) has ``c = 1``.
"""
from __future__ import annotations

import struct

import pyarrow as pa

FORMAT_VERSION = 1

RUN_JSON = "run.json"
PER_SECOND_FILE = "per_second.parquet"
LATENCY_FILE = "latency.parquet"
PRODUCERS_FILE = "producers.parquet"
RECEIVED_FILE = "received.parquet"

#: Message body prefix: run_token u32, producer u32, sent_ns i64, seq u64 (little-endian).
BODY_HEADER = struct.Struct("<IIqQ")
MIN_SIZE = BODY_HEADER.size  # 24 bytes

ROLE_PRODUCER = "producer"
ROLE_CONSUMER = "consumer"

#: The counter columns of PER_SECOND, in order (also the order workers report them in).
COUNTERS = ("sent", "confirmed", "nacked", "returned", "received", "redelivered", "foreign")

PER_SECOND = pa.schema([
    pa.field("second", pa.int32(), nullable=False),
    pa.field("time", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("role", pa.string(), nullable=False),
    pa.field("worker", pa.int32(), nullable=False),
    pa.field("queue", pa.string(), nullable=False),
    pa.field("node", pa.string(), nullable=False),
    *[pa.field(c, pa.int64(), nullable=False) for c in COUNTERS],
    pa.field("latency_p50_us", pa.int64()),
    pa.field("latency_p99_us", pa.int64()),
    pa.field("latency_max_us", pa.int64()),
], metadata={"shoal.loadtest.format_version": str(FORMAT_VERSION)})

LATENCY = pa.schema([
    pa.field("producer", pa.int32(), nullable=False),
    pa.field("seq", pa.int64(), nullable=False),
    pa.field("queue", pa.string(), nullable=False),
    pa.field("consumer", pa.int32(), nullable=False),
    pa.field("sent_ns", pa.int64(), nullable=False),
    pa.field("received_ns", pa.int64(), nullable=False),
    pa.field("latency_us", pa.int64(), nullable=False),
    pa.field("redelivered", pa.bool_(), nullable=False),
], metadata={"shoal.loadtest.format_version": str(FORMAT_VERSION)})

PRODUCERS = pa.schema([
    pa.field("producer", pa.int32(), nullable=False),
    pa.field("queue", pa.string(), nullable=False),
    pa.field("node", pa.string(), nullable=False),
    pa.field("sent", pa.int64(), nullable=False),
    pa.field("confirmed", pa.int64(), nullable=False),
    pa.field("nacked", pa.int64(), nullable=False),
    pa.field("returned", pa.int64(), nullable=False),
], metadata={"shoal.loadtest.format_version": str(FORMAT_VERSION)})

RECEIVED = pa.schema([
    pa.field("producer", pa.int32(), nullable=False),
    pa.field("seq_start", pa.int64(), nullable=False),
    pa.field("seq_end", pa.int64(), nullable=False),
    pa.field("count", pa.int32(), nullable=False),
], metadata={"shoal.loadtest.format_version": str(FORMAT_VERSION)})

#: File name -> schema, for readers and tests.
FILES = {
    PER_SECOND_FILE: PER_SECOND,
    LATENCY_FILE: LATENCY,
    PRODUCERS_FILE: PRODUCERS,
    RECEIVED_FILE: RECEIVED,
}
