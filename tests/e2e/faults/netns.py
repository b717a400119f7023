"""The fault campaign's cluster (tests/e2e/faults/campaign.py): network namespaces, their
links and cuts, and the Shoal processes in them. Linux only, root only (``ip netns``, ``nft``).

The network, all on this machine and named so that nothing else on the host is touched::

    root namespace: the clients, shoalc0 10.77.0.1/24
        | veth
    shoal-hub: uplink, n0, n1, n2, r0, r1, all ports of the bridge br0
        | one veth each
    shoal-n0 eth0 10.77.0.10, shoal-n1 .11, shoal-n2 .12, shoal-r0 .20, shoal-r1 .21

The bridge lives in a namespace of its own (``shoal-hub``) rather than in the root namespace:
with Docker installed the root namespace's FORWARD policy is drop and ``br_netfilter`` passes
bridged frames through it, so a root bridge would drop the nodes' traffic to each other. From
the root namespace 10.77.0.0/24 is one directly connected link (``shoalc0``), as with a root
bridge.

Faults on the network are nft rules in the processes' namespaces (table ``inet
shoal_campaign``): :meth:`Net.set_drops` rewrites one namespace's table at once. Each process
runs the real CLI (``shoal node``, ``shoal router``) under ``ip netns exec``, its output in a log
file; :class:`Proc` starts, kills, stops and continues it.
"""
from __future__ import annotations

import collections
import ctypes
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HUB = "shoal-hub"           #: the namespace holding the bridge
ROOT_LINK = "shoalc0"       #: the root namespace's end of the link to the hub
SUBNET = "10.77.0"
CLIENTS = "clients"         #: the root namespace, where the campaign's pika clients run
CLIENT_ADDR = f"{SUBNET}.1"
NFT_TABLE = "shoal_campaign"
NODE_PORT, AMQP_PORT = 5680, 5672
NODE_READY = "listening on"                 #: a node's log line once it serves its link
ROUTER_READY = "shoal router ready on"      #: a router's, once it accepts AMQP
NODES, ROUTERS = ("n0", "n1", "n2"), ("r0", "r1")
#: Every namespace this module may create; leftovers of a crashed run are removed at start.
NAMESPACES = (HUB, *(f"shoal-{m}" for m in NODES + ROUTERS))
#: Held (flock) by the run that owns the names above: a second run waits for it rather than
#: taking the first one's namespaces for a crashed run's leftovers.
LOCK_FILE = "/run/lock/shoal-campaign.lock"


class NetError(RuntimeError):
    """A command that sets up or changes the network failed."""


def sh(*argv: str, input: str | None = None, check: bool = True) -> str:
    """Run a command (no shell), return its stdout; raise NetError with its stderr."""
    res = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise NetError(f"{' '.join(argv)}: exit {res.returncode}: {res.stderr.strip()}")
    return res.stdout


def missing_tools() -> list[str]:
    """What the campaign needs and this machine lacks: root, ``ip netns``, ``nft``."""
    out = []
    if os.geteuid() != 0:
        out.append("root (network namespaces and nft need it)")
    if shutil.which("ip") is None:
        out.append("ip (iproute2) for ip netns")
    elif subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        out.append("a working ip netns")
    if shutil.which("nft") is None:
        out.append("nft (Debian package nftables)")
    return out


def address(member: str) -> str:
    """The address of ``n<i>`` (10.77.0.1i), ``r<i>`` (10.77.0.2i) or the clients."""
    if member == CLIENTS:
        return CLIENT_ADDR
    return f"{SUBNET}.{(10 if member[0] == 'n' else 20) + int(member[1:])}"


def netns(member: str) -> str:
    return f"shoal-{member}"


@dataclass(frozen=True)
class Drop:
    """One nft rule: in ``member``'s namespace drop what goes to (``out``) or comes from
    (``not out``) ``peer``'s address."""

    member: str
    peer: str
    out: bool


def cut_rules(a: str, b: str, both: bool) -> list[Drop]:
    """The drops that cut ``a`` -> ``b`` (and ``b`` -> ``a`` when ``both``). Rules go into a
    process's namespace, never the root one: a cut from the clients is made at the router."""
    if a == CLIENTS:
        return [Drop(b, a, out=False)] + ([Drop(b, a, out=True)] if both else [])
    return [Drop(a, b, out=True)] + ([Drop(a, b, out=False)] if both else [])


class RunLock:
    """The machine-wide lock of a campaign run (:data:`LOCK_FILE`); the kernel drops it when
    the holder dies, so a crashed run's leftovers are never mistaken for a live run."""

    def __init__(self, path: str = LOCK_FILE) -> None:
        self.path, self.fd = path, None

    def acquire(self, timeout: float, log=print) -> None:
        """Wait up to ``timeout`` s for another run to finish; raise NetError after."""
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline, said = time.monotonic() + timeout, False
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    self.fd = None
                    raise NetError(f"another campaign run holds {self.path} (its namespaces "
                                   f"are in use) after {timeout:.0f} s") from None
                if not said:
                    log(f"campaign: waiting for another run to finish ({self.path})")
                    said = True
                time.sleep(1.0)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)           # closing the descriptor drops the flock
            self.fd = None


class Net:
    """The hub, the bridge, one namespace and veth per member, and the cuts in force."""

    def __init__(self, members: tuple[str, ...] = NODES + ROUTERS) -> None:
        self.members = members
        self.drops: dict[str, set[Drop]] = {}      # member -> drops in force there
        self.active: collections.Counter[Drop] = collections.Counter()

    @staticmethod
    def clean_leftovers() -> list[str]:
        """Remove what a previous (crashed) run may have left: processes in our namespaces, the
        namespaces, the root link. Returns what was removed."""
        found = []
        existing = set(sh("ip", "netns", "list", check=False).split())
        for ns in NAMESPACES:
            if ns in existing:
                for pid in sh("ip", "netns", "pids", ns, check=False).split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                sh("ip", "netns", "del", ns, check=False)
                found.append(ns)
        if sh("ip", "link", "show", ROOT_LINK, check=False):
            sh("ip", "link", "del", ROOT_LINK, check=False)
            found.append(ROOT_LINK)
        return found

    def up(self) -> None:
        """Build the network (after :meth:`clean_leftovers`)."""
        sh("ip", "netns", "add", HUB)
        sh("ip", "-n", HUB, "link", "set", "lo", "up")
        sh("ip", "-n", HUB, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", HUB, "link", "set", "br0", "up")
        sh("ip", "link", "add", ROOT_LINK, "type", "veth", "peer", "name", "uplink", "netns", HUB)
        sh("ip", "-n", HUB, "link", "set", "uplink", "master", "br0", "up")
        sh("ip", "addr", "add", f"{CLIENT_ADDR}/24", "dev", ROOT_LINK)
        sh("ip", "link", "set", ROOT_LINK, "up")
        for m in self.members:
            ns = netns(m)
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", HUB, "link", "add", m, "type", "veth", "peer", "name", "eth0",
               "netns", ns)
            sh("ip", "-n", HUB, "link", "set", m, "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"{address(m)}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            self.drops[m] = set()

    def down(self) -> None:
        """Remove the namespaces and the root link (their nft tables go with them)."""
        self.clean_leftovers()

    def set_drops(self, member: str, drops: set[Drop]) -> None:
        """Make ``drops`` the rules in force in ``member``'s namespace (one atomic nft load)."""
        ins = " ".join(f"ip saddr {address(d.peer)} drop;" for d in sorted(
            drops, key=str) if not d.out)
        outs = " ".join(f"ip daddr {address(d.peer)} drop;" for d in sorted(
            drops, key=str) if d.out)
        script = (f"table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\n"
                  f"table inet {NFT_TABLE} {{\n"
                  f"  chain input {{ type filter hook input priority 0; policy accept; {ins} }}\n"
                  f"  chain output {{ type filter hook output priority 0; policy accept; "
                  f"{outs} }}\n"
                  f"}}\n")
        sh("ip", "netns", "exec", netns(member), "nft", "-f", "-", input=script)
        self.drops[member] = set(drops)

    def add(self, rules: list[Drop]) -> None:
        """Put ``rules`` in force (counted: two faults may need the same rule)."""
        self.active.update(rules)
        self._sync({r.member for r in rules})

    def remove(self, rules: list[Drop]) -> None:
        self.active.subtract(rules)
        self._sync({r.member for r in rules})

    def _sync(self, members: set[str]) -> None:
        for m in members:
            want = {d for d, n in self.active.items() if n > 0 and d.member == m}
            if want != self.drops[m]:
                self.set_drops(m, want)

    def heal_all(self) -> None:
        self.active.clear()
        for m, drops in self.drops.items():
            if drops:
                self.set_drops(m, set())


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the campaign dies (PR_SET_PDEATHSIG), so a
    crashed campaign leaves no broker behind. Children are started from the main thread."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


@dataclass
class Proc:
    """One Shoal process in its namespace: the same command at every (re)start, output appended
    to ``log``."""

    name: str                   #: node-0, router-1, ...
    member: str                 #: n0, r1, ...
    argv: list[str]
    env: dict[str, str]
    log: Path
    ready_text: str
    data_dir: Path | None = None
    popen: subprocess.Popen | None = None
    starts: int = 0
    paused: bool = False
    exits: list[tuple[float, int]] = field(default_factory=list)  #: unexpected exits (t, code)
    _ready_from: int = 0

    def start(self) -> None:
        """Start (or restart) the process; :meth:`wait_ready` waits for its ready line."""
        self.starts += 1
        with self.log.open("a") as f:
            f.write(f"=== campaign: start {self.starts} of {self.name} at "
                    f"{time.strftime('%H:%M:%S')} ===\n")
            self._ready_from = f.tell()
        out = self.log.open("ab")
        try:
            self.popen = subprocess.Popen(
                ["ip", "netns", "exec", netns(self.member), *self.argv], stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                preexec_fn=_die_with_parent)
        finally:
            out.close()
        self.paused = False

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def ready(self) -> bool:
        """Its ready line was printed since the last start."""
        try:
            with self.log.open("rb") as f:
                f.seek(self._ready_from)
                return self.ready_text.encode() in f.read()
        except OSError:
            return False

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready():
                return True
            if not self.alive():
                return False
            time.sleep(0.05)
        return False

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.popen.pid, sig)
        if sig == signal.SIGSTOP:
            self.paused = True
        elif sig == signal.SIGCONT:
            self.paused = False

    def kill9(self) -> None:
        """kill -9 (a stopped process dies too) and reap."""
        if self.alive():
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)
        self.paused = False

    def stop(self) -> int | None:
        """The end of a run: SIGCONT, SIGTERM, then SIGKILL after 5 s. Returns the exit code."""
        if self.popen is None:
            return None
        if self.alive():
            os.kill(self.popen.pid, signal.SIGCONT)
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        return self.popen.returncode

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return f"({self.log} unreadable)"
        return "\n".join(text[-lines:])


def shoal_command() -> list[str]:
    """The ``shoal`` entry point of this Python (its scripts folder, else the PATH)."""
    here = Path(sys.executable).parent / "shoal"
    found = str(here) if here.exists() else shutil.which("shoal")
    if found is None:
        raise NetError("no shoal command: run pip install -e '.[test]'")
    return [found]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every process: this one's without any ``SHOAL_*`` variable (the
    campaign's own or a test layout's would change the processes or be warned about), plus no
    management or Prometheus listener and ``guest`` allowed from the clients' address."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    env.update(SHOAL_MANAGEMENT_PORT="0", SHOAL_PROMETHEUS_PORT="0", SHOAL_LOOPBACK_USERS="",
               PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


def make_procs(run_dir: Path, extra_env: dict[str, str] | None = None) -> dict[str, Proc]:
    """The commands of 3 nodes and 2 routers, by member (n0..n2, r0, r1)."""
    shoal, env = shoal_command(), child_env(extra_env)
    endpoints = {f"node-{m[1:]}": f"tcp://{address(m)}:{NODE_PORT}" for m in NODES}
    procs: dict[str, Proc] = {}
    for m in NODES:
        nid = f"node-{m[1:]}"
        data = run_dir / nid
        peers = [a for other, ep in endpoints.items() if other != nid
                 for a in ("--peer", f"{other}={ep}")]
        procs[m] = Proc(nid, m, [*shoal, "node", "--node-id", nid, "--bind", endpoints[nid],
                                 "--data-dir", str(data), *peers],
                        env, run_dir / f"{nid}.log", NODE_READY, data_dir=data)
    nodes = [a for nid, ep in endpoints.items() for a in ("--node", f"{nid}={ep}")]
    for m in ROUTERS:
        rid = f"router-{m[1:]}"
        procs[m] = Proc(rid, m, [*shoal, "router", "--host", "0.0.0.0", "--port",
                                 str(AMQP_PORT), *nodes], env, run_dir / f"{rid}.log",
                        ROUTER_READY)
    return procs


def log_lines_since(procs, pattern: str, since: dict[str, int]) -> list[str]:
    """Lines matching ``pattern`` written to the logs of ``procs`` after the byte offsets
    ``since`` (name -> offset)."""
    rx = re.compile(pattern)
    out = []
    for p in procs:
        try:
            with p.log.open("rb") as f:
                f.seek(since.get(p.name, 0))
                out += [ln for ln in f.read().decode(errors="replace").splitlines()
                        if rx.search(ln)]
        except OSError:
            pass
    return out
