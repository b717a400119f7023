"""Connections, channels and consumers in the management API for the whole cluster (issue 23,
point 1; router/live.py): with two routers sharing the API's port, whichever answers lists the
clients of both, and closing a connection works wherever it lives (320 CONNECTION_FORCED, as
RabbitMQ's "Closed via management plugin"). Also pagination and ``shoal ctl`` over them."""
from __future__ import annotations

import time
import urllib.parse

import pika
import pytest

from tests.conftest import stop_cluster
from tests.e2e.management.test_management import call, http_cluster, rabbitmqadmin
from tests.e2e.management.test_management_ops import ctl

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    c = http_cluster(tmp_path_factory.mktemp("shoal-live"), routers=2,
                     mgmt_port="SHOAL_MANAGEMENT_PORT")
    yield c
    stop_cluster(c)


def connect(cl, router: int, name: str) -> pika.BlockingConnection:
    params = pika.URLParameters(cl.router_url(router))
    params.client_properties = {"connection_name": name}
    return pika.BlockingConnection(params)


def rows_named(cl, path: str, names: set[str], seconds: float = 15.0) -> list[dict]:
    """The API's rows at ``path`` whose client connection name is in ``names``, once all of
    them are listed in four answers in a row (the API's port is shared by both routers, and
    a router's report reaches the nodes a moment after a connection opens)."""
    deadline = time.monotonic() + seconds
    in_a_row = 0
    while True:
        status, rows, _ = call(cl, "GET", path)
        assert status == 200, rows
        found = [r for r in rows if _conn_name(r) in names]
        in_a_row = in_a_row + 1 if {_conn_name(r) for r in found} == names else 0
        if in_a_row == 4 or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def closed_by_broker(conn: pika.BlockingConnection, seconds: float = 15.0) -> tuple | None:
    """``(reply_code, reply_text)`` of the broker's connection.close, pumping ``conn`` for at
    most ``seconds``; None if it stayed open."""
    deadline = time.monotonic() + seconds
    try:
        while conn.is_open and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
    except pika.exceptions.ConnectionClosedByBroker as exc:
        return exc.reply_code, exc.reply_text
    return None


def _conn_name(row: dict) -> str:
    props = row.get("client_properties") or {}
    return props.get("connection_name", row.get("user_provided_name", ""))


def test_every_router_lists_every_routers_connections_channels_and_consumers(two, uid):
    a, b = connect(two, 0, f"a-{uid}"), connect(two, 1, f"b-{uid}")
    try:
        cha = a.channel()
        cha.queue_declare(f"live-{uid}")
        cha.basic_qos(prefetch_count=3)
        cha.basic_consume(f"live-{uid}", lambda *args: None, consumer_tag=f"tag-{uid}")
        b.channel()
        b.channel()
        # a router reports its live objects a moment after they change: wait until the
        # channels opened after the connection are in the report (CI's embed pass once saw
        # the report of the connection alone, under load)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(
                r["channels"] != 2 for r in rows_named(two, "/connections", {f"b-{uid}"})):
            time.sleep(0.1)
        for _ in range(4):          # the API's port is shared: each call may reach either
            conns = rows_named(two, "/connections", {f"a-{uid}", f"b-{uid}"})
            by_name = {_conn_name(r): r for r in conns}
            assert set(by_name) == {f"a-{uid}", f"b-{uid}"}
            assert by_name[f"a-{uid}"]["node"] != by_name[f"b-{uid}"]["node"]   # two routers
            assert by_name[f"b-{uid}"]["channels"] == 2
            assert by_name[f"a-{uid}"]["user"] == "guest" and by_name[f"a-{uid}"]["vhost"] == "/"
        name_a = by_name[f"a-{uid}"]["name"]
        status, chans, _ = call(two, "GET", f"/connections/{urllib.parse.quote(name_a, safe='')}"
                                           f"/channels")
        assert status == 200 and [c["prefetch_count"] for c in chans] == [3]
        assert chans[0]["consumer_count"] == 1
        cons = [c for c in call(two, "GET", "/consumers/%2F")[1]
                if c["consumer_tag"] == f"tag-{uid}"]
        assert len(cons) == 1 and cons[0]["queue"] == {"name": f"live-{uid}", "vhost": "/"}
        assert cons[0]["ack_required"] is True and cons[0]["prefetch_count"] == 3
        assert cons[0]["channel_details"]["connection_name"] == name_a
        assert call(two, "GET", "/overview")[1]["object_totals"]["connections"] >= 2
    finally:
        for c in (a, b):
            if c.is_open:
                c.close()


def test_closing_a_connection_on_either_router(two, uid):
    conns = {f"x-{uid}": connect(two, 0, f"x-{uid}"), f"y-{uid}": connect(two, 1, f"y-{uid}")}
    rows = rows_named(two, "/connections", set(conns))
    closed: dict[str, tuple] = {}
    for row in rows:
        conn = conns[_conn_name(row)]
        status, _, _ = call(two, "DELETE",
                            f"/connections/{urllib.parse.quote(row['name'], safe='')}")
        assert status == 204
        closed[_conn_name(row)] = closed_by_broker(conn)
    assert closed == {name: (320, "CONNECTION_FORCED - Closed via management plugin")
                      for name in conns}
    status, body, _ = call(two, "DELETE", "/connections/no%20such%20connection")
    assert status == 404 and body["error"] == "not_found"


def test_pagination_as_rabbitmq(two, uid):
    for i in range(3):
        call(two, "PUT", f"/queues/%2F/page-{uid}-{i}", {"durable": False})
    status, page, _ = call(two, "GET", f"/queues?page=2&page_size=2&name=page-{uid}")
    assert status == 200
    assert {k: page[k] for k in ("page", "page_size", "page_count", "filtered_count",
                                 "item_count")} == {"page": 2, "page_size": 2, "page_count": 2,
                                                    "filtered_count": 3, "item_count": 1}
    assert [q["name"] for q in page["items"]] == [f"page-{uid}-2"]
    status, body, _ = call(two, "GET", "/queues?page=0")
    assert status == 400 and body["error"] == "bad_request"


def test_ctl_lists_connections_and_closes_one(two, uid):
    conn = connect(two, 0, f"ctl-{uid}")
    try:
        (row,) = rows_named(two, "/connections", {f"ctl-{uid}"})
        r = ctl(two, "list", "connections")
        assert r.returncode == 0 and row["name"] in r.stdout
        r = ctl(two, "close-connection", row["name"])
        assert r.returncode == 0, r.stderr
        assert closed_by_broker(conn)[0] == 320
    finally:
        if conn.is_open:
            conn.close()


def test_rabbitmqadmin_gets_lists_connections_and_closes_one(two, uid):
    q = f"admin-get-{uid}"
    assert rabbitmqadmin(two, "declare", "queue", f"name={q}").returncode == 0
    assert rabbitmqadmin(two, "publish", "exchange=amq.default", f"routing_key={q}",
                         "payload=hello-admin").returncode == 0
    out = rabbitmqadmin(two, "-f", "tsv", "get", f"queue={q}", "ackmode=ack_requeue_false",
                        "count=1")
    assert out.returncode == 0, out.stderr
    assert "hello-admin" in out.stdout
    assert call(two, "GET", f"/queues/%2F/{q}")[1]["messages"] == 0
    conn = connect(two, 1, f"admin-{uid}")
    try:
        (row,) = rows_named(two, "/connections", {f"admin-{uid}"})
        out = rabbitmqadmin(two, "-f", "tsv", "list", "connections", "name", "user")
        assert f"{row['name']}\tguest" in out.stdout.splitlines()
        out = rabbitmqadmin(two, "-f", "tsv", "list", "channels", "name")
        assert out.returncode == 0, out.stderr
        assert rabbitmqadmin(two, "close", "connection", f"name={row['name']}").returncode == 0
        assert closed_by_broker(conn)[0] == 320
    finally:
        if conn.is_open:
            conn.close()
