"""The management HTTP API, first slice (issue 23; router/management/): RabbitMQ's paths,
JSON fields and status codes, with plain HTTP and with RabbitMQ's own ``rabbitmqadmin`` (from
Debian's rabbitmq-server package; those tests skip, saying so, where it is not installed)."""
from __future__ import annotations

import base64
import json
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request

import pytest

from tests.conftest import EXTERNAL_URL, free_port, start_cluster, stop_cluster

pytestmark = pytest.mark.e2e



def http_cluster(data_dir, nodes: int = 2, routers: int = 1, **ports: str):
    """A cluster whose routers serve HTTP: ``ports`` maps a Cluster attribute (``mgmt_port``,
    ``prom_port``) to the setting's env name, each given a free port. The caller stops it."""
    if EXTERNAL_URL:
        pytest.skip("needs a cluster started with its own HTTP ports")
    chosen = {attr: free_port() for attr in ports}
    c = start_cluster(data_dir, nodes, routers=routers,
                      env={env: str(chosen[attr]) for attr, env in ports.items()})
    for attr, port in chosen.items():
        setattr(c, attr, port)
    return c


@pytest.fixture(scope="module")
def mgmt(tmp_path_factory):
    c = http_cluster(tmp_path_factory.mktemp("shoal-mgmt"), mgmt_port="SHOAL_MANAGEMENT_PORT")
    yield c
    stop_cluster(c)


def call(cl, method: str, path: str, body=None, user="guest", password="guest"):
    """``(status, parsed JSON or None, headers)``."""
    data = None if body is None else (body if isinstance(body, bytes)
                                      else json.dumps(body).encode())
    req = urllib.request.Request(f"http://127.0.0.1:{cl.mgmt_port}/api{path}", data=data,
                                 method=method)
    req.add_header("Authorization", "Basic " + base64.b64encode(
        f"{user}:{password}".encode()).decode())
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            raw, status, headers = r.read(), r.status, r.headers
    except urllib.error.HTTPError as e:
        raw, status, headers = e.read(), e.code, e.headers
    return status, (json.loads(raw) if raw else None), headers


def test_a_wrong_password_is_401_with_rabbitmqs_error_json(mgmt):
    status, body, _ = call(mgmt, "GET", "/overview", password="wrong")
    assert status == 401 and body == {"error": "not_authorised", "reason": "Login failed"}


def test_overview_and_whoami(mgmt):
    status, body, _ = call(mgmt, "GET", "/overview")
    assert status == 200 and body["product_name"] == "Shoal"
    assert {"queues", "exchanges", "connections", "channels", "consumers"} <= \
        set(body["object_totals"])
    stats = body["message_stats"]               # summed over routers, RabbitMQ's names
    assert {"publish", "deliver_get", "ack", "confirm"} <= set(stats)
    assert set(stats["publish_details"]) == {"rate"}
    assert [t["name"] for t in body["exchange_types"]] == [   # the console's choices
        "direct", "fanout", "headers", "topic", "x-consistent-hash", "x-local-random"]
    assert call(mgmt, "GET", "/whoami")[1] == {"name": "guest", "tags": ["administrator"]}
    assert call(mgmt, "GET", "/health/checks/alarms")[:2] == (200, {"status": "ok"})
    nodes = call(mgmt, "GET", "/nodes")[1]
    assert [n["name"] for n in nodes] == ["node-0", "node-1"] and all(n["running"]
                                                                     for n in nodes)
    assert all(n["mem_used"] > 0 and n["mem_alarm"] is False for n in nodes)


def test_queue_declare_publish_count_purge_delete(mgmt, uid):
    q = f"mgmt-q-{uid}"
    assert call(mgmt, "PUT", f"/queues/%2F/{q}", {"durable": True,
                                                  "arguments": {"x-max-length": 5}})[0] == 201
    routed = call(mgmt, "POST", "/exchanges/%2F/amq.default/publish",
                  {"routing_key": q, "payload": "hi", "payload_encoding": "string",
                   "properties": {"delivery_mode": 2}})
    assert routed[:2] == (200, {"routed": True})
    assert call(mgmt, "POST", "/exchanges/%2F/amq.default/publish",
                {"routing_key": f"nowhere-{uid}", "payload": "x",
                 "properties": {}})[1] == {"routed": False}
    status, row, _ = call(mgmt, "GET", f"/queues/%2F/{q}")
    assert status == 200 and row["messages"] == row["messages_ready"] == 1
    assert row["arguments"] == {"x-max-length": 5} and row["durable"] is True
    listed = call(mgmt, "GET", "/queues/%2F?columns=name,messages")[1]
    assert {"name": q, "messages": 1} in listed
    assert call(mgmt, "DELETE", f"/queues/%2F/{q}/contents")[0] == 204
    assert call(mgmt, "GET", f"/queues/%2F/{q}")[1]["messages"] == 0
    assert call(mgmt, "DELETE", f"/queues/%2F/{q}")[0] == 204
    assert call(mgmt, "GET", f"/queues/%2F/{q}")[:2] == (
        404, {"error": "not_found", "reason": "Object Not Found"})


def test_exchanges_and_bindings(mgmt, uid):
    x, q = f"mgmt-x-{uid}", f"mgmt-bq-{uid}"
    assert call(mgmt, "PUT", f"/exchanges/%2F/{x}", {"type": "topic"})[0] == 201
    assert call(mgmt, "PUT", f"/queues/%2F/{q}", {})[0] == 201
    assert call(mgmt, "POST", f"/bindings/%2F/e/{x}/q/{q}", {"routing_key": "a.#"})[0] == 201
    assert call(mgmt, "GET", f"/exchanges/%2F/{x}")[1]["type"] == "topic"
    bindings = call(mgmt, "GET", "/bindings/%2F")[1]
    assert {"source": x, "destination": q, "routing_key": "a.#"}.items() <= \
        next(b for b in bindings if b["source"] == x).items()
    assert call(mgmt, "POST", f"/exchanges/%2F/{x}/publish",
                {"routing_key": "a.b", "payload": "m", "properties": {}})[1] == {"routed": True}
    assert call(mgmt, "GET", f"/queues/%2F/{q}")[1]["messages"] == 1
    pair = call(mgmt, "GET", f"/bindings/%2F/e/{x}/q/{q}")[1]
    assert [b["properties_key"] for b in pair] == ["a.%23"]      # quoted, as RabbitMQ
    assert call(mgmt, "DELETE", f"/bindings/%2F/e/{x}/q/{q}/a.%23")[0] == 204
    assert call(mgmt, "GET", f"/bindings/%2F/e/{x}/q/{q}")[1] == []
    assert call(mgmt, "POST", f"/exchanges/%2F/{x}/publish",
                {"routing_key": "a.b", "payload": "m", "properties": {}})[1] == {"routed": False}
    assert call(mgmt, "DELETE", f"/bindings/%2F/e/{x}/q/{q}/a.%23")[0] == 404
    assert call(mgmt, "PUT", "/exchanges/%2F/amq.mine", {"type": "direct"})[0] == 403
    assert call(mgmt, "PUT", f"/exchanges/%2F/{x}-2", {"type": "nope"})[0] == 400
    assert call(mgmt, "DELETE", f"/exchanges/%2F/{x}")[0] == 204
    assert call(mgmt, "DELETE", f"/queues/%2F/{q}")[0] == 204


def test_a_queues_and_an_exchanges_bindings_as_rabbitmq_lists_them(mgmt, uid):
    """The management UI's queue and exchange pages and AMQPStorm's ``queue.bindings`` /
    ``exchange.bindings``: a queue's binding to the default exchange comes first, as RabbitMQ's
    implicit bindings do (also in /api/bindings, never in the definitions export)."""
    x, y, q = f"mgmt-bx-{uid}", f"mgmt-by-{uid}", f"mgmt-bq2-{uid}"
    for name, type_ in ((x, "direct"), (y, "fanout")):
        assert call(mgmt, "PUT", f"/exchanges/%2F/{name}", {"type": type_})[0] == 201
    assert call(mgmt, "PUT", f"/queues/%2F/{q}", {})[0] == 201
    assert call(mgmt, "POST", f"/bindings/%2F/e/{x}/q/{q}", {"routing_key": "k"})[0] == 201
    assert call(mgmt, "POST", f"/bindings/%2F/e/{x}/e/{y}", {"routing_key": "r"})[0] == 201
    default = {"source": "", "vhost": "/", "destination": q, "destination_type": "queue",
               "routing_key": q, "arguments": {}, "properties_key": q}
    listed = call(mgmt, "GET", f"/queues/%2F/{q}/bindings")[1]
    assert listed[0] == default
    assert [(b["source"], b["routing_key"]) for b in listed[1:]] == [(x, "k")]
    source = call(mgmt, "GET", f"/exchanges/%2F/{x}/bindings/source")[1]
    assert sorted((b["destination"], b["destination_type"]) for b in source) == \
        sorted([(q, "queue"), (y, "exchange")])
    assert [b["source"] for b in
            call(mgmt, "GET", f"/exchanges/%2F/{y}/bindings/destination")[1]] == [x]
    assert call(mgmt, "GET", f"/exchanges/%2F/{y}/bindings/source")[1] == []
    assert default in call(mgmt, "GET", "/exchanges/%2F/amq.default/bindings/source")[1]
    assert default in call(mgmt, "GET", "/bindings/%2F")[1]
    exported = call(mgmt, "GET", "/definitions")[1]["bindings"]
    assert not [b for b in exported if b["source"] == ""]
    for path in (f"/queues/%2F/nope-{uid}/bindings", f"/exchanges/%2F/nope-{uid}/bindings/source"):
        assert call(mgmt, "GET", path)[:2] == (404, {"error": "not_found",
                                                     "reason": "Object Not Found"})
    for path in (f"/exchanges/%2F/{x}", f"/exchanges/%2F/{y}", f"/queues/%2F/{q}"):
        assert call(mgmt, "DELETE", path)[0] == 204


def test_one_node_the_cluster_name_and_the_node_health_checks(mgmt):
    overview = call(mgmt, "GET", "/overview")[1]
    assert call(mgmt, "GET", "/cluster-name")[1] == {"name": overview["cluster_name"]}
    assert call(mgmt, "GET", "/nodes/node-1")[1]["name"] == "node-1"
    assert call(mgmt, "GET", "/nodes/node-9")[0] == 404
    router = overview["contexts"][0]["node"]          # AMQPStorm's healthchecks test asks it
    for path in ("/healthchecks/node", f"/healthchecks/node/{router}",
                 "/healthchecks/node/node-0"):
        assert call(mgmt, "GET", path)[:2] == (200, {"status": "ok"})
    assert call(mgmt, "GET", "/healthchecks/node/node-9")[0] == 404


def test_users_deleted_in_bulk(mgmt, uid):
    names = [f"bulk-{uid}-{i}" for i in range(3)]
    for n in names:
        assert call(mgmt, "PUT", f"/users/{n}", {"password": "pw", "tags": ""})[0] == 201
    assert call(mgmt, "POST", "/users/bulk-delete",
                {"users": names[:2] + [f"never-{uid}"]})[0] == 204
    assert [call(mgmt, "GET", f"/users/{n}")[0] for n in names] == [404, 404, 200]
    assert call(mgmt, "POST", "/users/bulk-delete", {"names": names})[:2] == (
        400, {"error": "bad_request", "reason": "key_missing: users (a list of user names)"})
    assert call(mgmt, "DELETE", f"/users/{names[2]}")[0] == 204


def test_bad_input_gets_json_errors(mgmt, uid):
    status, body, _ = call(mgmt, "PUT", f"/queues/%2F/mgmt-bad-{uid}", b"{not json")
    assert status == 400 and body["error"] == "bad_request"
    status, body, _ = call(mgmt, "GET", "/queues/no-such-vhost")
    assert (status, body) == (404, {"error": "not_found", "reason": "vhost_not_found"})
    assert call(mgmt, "PUT", f"/queues/%2F/mgmt-args-{uid}",
                {"arguments": {"x-max-priority": "ten"}})[0] == 400


def test_definitions_export_and_import(mgmt, uid):
    status, defs, _ = call(mgmt, "GET", "/definitions")
    assert status == 200 and defs["rabbit_version"]
    assert [u["name"] for u in defs["users"]] == ["guest"]
    defs["queues"] = [{"name": f"mgmt-imp-{uid}", "vhost": "/", "durable": True,
                       "auto_delete": False, "arguments": {}}]
    assert call(mgmt, "POST", "/definitions", defs)[0] == 204
    assert call(mgmt, "GET", f"/queues/%2F/mgmt-imp-{uid}")[0] == 200
    defs["users"].append({"name": f"imported-{uid}", "password_hash": "", "tags": []})
    assert call(mgmt, "POST", "/definitions", defs)[0] == 204      # users change at run time
    assert f"imported-{uid}" in [u["name"] for u in call(mgmt, "GET", "/users")[1]]
    assert call(mgmt, "DELETE", f"/users/imported-{uid}")[0] == 204
    call(mgmt, "DELETE", f"/queues/%2F/mgmt-imp-{uid}")


def rabbitmqadmin(cl, *args: str) -> subprocess.CompletedProcess:
    tool = shutil.which("rabbitmqadmin")
    if tool is None:
        pytest.skip("rabbitmqadmin is not installed (Debian's rabbitmq-server package has it)")
    return subprocess.run([tool, "-H", "127.0.0.1", "-P", str(cl.mgmt_port), "-u", "guest",
                           "-p", "guest", *args], capture_output=True, text=True, timeout=30)


def test_rabbitmqadmin_declare_list_publish_purge_delete(mgmt, uid, tmp_path):
    q = f"mgmt-admin-{uid}"
    assert rabbitmqadmin(mgmt, "declare", "queue", f"name={q}", "durable=true").returncode == 0
    out = rabbitmqadmin(mgmt, "publish", "exchange=amq.default", f"routing_key={q}",
                        "payload=hello")
    assert out.returncode == 0 and "Message published" in out.stdout and "NOT" not in out.stdout
    out = rabbitmqadmin(mgmt, "-f", "tsv", "list", "queues", "name", "messages")
    assert f"{q}\t1" in out.stdout.splitlines()
    assert rabbitmqadmin(mgmt, "purge", "queue", f"name={q}").returncode == 0
    export = tmp_path / "defs.json"
    assert rabbitmqadmin(mgmt, "export", str(export)).returncode == 0
    assert any(x["name"] == q for x in json.loads(export.read_text())["queues"])
    assert rabbitmqadmin(mgmt, "import", str(export)).returncode == 0
    assert rabbitmqadmin(mgmt, "delete", "queue", f"name={q}").returncode == 0
    out = rabbitmqadmin(mgmt, "-f", "tsv", "list", "queues", "name")
    assert q not in out.stdout


def test_bindings_that_differ_only_in_arguments_have_their_own_properties_keys(mgmt, uid):
    """RabbitMQ's ``properties_key``: the routing key quoted as a query string is, and
    ``~hash`` of the arguments when there are any, so each of a headers exchange's bindings
    can be shown and deleted on its own; the key goes back in the path percent-encoded."""
    x, q = f"mgmt-hx-{uid}", f"mgmt-hq-{uid}"
    assert call(mgmt, "PUT", f"/exchanges/%2F/{x}", {"type": "headers"})[0] == 201
    assert call(mgmt, "PUT", f"/queues/%2F/{q}", {})[0] == 201
    for args in ({"x-match": "all", "a": "1"}, {"x-match": "all", "a": "2"}):
        assert call(mgmt, "POST", f"/bindings/%2F/e/{x}/q/{q}",
                    {"routing_key": "k/1 ~", "arguments": args})[0] == 201
    assert call(mgmt, "POST", f"/bindings/%2F/e/{x}/q/{q}", {"routing_key": ""})[0] == 201
    pair = call(mgmt, "GET", f"/bindings/%2F/e/{x}/q/{q}")[1]
    keys = {b["arguments"].get("a"): b["properties_key"] for b in pair}
    assert keys[None] == "~"
    assert keys["1"] != keys["2"]
    assert all(keys[a].startswith("k%2F1+%7E~") for a in ("1", "2"))
    path = f"/bindings/%2F/e/{x}/q/{q}/" + urllib.parse.quote(keys["2"], safe="")
    assert call(mgmt, "GET", path)[1]["arguments"] == {"x-match": "all", "a": "2"}
    assert call(mgmt, "DELETE", path)[0] == 204
    assert call(mgmt, "GET", path)[0] == 404
    left = call(mgmt, "GET", f"/bindings/%2F/e/{x}/q/{q}")[1]
    assert sorted(b["properties_key"] for b in left) == sorted([keys["1"], "~"])
    assert call(mgmt, "DELETE", f"/bindings/%2F/e/{x}/q/{q}/~")[0] == 204
    assert call(mgmt, "GET", f"/bindings/%2F/e/{x}/q/{q}/a~b~c")[0] == 404
    for path in (f"/exchanges/%2F/{x}", f"/queues/%2F/{q}"):
        assert call(mgmt, "DELETE", path)[0] == 204


def test_names_in_paths_are_decoded_once_and_amq_default_is_the_default_exchange(mgmt, uid):
    """A queue named ``p%41`` is ``p%2541`` in a path, as with RabbitMQ (it was read as
    ``pA``); ``/api/exchanges/V/amq.default`` is the default exchange, named ``""``."""
    q = f"mgmt-p%41-{uid}"
    quoted = urllib.parse.quote(q, safe="")
    assert call(mgmt, "PUT", f"/queues/%2F/{quoted}", {})[0] == 201
    assert call(mgmt, "GET", f"/queues/%2F/{quoted}")[1]["name"] == q
    assert q in [r["name"] for r in call(mgmt, "GET", "/queues/%2F")[1]]
    assert call(mgmt, "GET", f"/queues/%2F/{quoted}/bindings")[1][0]["properties_key"] == \
        urllib.parse.quote_plus(q)
    assert call(mgmt, "DELETE", f"/queues/%2F/{quoted}")[0] == 204
    status, row, _ = call(mgmt, "GET", "/exchanges/%2F/amq.default")
    assert (status, row["name"], row["type"]) == (200, "", "direct")
