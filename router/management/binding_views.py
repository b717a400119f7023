"""The management API's bindings (RabbitMQ's paths, bodies and status codes; the rows are
views.py ``binding_rows``):

- ``GET /api/bindings[/{vhost}]``: every binding, each queue's binding to the default
  exchange first, as RabbitMQ lists them (``rabbit_binding:list``: implicit bindings, source
  ``""``, key the queue's name; the definitions export leaves them out).
- ``GET /api/queues/{vhost}/{name}/bindings``: a queue's, its default one first; 404 for a
  queue that does not exist (the management UI's queue page, AMQPStorm's ``queue.bindings``).
- ``GET /api/exchanges/{vhost}/{name}/bindings/source`` and ``.../destination``: an
  exchange's bindings as source (the default exchange's: every queue's implicit one) or as
  destination; 404 for an exchange that does not exist.
- ``POST /api/bindings/{vhost}/e/{source}/{q|e}/{destination}``: a binding (201), ``GET``
  the bindings between the two; ``GET`` and ``DELETE .../{props}`` one by its
  ``properties_key`` (binding_rows.py), 404 if there is none.
"""
from __future__ import annotations

from aiohttp import web

from shoal.shared import wire
from shoal.shared.topology import LOCAL_RANDOM, check_local_random_binding
from shoal.shared.wire import T

from shoal.router import quorum
from shoal.router.broker import Broker
from shoal.router.management import binding_rows as props
from shoal.router.management.binding_rows import binding_rows
from shoal.router.management.views import (ApiError, _arg, _body, _broker, _exchange, _vhost,
                                           queue_rows)


def _implicit(vhost: str, queue: str) -> dict:
    """A queue's binding to the default exchange, as RabbitMQ's API shows it."""
    return {"source": "", "vhost": vhost, "destination": queue, "destination_type": "queue",
            "routing_key": queue, "arguments": {},
            "properties_key": props.properties_key(queue, {})}


async def _queues(broker: Broker, vhost: str | None,
                  request: web.Request) -> list[tuple[str, str]]:
    """(vhost, name) of every queue, once each (a replicated queue's members all list it);
    the nodes that did not answer are named in the response's header (server.py)."""
    rows, request["missing_nodes"] = await queue_rows(broker, vhost)
    return sorted({(r["vhost"], r["name"]) for r in rows})


async def bindings(request: web.Request):
    b, vhost = _broker(request), _vhost(request)
    return [_implicit(v, q) for v, q in await _queues(b, vhost, request)] + \
        binding_rows(b, vhost)


async def queue_bindings(request: web.Request):
    b, vhost, name = _broker(request), _vhost(request), _arg(request, "name")
    if (vhost, name) not in await _queues(b, vhost, request):
        raise ApiError(404, "not_found", "Object Not Found")
    return [_implicit(vhost, name)] + [
        r for r in binding_rows(b, vhost)
        if r["destination"] == name and r["destination_type"] == "queue"]


async def exchange_bindings(request: web.Request):
    b, vhost, name = _broker(request), _vhost(request), _exchange(request)
    if b.topology.get(vhost, name) is None:
        raise ApiError(404, "not_found", "Object Not Found")
    if request.match_info["side"] == "source":
        if name == "":
            return [_implicit(v, q) for v, q in await _queues(b, vhost, request)]
        return [r for r in binding_rows(b, vhost) if r["source"] == name]
    return [r for r in binding_rows(b, vhost)
            if r["destination"] == name and r["destination_type"] == "exchange"]


async def bind(request: web.Request):
    """POST /api/bindings/{vhost}/e/{source}/{q|e}/{destination}: a binding (201). A
    local-random source's binding to a replicated queue: 400 (RabbitMQ's 406 text; the
    owning node checks the rest)."""
    b, vhost = _broker(request), _vhost(request)
    source, dest = _exchange(request, "source"), _exchange(request, "dest")
    ex = b.topology.get(vhost, source)
    if ex is None:
        raise ApiError(404, "not_found", "Object Not Found")
    body = await _body(request)
    kind = wire.DEST_QUEUE if request.match_info["kind"] == "q" else wire.DEST_EXCHANGE
    if ex.type == LOCAL_RANDOM and kind == wire.DEST_QUEUE:
        check_local_random_binding(kind, body.get("routing_key", ""),
                                   quorum.queue_type(b, vhost, dest))
    await b.exchange_link(vhost, source).request(
        [T.BIND, vhost, source, kind, dest, body.get("routing_key", ""),
         body.get("arguments") or {}])
    return web.Response(status=201)


def _pair_rows(request: web.Request) -> list[dict]:
    b, vhost = _broker(request), _vhost(request)
    source, dest = _exchange(request, "source"), _exchange(request, "dest")
    kind = "queue" if request.match_info["kind"] == "q" else "exchange"
    if b.topology.get(vhost, source) is None:
        raise ApiError(404, "not_found", "Object Not Found")
    return [r for r in binding_rows(b, vhost) if r["source"] == source
            and r["destination"] == dest and r["destination_type"] == kind]


async def bindings_between(request: web.Request):
    """GET /api/bindings/{vhost}/e/{source}/{q|e}/{destination}: the bindings between them."""
    return _pair_rows(request)


def _one(request: web.Request) -> dict:
    """The binding a path's ``{props}`` names (binding_rows.py ``unpack``), or 404."""
    unpacked = props.unpack(_arg(request, "props"))
    row = None if unpacked is None else next(
        (r for r in _pair_rows(request) if props.matches(r, *unpacked)), None)
    if row is None:
        raise ApiError(404, "not_found", "Object Not Found")
    return row


async def binding(request: web.Request):
    """GET /api/bindings/{vhost}/e/{source}/{q|e}/{destination}/{props}: one binding."""
    return _one(request)


async def unbind(request: web.Request):
    """DELETE /api/bindings/{vhost}/e/{source}/{q|e}/{destination}/{props}: one binding,
    by its ``properties_key``. 404 if none."""
    b, vhost, source = _broker(request), _vhost(request), _exchange(request, "source")
    row = _one(request)
    kind = wire.DEST_QUEUE if row["destination_type"] == "queue" else wire.DEST_EXCHANGE
    await b.exchange_link(vhost, source).request(
        [T.UNBIND, vhost, source, kind, row["destination"], row["routing_key"],
         row["arguments"]])
    return None


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/bindings", bindings)
    r.add_get("/api/bindings/{vhost}", bindings)
    r.add_post("/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{dest}", bind)
    r.add_get("/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{dest}", bindings_between)
    r.add_get("/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{dest}/{props}", binding)
    r.add_delete("/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{dest}/{props}", unbind)
    r.add_get("/api/queues/{vhost}/{name}/bindings", queue_bindings)
    r.add_get("/api/exchanges/{vhost}/{name}/bindings/{side:source|destination}",
              exchange_bindings)
