"""Option parsing for the ``shoal`` Spark data source (strings in, typed values out).

Spark hands every option as a string (``.option("prefetch", 500)`` arrives as ``"500"``) in a
case-insensitive mapping whose keys it has lowercased; option names are case-insensitive here
too. Every unknown option name and every bad value raises :class:`ShoalSparkError` with a
one-line message naming the option (issue 21: a misspelled option used to be ignored).

Keys Spark itself puts into ``DataSource.options`` (measured with PySpark 4.3, local session):

- ``df.writeStream``: ``checkpointLocation`` (the option, which Spark reads itself) and
  ``queryName`` (from ``.queryName(name)``); both are accepted by the streaming sink and ignored;
- ``.load(path)``, ``.save(path)``, ``.start(path)``: ``path`` (``paths`` for a batch read of
  several); shoal has no use for a path, so it is refused with its own message;
- nothing else: ``trigger``, ``outputMode``, ``spark.sql.streaming.checkpointLocation`` and
  ``spark.datasource.shoal.*`` session settings never reach the options.
"""
from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass

from shoal.shared.errors import ShoalError


class ShoalSparkError(ShoalError):
    """A bad option or a broker failure seen by the ``shoal`` data source or ``shoal report``.

    ``str(err)`` is one line naming the option, queue or folder at fault.
    """


#: Option names of the streaming source, spelled as documented (matching ignores case).
SOURCE_OPTIONS = ("url", "queue", "multiqueue", "prefetch", "maxMessagesPerBatch",
                  "pollTimeoutMs")
#: Option names of the batch and streaming sinks.
SINK_OPTIONS = ("url", "exchange", "routingKey", "mandatory", "deliveryMode")
#: Keys Spark adds to a ``writeStream``'s options for itself; the sink accepts and ignores them.
SPARK_STREAM_SINK_KEYS = ("checkpointLocation", "queryName")
_PATH_KEYS = ("path", "paths")


def check_names(options: Mapping[str, str], valid: tuple[str, ...], api: str,
                spark_keys: tuple[str, ...] = ()) -> None:
    """Refuse option names that are neither in ``valid`` nor in ``spark_keys`` (case-insensitive).

    ``options``: Spark's option mapping; ``valid``: the connector's option names; ``api``: the
    call named in the message (``df.write.format("shoal")``); ``spark_keys``: keys Spark adds
    itself (accepted, ignored). Raises :class:`ShoalSparkError`, one line naming every unknown
    option, the nearest valid name for a near miss (``difflib.get_close_matches``) and the valid
    names. ``path``/``paths`` (from ``.load(path)``, ``.save(path)``, ``.start(path)``) get
    their own explanation. Rule: issue 21 (no option is silently ignored).
    """
    known = {name.lower() for name in valid + spark_keys}
    unknown = sorted((str(k) for k in options if str(k).lower() not in known), key=str.lower)
    if not unknown:
        return
    by_lower = {name.lower(): name for name in valid}
    described = []
    for key in unknown:
        if key.lower() in _PATH_KEYS:
            described.append(f"'{key}' (shoal takes no path: call .load(), .save() or "
                             ".start() without one)")
            continue
        near = difflib.get_close_matches(key.lower(), list(by_lower), n=1)
        described.append(f"'{key}' (did you mean '{by_lower[near[0]]}'?)" if near
                         else f"'{key}'")
    plural = "s" if len(unknown) > 1 else ""
    extra = (f", plus Spark's {' and '.join(spark_keys)}" if spark_keys else "")
    raise ShoalSparkError(f"shoal: unknown option{plural} {', '.join(described)} for {api}; "
                          f"valid options: {', '.join(valid)}{extra}")


def _get(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    for key, value in options.items():
        if key.lower() == name.lower():
            return value
    return default


def _int(options: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = _get(options, name)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ShoalSparkError(f"shoal: option {name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ShoalSparkError(f"shoal: option {name}={value} must be >= {minimum}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ShoalSparkError(f"shoal: option {name}={raw!r} is not true or false")


def _url(options: Mapping[str, str]) -> str:
    url = _get(options, "url")
    if not url:
        raise ShoalSparkError("shoal: option url is required "
                              "(e.g. amqp://guest:guest@127.0.0.1:5672/%2F)")
    if not str(url).startswith(("amqp://", "amqps://")):
        raise ShoalSparkError(f"shoal: option url={url!r} is not an amqp:// or amqps:// URL")
    return str(url)


@dataclass(frozen=True)
class SourceOptions:
    """Options of ``spark.readStream.format("shoal")``.

    ``url`` (required): AMQP URL. ``queue``: the queue to consume. ``multiqueue``: comma list of
    queues consumed by ONE consumer through the Qpid/Shoal ``x-multiqueue`` consume argument
    (``queue`` is then optional). ``prefetch`` (messages, default 2000) is the consumer's
    ``basic.qos prefetch_count``; ``maxMessagesPerBatch`` (default 1000) caps one micro-batch and
    must not exceed ``prefetch``. ``pollTimeoutMs`` (default 500): how long one trigger waits for
    the first message of a batch. No other name is accepted (:data:`SOURCE_OPTIONS`).
    """

    url: str
    queue: str
    multiqueue: tuple[str, ...]
    prefetch: int
    max_messages_per_batch: int
    poll_timeout_ms: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Spark's option mapping (names case-insensitive, values strings) -> SourceOptions.

        Raises :class:`ShoalSparkError` (one line) for an unknown name (:func:`check_names`),
        a missing or non-AMQP ``url``, neither ``queue`` nor ``multiqueue``, a non-integer or
        too small number, or ``prefetch < maxMessagesPerBatch``.
        """
        check_names(options, SOURCE_OPTIONS, 'spark.readStream.format("shoal")')
        url = _url(options)
        queue = str(_get(options, "queue", "") or "")
        multi = tuple(q.strip() for q in str(_get(options, "multiqueue", "") or "").split(",")
                      if q.strip())
        if not queue and not multi:
            raise ShoalSparkError("shoal: option queue (or multiqueue) is required for "
                                  "readStream")
        max_batch = _int(options, "maxMessagesPerBatch", 1000, 1)
        prefetch = _int(options, "prefetch", max(2000, max_batch), 1)
        if prefetch < max_batch:
            raise ShoalSparkError(f"shoal: option prefetch={prefetch} must be >= "
                                  f"maxMessagesPerBatch={max_batch}")
        return cls(url, queue, multi, prefetch, max_batch,
                   _int(options, "pollTimeoutMs", 500, 0))


@dataclass(frozen=True)
class SinkOptions:
    """Options of ``df.write.format("shoal")`` and ``df.writeStream.format("shoal")``.

    ``url`` (required). ``exchange`` (default ``""``, the default exchange) and ``routingKey``
    (default ``""``) apply to rows whose ``exchange`` / ``routing_key`` column is missing or
    null. ``mandatory`` (default true): the ``basic.publish`` mandatory bit (spec 1.8.3.7), so
    an unroutable row comes back as ``basic.return`` 312 NO_ROUTE (spec 1.8.3.8) and fails the
    task; ``false`` is the explicit opt-in to let the broker drop such rows. ``deliveryMode``
    (1 or 2, default 2 = persistent) for rows without properties. No other name is accepted
    (:data:`SINK_OPTIONS`; a ``writeStream`` also takes :data:`SPARK_STREAM_SINK_KEYS`).
    """

    url: str
    exchange: str
    routing_key: str
    mandatory: bool
    delivery_mode: int

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool = False) -> SinkOptions:
        """Spark's option mapping (names case-insensitive, values strings) -> SinkOptions.

        ``streaming``: the options of a ``writeStream`` (then Spark's ``checkpointLocation``
        and ``queryName`` are accepted). Raises :class:`ShoalSparkError` (one line) for an
        unknown name (:func:`check_names`), a missing or non-AMQP ``url``, a ``mandatory`` that
        is not true/false or a ``deliveryMode`` other than 1 or 2.
        """
        if streaming:
            check_names(options, SINK_OPTIONS, 'df.writeStream.format("shoal")',
                        SPARK_STREAM_SINK_KEYS)
        else:
            check_names(options, SINK_OPTIONS, 'df.write.format("shoal")')
        mode = _int(options, "deliveryMode", 2, 1)
        if mode not in (1, 2):
            raise ShoalSparkError(f"shoal: option deliveryMode={mode} must be 1 or 2")
        return cls(_url(options), str(_get(options, "exchange", "") or ""),
                   str(_get(options, "routingKey", "") or ""),
                   _bool(options, "mandatory", True), mode)
