"""The management API's endpoints (RabbitMQ management plugin's paths and JSON fields): the
overview, nodes, vhosts, users and permissions (read-only in this slice), queues (list, show,
declare, delete, purge), exchanges (list, show, declare, delete), the definitions export and
the health checks (bindings: binding_views.py). Names in paths are percent-encoded (``%2F`` is the vhost ``/``).

Queues are asked of every node (wire QUEUE_LIST) within ``NODE_TIMEOUT_S``; a node that does
not answer is left out and named in the ``X-Shoal-Missing-Nodes`` header.
"""
from __future__ import annotations

import asyncio
import base64
import json
import time

from aiohttp import web
from pamqp import commands as C
from pamqp.header import ContentHeader

from shoal.shared.definitions import access_document
from shoal.shared.errors import AMQPError
from shoal.shared.topology import BUILTIN_EXCHANGES, EXCHANGE_TYPES
from shoal.shared.wire import T

from shoal.router import live
from shoal.router.amqp.handshake import shoal_version
from shoal.router.broker import Broker
from shoal.router.management.binding_rows import binding_rows
from shoal.router.sender_selected import header_routes

#: a router's readiness, asked without credentials (router/management/server.py)
READY_PATH = "/api/health/checks/ready-to-serve-clients"
NODE_TIMEOUT_S = 5.0
RABBITMQ_VERSION = "3.10.8"     #: the RabbitMQ whose API this one follows (tools check it)


class ApiError(Exception):
    """An error answered as ``{"error": kind, "reason": reason}`` with ``status``."""

    def __init__(self, status: int, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.kind, self.reason = status, kind, reason


def _broker(request: web.Request) -> Broker:
    return request.app["broker"]


def _arg(request: web.Request, key: str) -> str:
    """A name from the path, percent-decoded once (aiohttp decodes ``match_info``), as
    RabbitMQ's cowboy does: a queue named ``a%41`` is ``a%2541`` in a path."""
    return request.match_info[key]


def _exchange(request: web.Request, key: str = "name") -> str:
    """The exchange a path names, ``amq.default`` being RabbitMQ's name for the default
    exchange ("") in paths (``rabbit_mgmt_util:id``: for a binding's source and destination
    too)."""
    name = _arg(request, key)
    return "" if name == "amq.default" else name


def _vhost(request: web.Request) -> str | None:
    if "vhost" not in request.match_info:
        return None
    vhost = _arg(request, "vhost")
    if vhost not in _broker(request).users.vhosts:
        raise ApiError(404, "not_found", "vhost_not_found")
    return vhost


async def _body(request: web.Request) -> dict:
    text = await request.text()
    data = json.loads(text) if text.strip() else {}
    if not isinstance(data, dict):
        raise ApiError(400, "bad_request", "the body must be a JSON object")
    return data


# ---- queues ---------------------------------------------------------------------------------
async def queue_rows(broker: Broker, vhost: str | None) -> tuple[list[dict], list[str]]:
    """Every node's queues (of ``vhost``) as RabbitMQ's JSON, and the nodes that did not answer
    in time."""
    ids = list(broker.links)
    results = await asyncio.gather(*(asyncio.wait_for(
        broker.links[n].request([T.QUEUE_LIST, vhost]), NODE_TIMEOUT_S) for n in ids),
        return_exceptions=True)
    rows, missing = [], []
    now, memo = time.monotonic(), _LAST_COUNTS
    for node_id, result in zip(ids, results):
        if isinstance(result, BaseException):
            missing.append(node_id)
            continue
        for vh, name, durable, exclusive, auto_delete, args, ready, consumers, unacked, \
                counts, *replica in result:
            row = {
                "name": name, "vhost": vh, "durable": durable, "exclusive": exclusive,
                "auto_delete": auto_delete, "arguments": args, "node": node_id,
                "messages": ready + unacked, "messages_ready": ready,
                "messages_unacknowledged": unacked, "consumers": consumers,
                "state": "running", "type": args.get("x-queue-type", "classic"),
                "policy": None,
                "message_stats": with_rates(memo, (node_id, vh, name),
                                            dict(zip(QUEUE_STATS, counts)), now)}
            if replica and isinstance(replica[0], dict):    # a stream (docs/streams.md)
                row.update(leader=node_id, members=[node_id], online=[node_id])
                row.update(replica[0], messages_ready=ready, messages=ready)   # several
                # members: the leader's row names them (node/streams/hosting.py describe)
                row["message_bytes"] = row.pop("bytes")
            elif replica and replica[0]:    # a quorum queue: RabbitMQ's leader, members, online
                _, _, leader, _, members, online = replica[0]
                row.update(type="quorum", leader=leader, members=members, online=online,
                           node=leader or node_id)
            rows.append(row)
    rows.sort(key=lambda r: (r["vhost"], r["name"]))
    if vhost is None and not missing:        # forget deleted queues
        listed = {(r["node"], r["vhost"], r["name"]) for r in rows}
        for key in [k for k in memo if k not in listed]:
            del memo[key]
    return rows, missing


#: a queue's counters (QUEUE_LIST) -> RabbitMQ's message_stats names
QUEUE_STATS = ("publish", "deliver_get", "ack")


#: (node, vhost, queue) -> (when, counters) last listed by this router (for rates)
_LAST_COUNTS: dict[tuple, tuple[float, list]] = {}


def with_rates(memo: dict, key: object, totals: dict[str, int], now: float) -> dict:
    """RabbitMQ's ``message_stats``: each of ``totals`` and its ``_details.rate``, per second
    since the totals last stored in ``memo`` under ``key`` (0.0 the first time)."""
    prev_t, prev = memo.get(key, (now, totals))
    memo[key] = (now, totals)
    dt = now - prev_t
    out: dict = {}
    for name, n in totals.items():
        out[name] = n
        out[f"{name}_details"] = {"rate": round(max(n - prev.get(name, 0), 0) / dt, 1)
                                  if dt > 0 else 0.0}
    return out


async def queues(request: web.Request):
    rows, request["missing_nodes"] = await queue_rows(_broker(request), _vhost(request))
    return rows


async def queue(request: web.Request):
    vhost, name = _vhost(request), _arg(request, "name")
    rows, _ = await queue_rows(_broker(request), vhost)
    for row in rows:
        if row["name"] == name:
            return row
    raise ApiError(404, "not_found", "Object Not Found")


async def declare_queue(request: web.Request):
    b, vhost, name = _broker(request), _vhost(request), _arg(request, "name")
    body = await _body(request)
    await b.declare_request(vhost, name,
        [T.QUEUE_DECLARE, vhost, name, False, bool(body.get("durable", True)), False,
         bool(body.get("auto_delete", False)), body.get("arguments") or {}, None])
    return web.Response(status=201)


async def delete_queue(request: web.Request):
    b, vhost, name = _broker(request), _vhost(request), _arg(request, "name")
    if_unused = request.query.get("if-unused") == "true"
    if_empty = request.query.get("if-empty") == "true"
    await b.queue_request(vhost, name, 
        [T.QUEUE_DELETE, vhost, name, if_unused, if_empty, None])
    return None


async def purge_queue(request: web.Request):
    b, vhost, name = _broker(request), _vhost(request), _arg(request, "name")
    await b.queue_request(vhost, name, [T.QUEUE_PURGE, vhost, name, None])
    return None


# ---- exchanges and bindings ----------------------------------------------------------------
def exchange_row(ex) -> dict:
    return {"name": ex.name, "vhost": ex.vhost, "type": ex.type, "durable": ex.durable,
            "auto_delete": ex.auto_delete, "internal": ex.internal,
            "arguments": ex.arguments, "user_who_performed_action": "", "policy": None}


async def exchanges(request: web.Request):
    vhost = _vhost(request)
    rows = [exchange_row(ex) for (vh, _), ex in sorted(_broker(request).topology.exchanges.items())
            if vhost is None or vh == vhost]
    return rows


async def exchange(request: web.Request):
    ex = _broker(request).topology.get(_vhost(request), _exchange(request))
    if ex is None:
        raise ApiError(404, "not_found", "Object Not Found")
    return exchange_row(ex)


async def declare_exchange(request: web.Request):
    b, vhost, name = _broker(request), _vhost(request), _arg(request, "name")
    body = await _body(request)
    type_ = body.get("type", "direct")
    if type_ not in EXCHANGE_TYPES:
        raise ApiError(400, "bad_request", f"unknown exchange type '{type_}'")
    if name in BUILTIN_EXCHANGES or name.startswith("amq."):
        raise ApiError(403, "access_refused", f"exchange name '{name}' contains reserved "
                                               f"prefix 'amq.*'")
    await b.exchange_link(vhost, name).request(
        [T.EXCHANGE_DECLARE, vhost, name, type_, False, bool(body.get("durable", True)),
         bool(body.get("auto_delete", False)), bool(body.get("internal", False)),
         body.get("arguments") or {}])
    return web.Response(status=201)


async def delete_exchange(request: web.Request):
    b, vhost, name = _broker(request), _vhost(request), _arg(request, "name")
    if name in BUILTIN_EXCHANGES:
        raise ApiError(403, "access_refused", f"operation not permitted on exchange '{name}'")
    await b.exchange_link(vhost, name).request(
        [T.EXCHANGE_DELETE, vhost, name, request.query.get("if-unused") == "true"])
    return None


async def publish(request: web.Request):
    """POST /api/exchanges/{vhost}/{name}/publish: ``{"routed": bool}``; the message goes
    without a confirm, as RabbitMQ's HTTP publish (meant for tests and operators)."""
    b, vhost, name = _broker(request), _vhost(request), _exchange(request)
    body = await _body(request)
    if b.topology.get(vhost, name) is None:
        raise ApiError(404, "not_found", "Object Not Found")
    payload = body.get("payload", "")
    if body.get("payload_encoding", "string") == "base64":
        data = base64.b64decode(payload)
    else:
        data = str(payload).encode("utf-8")
    try:
        props = C.Basic.Properties(**(body.get("properties") or {}))
    except TypeError as exc:
        raise ApiError(400, "bad_request", f"properties: {exc}") from None
    header = ContentHeader(0, len(data), props).marshal()
    key = str(body.get("routing_key", ""))
    if name == "":      # the default exchange routes to a queue that may not exist
        try:
            await b.queue_request(vhost, key, 
                [T.QUEUE_DECLARE, vhost, key, True, False, False, False, {}, None])
        except AMQPError:
            return {"routed": False}
    try:
        also, header = header_routes(header)
    except AMQPError as err:
        raise ApiError(400, "bad_request", err.text) from None
    return {"routed": b.publish_unconfirmed(vhost, name, key, header, data, also)}


# ---- the rest -------------------------------------------------------------------------------
async def overview(request: web.Request):
    b = _broker(request)
    (rows, _), (objects, _) = await asyncio.gather(queue_rows(b, None), live.cluster_report(b))
    return {
        "management_version": RABBITMQ_VERSION, "rabbitmq_version": RABBITMQ_VERSION,
        "product_name": "Shoal", "product_version": shoal_version(),
        "cluster_name": _cluster_name(request), "node": b.router_id,
        "object_totals": {"connections": len(objects["connections"]),
                          "channels": len(objects["channels"]),
                          "exchanges": len(b.topology.exchanges), "queues": len(rows),
                          "consumers": sum(r["consumers"] for r in rows)},
        "queue_totals": {"messages": sum(r["messages"] for r in rows),
                         "messages_ready": sum(r["messages_ready"] for r in rows),
                         "messages_unacknowledged": sum(r["messages_unacknowledged"]
                                                        for r in rows)},
        "message_stats": message_stats(request.app, objects["stats"]),
        "listeners": [], "exchange_types": EXCHANGE_TYPE_ROWS,
        "contexts": [{"node": b.router_id, "description": "RabbitMQ Management", "path": "/",
                      "port": str(request.url.port or "")}],
    }


def _cluster_name(request: web.Request) -> str:
    return f"shoal@{request.host.split(':')[0]}"


async def cluster_name(request: web.Request):
    """GET /api/cluster-name: ``{"name": ...}``, the overview's ``cluster_name`` (setting
    it, RabbitMQ's PUT, is not supported: 405)."""
    return {"name": _cluster_name(request)}


#: the overview's ``exchange_types`` (its "add exchange" form's choices), sorted by name,
#: with RabbitMQ's descriptions (each type module's ``description/0``)
EXCHANGE_TYPE_ROWS = [{"name": name, "description": text, "enabled": True}
                      for name, text in sorted({
                          "direct": "AMQP direct exchange, as per the AMQP specification",
                          "fanout": "AMQP fanout exchange, as per the AMQP specification",
                          "headers": "AMQP headers exchange, as per the AMQP specification",
                          "topic": "AMQP topic exchange, as per the AMQP specification",
                          "x-consistent-hash": "Consistent Hashing Exchange",
                          "x-local-random": "Picks one random local binding (queue) to "
                                            "route via (to).",
                      }.items())]


#: RabbitMQ's message_stats names -> the routers' summed counters (router/live.py)
MESSAGE_STATS = {"publish": "received", "deliver_get": "delivered", "ack": "acknowledged",
                 "confirm": "confirmed", "drop_unroutable": "unroutable",
                 "return_unroutable": "returned"}


def message_stats(app: web.Application, stats: dict) -> dict:
    """The overview's ``message_stats`` (the routers' summed counters), with rates since this
    router's previous overview (``app["rates"]``: a dict made with the app)."""
    return with_rates(app["rates"], "overview",
                      {name: stats.get(key, 0) for name, key in MESSAGE_STATS.items()},
                      time.monotonic())


async def whoami(request: web.Request):
    u = request["user"]
    return {"name": u.name, "tags": list(u.tags)}


async def nodes(request: web.Request):
    """Shoal's nodes: ``running`` (its link is up and it answered NODE_STATS), ``queues``,
    ``mem_used`` (resident bytes, RabbitMQ's field), ``mem_alarm``, ``messages_ready`` and
    ``paged_bytes`` (node/queues/paging.py)."""
    b = _broker(request)
    (rows, _), stats = await asyncio.gather(queue_rows(b, None), node_stats(b))
    per_node: dict[str, int] = {}
    for r in rows:
        per_node[r["node"]] = per_node.get(r["node"], 0) + 1
    out = []
    for node_id, link in b.links.items():
        st = stats.get(node_id, (None, 0.0))[0] or {}
        out.append({"name": node_id, "type": "disc", "running": link.up and bool(st),
                    "queues": per_node.get(node_id, 0), "mem_used": st.get("rss_bytes", 0),
                    "messages_ready": st.get("messages_ready", 0),
                    "paged_bytes": st.get("paged_bytes", 0),
                    "mem_alarm": st.get("blocked", "") == "low on memory"})
    return out


async def node(request: web.Request):
    """GET /api/nodes/{name}: one row of :func:`nodes`; 404 for a name that is not a node."""
    name = _arg(request, "name")
    for row in await nodes(request):
        if row["name"] == name:
            return row
    raise ApiError(404, "not_found", "Object Not Found")


async def node_stats(broker: Broker) -> dict[str, tuple[dict | None, float]]:
    """node id -> (its NODE_STATS, or None if it did not answer in time; round trip, s)."""
    async def one(link) -> tuple[dict | None, float]:
        t0 = time.perf_counter()
        try:
            got = await asyncio.wait_for(link.request([T.NODE_STATS]), NODE_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - down, slow or old: reported as not up
            return None, 0.0
        return got, time.perf_counter() - t0
    ids = list(broker.links)
    results = await asyncio.gather(*(one(broker.links[n]) for n in ids))
    return dict(zip(ids, results))



async def vhosts(request: web.Request):
    b = _broker(request)
    types = b.definitions.default_queue_types
    return [{"name": v, "description": "", "tags": [],
             "default_queue_type": types.get(v, "undefined"),
             "metadata": {"description": "", "tags": [],
                          "default_queue_type": types.get(v, "undefined")}}
            for v in b.users.vhosts]


async def users(request: web.Request):
    return [{"name": u.name, "password_hash": u.password_hash,
             "hashing_algorithm": u.hashing_algorithm, "tags": list(u.tags),
             "limits": u.limits} for u in _broker(request).users.users.values()]


async def permissions(request: web.Request):
    return [{"user": p.user, "vhost": p.vhost, "configure": p.configure, "write": p.write,
             "read": p.read} for p in _broker(request).users.permissions.values()]


async def definitions(request: web.Request):
    """RabbitMQ's definitions export (what ``rabbitmqadmin export`` saves)."""
    b = _broker(request)
    rows, missing = await queue_rows(b, None)
    if missing:
        raise ApiError(503, "service_unavailable", f"nodes not answering: {', '.join(missing)}")
    return {
        "rabbit_version": RABBITMQ_VERSION, "rabbitmq_version": RABBITMQ_VERSION,
        "product_name": "Shoal", "product_version": shoal_version(),
        "users": await users(request), "vhosts": access_document(b.definitions)["vhosts"],
        "permissions": await permissions(request),
        "topic_permissions": [{"user": u, "vhost": v, "exchange": x, "write": w, "read": r}
                              for (u, v), t in b.users.topics.items()
                              for x, (w, r) in t.items()],
        "parameters": [], "global_parameters": [], "policies": [],
        "queues": [{k: r[k] for k in ("name", "vhost", "durable", "auto_delete", "arguments")}
                   for r in rows if not r["exclusive"]],
        "exchanges": [{k: r[k] for k in ("name", "vhost", "type", "durable", "auto_delete",
                                         "internal", "arguments")}
                      for r in await exchanges(request)
                      if r["name"] not in BUILTIN_EXCHANGES],
        "bindings": [{k: r[k] for k in ("source", "vhost", "destination", "destination_type",
                                        "routing_key", "arguments")}
                     for r in binding_rows(b, None)],
    }


async def alarms(request: web.Request):
    """RabbitMQ's /api/health/checks/alarms: 200 ok, or 503 with the alarms in effect."""
    reason = _broker(request).blocked_reason
    if reason is None:
        return {"status": "ok"}
    return web.json_response({"status": "failed", "reason": reason,
                              "alarms": [{"node": n, "resource": r}
                                         for n, r in _broker(request).blocked_nodes.items()]},
                             status=503)


async def node_health(request: web.Request):
    """RabbitMQ's deprecated /api/healthchecks/node[/{node}] (still in RabbitMQ 4): 200
    ``{"status": "ok"}``, or 503 ``{"status": "failed", "reason": ...}``. ``node`` is a node
    of /api/nodes (ok while this router reaches it) or this router (the overview's
    ``contexts``; also the default: ok while it reaches at least one node); another name 404
    (rabbit_mgmt_wm_healthchecks)."""
    b = _broker(request)
    name = _arg(request, "node") if "node" in request.match_info else b.router_id
    if name == b.router_id:
        up, reason = any(link.up for link in b.links.values()), "no node is reachable"
    elif name in b.links:
        up, reason = b.links[name].up, f"node {name} is not reachable"
    else:
        raise ApiError(404, "not_found", "Object Not Found")
    if up:
        return {"status": "ok"}
    return web.json_response({"status": "failed", "reason": reason}, status=503)


async def ready_to_serve_clients(request: web.Request):
    """RabbitMQ 3.13's /api/health/checks/ready-to-serve-clients, a router's readiness
    (Helm's readinessProbe): 200 ``{"status": "ok"}`` while it reaches at least one node, 503
    ``{"status": "failed", "reason": "no node is reachable"}`` when it reaches none (issue
    36: a router never waits for every node). Answered without credentials (the guard's
    PUBLIC_PATHS), so that a kubelet can ask; it tells nothing else."""
    if any(link.up for link in _broker(request).links.values()):
        return web.json_response({"status": "ok"})
    return web.json_response({"status": "failed", "reason": "no node is reachable"},
                             status=503)


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get(READY_PATH, ready_to_serve_clients)
    r.add_get("/api/overview", overview)
    r.add_get("/api/whoami", whoami)
    r.add_get("/api/nodes", nodes)
    r.add_get("/api/nodes/{name}", node)
    r.add_get("/api/cluster-name", cluster_name)
    r.add_get("/api/healthchecks/node", node_health)
    r.add_get("/api/healthchecks/node/{node}", node_health)
    r.add_get("/api/vhosts", vhosts)
    r.add_get("/api/users", users)
    r.add_get("/api/permissions", permissions)
    r.add_get("/api/definitions", definitions)
    r.add_get("/api/health/checks/alarms", alarms)
    r.add_get("/api/queues", queues)
    r.add_get("/api/queues/{vhost}", queues)
    r.add_get("/api/queues/{vhost}/{name}", queue)
    r.add_put("/api/queues/{vhost}/{name}", declare_queue)
    r.add_delete("/api/queues/{vhost}/{name}", delete_queue)
    r.add_delete("/api/queues/{vhost}/{name}/contents", purge_queue)
    r.add_get("/api/exchanges", exchanges)
    r.add_get("/api/exchanges/{vhost}", exchanges)
    r.add_get("/api/exchanges/{vhost}/{name}", exchange)
    r.add_put("/api/exchanges/{vhost}/{name}", declare_exchange)
    r.add_delete("/api/exchanges/{vhost}/{name}", delete_exchange)
    r.add_post("/api/exchanges/{vhost}/{name}/publish", publish)

