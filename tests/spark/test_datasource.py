"""The ``shoal`` data source against a real Shoal cluster (``cluster`` fixture): the streaming
source survives a failed and a stopped query without losing a message, the sinks publish every
row with confirms, a row the broker returns (312 NO_ROUTE) or nacks fails the job instead of
vanishing, and bad or misspelled options fail with one clear line."""
from __future__ import annotations

import time

import pika
import pytest

pytest.importorskip("pyspark", reason="pyspark not installed: pip install 'shoal[spark]' "
                                  "runs the Spark tests")
from pyspark.sql import functions as F

DEADLINE_S = 60


def _channel(cluster):
    conn = pika.BlockingConnection(pika.URLParameters(cluster.url))
    return conn, conn.channel()


def _publish(cluster, queue: str, n: int) -> None:
    conn, ch = _channel(cluster)
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish("", queue, f"body-{i}".encode(),
                         pika.BasicProperties(message_id=str(i), content_type="text/plain",
                                              headers={"i": i, "flag": True, "raw": b"x"}))
    conn.close()


def _start(spark, cluster, queue, out, checkpoint, fail_at=None, **opts):
    """A query that appends (message_id, redelivered, batch) to parquet ``out``; with
    ``fail_at`` it writes that batch and then raises (a crash before Spark commits it)."""
    def sink(batch_df, batch_id):
        (batch_df.select(F.col("properties.message_id").alias("id"), "redelivered",
                         F.lit(batch_id).alias("batch"), "headers", "routing_key")
         .write.mode("append").parquet(out))
        if fail_at is not None and batch_id >= fail_at:
            raise RuntimeError("injected failure")

    reader = (spark.readStream.format("shoal").option("url", cluster.url)
              .option("queue", queue))
    for k, v in opts.items():
        reader = reader.option(k, v)
    return (reader.load().writeStream.foreachBatch(sink)
            .option("checkpointLocation", checkpoint).start())


def _ids(spark, out) -> list[str]:
    try:
        return [r.id for r in spark.read.parquet(out).select("id").collect()]
    except Exception:  # noqa: BLE001 - nothing written yet
        return []


def _wait_batches(query, n: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        done = [p for p in query.recentProgress if p["numInputRows"] > 0]
        if len(done) >= n:
            return
        time.sleep(0.2)
    raise AssertionError(f"query did not process {n} non-empty batches in {DEADLINE_S} s")


def test_failed_and_stopped_queries_lose_nothing(spark, cluster, uid, tmp_path):
    queue, n = f"spark-src-{uid}", 300
    _publish(cluster, queue, n)
    out, ck = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    opts = {"maxMessagesPerBatch": 60, "prefetch": 120}

    q1 = _start(spark, cluster, queue, out, ck, fail_at=1, **opts)   # crashes in batch 1
    with pytest.raises(Exception, match="injected failure"):
        q1.awaitTermination(DEADLINE_S)

    q2 = _start(spark, cluster, queue, out, ck, **opts)              # stopped mid-way
    _wait_batches(q2, 1)
    q2.stop()
    assert len(set(_ids(spark, out))) < n, "the stream should have been stopped mid-way"

    q3 = _start(spark, cluster, queue, out, ck, **opts)              # same checkpoint
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(set(_ids(spark, out))) < n and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        q3.stop()
    rows = spark.read.parquet(out).collect()
    assert {r.id for r in rows} == {str(i) for i in range(n)}
    # the crashed batch's messages came back from the broker, flagged as redelivered
    assert any(r.redelivered for r in rows)
    sample = next(r for r in rows if r.id == "7")
    assert sample.headers == {"i": "7", "flag": "true", "raw": "x"}
    assert sample.routing_key == queue


def test_source_row_shape(spark, cluster, uid):
    queue = f"spark-shape-{uid}"
    _publish(cluster, queue, 3)
    q = (spark.readStream.format("shoal").option("url", cluster.url).option("queue", queue)
         .load().writeStream.format("memory").queryName(f"shape_{uid}").start())
    try:
        deadline = time.monotonic() + DEADLINE_S
        while spark.sql(f"select count(*) from shape_{uid}").first()[0] < 3:
            assert time.monotonic() < deadline, "no rows from the source"
            time.sleep(0.2)
    finally:
        q.stop()
    row = spark.sql(f"select * from shape_{uid} order by properties.message_id").first()
    assert bytes(row.body) == b"body-0"
    assert row.exchange == "" and row.routing_key == queue and row.redelivered is False
    assert row.properties.content_type == "text/plain"
    assert row.properties.message_id == "0"
    assert row.timestamp is not None


def test_batch_and_stream_sinks_publish_every_row(spark, cluster, uid, tmp_path):
    queue = f"spark-sink-{uid}"
    conn, ch = _channel(cluster)
    ch.queue_declare(queue)
    df = (spark.range(300).repartition(3)
          .select(F.concat(F.lit("row-"), F.col("id").cast("string")).alias("body"),
                  F.create_map(F.lit("n"), F.col("id").cast("string")).alias("headers"),
                  F.struct(F.col("id").cast("string").alias("message_id")).alias("properties")))
    df.write.format("shoal").option("url", cluster.url).option("routingKey", queue) \
        .mode("append").save()

    stream = (spark.readStream.format("rate").option("rowsPerSecond", 200).load()
              .where(F.col("value") < 200)
              .select(F.concat(F.lit("tick-"), F.col("value").cast("string")).alias("body"),
                      F.lit(queue).alias("routing_key")))
    # queryName and checkpointLocation reach the sink's options: Spark adds them, shoal accepts
    q = (stream.writeStream.format("shoal").option("url", cluster.url).queryName(f"sink_{uid}")
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    got: dict[bytes, dict] = {}
    want = {f"row-{i}".encode() for i in range(300)} | {f"tick-{i}".encode() for i in range(200)}
    deadline = time.monotonic() + DEADLINE_S
    try:
        while not want <= set(got) and time.monotonic() < deadline:
            method, props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                time.sleep(0.1)
                continue
            got[body] = {"headers": props.headers, "message_id": props.message_id}
    finally:
        q.stop()
        conn.close()
    assert want <= set(got), f"missing {len(want - set(got))} of {len(want)} rows"
    assert got[b"row-42"] == {"headers": {"n": "42"}, "message_id": "42"}


def test_multiqueue_option_consumes_every_queue(spark, cluster, uid):
    queues = cluster.queues_on_distinct_nodes(2, prefix=f"spark-mq-{uid}")
    for i, q in enumerate(queues):
        _publish(cluster, q, 5 + i)
    name = f"mq_{uid}"
    q = (spark.readStream.format("shoal").option("url", cluster.url)
         .option("multiqueue", ",".join(queues)).load()
         .writeStream.format("memory").queryName(name).start())
    try:
        deadline = time.monotonic() + DEADLINE_S
        while spark.sql(f"select count(*) from {name}").first()[0] < 11:
            assert time.monotonic() < deadline, "multiqueue consumer did not get every message"
            time.sleep(0.2)
    finally:
        q.stop()
    keys = [r.routing_key for r in spark.sql(f"select routing_key from {name}").collect()]
    assert sorted(keys) == sorted([queues[0]] * 5 + [queues[1]] * 6)


def test_missing_url_and_unknown_queue_fail_clearly(spark, cluster, uid):
    with pytest.raises(Exception, match="option url is required"):
        spark.readStream.format("shoal").option("queue", "x").load() \
            .writeStream.format("memory").queryName(f"bad_{uid}").start().awaitTermination(30)
    q = (spark.readStream.format("shoal").option("url", cluster.url)
         .option("queue", f"missing-{uid}").load()
         .writeStream.format("memory").queryName(f"bad2_{uid}").start())
    with pytest.raises(Exception, match="404"):
        q.awaitTermination(DEADLINE_S)


def _bodies(spark, n: int):
    """One partition of ``n`` rows with body ``row-<i>``, in order."""
    return (spark.range(n).coalesce(1)
            .select(F.concat(F.lit("row-"), F.col("id").cast("string")).alias("body")))


def _drain(cluster, queue: str) -> list[bytes]:
    """Every body now in ``queue``, in queue order (taken off it)."""
    conn, ch = _channel(cluster)
    try:
        bodies = []
        while True:
            method, _props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                return bodies
            bodies.append(body)
    finally:
        conn.close()


def test_misspelled_options_fail_naming_the_option(spark, cluster, uid, tmp_path):
    queue = f"spark-typo-{uid}"
    conn, ch = _channel(cluster)
    ch.queue_declare(queue)
    conn.close()
    with pytest.raises(Exception) as info:
        _bodies(spark, 3).write.format("shoal").option("url", cluster.url) \
            .option("routing_key", queue).mode("append").save()
    assert "unknown option 'routing_key' (did you mean 'routingKey'?)" in str(info.value)
    assert _drain(cluster, queue) == []

    q = (spark.readStream.format("rate").load().selectExpr("cast(value as string) as body")
         .writeStream.format("shoal").option("url", cluster.url).option("routingkey", queue)
         .option("deliverymod", "1").option("checkpointLocation", str(tmp_path / "ck")).start())
    with pytest.raises(Exception, match=r"unknown option 'deliverymod' \(did you mean "
                                        r"'deliveryMode'\?\)"):
        q.awaitTermination(DEADLINE_S)

    with pytest.raises(Exception, match=r"unknown option 'queues' \(did you mean 'queue'\?\)"):
        spark.readStream.format("shoal").option("url", cluster.url).option("queues", queue) \
            .load().writeStream.format("memory").queryName(f"typo_{uid}").start() \
            .awaitTermination(DEADLINE_S)


def test_unroutable_rows_fail_the_job(spark, cluster, uid, tmp_path):
    nowhere = f"spark-nowhere-{uid}"           # default exchange, no such queue
    with pytest.raises(Exception) as info:
        _bodies(spark, 5).write.format("shoal").option("url", cluster.url) \
            .option("routingKey", nowhere).mode("append").save()
    message = str(info.value)
    assert "ShoalSparkError" in message and "312 NO_ROUTE" in message
    assert f"routing key '{nowhere}'" in message

    # a mixed DataFrame: the job fails on the one row no queue takes, the others arrive
    queue = f"spark-mixed-{uid}"
    conn, ch = _channel(cluster)
    ch.queue_declare(queue)
    conn.close()
    mixed = _bodies(spark, 10).withColumn(
        "routing_key", F.when(F.col("body") == "row-4", F.lit(nowhere)).otherwise(F.lit(queue)))
    with pytest.raises(Exception, match="312 NO_ROUTE"):
        mixed.write.format("shoal").option("url", cluster.url).mode("append").save()
    assert set(_drain(cluster, queue)) == {f"row-{i}".encode() for i in range(4)}

    # the streaming sink fails its query the same way
    q = (spark.readStream.format("rate").option("rowsPerSecond", 5).load()
         .selectExpr("cast(value as string) as body").writeStream.format("shoal")
         .option("url", cluster.url).option("routingKey", nowhere)
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    with pytest.raises(Exception, match="312 NO_ROUTE"):
        q.awaitTermination(DEADLINE_S)

    # dropping unroutable rows is an explicit choice
    _bodies(spark, 5).write.format("shoal").option("url", cluster.url) \
        .option("routingKey", nowhere).option("mandatory", "false").mode("append").save()


def test_nacked_rows_fail_the_job(spark, cluster, uid):
    queue = f"spark-full-{uid}"
    conn, ch = _channel(cluster)
    ch.queue_declare(queue, arguments={"x-max-length": 3, "x-overflow": "reject-publish"})
    conn.close()
    with pytest.raises(Exception) as info:
        _bodies(spark, 10).write.format("shoal").option("url", cluster.url) \
            .option("routingKey", queue).mode("append").save()
    assert "ShoalSparkError" in str(info.value) and "basic.nack" in str(info.value)
    assert _drain(cluster, queue) == [f"row-{i}".encode() for i in range(3)]
