"""Header rewriting for dead-lettered and redelivered messages, as RabbitMQ writes it.

* :func:`dead_letter_header`: adds the ``x-death`` history (RabbitMQ "Dead Letter Exchanges":
  an array of tables, newest first, one per (queue, reason) with ``count``, ``reason``,
  ``queue``, ``time``, ``exchange``, ``routing-keys`` and ``original-expiration`` when the
  message had a per-message TTL, which is removed so the copy does not expire again), plus
  ``x-first-death-*`` (RabbitMQ 3.10 writes no ``x-last-death-*``; 3.13 added them). Returns None for a dead-letter cycle (the message
  already died in this queue and no death in its history was a rejection): it is dropped.
* :func:`send_dead_letter`: sends the copy to a router (REPUBLISH) to be routed;
  :func:`republish` makes that message (with a confirm id for at-least-once
  dead-lettering, node/replication/dead_letters.py).
* :func:`delivery_count_header`: sets ``x-delivery-count`` (failed deliveries so far, as
  RabbitMQ quorum queues do) on a redelivery from a queue with a delivery limit.

The publisher's other headers keep the bytes (and so the field types) it sent; what the broker
writes has RabbitMQ's types: ``count`` and ``x-delivery-count`` are signed 64-bit integers
('l'), ``time`` a timestamp (node/queues/header_table.py). The node calls these only on these paths.
"""
from __future__ import annotations

import datetime
import logging
from typing import Any

from pamqp import decode
from pamqp.commands import Basic

from shoal.shared.wire import TAG_REPUBLISH

from shoal.shared.header_table import Long, array_strings, raw_headers, splice_headers
from shoal.node.queues.message import encode_header, parse_properties
from shoal.node.queues.paging import body_bytes

log = logging.getLogger("shoal.node")

_FIRST_DEATH_KEYS = ("x-first-death-reason", "x-first-death-queue", "x-first-death-exchange")
_CC = frozenset(("CC",))


def _text(v: Any) -> Any:
    return bytes(v).decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else v


def _death(d: dict) -> dict:
    """One x-death table with RabbitMQ's field types."""
    out = {}
    for k, v in d.items():
        if k == "count":
            v = Long(int(v or 0))
        elif isinstance(v, (bytes, bytearray)):
            v = _text(v)
        elif isinstance(v, list):
            v = [_text(x) for x in v]
        out[k] = v
    return out


def dead_letter_header(header: bytes, body_size: int, queue: str, reason: str,
                       exchange: str, routing_key: str, wall_ms: float,
                       drop_cc: bool = False) -> bytes | None:
    """The content-header payload of the dead-lettered copy, or None (cycle: drop it).

    A new death's ``routing-keys`` are the publish's routing key and the message's ``CC``
    keys (sender-selected distribution; ``BCC`` was taken out when it was published).
    ``drop_cc``: the queue has an ``x-dead-letter-routing-key``, which alone routes the copy,
    so its ``CC`` header goes (RabbitMQ 3.10's ``rabbit_dead_letter:make_msg``)."""
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
        cc = array_strings(dict(raw_headers(header) or ()).get("CC", b"")) \
            if b"CC" in header else []
        found = {"count": 1, "reason": reason, "queue": queue, "time": when,
                 "exchange": exchange, "routing-keys": [routing_key, *cc]}
        if props.expiration is not None:
            found["original-expiration"] = props.expiration
    deaths.insert(0, found)
    added: dict[str, Any] = {"x-death": [_death(d) for d in deaths]}
    if "x-first-death-reason" not in headers:
        added.update(zip(_FIRST_DEATH_KEYS, (reason, queue, exchange)))
    props.expiration = None
    return _rewrite(header, props, body_size, added, _CC if drop_cc else frozenset())


def delivery_count_header(header: bytes, body_size: int, count: int) -> bytes:
    """``header`` with ``x-delivery-count`` = ``count`` (a 64-bit integer, as RabbitMQ)."""
    props = parse_properties(header) or Basic.Properties()
    return _rewrite(header, props, body_size, {"x-delivery-count": Long(count)})


def annotated_header(header: bytes, table: bytes) -> bytes:
    """``header`` with the entries of ``table`` (an encoded AMQP 0-9-1 field table: a
    modified outcome's message annotations, AMQP 1.0 3.4.5) set in its headers, replacing
    those of the same key (RabbitMQ 4's ``modify`` merges them into the message). Raises
    ValueError for a table that does not decode."""
    try:
        _, added = decode.field_table(table)
    except Exception as exc:  # noqa: BLE001 - pamqp raises assorted errors on bad bytes
        raise ValueError(f"bad annotations table: {exc}") from None
    props = parse_properties(header) or Basic.Properties()
    return _rewrite(header, props, int.from_bytes(header[4:12], "big"), dict(added))


def _rewrite(header: bytes, props: Basic.Properties, body_size: int,
             added: dict[str, Any], removed: frozenset[str] = frozenset()) -> bytes:
    """``props`` encoded, its headers the publisher's entries as sent (less those in
    ``added`` and ``removed``) followed by ``added``. A headers table that does not split is
    decoded and encoded again instead (pamqp's types)."""
    kept = raw_headers(header)
    if kept is None:
        headers = {k: v for k, v in (props.headers or {}).items() if k not in removed}
        headers.update(added)
        props.headers = headers
        return encode_header(props, body_size)
    props.headers = None
    entries: list = [(k, v) for k, v in kept if k not in added and k not in removed]
    entries += list(added.items())
    return splice_headers(encode_header(props, body_size), entries)


def send_dead_letter(shard: Any, q: Any, entry: Any, reason: str) -> None:
    """Send ``entry`` of queue ``q`` to its x-dead-letter-exchange with an x-death header:
    REPUBLISH to one of ``shard``'s routers (routing needs the exchange cache routers have).
    Dropped, logged, when no router is connected or the message cycles."""
    if not shard.peers:
        log.warning("dropping dead letter from queue '%s': no router connected", q.name)
        return
    msg = republish(shard, q, entry.exchange, entry.routing_key, entry.header,
                    body_bytes(entry.body), reason)
    if msg is not None:
        shard.send(next(iter(shard.peers)), msg)


def republish(shard: Any, q: Any, exchange: str, routing_key: str, header: bytes,
              body: bytes, reason: str, confirm: int = 0) -> list | None:
    """The REPUBLISH (shared/wire.py) of a message of queue ``q`` dead-lettered for
    ``reason``, with ``confirm`` (an id) when the router must confirm it; None for a
    cycle (logged: it is dropped)."""
    t = shard.timers
    copy = dead_letter_header(header, len(body), q.name, reason, exchange, routing_key,
                              t.now + t.wall_offset_ms, drop_cc=q.cfg.dlrk is not None)
    if copy is None:
        log.info("dropping dead letter cycling through queue '%s'", q.name)
        return None
    rk = q.cfg.dlrk if q.cfg.dlrk is not None else routing_key
    msg = [TAG_REPUBLISH, q.vhost, q.cfg.dlx, rk, copy, body]
    if confirm:
        msg.append(confirm)
    return msg
