"""The management API's message endpoints: get messages from a queue (the console's "Get
messages", ``rabbitmqadmin get``) and the aliveness test, with RabbitMQ's request and reply
JSON (management plugin, ``rabbit_mgmt_wm_queue_get`` and ``rabbit_mgmt_wm_aliveness_test``).
"""
from __future__ import annotations

import asyncio
import base64
import uuid

from aiohttp import web
from pamqp import commands as C
from pamqp.header import ContentHeader

from shoal.shared import wire
from shoal.shared.errors import AMQPError
from shoal.shared.wire import TAG_SETTLE, T

from shoal.router.amqp.fastpath import parse_properties
from shoal.router.amqp10.whole import for_091
from shoal.router.live import json_safe
from shoal.router.management.views import ApiError, _arg, _body, _broker, _vhost

#: ackmode -> the settlement of every fetched message once all are fetched (RabbitMQ fetches
#: ``count`` messages, then requeues or drops them together, so a requeued one is not
#: fetched twice by the same request).
ACKMODES = {"ack_requeue_true": wire.OUTCOME_REQUEUE, "reject_requeue_true": wire.OUTCOME_REQUEUE,
            "ack_requeue_false": wire.OUTCOME_ACK, "reject_requeue_false": wire.OUTCOME_REJECT}
#: pamqp's property names -> RabbitMQ's JSON names where they differ
_PROP_NAMES = {"message_type": "type"}


def properties_json(header: bytes) -> dict:
    """A content header's set properties as RabbitMQ's JSON (only the ones present)."""
    props = parse_properties(header)
    return {_PROP_NAMES.get(k, k): json_safe(v) for k, v in dict(props).items()
            if v is not None and not (k == "cluster_id" and v == "")}


def payload_json(body: bytes, encoding: str, truncate: int | None) -> tuple[str, str]:
    """``(payload, payload_encoding)``: text when ``encoding`` is auto and the body is UTF-8,
    else base64 (RabbitMQ's rule)."""
    data = body if truncate is None else body[:truncate]
    if encoding == "auto":
        try:
            return data.decode("utf-8"), "string"
        except UnicodeDecodeError:
            pass
    return base64.b64encode(data).decode(), "base64"


async def get_messages(request: web.Request):
    """POST /api/queues/{vhost}/{name}/get with ``{"count", "ackmode", "encoding",
    "truncate"}``: up to ``count`` messages (fewer if the queue has fewer), each with
    ``payload``, ``payload_bytes``, ``payload_encoding``, ``redelivered``, ``exchange``,
    ``routing_key``, ``message_count`` and ``properties``. 400 for a bad ackmode, encoding
    or count; 404 for a missing queue."""
    b, vhost, name = _broker(request), _vhost(request), _arg(request, "name")
    body = await _body(request)
    ackmode = body.get("ackmode", "ack_requeue_true")
    if ackmode not in ACKMODES:
        raise ApiError(400, "bad_request", f"invalid ackmode '{ackmode}': one of "
                                           f"{', '.join(ACKMODES)}")
    encoding = body.get("encoding", "auto")
    if encoding not in ("auto", "base64"):
        raise ApiError(400, "bad_request", f"invalid encoding '{encoding}': auto or base64")
    count, truncate = body.get("count", 1), body.get("truncate")
    if isinstance(count, str) and count.isdigit():
        count = int(count)
    if isinstance(truncate, str) and truncate.isdigit():
        truncate = int(truncate)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ApiError(400, "bad_request", f"invalid count {count!r}: a positive integer")
    if truncate is not None and (isinstance(truncate, bool) or not isinstance(truncate, int)
                                 or truncate < 0):
        raise ApiError(400, "bad_request", f"invalid truncate {truncate!r}: bytes, 0 or more")
    node: str | None = None
    out, ids = [], []
    try:
        for _ in range(count):
            node, got = await b.get_request(vhost, name, [T.GET, vhost, name, False, None])
            if got is None:
                break
            delivery_id, redelivered, exchange, key, header, data, left = got
            ids.append(delivery_id)
            header, data = for_091(header, bytes(data))     # an AMQP 1.0 message kept whole
            payload, kind = payload_json(bytes(data), encoding, truncate)
            out.append({"payload_bytes": len(data), "redelivered": bool(redelivered),
                        "exchange": exchange, "routing_key": key, "message_count": left,
                        "properties": properties_json(header), "payload": payload,
                        "payload_encoding": kind})
    finally:
        if ids and node is not None and node in b.links:
            b.links[node].send([TAG_SETTLE, ACKMODES[ackmode], ids])   # hot: plain ints
    return out


async def aliveness(request: web.Request):
    """GET /api/aliveness-test/{vhost}: declare ``aliveness-test`` in the vhost, publish a
    message to it and get it back: 200 ``{"status": "ok"}``, or 503 with the reason."""
    b, vhost = _broker(request), _vhost(request)
    name = "aliveness-test"
    link = b.queue_link(vhost, name)
    token = uuid.uuid4().hex.encode()
    try:
        await link.request([T.QUEUE_DECLARE, vhost, name, False, False, False, False, {}, None])
        await link.request([T.QUEUE_PURGE, vhost, name, None])
        header = ContentHeader(0, len(token), C.Basic.Properties()).marshal()
        if not b.publish_unconfirmed(vhost, "", name, header, token):
            raise ApiError(503, "failed", "the test message was not routed")
        for _ in range(50):
            got = await link.request([T.GET, vhost, name, True, None])
            if got is not None and bytes(got[5]) == token:
                return {"status": "ok"}
            await asyncio.sleep(0.02)
    except AMQPError as exc:
        raise ApiError(503, "failed", exc.reply_text) from None
    raise ApiError(503, "failed", "the test message did not come back")


def add_routes(app: web.Application) -> None:
    app.router.add_post("/api/queues/{vhost}/{name}/get", get_messages)
    app.router.add_get("/api/aliveness-test/{vhost}", aliveness)
