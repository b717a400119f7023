"""``shoal ctl``: the operator's command line over the management HTTP API (issue 23, point 4;
docs/management.md), in the spirit of ``rabbitmqctl`` and ``rabbitmqadmin``.

It talks to any router's API (``--url``, env ``SHOAL_MANAGEMENT_URL``, default
``http://127.0.0.1:15672``) as ``--user``/``--password`` (env ``SHOAL_USER``/``SHOAL_PASSWORD``,
default guest/guest). Lists print a table (``--json`` for the API's JSON). Any error (HTTP
status, the API's ``{"error", "reason"}``, a refused connection) prints one line on stderr and
exits 1; bad arguments exit 2 (argparse).
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

#: Columns shown per list (RabbitMQ's field names; ``--json`` gives every field).
COLUMNS = {
    "queues": ["vhost", "name", "node", "messages_ready", "messages_unacknowledged",
               "consumers", "durable"],
    "exchanges": ["vhost", "name", "type", "durable", "auto_delete", "internal"],
    "bindings": ["vhost", "source", "destination_type", "destination", "routing_key"],
    "connections": ["name", "user", "vhost", "channels", "state", "node"],
    "channels": ["name", "connection_details.name", "number", "consumer_count",
                 "messages_unacknowledged", "prefetch_count"],
    "consumers": ["queue.vhost", "queue.name", "consumer_tag", "channel_details.name",
                  "ack_required", "prefetch_count"],
    "nodes": ["name", "running", "queues"],
    "users": ["name", "tags"],
    "vhosts": ["name"],
    "permissions": ["user", "vhost", "configure", "write", "read"],
}


class CtlError(Exception):
    """What went wrong, in one line for the operator."""


def q(name: str) -> str:
    """A path segment, percent-encoded as the API wants (``/`` is ``%2F``)."""
    return urllib.parse.quote(name, safe="")


class Api:
    """The management API at ``url`` with HTTP basic auth."""

    def __init__(self, url: str, user: str, password: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.auth = f"Basic {token}"
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """``method path`` with a JSON ``body``; returns the decoded JSON (None when empty).
        Raises CtlError with the API's reason, or why the API could not be reached."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": self.auth, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                text = resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", "replace")
            try:
                err = json.loads(text)
                reason = f"{err.get('error')}: {err.get('reason')}"
            except (ValueError, AttributeError):
                reason = text.strip()[:200] or exc.reason
            raise CtlError(f"{method} {path}: {exc.code} {reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            why = getattr(exc, "reason", exc)
            raise CtlError(f"cannot reach the management API at {self.url}: {why}") from None
        return json.loads(text) if text.strip() else None


def _get(row: dict, path: str) -> Any:
    for part in path.split("."):
        row = row.get(part, "") if isinstance(row, dict) else ""
    return row


def table(rows: list[dict], columns: list[str]) -> str:
    """Rows as a plain text table with a header line."""
    cells = [columns] + [[_text(_get(r, c)) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip()
                     for line in cells)


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return ",".join(map(str, v))
    return "" if v is None else str(v)


def run(api: Api, a: argparse.Namespace) -> str | None:
    """Carry out one parsed command; returns what to print."""
    vh = q(a.vhost)
    if a.command == "list":
        path = f"/api/{a.what}" + (f"/{vh}" if a.what in ("queues", "exchanges", "bindings")
                                   and a.vhost_given else "")
        rows = api.call("GET", path)
        return json.dumps(rows, indent=2) if a.json else table(rows, COLUMNS[a.what])
    if a.command == "purge":
        api.call("DELETE", f"/api/queues/{vh}/{q(a.queue)}/contents")
        return f"purged queue '{a.queue}'"
    if a.command == "delete":
        kind = "queues" if a.kind == "queue" else "exchanges"
        api.call("DELETE", f"/api/{kind}/{vh}/{q(a.name)}")
        return f"deleted {a.kind} '{a.name}'"
    if a.command == "close-connection":
        api.call("DELETE", f"/api/connections/{q(a.name)}")
        return f"closed connection '{a.name}'"
    if a.command == "export":
        defs = api.call("GET", "/api/definitions")
        text = json.dumps(defs, indent=2)
        if a.file == "-":
            return text
        with open(a.file, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        return f"exported definitions to {a.file}"
    if a.command == "import":
        try:
            with open(a.file, encoding="utf-8") as f:
                defs = json.load(f)
        except (OSError, ValueError) as exc:
            raise CtlError(f"cannot read definitions from {a.file}: {exc}") from None
        api.call("POST", "/api/definitions", defs)
        return f"imported definitions from {a.file}"
    if a.command == "add-user":
        api.call("PUT", f"/api/users/{q(a.name)}", {"password": a.password, "tags": a.tags})
        return f"added user '{a.name}'"
    if a.command == "change-password":
        user = api.call("GET", f"/api/users/{q(a.name)}")
        api.call("PUT", f"/api/users/{q(a.name)}",
                 {"password": a.password, "tags": ",".join(user.get("tags") or [])})
        return f"changed the password of '{a.name}'"
    if a.command == "delete-user":
        api.call("DELETE", f"/api/users/{q(a.name)}")
        return f"deleted user '{a.name}'"
    if a.command == "add-vhost":
        api.call("PUT", f"/api/vhosts/{q(a.name)}", {})
        return f"added vhost '{a.name}'"
    if a.command == "set-permissions":
        api.call("PUT", f"/api/permissions/{vh}/{q(a.user)}",
                 {"configure": a.conf, "write": a.write, "read": a.read})
        return f"set permissions of '{a.user}' in vhost '{a.vhost}'"
    if a.command in QUORUM_COMMANDS:
        return run_quorum(api, a)
    raise CtlError(f"unknown command {a.command}")  # pragma: no cover (argparse refuses it)


#: rabbitmq-queues' commands, with its argument order (docs/replication.md, "Operating")
QUORUM_COMMANDS = ("add_member", "delete_member", "grow", "shrink", "rebalance",
                   "quorum_status", "stream_status")


def run_quorum(api: Api, a: argparse.Namespace) -> str:
    """The quorum queue commands (router/management/quorum_views.py)."""
    vh = q(a.vhost)
    if a.command == "quorum_status":
        rows = api.call("GET", f"/api/queues/{vh}/{q(a.queue)}/quorum-status")
        return json.dumps(rows, indent=2) if a.json else table(
            rows, ["node", "raft_state", "membership", "last_index", "commit_index", "term"])
    if a.command == "stream_status":        # rabbitmq-streams stream_status
        rows = api.call("GET", f"/api/queues/{vh}/{q(a.queue)}/stream-status")
        return json.dumps(rows, indent=2) if a.json else table(
            rows, ["role", "node", "epoch", "offset", "committed_offset", "first_offset",
                   "readers", "segments"])
    if a.command == "add_member":
        out = api.call("POST", f"/api/queues/{vh}/{q(a.queue)}/members", {"node": a.node})
        return f"queue '{a.queue}': members {', '.join(out['members'])}"
    if a.command == "delete_member":
        out = api.call("DELETE", f"/api/queues/{vh}/{q(a.queue)}/members/{q(a.node)}")
        return f"queue '{a.queue}': members {', '.join(out['members'])}"
    if a.command in ("grow", "shrink"):
        body = {"node": a.node}
        if a.command == "grow":
            body["strategy"] = a.strategy
        rows = api.call("POST", f"/api/quorum/{a.command}", body)
        return f"{a.command}: {len(rows)} quorum queues changed" + \
            "".join(f"\n  {r['vhost']} {r['name']}" for r in rows)
    rows = api.call("POST", "/api/rebalance/quorum")
    return f"rebalance: {len(rows)} leaders moved" + \
        "".join(f"\n  {r['vhost']} {r['name']}: {r['from']} -> {r['to']}" for r in rows)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shoal ctl", description="Manage a running Shoal through "
                                "its management HTTP API (any router answers for all).")
    p.add_argument("--url", default=os.environ.get("SHOAL_MANAGEMENT_URL",
                                                   "http://127.0.0.1:15672"),
                   help="the management API (default http://127.0.0.1:15672, env "
                        "SHOAL_MANAGEMENT_URL)")
    p.add_argument("--user", "-u", dest="api_user", default=os.environ.get("SHOAL_USER", "guest"),
                   help="who logs in to the API (default guest, env SHOAL_USER)")
    p.add_argument("--password", dest="api_password",
                   default=os.environ.get("SHOAL_PASSWORD", "guest"),
                   help="their password (default guest, env SHOAL_PASSWORD)")
    p.add_argument("--vhost", "-p", default=None, help="virtual host (default /)")
    # -p VHOST also after the command, as rabbitmqctl takes it (set-permissions -p VH ...)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--vhost", "-p", default=argparse.SUPPRESS, help="virtual host")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add = sub.add_parser

    def add_parser(name: str, **kw) -> argparse.ArgumentParser:
        return add(name, parents=[common], **kw)

    sub.add_parser = add_parser  # type: ignore[method-assign]
    ls = sub.add_parser("list", help="list queues, exchanges, bindings, connections, ...")
    ls.add_argument("what", choices=sorted(COLUMNS))
    ls.add_argument("--json", action="store_true", help="the API's JSON instead of a table")
    sub.add_parser("purge", help="purge a queue").add_argument("queue")
    d = sub.add_parser("delete", help="delete a queue or an exchange")
    d.add_argument("kind", choices=["queue", "exchange"])
    d.add_argument("name")
    sub.add_parser("close-connection", help="close a client connection (its name as "
                   "listed)").add_argument("name")
    sub.add_parser("export", help="write the definitions (JSON) to FILE, - for stdout"
                   ).add_argument("file")
    sub.add_parser("import", help="load definitions (JSON) from FILE").add_argument("file")
    au = sub.add_parser("add-user", help="add a user (password hashed by the broker)")
    au.add_argument("name")
    au.add_argument("password")
    au.add_argument("--tags", default="", help="comma-separated: administrator, management, "
                                               "monitoring")
    cp = sub.add_parser("change-password", help="set a user's password")
    cp.add_argument("name")
    cp.add_argument("password")
    sub.add_parser("delete-user", help="delete a user").add_argument("name")
    sub.add_parser("add-vhost", help="add a virtual host").add_argument("name")
    sp = sub.add_parser("set-permissions", help="set a user's permissions in a vhost "
                        "(rabbitmqctl's order: USER CONF WRITE READ, regular expressions)")
    for arg in ("user", "conf", "write", "read"):
        sp.add_argument(arg)
    # rabbitmq-queues' commands, same names and argument order
    for name, text in (("add_member", "add a member on NODE to a quorum queue"),
                       ("delete_member", "remove the member on NODE of a quorum queue")):
        m = sub.add_parser(name, help=text)
        m.add_argument("queue")
        m.add_argument("node")
    g = sub.add_parser("grow", help="add a member on NODE to every quorum queue (all), or to "
                       "those with an even number of members (even)")
    g.add_argument("node")
    g.add_argument("strategy", choices=["all", "even"])
    sub.add_parser("shrink", help="remove the members on NODE of every quorum queue"
                   ).add_argument("node")
    sub.add_parser("rebalance", help="spread quorum queue leaders over the nodes"
                   ).add_argument("type", choices=["all", "quorum"])
    qs = sub.add_parser("quorum_status", help="a quorum queue's members and their Raft state")
    qs.add_argument("queue")
    qs.add_argument("--json", action="store_true", help="the API's JSON instead of a table")
    ss = sub.add_parser("stream_status", help="a stream's members, offsets and segments "
                        "(rabbitmq-streams stream_status)")
    ss.add_argument("queue")
    ss.add_argument("--json", action="store_true", help="the API's JSON instead of a table")
    return p


def main(argv: list[str]) -> int:
    a = parser().parse_args(argv)
    a.vhost_given = a.vhost is not None
    a.vhost = a.vhost if a.vhost is not None else "/"
    try:
        out = run(Api(a.url, a.api_user, a.api_password), a)
    except CtlError as exc:
        print(f"shoal ctl: {exc}", file=sys.stderr)
        return 1
    if out:
        print(out)
    return 0
