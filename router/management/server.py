"""The management API's HTTP side: the aiohttp application, HTTP basic auth against the
broker's users, RabbitMQ's error JSON, and ``columns=`` / ``sort=`` on lists.

The web console (``/``, static files in ``console/``) is served without a login: it holds no
data and asks the API with the credentials typed into it. Users tagged ``administrator`` may
do everything; ``management`` and ``monitoring`` read only (GET, and not users, permissions
or definitions: 401 "Not administrator user"); others get 401 ``{"error": "not_authorised", "reason": "Not management user"}``,
as RabbitMQ answers. Errors are ``{"error": ..., "reason": ...}`` with RabbitMQ's status
codes, never a traceback.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import re
import socket
from pathlib import Path
from typing import Any

from aiohttp import web

from shoal.shared.errors import AMQPError, ConfigError

from shoal.router.broker import Broker
from shoal.router.links.node_link import NodeDown
from shoal.router.management import (access_views, binding_views, live_views, messages,
                                     quorum_views, views)

log = logging.getLogger("shoal.router.management")

CONSOLE = Path(__file__).resolve().parent / "console"
#: Who may do what (the issue's rule, RabbitMQ's tags): administrators everything; users tagged
#: management or monitoring read (GET) what is not an administrator's business.
WRITE_TAGS = frozenset({"administrator"})
READ_TAGS = WRITE_TAGS | {"management", "monitoring"}
#: Paths only administrators may read (RabbitMQ: "Not administrator user"): password hashes,
#: permissions and definitions
ADMIN_PATHS = re.compile(r"^/api/(users|permissions|topic-permissions|definitions)(/|$)"
                         r"|^/api/vhosts/[^/]+/permissions/?$")


def error(status: int, kind: str, reason: str) -> web.Response:
    return web.json_response({"error": kind, "reason": reason}, status=status)


def _user(broker: Broker, request: web.Request):
    header = request.headers.get("Authorization", "")
    if not header.startswith("Basic "):
        return None
    try:
        name, _, password = base64.b64decode(header[6:]).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    peer = request.remote or "?"
    loopback = peer in ("127.0.0.1", "::1")
    if not broker.users.authenticate(name, password, peer, loopback):
        return None
    return broker.users.users[name]


def _columns(data: Any, request: web.Request) -> Any:
    """RabbitMQ's ``columns=a,b.c`` (keep those keys), ``sort=key`` and pagination on lists:
    with ``page`` (from 1), ``page_size`` (default 100, at most 500), ``name`` (a substring,
    or a regular expression with ``use_regex=true``) a list becomes RabbitMQ's page object
    (``items``, ``page``, ``page_count``, ``page_size``, ``item_count``, ``filtered_count``,
    ``total_count``). Raises ApiError 400 for a bad page, page size or expression."""
    cols = request.query.get("columns")
    sort = request.query.get("sort")
    if isinstance(data, list):
        if sort:
            data = sorted(data, key=lambda d: (str(d.get(sort, "")),),
                          reverse=request.query.get("sort_reverse") == "true")
        page = _page(data, request)
        if cols:
            keep = [c.strip() for c in cols.split(",") if c.strip()]
            if page is not None:
                page["items"] = [_pick(d, keep) for d in page["items"]]
            else:
                data = [_pick(d, keep) for d in data]
        if page is not None:
            return page
    elif isinstance(data, dict) and cols:
        data = _pick(data, [c.strip() for c in cols.split(",") if c.strip()])
    return data


def _page(data: list, request: web.Request) -> dict | None:
    q = request.query
    if "page" not in q:
        return None
    try:
        page, size = int(q["page"]), int(q.get("page_size", "100"))
    except ValueError:
        raise views.ApiError(400, "bad_request", "page and page_size must be integers") \
            from None
    if page < 1 or not 1 <= size <= 500:
        raise views.ApiError(400, "bad_request", "page must be 1 or more and page_size from "
                                                 "1 to 500")
    total = len(data)
    name = q.get("name", "")
    if name:
        if q.get("use_regex") == "true":
            try:
                rx = re.compile(name)
            except re.error as exc:
                raise views.ApiError(400, "bad_request", f"bad name expression: {exc}") \
                    from None
            data = [d for d in data if rx.search(str(d.get("name", "")))]
        else:
            data = [d for d in data if name in str(d.get("name", ""))]
    count = max(1, -(-len(data) // size))
    if page > count:
        raise views.ApiError(400, "bad_request", f"page {page} is past the last page "
                                                 f"({count})")
    items = data[(page - 1) * size:page * size]
    return {"filtered_count": len(data), "item_count": len(items), "items": items,
            "page": page, "page_count": count, "page_size": size, "total_count": total}


def _pick(d: dict, keep: list[str]) -> dict:
    out: dict = {}
    for path in keep:
        src, dst, parts = d, out, path.split(".")
        for i, part in enumerate(parts):
            if not isinstance(src, dict) or part not in src:
                break
            if i == len(parts) - 1:
                dst[part] = src[part]
            else:
                src = src[part]
                dst = dst.setdefault(part, {})
    return out


async def _console_page(request: web.Request) -> web.FileResponse:
    """``/``: the web console (router/management/console/, a static page over this API)."""
    return web.FileResponse(CONSOLE / "index.html")


def make_app(broker: Broker) -> web.Application:
    @web.middleware
    async def guard(request: web.Request, handler):
        if not request.path.startswith("/api/") or request.path == views.READY_PATH:
            return await handler(request)       # the console's static files; readiness
        user = _user(broker, request)
        if user is None or not (set(user.tags) & READ_TAGS):
            return error(401, "not_authorised", "Login failed" if user is None
                         else "Not management user")
        admin = bool(set(user.tags) & WRITE_TAGS)
        if not admin and (request.method != "GET" or ADMIN_PATHS.match(request.path)):
            return error(401, "not_authorised", "Not administrator user")
        request["user"] = user
        try:
            out = await handler(request)
            if out is not None and not isinstance(out, web.StreamResponse):
                out = _columns(out, request)
        except web.HTTPException as exc:
            return error(exc.status, "not_found" if exc.status == 404 else "bad_request",
                         exc.reason or "")
        except views.ApiError as exc:
            return error(exc.status, exc.kind, exc.reason)
        except NodeDown as exc:             # the node that holds it is down: try again later
            return error(503, "service_unavailable", exc.text)
        except asyncio.TimeoutError:
            return error(503, "service_unavailable", "a node did not answer in time")
        except AMQPError as exc:
            status = {404: 404, 403: 401, 405: 400, 406: 400}.get(exc.reply_code, 500)
            text = exc.reply_text.split(" - ", 1)[-1]
            return error(status, "not_found" if status == 404 else "bad_request", text)
        except json.JSONDecodeError as exc:
            return error(400, "bad_request", f"the body is not JSON: {exc}")
        except ConfigError as exc:
            return error(400, "bad_request", str(exc))
        except Exception:  # noqa: BLE001 - the API answers with JSON, never a traceback
            log.exception("management API: %s %s", request.method, request.path)
            return error(500, "internal_error", "see the broker log")
        if isinstance(out, web.StreamResponse):
            return out
        if out is None:
            return web.Response(status=204)
        resp = web.json_response(out)
        if request.get("missing_nodes"):      # nodes that did not answer in time
            resp.headers["X-Shoal-Missing-Nodes"] = ",".join(request["missing_nodes"])
        return resp

    app = web.Application(middlewares=[guard])
    app["broker"] = broker
    app["rates"] = {}
    views.add_routes(app)
    binding_views.add_routes(app)
    app.router.add_get("/", _console_page)
    app.router.add_static("/console/", CONSOLE)
    messages.add_routes(app)
    live_views.add_routes(app)
    access_views.add_routes(app)
    quorum_views.add_routes(app)
    _trailing_slashes(app)
    return app


def _trailing_slashes(app: web.Application) -> None:
    """Every API path also with a trailing slash (``DELETE /api/vhosts/v/``), same handler:
    RabbitMQ's router (cowboy's ``split_path``) ignores one, and clients send it (RabbitMQ's
    AMQP 1.0 client's tests)."""
    for route in list(app.router.routes()):
        path = route.resource.canonical if route.resource is not None else ""
        if path.startswith("/api/") and not path.endswith("/") and route.method != "HEAD":
            app.router.add_route(route.method, path + "/", route.handler)


async def start(broker: Broker, host: str, port: int) -> web.AppRunner:
    """Serve the API on ``host:port`` (SO_REUSEPORT, as routers share the AMQP port). Raises
    OSError when the port cannot be bound (the router stops with one line naming it)."""
    return await serve(make_app(broker), host, port, "management API", "/api/")


async def serve(app: web.Application, host: str, port: int, what: str,
                path: str) -> web.AppRunner:
    """Serve ``app`` on ``host:port`` (SO_REUSEPORT); ``what`` names it in the log. Raises
    OSError when the port cannot be bound, after cleaning up."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_port=hasattr(socket, "SO_REUSEPORT"))
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    log.info("%s on http://%s:%s%s", what, host, port, path)
    return runner
