"""Option parsing for the ``shoal`` Spark data source (strings in, typed values out).

Spark hands every option as a string (``.option("prefetch", 500)`` arrives as ``"500"``);
option names are case-insensitive. Every bad value raises :class:`ShoalSparkError` with a
one-line message naming the option.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shoal.shared.errors import ShoalError


class ShoalSparkError(ShoalError):
    """A bad option or a broker failure seen by the ``shoal`` data source or ``shoal report``.

    ``str(err)`` is one line naming the option, queue or folder at fault.
    """


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
    the first message of a batch.
    """

    url: str
    queue: str
    multiqueue: tuple[str, ...]
    prefetch: int
    max_messages_per_batch: int
    poll_timeout_ms: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
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
    null. ``mandatory`` (default false): publish with the mandatory flag, so an unroutable row
    (``basic.return`` 312 NO_ROUTE) fails the task instead of being dropped by the broker.
    ``deliveryMode`` (1 or 2, default 2 = persistent) for rows without properties.
    """

    url: str
    exchange: str
    routing_key: str
    mandatory: bool
    delivery_mode: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        mode = _int(options, "deliveryMode", 2, 1)
        if mode not in (1, 2):
            raise ShoalSparkError(f"shoal: option deliveryMode={mode} must be 1 or 2")
        return cls(_url(options), str(_get(options, "exchange", "") or ""),
                   str(_get(options, "routingKey", "") or ""),
                   _bool(options, "mandatory", False), mode)
