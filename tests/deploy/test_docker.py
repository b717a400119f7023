"""The docker image and ``shoal cluster`` against a real Docker engine.

Builds deploy/Dockerfile offline (no network in the build: wheels from deploy/wheelhouse) on a
locally made Debian base (deploy/make-base-image.sh; reused when the engine has it), starts a
1-router 2-node cluster in host-network containers, runs a pika scenario and a short load, and
tears it down. Skipped, saying why, where no engine (or no way to make the base) is available.
Set SHOAL_TEST_BASE_IMAGE to use another base image (any Debian-like image with python3).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

docker = pytest.importorskip("docker", reason="the docker package is not installed "
                                              "(pip install 'shoal[deploy]')")
pika = pytest.importorskip("pika")

from shoal.deploy import dockercluster as dc
from shoal.shared.placement import owner

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = os.environ.get("SHOAL_TEST_BASE_IMAGE", "shoal-base:bookworm")
TAG = "shoal:test"
pytestmark = pytest.mark.timeout(900)   # a first run makes the base image (debootstrap)


@pytest.fixture(scope="module")
def client():
    try:
        c = docker.from_env()
        c.ping()
    except docker.errors.DockerException as exc:
        pytest.skip(f"no Docker engine available ({str(exc).splitlines()[0][:120]})")
    yield c
    c.close()


@pytest.fixture(scope="module")
def image(client) -> str:
    """The Shoal image built from deploy/Dockerfile on BASE_IMAGE with the network off."""
    try:
        client.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        if shutil.which("debootstrap") is None or os.geteuid() != 0:
            pytest.skip(f"base image {BASE_IMAGE} is missing and cannot be made here "
                        "(deploy/make-base-image.sh needs root and debootstrap)")
        subprocess.run([str(ROOT / "deploy" / "make-base-image.sh"), BASE_IMAGE], check=True)
    dc.build_image(client, BASE_IMAGE, TAG, root=ROOT, offline=True)
    return TAG


def labelled(client, cluster_id: str) -> list:
    return client.containers.list(all=True, filters={"label": f"{dc.LABEL}={cluster_id}"})


def queues_on_each_node(node_ids: list[str]) -> dict[str, str]:
    """One queue name per node id (rendezvous placement), so the scenario crosses every node."""
    found: dict[str, str] = {}
    i = 0
    while len(found) < len(node_ids):
        name = f"deploy-q-{i}"
        found.setdefault(owner("/", name, node_ids), name)
        i += 1
    return found


def test_image_is_non_root_with_a_health_check(client, image) -> None:
    cfg = client.images.get(image).attrs["Config"]
    assert cfg["User"] == "10001:10001"
    assert cfg["Healthcheck"]["Test"][-1] == "/opt/shoal/healthcheck.py"
    assert cfg["Entrypoint"] == ["/usr/local/bin/shoal-entrypoint"]
    out = client.containers.run(image, ["sh", "-c", "id -u; shoal --help"], remove=True,
                                network_mode="none").decode()
    assert out.splitlines()[0] == "10001"
    assert "router" in out and "node" in out


def test_pika_scenario_and_load_on_a_docker_cluster(client, image, tmp_path) -> None:
    cluster = dc.DockerCluster(client, image=image, nodes=2, id=f"test-{secrets.token_hex(3)}")
    try:
        url = cluster.up()
        roles = sorted(c.labels[dc.ROLE_LABEL] for c in labelled(client, cluster.id))
        assert roles == ["node", "node", "router"]
        for c in labelled(client, cluster.id):       # the image's HEALTHCHECK command
            code, out = c.exec_run(["/opt/shoal/bin/python", "/opt/shoal/healthcheck.py"])
            assert code == 0, (c.name, out)

        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.confirm_delivery()
        queues = queues_on_each_node(["node-0", "node-1"])
        for q in queues.values():
            ch.queue_declare(q, durable=True)
            for i in range(20):                      # confirmed: raises on nack/return
                ch.basic_publish("", q, f"{q}:{i}".encode(),
                                 pika.BasicProperties(delivery_mode=2, headers={"i": i}))
        ch.basic_qos(prefetch_count=5)
        for q in queues.values():
            got = []
            for method, props, body in ch.consume(q, inactivity_timeout=10):
                assert method is not None, f"{q}: only {len(got)} of 20 delivered"
                got.append((body.decode(), props.headers["i"]))
                ch.basic_ack(method.delivery_tag)
                if len(got) == 20:
                    break
            ch.cancel()
            assert got == [(f"{q}:{i}", i) for i in range(20)]
            method, _, _ = ch.basic_get(q)
            assert method is None                    # everything was acknowledged
            ch.queue_delete(q)
        conn.close()

        results = cluster.run_load(["--time", "3", "--producers", "1", "--consumers", "1",
                                    "--size", "100", "--rate", "500"], tmp_path / "out")
        assert [r["exit_code"] for r in results] == [0]
        out = Path(results[0]["out"])
        assert (out / "container.log").is_file()
        assert [p for p in out.iterdir() if p.name != "container.log"], "no load output"
        if results[0]["tool"] == "pika-load":
            summary = json.loads((out / "summary.json").read_text())
            assert summary["received_acked"] == summary["sent_confirmed"] > 0
        else:   # issue 43 point 6: the queue's node, from the router's management API
            run = json.loads((out / "run.json").read_text())
            assert run["placement"] == "management"
            assert run["queues"][0]["node"] in ("node-0", "node-1")
        assert sorted(c.labels[dc.ROLE_LABEL] for c in labelled(client, cluster.id)) == \
            ["node", "node", "router"]               # load generators are gone
    finally:
        cluster.remove_started()
    assert labelled(client, cluster.id) == []


def cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shoal.cli", "cluster", *args],
                          capture_output=True, text=True, timeout=120, check=False, **kw)


def test_cli_up_status_down(client, image) -> None:
    cid = f"test-{secrets.token_hex(3)}"
    try:
        up = cli("up", "--nodes", "1", "--image", image, "--id", cid)
        assert up.returncode == 0, up.stderr
        url = up.stdout.split(" up: ", 1)[1].split()[0]
        conn = pika.BlockingConnection(pika.URLParameters(url))
        conn.channel().queue_declare("", exclusive=True)
        conn.close()
        status = cli("status", "--id", cid)
        assert f"{cid}-router" in status.stdout and f"{cid}-node-0" in status.stdout
        again = cli("up", "--nodes", "1", "--image", image, "--id", cid)
        assert again.returncode == 1 and "exists" in again.stderr
        down = cli("down", "--id", cid)
        assert down.returncode == 0 and "removed 2 containers" in down.stdout
    finally:
        dc.down(client, cid)
    assert labelled(client, cid) == []


def test_cli_removes_its_cluster_on_sigterm(client, image) -> None:
    cid = f"test-{secrets.token_hex(3)}"
    proc = subprocess.Popen([sys.executable, "-m", "shoal.cli", "cluster", "up",
                             "--nodes", "2", "--image", image, "--id", cid, "--foreground"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert " up: amqp://" in line, proc.stderr.read() if not line else line
        assert len(labelled(client, cid)) == 3
        proc.terminate()
        assert proc.wait(timeout=60) == 130
        assert "interrupted by SIGTERM" in proc.stderr.read()
    finally:
        proc.kill()
        dc.down(client, cid)
    assert labelled(client, cid) == []


def test_the_clusters_ports_are_picked_where_the_kernel_hands_none_out() -> None:
    """A cluster's ports (AMQP, nodes, management) come from far below the ephemeral range,
    so no outgoing connection or ``bind(0)`` takes one before its container binds it (CI
    127: "port 49981 is in use" for a router whose port was picked with ``bind(0)``), and
    apart from the test clusters' ports (tests/conftest.py ``PORT_BASE`` up)."""
    import socket

    from tests.conftest import PORT_BASE
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in {dc.free_port() for _ in range(20)}:
        assert port in dc.FREE_PORTS and port < min(low, PORT_BASE)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    # never the same port twice: a cluster picks all of its ports before any is bound (CI
    # 139: a router's AMQP port was also given to another of its containers); 200 picks at
    # random of 5,000 would repeat one with a probability of about 98 %
    picks = [dc.free_port() for _ in range(200)]
    assert len(set(picks)) == len(picks)


def test_missing_image_is_one_clear_line(client) -> None:
    res = cli("up", "--nodes", "1", "--image", "shoal-no-such-image:none",
              "--id", f"test-{secrets.token_hex(3)}")
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        ("shoal cluster: image shoal-no-such-image:none not found: build it with "
         "'shoal cluster build'")]


def test_a_router_serves_with_a_node_container_stopped(client, image) -> None:
    """Issue 36 on docker: with node-1's container stopped, a router container restarted
    serves (queues on node-0 work; node-1's answer RabbitMQ's 404), its HEALTHCHECK passes,
    and node-1 started again is taken in without restarting the router."""
    cluster = dc.DockerCluster(client, image=image, nodes=2, id=f"test-{secrets.token_hex(3)}")
    try:
        url = cluster.up()
        queues = queues_on_each_node(["node-0", "node-1"])
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        for q in queues.values():
            ch.queue_declare(q, durable=True)
        conn.close()
        by_name = {c.name[len(cluster.id) + 1:]: c for c in labelled(client, cluster.id)}
        by_name["node-1"].stop(timeout=10)
        by_name["router"].restart(timeout=10)
        conn = _connect_within(url, 60)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", queues["node-0"], b"served", pika.BasicProperties(delivery_mode=2))
        assert ch.basic_get(queues["node-0"], auto_ack=True)[2] == b"served"
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            conn.channel().queue_declare(queues["node-1"], durable=True)
        assert err.value.reply_code == 404 and "home node 'node-1'" in err.value.reply_text
        code, out = by_name["router"].exec_run(["/opt/shoal/bin/python",
                                                "/opt/shoal/healthcheck.py"])
        assert code == 0, out
        by_name["node-1"].start()
        deadline = time.monotonic() + 60
        while True:
            try:
                conn.channel().queue_declare(queues["node-1"], durable=True)
                break
            except pika.exceptions.ChannelClosedByBroker:
                assert time.monotonic() < deadline, "node-1 was not taken in"
                time.sleep(0.5)
        conn.close()
    finally:
        cluster.remove_started()


def _connect_within(url: str, seconds: float) -> pika.BlockingConnection:
    deadline = time.monotonic() + seconds
    while True:
        try:
            return pika.BlockingConnection(pika.URLParameters(url))
        except pika.exceptions.AMQPConnectionError:
            assert time.monotonic() < deadline, "the router did not serve"
            time.sleep(0.5)
