"""The management API's users, vhosts and permissions, changed at run time (RabbitMQ's paths,
bodies and status codes): each change is a compare-and-set on the store the first node keeps
(router/access_sync.py), applied by every router before the API answers.

- ``PUT /api/users/{name}``: ``{"password": ..., "tags": "administrator,management"}`` (or
  ``password_hash`` with ``hashing_algorithm``; no password: cannot log in with one) - 201 new,
  204 changed; ``DELETE``: 204 (the user's connections are closed, 320).
- ``PUT /api/vhosts/{name}`` 201/204; ``DELETE``: its queues and exchanges are deleted first,
  its connections closed.
- ``PUT /api/permissions/{vhost}/{user}``: ``{"configure", "write", "read"}`` 201/204;
  ``DELETE`` 204. 400 for an unknown user or vhost (RabbitMQ's wording), 404 to delete what
  does not exist.
"""
from __future__ import annotations

import re

from aiohttp import web

from shoal.shared.definitions import (DEFAULT_HASHING, DEFAULT_QUEUE_TYPES, HASHING_ALGORITHMS,
                                      Definitions,
                                      Permission, User, hash_password, merge_access,
                                      parse_definitions)
from shoal.shared.topology import BUILTIN_EXCHANGES
from shoal.shared.wire import T

from shoal.router import access_sync
from shoal.router.import_definitions import declare_topology
from shoal.router.management.views import ApiError, _arg, _body, _broker, permissions, queue_rows, users


def _not_found() -> ApiError:
    return ApiError(404, "not_found", "Object Not Found")


def _tags(body: dict) -> tuple[str, ...]:
    tags = body.get("tags", "")
    if isinstance(tags, str):
        tags = tags.split(",")
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ApiError(400, "bad_request", "tags must be a comma-separated string or a list")
    return tuple(t.strip() for t in tags if t.strip())


async def user(request: web.Request):
    name = _arg(request, "name")
    for row in await users(request):
        if row["name"] == name:
            return row
    raise _not_found()


async def put_user(request: web.Request):
    name, body = _arg(request, "name"), await _body(request)
    if not name:
        raise ApiError(400, "bad_request", "a user needs a name")
    tags = _tags(body)
    if "password" in body:
        if not isinstance(body["password"], str):
            raise ApiError(400, "bad_request", "password must be a string")
        algorithm, pw_hash = DEFAULT_HASHING, hash_password(body["password"])
    elif "password_hash" in body:
        algorithm = body.get("hashing_algorithm", DEFAULT_HASHING)
        if algorithm not in HASHING_ALGORITHMS:
            raise ApiError(400, "bad_request", f"unknown hashing_algorithm '{algorithm}'")
        pw_hash = str(body["password_hash"])
    else:
        algorithm, pw_hash = DEFAULT_HASHING, ""
    created = []

    def edit(defs: Definitions) -> Definitions:
        old = defs.users.get(name)
        created.append(old is None)
        defs.users[name] = User(name, pw_hash, algorithm, tags,
                                old.limits if old is not None else {})
        return defs
    await access_sync.change(_broker(request), edit)
    return web.Response(status=201 if created[-1] else 204)


async def delete_user(request: web.Request):
    name = _arg(request, "name")

    def edit(defs: Definitions) -> Definitions:
        if name not in defs.users:
            raise _not_found()
        del defs.users[name]
        defs.permissions = {k: p for k, p in defs.permissions.items() if p.user != name}
        defs.topic_permissions = [t for t in defs.topic_permissions if t.user != name]
        return defs
    await access_sync.change(_broker(request), edit)
    return None


async def delete_users(request: web.Request):
    """POST /api/users/bulk-delete ``{"users": [names]}``: 204; each named user that exists
    is deleted as by ``DELETE /api/users/{name}``, in one change. 400 without ``users``
    (rabbit_mgmt_wm_users_bulk_delete)."""
    names = (await _body(request)).get("users")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ApiError(400, "bad_request", "key_missing: users (a list of user names)")
    gone = set(names)

    def edit(defs: Definitions) -> Definitions:
        for name in gone & set(defs.users):
            del defs.users[name]
        defs.permissions = {k: p for k, p in defs.permissions.items() if p.user not in gone}
        defs.topic_permissions = [t for t in defs.topic_permissions if t.user not in gone]
        return defs
    await access_sync.change(_broker(request), edit)
    return web.Response(status=204)


async def vhost(request: web.Request):
    b, name = _broker(request), _arg(request, "name")
    if name not in b.users.vhosts:
        raise _not_found()
    qtype = b.definitions.default_queue_types.get(name, "undefined")
    return {"name": name, "description": "", "tags": [], "default_queue_type": qtype,
            "metadata": {"description": "", "tags": [], "default_queue_type": qtype}}


def grant_creator(defs: Definitions, user: str, vhost: str) -> None:
    """The user who created ``vhost`` through the API gets full permissions there (``.*``
    for configure, write and read), unless ``defs`` already names theirs: RabbitMQ's
    ``rabbit_vhost:maybe_grant_full_permissions``, 3.10 and 4 alike, for ``PUT
    /api/vhosts`` and a definitions import over HTTP."""
    if user in defs.users and (user, vhost) not in defs.permissions:
        defs.permissions[(user, vhost)] = Permission(user, vhost, ".*", ".*", ".*")


async def put_vhost(request: web.Request):
    """``PUT /api/vhosts/{name}``; the body's ``default_queue_type`` (RabbitMQ 3.11+:
    ``classic`` or ``quorum``; ``undefined`` clears it) sets the type of queues declared
    there without ``x-queue-type``. 400 for another type. A new vhost gives its creator
    full permissions there (:func:`grant_creator`)."""
    name = _arg(request, "name")
    body = await _body(request)
    if not name:
        raise ApiError(400, "bad_request", "a vhost needs a name")
    qtype = body.get("default_queue_type") if isinstance(body, dict) else None
    if qtype not in (None, "", "undefined", *DEFAULT_QUEUE_TYPES):
        raise ApiError(400, "bad_request", f"default_queue_type must be one of "
                                           f"{', '.join(DEFAULT_QUEUE_TYPES)}, got {qtype!r}")
    created = []

    def edit(defs: Definitions) -> Definitions | None:
        created.append(name not in defs.vhosts)
        before = defs.default_queue_types.get(name)
        if qtype in ("", "undefined"):
            defs.default_queue_types.pop(name, None)
        elif qtype is not None:
            defs.default_queue_types[name] = qtype
        if not created[-1]:
            return defs if defs.default_queue_types.get(name) != before else None
        defs.vhosts.append(name)
        grant_creator(defs, request["user"].name, name)
        return defs
    await access_sync.change(_broker(request), edit)
    return web.Response(status=201 if created[-1] else 204)


async def delete_vhost(request: web.Request):
    b, name = _broker(request), _arg(request, "name")
    if name not in b.users.vhosts:
        raise _not_found()
    rows, missing = await queue_rows(b, name)
    if missing:
        raise ApiError(503, "service_unavailable", f"nodes not answering: {', '.join(missing)}")
    for row in rows:                     # RabbitMQ deletes the vhost's queues and exchanges
        await b.queue_request(name, row["name"], 
            [T.QUEUE_DELETE, name, row["name"], False, False, None])
    for (vh, ex) in list(b.topology.exchanges):
        if vh == name and ex not in BUILTIN_EXCHANGES:
            await b.exchange_link(name, ex).request([T.EXCHANGE_DELETE, name, ex, False])

    def edit(defs: Definitions) -> Definitions:
        if name not in defs.vhosts:
            raise _not_found()
        defs.vhosts.remove(name)
        defs.permissions = {k: p for k, p in defs.permissions.items() if p.vhost != name}
        defs.topic_permissions = [t for t in defs.topic_permissions if t.vhost != name]
        defs.vhost_limits.pop(name, None)
        defs.default_queue_types.pop(name, None)
        return defs
    await access_sync.change(b, edit)
    return None


async def permission(request: web.Request):
    vhost, name = _arg(request, "vhost"), _arg(request, "user")
    for row in await permissions(request):
        if row["vhost"] == vhost and row["user"] == name:
            return row
    raise _not_found()


async def user_permissions(request: web.Request):
    name = _arg(request, "name")
    if name not in _broker(request).users.users:
        raise _not_found()
    return [r for r in await permissions(request) if r["user"] == name]


async def vhost_permissions(request: web.Request):
    name = _arg(request, "name")
    if name not in _broker(request).users.vhosts:
        raise _not_found()
    return [r for r in await permissions(request) if r["vhost"] == name]


async def put_permission(request: web.Request):
    vhost, name, body = _arg(request, "vhost"), _arg(request, "user"), await _body(request)
    exprs = []
    for key in ("configure", "write", "read"):
        value = body.get(key)
        if not isinstance(value, str):
            raise ApiError(400, "bad_request", f"{key} must be a string (a regular expression)")
        try:
            re.compile(value)
        except re.error as exc:
            raise ApiError(400, "bad_request", f"{key} is not a regular expression: {exc}") \
                from None
        exprs.append(value)
    created = []

    def edit(defs: Definitions) -> Definitions:
        if name not in defs.users:
            raise ApiError(400, "bad_request", f"user '{name}' does not exist")
        if vhost not in defs.vhosts:
            raise ApiError(400, "bad_request", f"vhost '{vhost}' does not exist")
        created.append((name, vhost) not in defs.permissions)
        defs.permissions[(name, vhost)] = Permission(name, vhost, *exprs)
        return defs
    await access_sync.change(_broker(request), edit)
    return web.Response(status=201 if created[-1] else 204)


async def delete_permission(request: web.Request):
    vhost, name = _arg(request, "vhost"), _arg(request, "user")

    def edit(defs: Definitions) -> Definitions:
        if (name, vhost) not in defs.permissions:
            raise _not_found()
        del defs.permissions[(name, vhost)]
        return defs
    await access_sync.change(_broker(request), edit)
    return None


async def import_definitions(request: web.Request):
    """POST /api/definitions: users, vhosts, permissions and limits are merged into the stored
    ones (an entry replaces the one of the same name, as RabbitMQ's import; a new vhost gives
    the importing user full permissions there unless the file names theirs,
    :func:`grant_creator`), then exchanges, queues and bindings are declared
    (router/import_definitions.py). 400 if the file does not check or some objects could not
    be declared."""
    b = _broker(request)
    defs = parse_definitions(await _body(request), "the posted definitions")
    acting = request["user"].name

    def edit(current: Definitions) -> Definitions:
        new = [v for v in defs.vhosts if v not in current.vhosts]
        merged = merge_access(current, defs)
        for vhost in new:
            grant_creator(merged, acting, vhost)
        return merged
    if defs.users or defs.vhosts or defs.permissions or defs.topic_permissions or \
            defs.vhost_limits:
        await access_sync.change(b, edit)
    done, skipped = await declare_topology(b, defs)
    if skipped:
        raise ApiError(400, "bad_request", f"{skipped} of {done + skipped} objects were "
                                           f"skipped (see the broker log)")
    return web.Response(status=204)


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_post("/api/definitions", import_definitions)
    r.add_post("/api/users/bulk-delete", delete_users)
    r.add_get("/api/users/{name}", user)
    r.add_put("/api/users/{name}", put_user)
    r.add_delete("/api/users/{name}", delete_user)
    r.add_get("/api/users/{name}/permissions", user_permissions)
    r.add_get("/api/vhosts/{name}", vhost)
    r.add_put("/api/vhosts/{name}", put_vhost)
    r.add_delete("/api/vhosts/{name}", delete_vhost)
    r.add_get("/api/vhosts/{name}/permissions", vhost_permissions)
    r.add_get("/api/permissions/{vhost}/{user}", permission)
    r.add_put("/api/permissions/{vhost}/{user}", put_permission)
    r.add_delete("/api/permissions/{vhost}/{user}", delete_permission)
