"""Which node holds each queue of a run, asked of the broker's management API (RabbitMQ's HTTP
API, which Shoal serves too: ``GET /api/queues/VHOST`` gives each queue's ``node``; for a
quorum queue, its leader). Issue 43 point 6: ``shoal report``'s per-node table needs it.

Asked once, after every worker declared its queues. A broker whose management API does not
answer (not enabled, another port, no access) leaves the placement to ``--nodes`` (Shoal's
hash) or unknown (``""``); the run goes on either way.
"""
from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request

from .client import AMQPUrl

#: seconds the management API may take to answer
TIMEOUT_S = 5.0
#: RabbitMQ's management port (and Shoal's ``management_port``)
DEFAULT_PORT = 15672


def default_url(amqp: AMQPUrl) -> str:
    """The management API on the AMQP host, RabbitMQ's port: ``http://HOST:15672``."""
    host = f"[{amqp.host}]" if ":" in amqp.host else amqp.host
    return f"http://{host}:{DEFAULT_PORT}"


def queue_nodes(management_url: str, amqp: AMQPUrl, queues: list[str]) -> dict[str, str]:
    """``queue -> node`` for those of ``queues`` the API lists in the URL's vhost, asked with
    the AMQP URL's user and password. Raises ``OSError`` (unreachable, HTTP error, time-out)
    or ``ValueError`` (an answer that is not RabbitMQ's queue list)."""
    vhost = urllib.parse.quote(amqp.vhost, safe="")
    url = f"{management_url.rstrip('/')}/api/queues/{vhost}?columns=name,node"
    token = base64.b64encode(f"{amqp.user}:{amqp.password}".encode()).decode()
    req = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
        rows = json.loads(resp.read())
    if not isinstance(rows, list):
        raise ValueError("the management API's queue list is not a JSON array")
    wanted = set(queues)
    return {r["name"]: str(r["node"]) for r in rows
            if isinstance(r, dict) and r.get("name") in wanted and r.get("node")}
