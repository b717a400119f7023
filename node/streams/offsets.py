"""Where a stream consumer starts: RabbitMQ's ``x-stream-offset`` (rabbit_stream_queue.erl
``parse_offset_arg``), and the ``x-max-age`` durations it shares with retention
(rabbit_amqqueue.erl ``check_max_age``).

An offset spec is one of:

- ``"first"``: the first message still held; ``"last"``: the first message of the last
  chunk written (a chunk is what one publishing turn wrote); ``"next"`` (the default):
  only messages published from now on;
- an integer: that offset (clamped to what is held: before the first, the first; after the
  last, next);
- a timestamp (AMQP 0-9-1 field type ``T``, seconds): the first chunk written at that time
  or later;
- a duration string such as ``"1h"`` or ``"30m"`` (``Y``, ``M``, ``D``, ``h``, ``m``,
  ``s``): the first chunk written that long ago or later.
"""
from __future__ import annotations

import datetime
import re
from typing import Any

FIRST = "first"
LAST = "last"
NEXT = "next"
OFFSET = "offset"
TIMESTAMP = "timestamp"

_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "D": 86_400_000,
            "M": 30 * 86_400_000, "Y": 365 * 86_400_000}
_AGE = re.compile(r"([0-9]+)(.*)", re.S)


class Timestamp(int):
    """An AMQP 0-9-1 timestamp (field type ``T``, seconds since the epoch), kept apart from
    an integer offset. Over the wire the router sends such a value as ``{"timestamp":
    seconds}`` (msgpack has no timestamp type here), which is read the same way."""


def parse_max_age(value: Any) -> int:
    """``x-max-age`` (or an ``x-stream-offset`` duration) in ms. Raises ValueError
    ``invalid_max_age`` (RabbitMQ's reason) unless a positive integer and one of the units
    Y, M, D, h, m, s."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    if not isinstance(value, str):
        raise ValueError("invalid_max_age")
    m = _AGE.fullmatch(value)
    if m is None or m.group(2) not in _UNIT_MS or int(m.group(1)) <= 0:
        raise ValueError("invalid_max_age")
    return int(m.group(1)) * _UNIT_MS[m.group(2)]


def parse_offset_spec(value: Any, now_ms: int) -> tuple[str, int]:
    """``(kind, value)`` for an ``x-stream-offset`` argument (None: absent, so ``next``).
    ``kind`` is one of first, last, next (value 0), offset (the offset) or timestamp (epoch
    ms; a duration is turned into one from ``now_ms``). Raises ValueError with RabbitMQ's
    reason (``invalid_max_age`` for a bad duration)."""
    if value is None:
        return NEXT, 0
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, datetime.datetime):
        return TIMESTAMP, int(value.timestamp()) * 1000
    if isinstance(value, Timestamp):
        return TIMESTAMP, int(value) * 1000
    if isinstance(value, dict) and isinstance(value.get("timestamp"), int):
        # a 0-9-1 timestamp as the router passes it (router/frontend/channel.py)
        return TIMESTAMP, value["timestamp"] * 1000
    if value in (FIRST, LAST, NEXT):
        return value, 0
    if isinstance(value, str):
        return TIMESTAMP, now_ms - parse_max_age(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return OFFSET, value
    raise ValueError(f"{{invalid_offset_arg,{value!r}}}")


def start_offset(spec: tuple[str, int], first: int, next_offset: int, last_chunk: int | None,
                 seek_time: Any) -> int:
    """The offset a consumer with ``spec`` starts at, in a log holding ``first`` up to
    ``next_offset`` (exclusive) whose last chunk starts at ``last_chunk``; ``seek_time(ms)``
    gives the first chunk written at that time or later (segments.py)."""
    kind, v = spec
    if kind == FIRST:
        return first
    if kind == LAST:
        return next_offset if last_chunk is None else last_chunk
    if kind == NEXT:
        return next_offset
    if kind == OFFSET:
        return min(max(v, first), next_offset)
    return seek_time(v)
