"""Header rewriting for dead-lettered and redelivered messages, as RabbitMQ writes it.

* :func:`dead_letter_header`: adds the ``x-death`` history (RabbitMQ "Dead Letter Exchanges":
  an array of tables, newest first, one per (queue, reason) with ``count``, ``reason``,
  ``queue``, ``time``, ``exchange``, ``routing-keys`` and ``original-expiration`` when the
  message had a per-message TTL, which is removed so the copy does not expire again), plus
  ``x-first-death-*`` and ``x-last-death-*``. Returns None for a dead-letter cycle (the message
  already died in this queue and no death in its history was a rejection): it is dropped.
* :func:`delivery_count_header`: sets ``x-delivery-count`` (failed deliveries so far, as
  RabbitMQ quorum queues do) on a redelivery from a queue with a delivery limit.

Both decode with pamqp and re-encode; the node calls them only on these paths.
"""
from __future__ import annotations

import datetime
from typing import Any

from pamqp.commands import Basic

from .message import encode_header, parse_properties


def _text(v: Any) -> Any:
    return bytes(v).decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else v


def dead_letter_header(header: bytes, body_size: int, queue: str, reason: str,
                       exchange: str, routing_key: str, wall_ms: float) -> bytes | None:
    """The content-header payload of the dead-lettered copy, or None (cycle: drop it)."""
    props = parse_properties(header) or Basic.Properties()
    headers = dict(props.headers or {})
    deaths = [dict(d) for d in headers.get("x-death") or [] if isinstance(d, dict)]
    if reason != "rejected" and any(_text(d.get("queue")) == queue for d in deaths) and \
            not any(_text(d.get("reason")) == "rejected" for d in deaths):
        return None
    when = datetime.datetime.fromtimestamp(int(wall_ms // 1000), tz=datetime.timezone.utc)
    found = None
    for d in deaths:
        if _text(d.get("queue")) == queue and _text(d.get("reason")) == reason:
            found = d
            break
    if found is not None:
        deaths.remove(found)
        found["count"] = int(found.get("count") or 0) + 1
        found["time"] = when
    else:
        found = {"count": 1, "reason": reason, "queue": queue, "time": when,
                 "exchange": exchange, "routing-keys": [routing_key]}
        if props.expiration is not None:
            found["original-expiration"] = props.expiration
    deaths.insert(0, found)
    headers["x-death"] = deaths
    if "x-first-death-reason" not in headers:
        headers["x-first-death-reason"] = reason
        headers["x-first-death-queue"] = queue
        headers["x-first-death-exchange"] = exchange
    headers["x-last-death-reason"] = reason
    headers["x-last-death-queue"] = queue
    headers["x-last-death-exchange"] = exchange
    props.headers = headers
    props.expiration = None
    return encode_header(props, body_size)


def delivery_count_header(header: bytes, body_size: int, count: int) -> bytes:
    """``header`` with ``x-delivery-count`` = ``count``."""
    props = parse_properties(header) or Basic.Properties()
    headers = dict(props.headers or {})
    headers["x-delivery-count"] = count
    props.headers = headers
    return encode_header(props, body_size)
