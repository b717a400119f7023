"""The management API's quorum queue and stream commands (design.md section 8,
docs/replication.md, docs/streams.md): what ``rabbitmq-queues`` and ``rabbitmq-streams`` do
over Erlang distribution, Shoal's API does over HTTP, for ``shoal ctl`` (deploy/ctl.py) with
the same command names and argument order.

- ``GET /api/queues/{vhost}/{name}/quorum-status``: each member as the leader sees it;
- ``GET /api/queues/{vhost}/{name}/stream-status``: each member of a stream, with
  ``rabbitmq-streams stream_status``'s columns (404 unless a stream);
- ``POST /api/queues/{vhost}/{name}/members`` ``{"node": N}``: add_member;
- ``DELETE /api/queues/{vhost}/{name}/members/{node}``: delete_member;
- ``POST /api/quorum/grow`` ``{"node": N, "strategy": "all" | "even"}`` and
  ``POST /api/quorum/shrink`` ``{"node": N}``: every quorum queue (its leader decides);
- ``POST /api/rebalance/quorum``: leaders moved so that no node leads more than its share.

Errors: 404 (no such queue or node), 400 (a change that cannot be made), as the rest of the API.
"""
from __future__ import annotations

import asyncio
import math

from aiohttp import web

from shoal.shared.wire import T

from shoal.router.management.views import ApiError, _arg, _body, _broker, _vhost, queue_rows
from shoal.router.management.views import queue as queue_row

STATUS_FIELDS = ("node", "member", "raft_state", "membership", "last_index", "commit_index",
                 "term")


async def quorum_status(request: web.Request):
    b, vhost, name = _broker(request), _vhost(request), _arg(request, "name")
    rows = await b.queue_request(vhost, name, [T.QUORUM_OP, "status", vhost, name, None])
    return [dict(zip(STATUS_FIELDS, r)) for r in rows]


async def stream_status(request: web.Request):
    """rabbitmq-streams' stream_status: role, node, epoch, offset (the last written),
    committed_offset, first_offset, readers (the consumers reading from that member:
    node/streams/readers.py), segments, per member."""
    row = await queue_row(request)
    if row.get("type") != "stream":
        raise ApiError(404, "not_found", f"queue '{row['name']}' in vhost '{row['vhost']}' is "
                                         f"not a stream")
    readers: dict[str, int] = {}            # consumers by the member they read from
    for c in row["stream_consumers"]:
        node = c[3] if len(c) > 3 and c[3] is not None else row["node"]
        readers[node] = readers.get(node, 0) + 1
    rows = [{"role": "writer", "node": row["node"], "epoch": row["epoch"],
             "offset": row.get("member_offsets", {}).get(row["node"],
                                                         row["committed_offset"]),
             "committed_offset": row["committed_offset"],
             "first_offset": row["first_offset"], "readers": readers.get(row["node"], 0),
             "segments": row["segments"]}]
    for node in row.get("members", []):     # the other members, as the leader sees them
        if node != row["node"]:
            rows.append({"role": "replica", "node": node, "epoch": row["epoch"],
                         "offset": row.get("member_offsets", {}).get(node, -1),
                         "committed_offset": row["committed_offset"],
                         "first_offset": None, "readers": readers.get(node, 0),
                         "segments": None})
    return rows


async def _node_arg(request: web.Request, data: dict) -> str:
    node = data.get("node")
    if not isinstance(node, str) or node not in _broker(request).links:
        raise ApiError(404, "not_found", f"no node {node!r} in the cluster")
    return node


async def add_member(request: web.Request):
    b, vhost, name = _broker(request), _vhost(request), _arg(request, "name")
    node = await _node_arg(request, await _body(request))
    wanted = await b.queue_request(vhost, name, [T.QUORUM_OP, "add_member", vhost, name, node])
    return {"members": wanted}


async def delete_member(request: web.Request):
    b, vhost, name = _broker(request), _vhost(request), _arg(request, "name")
    node = await _node_arg(request, {"node": _arg(request, "node")})
    wanted = await b.queue_request(vhost, name,
                                   [T.QUORUM_OP, "delete_member", vhost, name, node])
    return {"members": wanted}


async def _every_node(request: web.Request, op: str, node: str, strategy: str | None) -> list:
    b = _broker(request)
    replies = await asyncio.gather(*(link.request([T.QUORUM_OP, op, None, strategy, node])
                                     for link in b.links.values() if link.up))
    return [{"vhost": v, "name": n} for rows in replies for v, n in rows]


async def grow(request: web.Request):
    data = await _body(request)
    node = await _node_arg(request, data)
    strategy = data.get("strategy", "all")
    if strategy not in ("all", "even"):
        raise ApiError(400, "bad_request", f"strategy must be all or even, not {strategy!r}")
    return await _every_node(request, "grow", node, strategy)


async def shrink(request: web.Request):
    node = await _node_arg(request, await _body(request))
    return await _every_node(request, "shrink", node, None)


async def rebalance(request: web.Request):
    """Move leaders off nodes that lead more than ``ceil(queues / nodes)`` quorum queues, each
    to the member node that leads fewest (a transfer: the leader steps down, that member
    campaigns). Returns the transfers made."""
    b = _broker(request)
    rows, _ = await queue_rows(b, None)     # the members as the leaders see them now
    leaders = {(r["vhost"], r["name"]): [r["leader"], 0, r["members"], r["online"]]
               for r in rows if r.get("type") == "quorum" and r.get("leader") in b.links}
    up = [n for n, link in b.links.items() if link.up]
    if not leaders or not up:
        return []
    share = math.ceil(len(leaders) / len(up))
    count = {n: 0 for n in up}
    for node, *_ in leaders.values():
        count[node] = count.get(node, 0) + 1
    moves = []
    for (vhost, name), (node, _, members, online) in sorted(leaders.items()):
        if count.get(node, 0) <= share:
            continue
        targets = [m for m in (online or members) if m != node and m in count]
        if not targets:
            continue
        target = min(targets, key=lambda m: (count[m], m))
        if count[target] + 1 > share:
            continue
        try:
            done = await b.queue_request(vhost, name, [T.QUORUM_OP, "transfer", vhost, name,
                                                       target])
        except Exception:  # noqa: BLE001 - a queue that cannot move now stays
            continue
        if done:
            count[node] -= 1
            count[target] += 1
            moves.append({"vhost": vhost, "name": name, "from": node, "to": target})
    return moves


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/queues/{vhost}/{name}/quorum-status", quorum_status)
    r.add_get("/api/queues/{vhost}/{name}/stream-status", stream_status)
    r.add_post("/api/queues/{vhost}/{name}/members", add_member)
    r.add_delete("/api/queues/{vhost}/{name}/members/{node}", delete_member)
    r.add_post("/api/quorum/grow", grow)
    r.add_post("/api/quorum/shrink", shrink)
    r.add_post("/api/rebalance/quorum", rebalance)
