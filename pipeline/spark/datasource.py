"""``shoal``: a Spark 4 Python data source for AMQP 0-9-1 queues (any broker: Shoal, RabbitMQ).

Register it with :func:`shoal.pipeline.spark.register` (or ``spark.dataSource.register(
ShoalDataSource)``), then::

    spark.readStream.format("shoal").option("url", URL).option("queue", "q").load()
    df.writeStream.format("shoal").option("url", URL).option("checkpointLocation", d).start()
    df.write.format("shoal").option("url", URL).mode("append").save()

Source rows have :data:`SOURCE_SCHEMA`. Delivery is at-least-once: the stream reader runs on
the driver (``SimpleDataSourceStreamReader``) and keeps one consumer connection whose
deliveries stay unacknowledged until Spark has committed the micro-batch that holds them
(``basic.ack`` with ``multiple=True`` up to the batch's last ``delivery_tag``, spec 1.8.3.13).
If the query fails or stops, the connection closes and the broker requeues the unacknowledged
messages with ``redelivered=true`` (spec 1.8, "basic.recover" semantics of a closed channel):
a restarted query on the same checkpoint gets them again. A batch replayed from the write-ahead
log after a restart is therefore empty (AMQP cannot re-read a range); its messages arrive in the
following batches instead. Not supported: ``asyncProgressTrackingEnabled`` (the reader acks
a batch once Spark asks for the batch after it, which assumes synchronous commits).

The sink publishes every row with publisher confirms (RabbitMQ extension ``confirm.select``) and
the mandatory flag (unless ``mandatory=false``), and returns its commit message only when the
broker has confirmed every row of the partition; a ``basic.nack`` or a ``basic.return`` (312
NO_ROUTE) fails the task with :class:`ShoalSparkError`, and Spark retries or fails the job. An
unknown option fails the query or job before anything runs. Options:
:class:`~shoal.pipeline.spark.options.SourceOptions`,
:class:`~shoal.pipeline.spark.options.SinkOptions`.
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import queue as _queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamWriter,
    DataSourceWriter,
    SimpleDataSourceStreamReader,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .options import ShoalSparkError, SinkOptions, SourceOptions

log = logging.getLogger(__name__)

#: basic.properties (spec 1.8.2), as a struct; ``timestamp`` is the AMQP timestamp (seconds).
PROPERTIES_SCHEMA = StructType([
    StructField("content_type", StringType()),
    StructField("content_encoding", StringType()),
    StructField("delivery_mode", IntegerType()),
    StructField("priority", IntegerType()),
    StructField("correlation_id", StringType()),
    StructField("reply_to", StringType()),
    StructField("expiration", StringType()),
    StructField("message_id", StringType()),
    StructField("timestamp", TimestampType()),
    StructField("type", StringType()),
    StructField("user_id", StringType()),
    StructField("app_id", StringType()),
])

#: Rows of ``readStream.format("shoal")``. ``headers`` values are stringified (bytes as UTF-8,
#: booleans as true/false, tables and arrays as JSON). ``timestamp`` is when the connector
#: received the delivery (wall clock, UTC). ``delivery_tag`` is per connection.
SOURCE_SCHEMA = StructType([
    StructField("body", BinaryType()),
    StructField("routing_key", StringType()),
    StructField("exchange", StringType()),
    StructField("headers", MapType(StringType(), StringType())),
    StructField("properties", PROPERTIES_SCHEMA),
    StructField("redelivered", BooleanType()),
    StructField("timestamp", TimestampType()),
    StructField("delivery_tag", LongType()),
])

_PROPERTY_NAMES = [f.name for f in PROPERTIES_SCHEMA.fields]


def stringify(value: Any) -> str | None:
    """A header value as a string: ``None`` stays null, bytes are decoded as UTF-8 (invalid
    bytes replaced), booleans are ``true``/``false``, tables and arrays are JSON."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=stringify, sort_keys=True)
    return str(value)


def _utc(seconds: float | None) -> _dt.datetime | None:
    if seconds is None:
        return None
    return _dt.datetime.fromtimestamp(seconds, tz=_dt.UTC)


def _properties_row(props: Any) -> tuple:
    out = []
    for name in _PROPERTY_NAMES:
        value = getattr(props, name, None)
        if name == "timestamp":
            value = _utc(value) if isinstance(value, (int, float)) else None
        elif name in ("delivery_mode", "priority"):
            value = int(value) if value is not None else None
        elif value is not None:
            value = str(value)
        out.append(value)
    return tuple(out)


class ShoalDataSource(DataSource):
    """The ``shoal`` format: streaming source, streaming sink and batch sink."""

    @classmethod
    def name(cls) -> str:
        return "shoal"

    def schema(self) -> StructType:
        return SOURCE_SCHEMA

    def simpleStreamReader(self, schema: StructType) -> ShoalStreamReader:
        return ShoalStreamReader(SourceOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> ShoalWriter:
        return ShoalWriter(SinkOptions.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> ShoalStreamWriter:
        return ShoalStreamWriter(SinkOptions.parse(self.options, streaming=True), schema)


# --------------------------------------------------------------------------- source


class _Consumer:
    """One pika BlockingConnection owned by a background thread (pika is not thread-safe):
    the thread consumes into ``inbox`` and keeps heartbeats going; other threads ask it to
    ack through ``add_callback_threadsafe``. A broker or connection error is kept in
    ``error`` and raised by the reader's next call."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.inbox: _queue.Queue = _queue.Queue()
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._conn = None
        self._channel = None
        self._thread = threading.Thread(target=self._run, name="shoal-spark-consumer",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(30.0):
            raise ShoalSparkError(f"shoal: no connection to {_safe(opts.url)} within 30 s")
        self.check()

    def _run(self) -> None:
        import pika
        try:
            self._conn = pika.BlockingConnection(pika.URLParameters(self.opts.url))
            ch = self._conn.channel()
            ch.basic_qos(prefetch_count=self.opts.prefetch)
            args = {"x-multiqueue": list(self.opts.multiqueue)} if self.opts.multiqueue else None
            ch.basic_consume(self.opts.queue, self._on_message, arguments=args)
            self._channel = ch
        except BaseException as exc:  # noqa: BLE001 - handed to the reader, raised there
            self.error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            while not self._stop.is_set():
                self._conn.process_data_events(time_limit=0.05)
        except BaseException as exc:  # noqa: BLE001 - handed to the reader, raised there
            if not self._stop.is_set():
                self.error = exc
        finally:
            try:
                if self._conn.is_open:
                    self._conn.close()
            except Exception as exc:  # noqa: BLE001 - closing a broken connection
                log.debug("shoal source: closing the connection failed: %r", exc)

    def _on_message(self, channel, method, properties, body) -> None:
        headers = {str(k): stringify(v) for k, v in (properties.headers or {}).items()}
        self.inbox.put((bytes(body), method.routing_key, method.exchange, headers,
                        _properties_row(properties), bool(method.redelivered),
                        _dt.datetime.now(tz=_dt.UTC), int(method.delivery_tag)))

    def check(self) -> None:
        if self.error is not None:
            what = self.opts.queue or ",".join(self.opts.multiqueue)
            raise ShoalSparkError(f"shoal: consuming from {what!r} at {_safe(self.opts.url)} "
                                  f"failed: {self.error!r}") from self.error

    def ack_up_to(self, delivery_tag: int) -> None:
        """``basic.ack(delivery_tag, multiple=True)`` on the consumer thread."""
        self.check()
        ch = self._channel
        self._conn.add_callback_threadsafe(
            lambda: ch.basic_ack(delivery_tag=delivery_tag, multiple=True))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)


def _safe(url: str) -> str:
    """The URL without its password, for messages."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        cred, host = rest.rsplit("@", 1)
        return f"{scheme}://{cred.split(':', 1)[0]}@{host}"
    return url


@dataclass
class _PendingBatch:
    end_seq: int
    last_tag: int


class ShoalStreamReader(SimpleDataSourceStreamReader):
    """Driver-side reader. Offsets are ``{"seq": n}``: n messages handed to Spark since the
    query began (a counter kept in the checkpoint, not a broker position)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._consumer: _Consumer | None = None
        self._pending: list[_PendingBatch] = []

    def _get_consumer(self) -> _Consumer:
        if self._consumer is None:
            self._consumer = _Consumer(self.opts)
        self._consumer.check()
        return self._consumer

    def initialOffset(self) -> dict:
        return {"seq": 0}

    def read(self, start: dict) -> tuple[Iterator[tuple], dict]:
        """Up to ``maxMessagesPerBatch`` deliveries (waits up to ``pollTimeoutMs`` for the
        first). Spark asks for batch N+1 only after batch N is in its commit log, so every
        batch ending at or before ``start`` is acknowledged here too (a no-op when
        :meth:`commit` already did it)."""
        consumer = self._get_consumer()
        start_seq = int(start["seq"])
        self._ack_through(start_seq)
        rows: list[tuple] = []
        try:
            rows.append(consumer.inbox.get(timeout=self.opts.poll_timeout_ms / 1000))
        except _queue.Empty:
            consumer.check()
            return iter(()), {"seq": start_seq}
        while len(rows) < self.opts.max_messages_per_batch:
            try:
                rows.append(consumer.inbox.get_nowait())
            except _queue.Empty:
                break
        end_seq = start_seq + len(rows)
        self._pending.append(_PendingBatch(end_seq, rows[-1][-1]))
        return iter(rows), {"seq": end_seq}

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[tuple]:
        """A batch replayed after a restart: empty. Its messages were never acknowledged, so
        the broker requeued them (redelivered=true) and later batches carry them."""
        return iter(())

    def commit(self, end: dict) -> None:
        """Spark has committed every batch up to ``end``: ack their deliveries."""
        self._ack_through(int(end["seq"]))

    def _ack_through(self, seq: int) -> None:
        done = [b for b in self._pending if b.end_seq <= seq]
        if not done:
            return
        self._pending = [b for b in self._pending if b.end_seq > seq]
        self._get_consumer().ack_up_to(max(b.last_tag for b in done))

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


# --------------------------------------------------------------------------- sink


@dataclass
class ShoalCommitMessage(WriterCommitMessage):
    """What one write task reports: ``published`` rows, every one confirmed by the broker."""

    published: int


class _Publisher:
    """Publishes rows with publisher confirms on one BlockingConnection (one per task)."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.opts = opts
        self.fields = set(schema.fieldNames())
        if "body" not in self.fields:
            raise ShoalSparkError("shoal: the DataFrame written to shoal needs a 'body' column "
                                  f"(binary or string); it has {sorted(self.fields)}")

    def publish_all(self, rows: Iterator[Any]) -> ShoalCommitMessage:
        import pika
        import pika.exceptions as pe
        conn = pika.BlockingConnection(pika.URLParameters(self.opts.url))
        count = 0
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            for row in rows:
                d = row.asDict(recursive=True)
                exchange = d.get("exchange") or self.opts.exchange
                key = d.get("routing_key")
                key = self.opts.routing_key if key is None else key
                try:
                    # With confirms on, pika's basic_publish returns once the broker acked it;
                    # it raises NackError on basic.nack and UnroutableError when a
                    # basic.return came before the ack (mandatory and no queue took it).
                    ch.basic_publish(exchange, key, _body(d.get("body")),
                                     self._properties(d), mandatory=self.opts.mandatory)
                except pe.NackError:
                    raise ShoalSparkError(
                        f"shoal: the broker refused (basic.nack) row {count + 1} of this task, "
                        f"to exchange {exchange!r} routing key {key!r} (a queue full with "
                        f"x-overflow=reject-publish, or a broker failure); {count} earlier "
                        f"rows were confirmed") from None
                except pe.UnroutableError as exc:
                    raise ShoalSparkError(
                        f"shoal: unroutable row {count + 1} of this task ({_returned(exc)}): "
                        f"exchange {exchange!r} routes routing key {key!r} to no queue; "
                        f"{count} earlier rows were confirmed. Bind a queue, or set option "
                        f"mandatory=false to let the broker drop such rows") from None
                count += 1
        finally:
            if conn.is_open:
                conn.close()
        return ShoalCommitMessage(count)

    def _properties(self, d: dict) -> Any:
        import pika
        kw: dict[str, Any] = {"delivery_mode": self.opts.delivery_mode}
        props = d.get("properties") or {}
        for name, value in props.items():
            if value is None or name not in _PROPERTY_NAMES:
                continue
            if name == "timestamp" and isinstance(value, _dt.datetime):
                value = int(value.timestamp())
            kw[name] = value
        headers = d.get("headers")
        if headers:
            kw["headers"] = dict(headers)
        return pika.BasicProperties(**kw)


def _returned(exc: Exception) -> str:
    """``"312 NO_ROUTE"`` from pika's UnroutableError (its ``messages`` hold the basic.return)."""
    for message in getattr(exc, "messages", None) or []:
        method = getattr(message, "method", None)
        if method is not None and getattr(method, "reply_code", None):
            return f"{method.reply_code} {method.reply_text}"
    return "312 NO_ROUTE"


def _body(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return str(value).encode("utf-8")


class ShoalWriter(DataSourceWriter):
    """Batch ``df.write.format("shoal")``: each task publishes its partition (confirmed)."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.publisher = _Publisher(opts, schema)

    def write(self, iterator: Iterator[Any]) -> ShoalCommitMessage:
        return self.publisher.publish_all(iterator)


class ShoalStreamWriter(DataSourceStreamWriter):
    """Streaming ``df.writeStream.format("shoal")``: each micro-batch task publishes its rows
    (confirmed) before the batch can commit. A failed batch is retried whole by Spark, so a
    consumer may see a row twice (at-least-once)."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.publisher = _Publisher(opts, schema)

    def write(self, iterator: Iterator[Any]) -> ShoalCommitMessage:
        return self.publisher.publish_all(iterator)

    def commit(self, messages: list, batchId: int) -> None:
        total = sum(m.published for m in messages if m is not None)
        log.info("shoal sink: batch %d committed, %d messages confirmed", batchId, total)
