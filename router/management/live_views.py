"""The management API's connections, channels and consumers, for the whole cluster (RabbitMQ's
paths and fields): this router's own rows, fresh, and every other router's latest report as
the nodes hold it (router/live.py; wire ROUTER_REPORTS). DELETE of a connection closes it with
320 CONNECTION_FORCED wherever it is (through a node: wire FORCE_CLOSE)."""
from __future__ import annotations

from aiohttp import web

from shoal.shared.wire import T

from shoal.router import live
from shoal.router.management.views import ApiError, _arg, _broker, _vhost

REASON = "Closed via management plugin"     #: RabbitMQ's reply text (X-Reason overrides it)


async def _rows(request: web.Request, key: str) -> list[dict]:
    merged, request["missing_nodes"] = await live.cluster_report(_broker(request))
    vhost = _vhost(request)
    rows = merged[key]
    if vhost is not None:
        rows = [r for r in rows if (r.get("vhost") or r.get("queue", {}).get("vhost")) == vhost]
    return rows


async def connections(request: web.Request):
    return await _rows(request, "connections")


async def _named(request: web.Request, key: str) -> dict:
    """The row of ``key`` (connections, channels) named by the path's ``{name}``; 404."""
    name = _arg(request, "name")
    row = next((r for r in await _rows(request, key) if r["name"] == name), None)
    if row is None:
        raise ApiError(404, "not_found", "Object Not Found")
    return row


async def connection(request: web.Request):
    return await _named(request, "connections")


async def close_connection(request: web.Request):
    """DELETE /api/connections/{name}: 204 once asked (the close itself follows), 404 if no
    router has it."""
    b, name = _broker(request), _arg(request, "name")
    reason = request.headers.get("X-Reason", REASON)
    if b.close_connection(name, reason):
        return None
    row = await _named(request, "connections")
    link = next((x for x in b.links.values() if x.up), None)   # any node passes it on
    if link is None:
        raise ApiError(503, "service_unavailable", "no node is up to reach that router")
    link.send([T.FORCE_CLOSE, row["node"], name, reason])
    return None


async def connection_channels(request: web.Request):
    name = _arg(request, "name")
    return [r for r in await _rows(request, "channels")
            if r["connection_details"]["name"] == name]


async def channels(request: web.Request):
    return await _rows(request, "channels")


async def channel(request: web.Request):
    return await _named(request, "channels")


async def consumers(request: web.Request):
    return await _rows(request, "consumers")


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/connections", connections)
    r.add_get("/api/vhosts/{vhost}/connections", connections)
    r.add_get("/api/connections/{name}", connection)
    r.add_delete("/api/connections/{name}", close_connection)
    r.add_get("/api/connections/{name}/channels", connection_channels)
    r.add_get("/api/channels", channels)
    r.add_get("/api/vhosts/{vhost}/channels", channels)
    r.add_get("/api/channels/{name}", channel)
    r.add_get("/api/consumers", consumers)
    r.add_get("/api/consumers/{vhost}", consumers)
