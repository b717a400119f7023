"""Users, vhosts and permissions changed at run time through the management API (issue 23,
point 1; issue 22, point 1): stored by the first node, seen by every router at once (two
routers share the API's port here), surviving a restart, and effective for pika clients:
a new user logs in, a permission change is enforced, a deleted user's connection is closed.
Also ``shoal ctl``'s user commands."""
from __future__ import annotations

import os
import signal
import time

import pika
import pytest

from tests.conftest import EXTERNAL_URL, free_port, start_cluster, stop_cluster
from tests.e2e.management.test_management import call
from tests.e2e.management.test_management_live import closed_by_broker
from tests.e2e.management.test_management_ops import ctl

pytestmark = pytest.mark.e2e


def start(data_dir, port):
    """Two routers sharing the management ``port`` (the same port again after a restart)."""
    c = start_cluster(data_dir, 2, routers=2, env={"SHOAL_MANAGEMENT_PORT": str(port)})
    c.mgmt_port = port
    return c


def url(cl, user: str, password: str, vhost: str = "%2F", router: int = 0) -> str:
    return cl.router_url(router).replace("guest:guest@", f"{user}:{password}@").rsplit(
        "/", 1)[0] + f"/{vhost}"


def refused_login(cl, user: str, password: str, vhost: str = "%2F") -> bool:
    try:
        pika.BlockingConnection(pika.URLParameters(url(cl, user, password, vhost))).close()
        return False
    except (pika.exceptions.ProbableAuthenticationError,
            pika.exceptions.ProbableAccessDeniedError, pika.exceptions.ConnectionClosedByBroker):
        return True


def test_users_vhosts_and_permissions_change_at_run_time(tmp_path, uid):
    if EXTERNAL_URL:
        pytest.skip("needs clusters of its own")
    port = free_port()
    cl = start(tmp_path / "c", port)
    try:
        u = f"app-{uid}"
        assert call(cl, "PUT", f"/users/{u}", {"password": "s3cret", "tags": "management"}
                    )[0] == 201
        assert call(cl, "PUT", "/vhosts/apps", {})[0] == 201
        # its creator (guest) gets full permissions there, as from RabbitMQ (3.10 and 4:
        # rabbit_vhost:maybe_grant_full_permissions); so does a definitions import's user
        full = {"configure": ".*", "write": ".*", "read": ".*"}
        assert {k: call(cl, "GET", "/permissions/apps/guest")[1][k] for k in full} == full
        pika.BlockingConnection(pika.URLParameters(url(cl, "guest", "guest", "apps"))).close()
        assert call(cl, "POST", "/definitions", {"vhosts": [{"name": f"imp-{uid}"}]}
                    )[0] == 204
        got = call(cl, "GET", f"/permissions/imp-{uid}/guest")[1]
        assert {k: got[k] for k in full} == full
        # a trailing slash is the same path, as RabbitMQ's router has it
        assert call(cl, "DELETE", f"/vhosts/imp-{uid}/")[0] == 204
        assert call(cl, "GET", f"/vhosts/imp-{uid}")[0] == 404
        status, body, _ = call(cl, "PUT", "/permissions/apps/nobody-at-all",
                               {"configure": ".*", "write": ".*", "read": ".*"})
        assert status == 400 and body["error"] == "bad_request"
        assert call(cl, "PUT", f"/permissions/apps/{u}",
                    {"configure": "^app-", "write": ".*", "read": ".*"})[0] == 201
        # both routers know at once (the API answered after every router applied it)
        for router in (0, 1):
            conn = pika.BlockingConnection(pika.URLParameters(url(cl, u, "s3cret", "apps",
                                                                  router)))
            ch = conn.channel()
            ch.queue_declare(f"app-q-{router}")
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
                ch.queue_declare(f"other-q-{router}")
            assert exc.value.reply_code == 403
            conn.close()
        assert refused_login(cl, u, "wrong")
        assert call(cl, "GET", f"/users/{u}")[1]["tags"] == ["management"]
        # a management user reads, administrators change (and see users and permissions)
        assert call(cl, "GET", "/queues", user=u, password="s3cret")[0] == 200
        assert call(cl, "PUT", f"/queues/apps/app-x-{uid}", {}, user=u, password="s3cret"
                    )[:2] == (401, {"error": "not_authorised",
                                    "reason": "Not administrator user"})
        assert call(cl, "GET", "/users", user=u, password="s3cret")[0] == 401
        assert call(cl, "GET", "/users/", user=u, password="s3cret")[0] == 401
        assert call(cl, "GET", "/vhosts/apps/permissions/", user=u, password="s3cret"
                    )[0] == 401
        assert call(cl, "GET", "/definitions", user=u, password="s3cret")[0] == 401
        assert [p["vhost"] for p in call(cl, "GET", f"/users/{u}/permissions")[1]] == ["apps"]
        # a permission widened applies to an open connection's next declare
        conn = pika.BlockingConnection(pika.URLParameters(url(cl, u, "s3cret", "apps")))
        assert call(cl, "PUT", f"/permissions/apps/{u}",
                    {"configure": ".*", "write": ".*", "read": ".*"})[0] == 204
        conn.channel().queue_declare(f"other-{uid}")
        # deleting the user closes its connection (320) and refuses the next login
        assert call(cl, "DELETE", f"/users/{u}")[0] == 204
        assert closed_by_broker(conn) == (320, f"CONNECTION_FORCED - user '{u}' was deleted")
        assert refused_login(cl, u, "s3cret", "apps")
        assert call(cl, "DELETE", f"/users/{u}")[0] == 404
        # kept by the first node: a restarted cluster still has the vhost and the new user
        r = ctl(cl, "add-user", f"ops-{uid}", "pw", "--tags", "administrator")
        assert r.returncode == 0, r.stderr
        assert ctl(cl, "set-permissions", "-p", "apps", f"ops-{uid}", ".*", ".*", ".*"
                   ).returncode == 0
    finally:
        stop_cluster(cl)
    cl = start(tmp_path / "c", port)
    try:
        assert "apps" in [v["name"] for v in call(cl, "GET", "/vhosts")[1]]
        conn = pika.BlockingConnection(pika.URLParameters(url(cl, f"ops-{uid}", "pw", "apps")))
        conn.close()
        assert ctl(cl, "change-password", f"ops-{uid}", "pw2").returncode == 0
        assert refused_login(cl, f"ops-{uid}", "pw", "apps")
        assert call(cl, "GET", "/queues/apps")[0] == 200
        assert call(cl, "DELETE", "/vhosts/apps")[0] == 204
        assert call(cl, "GET", "/queues/apps")[0] == 404
        assert ctl(cl, "delete-user", f"ops-{uid}").returncode == 0
        assert ctl(cl, "add-vhost", f"v-{uid}").returncode == 0
        assert f"v-{uid}" in [v["name"] for v in call(cl, "GET", "/vhosts")[1]]
    finally:
        stop_cluster(cl)


def test_a_change_while_the_first_node_is_stuck_is_503(tmp_path, uid):
    """A node does not answer (SIGSTOP on node-0, which keeps the users): a change is refused
    with 503 after the API's 5 s, lists answer with what the other nodes have and name the
    missing node, never a hang or a traceback; once it runs again, changes go through."""
    if EXTERNAL_URL:
        pytest.skip("needs clusters of its own")
    cl = start(tmp_path / "c", free_port())
    try:
        node0 = cl.node("node-0")
        if node0.embedded:
            pytest.skip("node-0 runs inside router-0 here (--embed-node): stopping it would "
                        "stop the API too")
        q = next(f"stuck-q-{uid}-{i}" for i in range(100)
                 if cl.owner(f"stuck-q-{uid}-{i}") == "node-1")
        assert call(cl, "PUT", f"/queues/%2F/{q}", {})[0] == 201
        os.kill(node0.pid, signal.SIGSTOP)
        try:
            status, body, _ = call(cl, "PUT", f"/users/stuck-{uid}", {"password": "x"})
            listed, rows, headers = call(cl, "GET", "/queues")      # what the others have
            nodes = call(cl, "GET", "/nodes")[1]
        finally:
            os.kill(node0.pid, signal.SIGCONT)
        assert status == 503 and body["error"] == "service_unavailable"
        assert listed == 200 and q in [r["name"] for r in rows]
        assert headers["X-Shoal-Missing-Nodes"] == "node-0"
        assert {n["name"]: n["running"] for n in nodes} == {"node-0": False, "node-1": True}
        # the routers may have given node-0 up meanwhile (link_heartbeat_timeout): they reconnect
        deadline, status = time.monotonic() + 30, 0
        while status != 201 and time.monotonic() < deadline:
            status = call(cl, "PUT", f"/users/stuck-{uid}", {"password": "x"})[0]
            time.sleep(0.2)
        assert status == 201
    finally:
        stop_cluster(cl)
