"""Header rewriting for dead-lettered and redelivered messages, as RabbitMQ writes it.

* :func:`dead_letter_header`: adds the ``x-death`` history (RabbitMQ "Dead Letter Exchanges":
  an array of tables, newest first, one per (queue, reason) with ``count``, ``reason``,
  ``queue``, ``time``, ``exchange``, ``routing-keys`` and ``original-expiration`` when the
  message had a per-message TTL, which is removed so the copy does not expire again), plus
  ``x-first-death-*`` (RabbitMQ 3.10 writes no ``x-last-death-*``; 3.13 added them). A
  copy that would cycle back into a queue is dropped where it is routed
  (router/dead_letters.py ``without_cycles``).
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
import struct
from collections import Counter
from typing import Any

from pamqp import decode
from pamqp.commands import Basic

from shoal.shared.wire import TAG_REPUBLISH

from shoal.shared.header_table import (Long, array_items, array_of, array_strings,
                                      raw_headers, splice_headers, text as _text, typed)
from shoal.node.queues.message import encode_header, parse_properties
from shoal.node.queues.paging import body_bytes

log = logging.getLogger("shoal.node")

_FIRST_DEATH_KEYS = ("x-first-death-reason", "x-first-death-queue", "x-first-death-exchange")
_CC = frozenset(("CC",))



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
                       drop_cc: bool = False) -> bytes:
    """The content-header payload of the dead-lettered copy. Whether the copy would cycle
    back into a queue is decided where it is routed (router/dead_letters.py
    ``without_cycles``, as RabbitMQ's ``detect_cycles``).

    A new death's ``routing-keys`` are the publish's routing key and the message's ``CC``
    keys (sender-selected distribution; ``BCC`` was taken out when it was published).
    ``drop_cc``: the queue has an ``x-dead-letter-routing-key``, which alone routes the copy,
    so its ``CC`` header goes (RabbitMQ 3.10's ``rabbit_dead_letter:make_msg``)."""
    props = parse_properties(header) or Basic.Properties()
    headers = dict(props.headers or {})
    deaths = [dict(d) for d in headers.get("x-death") or [] if isinstance(d, dict)]
    kept = _raw_deaths(header, headers.get("x-death"))
    raws: list[bytes | None] = list(kept) if kept is not None else [None] * len(deaths)
    if len(deaths) > 1:
        deaths, raws = _grouped(deaths, raws)
    found = None
    for i, d in enumerate(deaths):
        if _text(d.get("queue")) == queue and _text(d.get("reason")) == reason:
            found = deaths.pop(i)
            del raws[i]
            break
    if found is not None:       # counted up; its time stays the first death's, as RabbitMQ's
        found["count"] = int(found.get("count") or 0) + 1
    else:
        when = datetime.datetime.fromtimestamp(int(wall_ms // 1000), tz=datetime.timezone.utc)
        cc = array_strings(dict(raw_headers(header) or ()).get("CC", b"")) \
            if b"CC" in header else []
        found = {"count": 1, "reason": reason, "queue": queue, "time": when,
                 "exchange": exchange, "routing-keys": [routing_key, *cc]}
        if props.expiration is not None:
            found["original-expiration"] = props.expiration
    found = dict(sorted(found.items()))     # rabbit_misc:sort_field_table
    added: dict[str, Any] = {"x-death": [_death(d) for d in [found, *deaths]] if kept is None
                             else array_of([typed(_death(found)), *(
                                 r if r is not None else typed(_death(d))
                                 for d, r in zip(deaths, raws))])}
    if "x-first-death-reason" not in headers:
        added.update(zip(_FIRST_DEATH_KEYS, (reason, queue, exchange)))
    props.expiration = None
    return _rewrite(header, props, body_size, added, _CC if drop_cc else frozenset())


def _grouped(deaths: list[dict], raws: list[bytes | None]) -> tuple[list[dict],
                                                                     list[bytes | None]]:
    """An x-death array as RabbitMQ before 3.5 could write it, with a (queue, reason) more than
    once (rabbitmq-server#78), made one entry per (queue, reason): the first of each, given a
    ``count`` of how many there were when it has none (its raw octets otherwise kept), in
    reverse order of first appearance. RabbitMQ 3.10's ``rabbit_dead_letter``
    ``group_by_queue_and_reason``, order included (a fold that prepends)."""
    keys = [(_text(d.get("queue")), _text(d.get("reason"))) for d in deaths]
    counts = Counter(keys)
    out_d: list[dict] = []
    out_r: list[bytes | None] = []
    seen: set = set()
    for d, raw, key in zip(deaths, raws, keys):
        if key in seen:
            continue
        seen.add(key)
        if "count" not in d:
            d = {"count": counts[key], **d}
            raw = None if raw is None else _with_count(raw, counts[key])
        out_d.append(d)
        out_r.append(raw)
    return out_d[::-1], out_r[::-1]


def _with_count(item: bytes, n: int) -> bytes:
    """A raw x-death item (``F``, length, fields) with a ``count`` long field put first, the
    rest as sent (RabbitMQ's ``ensure_xdeath_event_count``)."""
    fields = b"\x05countl" + struct.pack(">q", n) + item[5:]
    return b"F" + struct.pack(">I", len(fields)) + fields


def _raw_deaths(header: bytes, decoded: Any) -> list[bytes] | None:
    """The x-death array's items as sent (type octet and value), one per decoded table; None
    when there is none, or it does not split so. The deaths this death leaves alone keep
    their octets, and so their field types (RabbitMQ keeps them: a publisher's count 1 as an
    int stays one; the count Shoal writes is a long)."""
    if not isinstance(decoded, list) or not all(isinstance(d, dict) for d in decoded):
        return None
    items = array_items(dict(raw_headers(header) or ()).get("x-death", b""))
    return items if items is not None and len(items) == len(decoded) else None


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
    Dropped, logged, when no router is connected."""
    if not shard.peers:
        log.warning("dropping dead letter from queue '%s': no router connected", q.name)
        return
    shard.send(next(iter(shard.peers)), republish(
        shard, q, entry.exchange, entry.routing_key, entry.header, body_bytes(entry.body),
        reason))


def republish(shard: Any, q: Any, exchange: str, routing_key: str, header: bytes,
              body: bytes, reason: str, confirm: int = 0) -> list:
    """The REPUBLISH (shared/wire.py) of a message of queue ``q`` dead-lettered for
    ``reason``, with ``confirm`` (an id) when the router must confirm it."""
    t = shard.timers
    copy = dead_letter_header(header, len(body), q.name, reason, exchange, routing_key,
                              t.now + t.wall_offset_ms, drop_cc=q.cfg.dlrk is not None)
    rk = q.cfg.dlrk if q.cfg.dlrk is not None else routing_key
    msg = [TAG_REPUBLISH, q.vhost, q.cfg.dlx, rk, copy, body]
    if confirm:
        msg.append(confirm)
    return msg
