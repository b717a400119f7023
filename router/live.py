"""This router's live objects (connections, channels, consumers) as the RabbitMQ management
API shows them, reported to the nodes so that any router answers for the whole cluster
(issue 23, point 1; docs/management.md).

Routers share nothing but the nodes (design.md section 1), so each router sends its rows to
every node once a second (wire ROUTER_REPORT, :func:`report_loop`); the management API asks
the nodes for the latest report of every router (ROUTER_REPORTS) and merges them.

A report is built and packed in slices of REPORT_SLICE connections, the event loop running
between them, and travels as those packed slices: a node keeps the bytes without decoding the
rows, and only the API's :func:`cluster_report` unpacks them. Built and sent whole, the report
of 1,000 connections with 10,000 consumers held the router's loop about 60 ms and each node's
about 140 ms once a second, and 1-5% of deliveries waited that long (issue 46, shape G).

RabbitMQ's own figures are as old as its ``collect_statistics_interval`` (5 s); these are at
most about a second old. Closing a connection on another router goes through a node
(FORCE_CLOSE, then :meth:`Broker.close_connection <shoal.router.broker.Broker.close_connection>`
there).
"""
from __future__ import annotations

import asyncio
import datetime
import decimal
import logging
from typing import Any

import msgpack

from shoal.shared.wire import T

from shoal.router.broker import Broker

log = logging.getLogger("shoal.router.live")

REPORT_INTERVAL_S = 1.0
REPORT_SLICE = 50           #: connections built and packed between two turns of the loop
ASK_TIMEOUT_S = 5.0         #: how long :func:`cluster_report` waits for a node
STALE_MS = 10_000           #: a report older than this is left out
COALESCE_S = 0.05           #: connections opened or closed together: one report
#: Broker.stats counters reported, summed over routers for the API's message_stats
STATS = ("received", "routed", "unroutable", "returned", "confirmed", "delivered",
         "acknowledged")


def json_safe(v: Any) -> Any:
    """An AMQP field value as JSON (client properties, headers): timestamps as epoch
    seconds, decimals as floats, byte strings as text."""
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if isinstance(v, datetime.datetime):
        return int(v.replace(tzinfo=v.tzinfo or datetime.timezone.utc).timestamp())
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).decode("utf-8", "replace")
    return v


def report(broker: Broker) -> dict[str, Any]:
    """This router's connections, channels and consumers as the API's JSON rows, and its
    ``stats`` (:data:`STATS`)."""
    rows = _rows(broker, list(broker.connections))
    rows["stats"] = _stats(broker)
    return rows


async def packed_report(broker: Broker) -> dict[str, Any]:
    """:func:`report` as ROUTER_REPORT carries it: ``{"slices": [bytes, ...], "stats": {}}``,
    each slice the msgpack of :func:`_rows` over REPORT_SLICE connections, the event loop
    let run after each."""
    connections = list(broker.connections)
    slices = []
    for i in range(0, len(connections), REPORT_SLICE):
        slices.append(msgpack.packb(_rows(broker, connections[i:i + REPORT_SLICE]),
                                    use_bin_type=True))
        await asyncio.sleep(0)
    return {"slices": slices, "stats": _stats(broker)}


def _stats(broker: Broker) -> dict[str, int]:
    return {k: broker.stats[k] for k in STATS}


def unpacked(rep: dict) -> dict[str, Any]:
    """A report as a node gave it back: rows of :func:`packed_report`'s slices unpacked (a
    report of a router before the slices: as it is). A slice that does not unpack is left
    out (logged)."""
    slices = rep.get("slices")
    if not isinstance(slices, list):
        return rep
    out: dict[str, Any] = {"connections": [], "channels": [], "consumers": [],
                           "stats": rep.get("stats") or {}}
    for raw in slices:
        try:
            rows = msgpack.unpackb(raw, raw=False)
        except (ValueError, TypeError, msgpack.UnpackException):
            log.warning("a router report slice does not unpack; left out")
            continue
        if isinstance(rows, dict):
            for key in ("connections", "channels", "consumers"):
                if isinstance(rows.get(key), list):
                    out[key].extend(rows[key])
    return out


def _rows(broker: Broker, connections: list) -> dict[str, list[dict]]:
    """The rows of ``connections``."""
    conns: list[dict] = []
    chans: list[dict] = []
    cons: list[dict] = []
    for c in connections:
        amqp = c.amqp
        if amqp is None or not getattr(c, "name", None):
            continue
        user = amqp.user or ""
        peer = {"name": c.name, "peer_host": c.peer[0], "peer_port": c.peer[1]}
        conns.append({
            "name": c.name, "node": broker.router_id, "user": user, "vhost": c.vhost,
            "state": "blocked" if c.blocked else ("running" if user else "starting"),
            "channels": len(c.channels), "ssl": c.tls,
            "protocol": getattr(c, "protocol", "AMQP 0-9-1"),
            "peer_host": c.peer[0], "peer_port": c.peer[1], "host": c.local[0],
            "port": c.local[1], "connected_at": c.connected_at,
            "client_properties": json_safe(c.client_properties),
            "type": "network",
            "auth_mechanism": getattr(c, "auth_mechanism", "") or "PLAIN"})
        for ch in list(c.channels.values()):
            ch_name = f"{c.name} ({ch.number})"
            details = {"name": ch_name, "number": ch.number, "connection_name": c.name,
                       "peer_host": c.peer[0], "peer_port": c.peer[1], "user": user}
            chans.append({
                "name": ch_name, "number": ch.number, "node": broker.router_id,
                "connection_details": peer, "vhost": c.vhost, "user": user,
                "consumer_count": len(ch.pool.targets),
                "messages_unacknowledged": len(ch.unacked),
                "prefetch_count": ch.pool.prefetch_count,
                "global_prefetch_count": ch.pool.global_prefetch,
                "confirm": ch.confirm, "transactional": ch.tx is not None,
                "state": "running"})
            for t in list(ch.pool.targets.values()):
                for queue in dict.fromkeys(t.queues):
                    cons.append({
                        "consumer_tag": t.tag, "queue": {"name": queue, "vhost": t.vhost},
                        "channel_details": details, "ack_required": not t.no_ack,
                        "prefetch_count": ch.pool.prefetch_count, "exclusive": False,
                        "arguments": {}, "active": True, "activity_status": "up"})
    return {"connections": conns, "channels": chans, "consumers": cons}


async def report_loop(broker: Broker) -> None:
    """Send :func:`report` to every node that is up, each ``REPORT_INTERVAL_S``, and soon
    (``COALESCE_S``) after a connection opened or closed (``broker.report_soon``)."""
    while True:
        try:
            await asyncio.wait_for(broker.report_soon.wait(), REPORT_INTERVAL_S)
            await asyncio.sleep(COALESCE_S)
        except asyncio.TimeoutError:
            pass
        broker.report_soon.clear()
        try:
            rows = await packed_report(broker)
        except Exception:  # noqa: BLE001 - a bad row must not stop the reports
            log.exception("building the router report failed")
            continue
        for link in broker.links.values():
            if link.up:
                link.send([T.ROUTER_REPORT, broker.router_id, rows])


async def cluster_report(broker: Broker) -> tuple[dict[str, Any], list[str]]:
    """Every router's connections, channels and consumers (lists of rows) and ``stats``
    (:data:`STATS` summed over routers), and the nodes that did not answer in time. Of
    several nodes' copies of one router's report the newest is taken."""
    ids = [n for n, link in broker.links.items() if link.up]
    results = await asyncio.gather(*(asyncio.wait_for(
        broker.links[n].request([T.ROUTER_REPORTS]), ASK_TIMEOUT_S) for n in ids),
        return_exceptions=True)
    newest: dict[str, tuple[float, dict]] = {}
    missing = [n for n in broker.links if n not in ids]
    for node_id, result in zip(ids, results):
        if isinstance(result, BaseException):
            missing.append(node_id)
            continue
        for router_id, rep, age in result:
            if age > STALE_MS or not isinstance(rep, dict):     # that router stopped
                continue                # reporting (it is going away)
            if router_id not in newest or age < newest[router_id][0]:
                newest[router_id] = (age, rep)
    newest[broker.router_id] = (0.0, report(broker))       # ours, as of now
    merged: dict[str, Any] = {"connections": [], "channels": [], "consumers": []}
    stats = dict.fromkeys(STATS, 0)
    for _, rep in newest.values():
        rep = unpacked(rep)
        for key, rows in merged.items():
            rows.extend(r for r in rep.get(key, ()) if isinstance(r, dict))
        for key, n in (rep.get("stats") or {}).items():
            if key in stats and isinstance(n, int):
                stats[key] += n
    merged["stats"] = stats
    for key in ("connections", "channels", "consumers"):
        merged[key].sort(key=lambda r: str(r.get("name", r.get("consumer_tag", ""))))
    return merged, missing
