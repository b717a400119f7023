"""``shoal cluster``: Shoal clusters in docker containers, for load tests (docs/deploy.md).

Commands (``shoal cluster COMMAND --help`` for flags)::

    shoal cluster build  [--base-image IMG] [--tag TAG]   # wheelhouse + deploy/Dockerfile
    shoal cluster up     --nodes N [--image TAG] [--port P] [--id ID]
                         [--loadtest-args '...' [--loadgens K] [--out DIR]] [--foreground]
    shoal cluster loadtest [--id ID] [--loadgens K] [--out DIR] -- ARGS...
    shoal cluster status [--id ID]
    shoal cluster down   [--id ID]

Every container runs with host networking on 127.0.0.1: the router on ``--port`` (a free one by
default), node ``i`` as ``node-<i>`` on ``tcp://127.0.0.1:<free port>``. Each carries the labels
``shoal.cluster=<id>`` and ``shoal.role=router|node|loadgen`` (the router also ``shoal.url``),
so ``down`` finds everything a cluster started, whichever process started it. A command that is
interrupted (SIGINT/SIGTERM) or fails removes the containers it started itself.

A load generator runs ``shoal loadtest --url URL ARGS --out /out`` in the same image (the
``shoal loadtest`` tool, when the image has it; otherwise this module's small pika
publish/consume load, ``python -m shoal.deploy.pika_load``), and its ``/out`` is
copied to ``OUT/<container name>/`` on the host with the container's log.

Needs the ``docker`` package (``pip install 'shoal[deploy]'``) and a Docker engine. Errors are
:class:`ClusterError` (one line; the CLI exits 1).
"""
from __future__ import annotations

import argparse
import random
import secrets
import shlex
import signal
import socket
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .image import DEFAULT_IMAGE, ClusterError, Interrupted, build_image, docker_client

LABEL = "shoal.cluster"
ROLE_LABEL = "shoal.role"
URL_LABEL = "shoal.url"
#: the router's management API (``shoal loadtest --management-url``: which node holds a queue)
MANAGEMENT_LABEL = "shoal.management"
NODE_READY_TIMEOUT_S = 60.0
ROUTER_READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10
LOAD_TIMEOUT_S = 600.0


#: where :func:`free_port` picks from: below RabbitMQ's management and Prometheus ports
#: (15672, 15692) and far below the kernel's ephemeral range (``bind(0)`` and outgoing
#: connections draw from that), and apart from the ports the test suite hands its own
#: clusters (tests/conftest.py: 20000 up, one slice per xdist worker)
FREE_PORTS = range(10000, 15000)
#: the ports :func:`free_port` gave in this process, not given again: a cluster picks all its
#: ports before its containers bind any, so a pick free at the time could be another pick of
#: the same cluster (CI 139: "port 13260 is in use" for a router's AMQP port)
_given: set[int] = set()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now and not given before by this process, picked at
    random in :data:`FREE_PORTS`: one that ``bind(0)`` gave could be taken by an outgoing
    connection before the container bound it (CI 127: a router's "port 49981 is in use",
    picked with ``bind(0)`` while its nodes started). Falls back to ``bind(0)`` if none of
    64 tries binds."""
    rng = random.SystemRandom()
    port = first_free(p for p in (rng.choice(FREE_PORTS) for _ in range(64))
                      if p not in _given)
    if port is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    if len(_given) >= len(FREE_PORTS) // 2:     # a long-lived process: start afresh
        _given.clear()
    _given.add(port)
    return port


def first_free(ports: Iterable[int]) -> int | None:
    """The first of ``ports`` that binds on 127.0.0.1 now (tried in order, lazily), or None.
    tests/conftest.py's ``free_port`` tries its slice with it too."""
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return None


@contextmanager
def signals_raise() -> Iterator[None]:
    """Turn the first SIGINT/SIGTERM into :class:`Interrupted` inside the block (main thread
    only); later ones are ignored so that the clean-up in ``finally`` runs to the end."""
    seen: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if not seen:                        # a second signal must not cut the clean-up short
            seen.append(signum)
            raise Interrupted(f"interrupted by {signal.Signals(signum).name}")
    try:
        old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:                      # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# --- the cluster -------------------------------------------------------------------------

@dataclass
class DockerCluster:
    """One router and ``nodes`` node containers on the host network, labelled ``id``."""

    client: Any
    image: str = DEFAULT_IMAGE
    nodes: int = 2
    port: int = 0                          #: router AMQP port; 0 picks a free one
    id: str = field(default_factory=lambda: f"shoal-{secrets.token_hex(3)}")
    user: str = "guest"
    password: str = "guest"
    started: list[Any] = field(default_factory=list)  #: containers this object started
    #: the router's management API, once up (or found by its label)
    management_url: str = ""

    @property
    def url(self) -> str:
        """AMQP URL of the router (guest is loopback-only, which host networking satisfies)."""
        return f"amqp://{self.user}:{self.password}@127.0.0.1:{self.port}/"

    def _run(self, name: str, role: str, command: list[str], env: dict | None = None,
             **labels: str) -> Any:
        import docker
        try:
            c = self.client.containers.run(
                self.image, command, name=f"{self.id}-{name}", detach=True,
                network_mode="host", labels={LABEL: self.id, ROLE_LABEL: role, **labels},
                environment={"SHOAL_LOG_LEVEL": "info", **(env or {})})
        except docker.errors.APIError as exc:
            raise ClusterError(f"cannot start {name}: {exc.explanation or exc}") from None
        self.started.append(c)
        return c

    def up(self) -> str:
        """Start the nodes, wait until each accepts TCP, start the router, wait for its ready
        line. Returns the AMQP URL. On any error removes what it started and raises
        ClusterError naming the container and its last log line."""
        import docker
        try:
            try:
                self.client.images.get(self.image)      # never pull: images are built here
            except docker.errors.ImageNotFound:
                raise ClusterError(f"image {self.image} not found: build it with "
                                   "'shoal cluster build'") from None
            if self.client.containers.list(all=True, filters={"label": f"{LABEL}={self.id}"}):
                raise ClusterError(f"cluster {self.id} exists: 'shoal cluster down --id "
                                   f"{self.id}' first")
            self.port = self.port or free_port()
            ports = [free_port() for _ in range(self.nodes)]
            links = [(f"node-{i}", f"tcp://127.0.0.1:{p}") for i, p in enumerate(ports)]
            endpoints = []
            for (node_id, endpoint), node_port in zip(links, ports):
                # each node links to the others (quorum queues; what each knows of the others)
                peers = [a for other, ep in links if other != node_id
                         for a in ("--peer", f"{other}={ep}")]
                c = self._run(node_id, "node", ["node", "--node-id", node_id, "--bind",
                                                endpoint, "--data-dir", "/var/lib/shoal",
                                                *peers])
                endpoints.append((node_id, endpoint, node_port, c))
            for node_id, _, node_port, c in endpoints:
                _wait(c, lambda p=node_port: _accepts(p), NODE_READY_TIMEOUT_S)
            args = ["router", "--host", "127.0.0.1", "--port", str(self.port)]
            for node_id, endpoint, _, _ in endpoints:
                args += ["--node", f"{node_id}={endpoint}"]
            # its HTTP ports free ones, so that clusters side by side do not collide
            mgmt, prom = free_port(), free_port()
            self.management_url = f"http://127.0.0.1:{mgmt}"
            router = self._run("router", "router", args,
                               env={"SHOAL_MANAGEMENT_PORT": str(mgmt),
                                    "SHOAL_PROMETHEUS_PORT": str(prom)},
                               **{URL_LABEL: self.url, MANAGEMENT_LABEL: self.management_url})
            _wait(router, lambda: b"shoal router ready on" in router.logs(stdout=True,
                                                                          stderr=False),
                  ROUTER_READY_TIMEOUT_S)
            return self.url
        except BaseException:
            self.remove_started()
            raise

    def remove_started(self) -> None:
        """Remove (force, with volumes) every container this object started."""
        for c in reversed(self.started):
            _remove(c)
        self.started.clear()

    def run_load(self, args: list[str], out_dir: Path, loadgens: int = 1,
                 timeout_s: float = LOAD_TIMEOUT_S) -> list[dict]:
        """Run ``loadgens`` load-generator containers against this cluster and wait for them.

        Each runs ``loadtest --url URL ARGS --out /out`` (or the pika fallback, see the module
        docstring); its /out and log land in ``out_dir/<container name>/``. Returns one dict per
        generator: ``name``, ``exit_code``, ``out`` (host path), ``tool``. The generators are
        removed afterwards, also on error or interrupt. Raises ClusterError when one exits
        non-zero or outlives ``timeout_s`` (seconds).
        """
        import requests
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        tool = "shoal-loadtest" if self._image_has_loadtest() else "pika-load"
        if "--url" not in args:
            args = ["--url", self.url, *args]
        if tool == "shoal-loadtest" and self.management_url and \
                "--management-url" not in args:
            args = [*args, "--management-url", self.management_url]
        gens = []
        try:
            for i in range(loadgens):
                if tool == "shoal-loadtest":
                    cmd = ["loadtest", *args, "--out", "/out"]
                else:
                    cmd = ["python", "-m", "shoal.deploy.pika_load", *args,
                           "--out", "/out", "--queue", f"{self.id}-load-{i}"]
                gens.append(self._run(f"loadgen-{i}-{secrets.token_hex(2)}", "loadgen", cmd))
            results, failed = [], []
            deadline = time.monotonic() + timeout_s
            for c in gens:
                try:
                    code = c.wait(timeout=max(1.0, deadline - time.monotonic()))["StatusCode"]
                except requests.exceptions.RequestException:  # the wait timed out
                    raise ClusterError(f"{c.name} still running after {timeout_s:.0f} s") \
                        from None
                dest = out_dir / c.name
                _copy_out(c, "/out", dest)
                (dest / "container.log").write_bytes(c.logs())
                results.append({"name": c.name, "exit_code": code, "out": str(dest),
                                "tool": tool})
                if code != 0:
                    failed.append(f"{c.name} exited {code}: {_last_line(c)}")
            if failed:
                raise ClusterError("; ".join(failed))
            return results
        finally:
            for c in gens:
                _remove(c)
                if c in self.started:
                    self.started.remove(c)

    def _image_has_loadtest(self) -> bool:
        """True when ``shoal loadtest --help`` works in the image."""
        import docker
        try:
            self.client.containers.run(self.image, ["loadtest", "--help"], remove=True,
                                       network_mode="none")
            return True
        except docker.errors.ContainerError:      # no such command in this image
            return False


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _last_line(container: Any) -> str:
    lines = container.logs(tail=5).decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else "(no output)"


def _wait(container: Any, ready: Any, timeout_s: float) -> None:
    """Poll ``ready()`` until true; ClusterError if the container exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        container.reload()
        if container.status in ("exited", "dead"):
            raise ClusterError(f"{container.name} exited: {_last_line(container)}")
        if ready():
            return
        time.sleep(0.2)
    raise ClusterError(f"{container.name} not ready after {timeout_s:.0f} s: "
                       f"{_last_line(container)}")


def _remove(container: Any) -> None:
    """Stop gracefully (SIGTERM, then SIGKILL after STOP_TIMEOUT_S) and remove with volumes."""
    import docker
    try:
        container.stop(timeout=STOP_TIMEOUT_S)
    except docker.errors.DockerException:
        pass
    try:
        container.remove(force=True, v=True)
    except docker.errors.NotFound:
        pass


def _copy_out(container: Any, path: str, dest: Path) -> None:
    """Copy ``path`` of a (stopped) container into ``dest`` on the host."""
    import docker
    dest.mkdir(parents=True, exist_ok=True)
    try:
        stream, _ = container.get_archive(path)
    except docker.errors.NotFound:
        return
    with tempfile.TemporaryFile() as f:
        for chunk in stream:
            f.write(chunk)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            base = Path(path).name
            for m in tar.getmembers():
                rel = Path(m.name).relative_to(base) if m.name != base else None
                if rel is None or m.issym() or m.islnk() or ".." in rel.parts:
                    continue
                m.name = str(rel)
                tar.extract(m, dest, filter="data")


def cluster_containers(client: Any, cluster_id: str | None = None) -> list[Any]:
    """Every container labelled ``shoal.cluster`` (``=cluster_id`` when given)."""
    label = f"{LABEL}={cluster_id}" if cluster_id else LABEL
    return client.containers.list(all=True, filters={"label": label})


def down(client: Any, cluster_id: str | None = None) -> list[str]:
    """Remove a cluster's containers (every Shoal cluster's without an id): load generators
    and the router first, then the nodes. Returns the removed container names."""
    order = {"loadgen": 0, "router": 1, "node": 2}
    cs = sorted(cluster_containers(client, cluster_id),
                key=lambda c: order.get(c.labels.get(ROLE_LABEL, ""), 3))
    for c in cs:
        _remove(c)
    return [c.name for c in cs]


# --- command line ------------------------------------------------------------------------

def _print_status(client: Any, cluster_id: str | None) -> int:
    cs = cluster_containers(client, cluster_id)
    if not cs:
        print("no shoal cluster containers" + (f" for {cluster_id}" if cluster_id else ""))
        return 0
    for c in sorted(cs, key=lambda c: (c.labels.get(LABEL, ""), c.name)):
        health = c.attrs.get("State", {}).get("Health", {}).get("Status", "-")
        url = c.labels.get(URL_LABEL, "")
        print(f"{c.labels.get(LABEL)}  {c.name:32} {c.labels.get(ROLE_LABEL, '?'):8} "
              f"{c.status:9} {health:10} {url}".rstrip())
    return 0


def _router_of(client: Any, cluster_id: str | None) -> Any:
    routers = [c for c in cluster_containers(client, cluster_id)
               if c.labels.get(ROLE_LABEL) == "router"]
    if len(routers) != 1:
        raise ClusterError(f"found {len(routers)} cluster routers" +
                           (f" for {cluster_id}" if cluster_id else "; name one with --id"))
    return routers[0]


def main(argv: list[str] | None = None) -> int:
    """``shoal cluster ...``; returns the exit code (1 with one line on any error)."""
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="shoal cluster",
                                description="Shoal clusters in docker containers (host network).")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the image from deploy/Dockerfile")
    b.add_argument("--base-image", default="python:3.12-slim")
    b.add_argument("--tag", default=DEFAULT_IMAGE)
    b.add_argument("--online", action="store_true",
                   help="let the build use the network instead of a wheelhouse")
    u = sub.add_parser("up", help="start a router and N nodes; print the AMQP URL")
    u.add_argument("--nodes", type=int, default=2)
    u.add_argument("--image", default=DEFAULT_IMAGE)
    u.add_argument("--port", type=int, default=0, help="router port (default: a free one)")
    u.add_argument("--id", help="cluster id (default: shoal-<random>)")
    u.add_argument("--loadtest-args", help="run a load with these args, collect it, tear down")
    u.add_argument("--loadgens", type=int, default=1)
    u.add_argument("--out", default="shoal-loadtest-out")
    u.add_argument("--foreground", action="store_true",
                   help="stay until Ctrl-C/SIGTERM, then remove the cluster")
    lt = sub.add_parser("loadtest", help="run load generators against a running cluster")
    lt.add_argument("--id")
    lt.add_argument("--loadgens", type=int, default=1)
    lt.add_argument("--out", default="shoal-loadtest-out")
    lt.add_argument("args", nargs=argparse.REMAINDER, help="shoal loadtest args (after --)")
    for name, text in (("status", "list cluster containers"), ("down", "remove clusters")):
        sub.add_parser(name, help=text).add_argument("--id", help="one cluster (default: all)")
    args = p.parse_args(argv)
    if args.command == "up" and not 1 <= args.nodes <= 256:
        print("shoal cluster: --nodes must be from 1 to 256", file=sys.stderr)
        return 2
    try:
        with signals_raise():
            return _run(args)
    except ClusterError as exc:
        print(f"shoal cluster: {exc}", file=sys.stderr)
        return 130 if isinstance(exc, Interrupted) else 1


def _run(args: argparse.Namespace) -> int:
    client = docker_client()
    if args.command == "build":
        image_id = build_image(client, args.base_image, args.tag, offline=not args.online)
        print(f"built {args.tag} ({image_id[:19]}) on {args.base_image}")
        return 0
    if args.command == "status":
        return _print_status(client, args.id)
    if args.command == "down":
        names = down(client, args.id)
        print(f"removed {len(names)} containers")
        return 0
    if args.command == "loadtest":
        router = _router_of(client, args.id)
        cluster = DockerCluster(client, image=router.image.tags[0] if router.image.tags
                                else router.image.id, id=router.labels[LABEL],
                                management_url=router.labels.get(MANAGEMENT_LABEL, ""))
        extra = args.args[1:] if args.args[:1] == ["--"] else args.args
        results = cluster.run_load(["--url", router.labels[URL_LABEL], *extra],
                                   Path(args.out), args.loadgens)
        for r in results:
            print(f"{r['name']}: exit {r['exit_code']}, output in {r['out']} ({r['tool']})")
        return 0
    cluster = DockerCluster(client, image=args.image, nodes=args.nodes, port=args.port,
                            **({"id": args.id} if args.id else {}))
    url = cluster.up()
    print(f"shoal cluster {cluster.id} up: {url} ({args.nodes} nodes, image {args.image})",
          flush=True)
    if not (args.loadtest_args or args.foreground):
        return 0
    try:
        if args.loadtest_args:
            for r in cluster.run_load(shlex.split(args.loadtest_args), Path(args.out),
                                      args.loadgens):
                print(f"{r['name']}: exit {r['exit_code']}, output in {r['out']} ({r['tool']})")
        else:
            signal.pause()
    finally:
        cluster.remove_started()
        print(f"shoal cluster {cluster.id} removed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
