"""One ``Settings`` object for every Shoal process (design.md section 7, "thin entry points").

Sources, lowest precedence first: built-in defaults, a YAML file (``--config``), ``SHOAL_*``
environment variables (``SHOAL_PORT=5673``; lists comma-separated; users as
``name:password,name2:password2``), then command-line flags. Any invalid value raises
:class:`~shoal.shared.errors.ConfigError` whose message names the setting, e.g.
``invalid setting 'port': must be an integer from 1 to 65535 (got 'abc')``.
"""
from __future__ import annotations

import dataclasses
import difflib
import errno
import os
import re
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping


from .errors import ConfigError
from .linkauth import check_keys


#: RabbitMQ's upper bound for ``max_message_size`` (rabbit.app: 512 MiB).
MAX_MESSAGE_SIZE_LIMIT = 512 * 1024 * 1024


def default_layout(cores: int) -> tuple[int, int]:
    """``(routers, nodes)`` that ``shoal serve`` runs on a machine of ``cores`` CPUs: half the
    cores hold queues (nodes), the other half route (AMQP), and from 4 cores one router more
    for every 4 cores, at least one of each: 1 + 1 on 2 cores, 3 + 2 on 4, 6 + 4 on 8.

    A router spends about twice a node's CPU on each message (a publish parsed, a delivery
    written, an ack read, and the link's frames to and from the nodes), so with half and half
    the routers reach their cores while the nodes use about half of theirs. Measured with
    tests/benchmarks/scaling.py on 4 emulated cores, no confirms (docs/performance.md,
    "Scaling across cores"): 3 routers + 2 nodes delivered 1.32x what 2 + 2 did (median of 4
    alternating pairs); 1 + 3 and 3 + 1 about half of 2 + 2. With more processes than CPUs,
    ``serve`` pins none of them (:func:`cpu_plan`)."""
    nodes = max(1, cores - cores // 2)
    return max(1, cores // 2 + cores // 4), nodes


def cpu_plan(cpus: list[int], routers: int, nodes: int) -> tuple[list[int], list[int]]:
    """``(router CPUs, node CPUs)``: the CPU each router and each node process is held to
    (``pin_cpus``). Routers take the first ``round(C * R / (R + N))`` of the ``C`` CPUs (at
    least one, and at least one left for nodes), nodes the rest, each kind round-robin over its
    share; ``([], [])`` (no pinning) with fewer than 2 CPUs, and with more processes than CPUs
    on 4 CPUs or more (the default layout there, :func:`default_layout`: pinned, two routers
    would share one CPU while a node's CPU idles; unpinned, the kernel spreads the processes,
    each still at most one CPU, as scaling.py's nested quotas measured it). Pinning a process
    keeps its Python thread and its ZeroMQ I/O thread on one CPU: at 5,000 msg/s that cut the
    broker's CPU per message by 18 % (docs/performance.md, issue 20)."""
    if len(cpus) < 2 or routers + nodes < 1 or routers + nodes > len(cpus) >= 4:
        return [], []
    share = min(len(cpus) - 1, max(1, round(len(cpus) * routers / (routers + nodes))))
    mine, theirs = cpus[:share], cpus[share:]
    return ([mine[i % len(mine)] for i in range(routers)],
            [theirs[i % len(theirs)] for i in range(nodes)])


def _default_data_dir() -> str:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                           "share")
    return os.path.join(base, "shoal")


@dataclass
class Settings:
    """Every setting, with its unit. Field names are the YAML keys and ``SHOAL_<NAME>``."""

    host: str = "127.0.0.1"                  #: router listen address
    port: int = 5672                         #: router AMQP port (0 = pick a free one)
    nodes: int = field(default_factory=lambda: default_layout(os.cpu_count() or 1)[1])
    #: ``serve``: node count (default: half the CPUs, see :func:`default_layout`)
    routers: int = 0                         #: ``serve``: router processes sharing ``port``
    #: (SO_REUSEPORT: the kernel spreads connections over them), each linked to every node;
    #: 0 = half the CPUs, and one more per 4 CPUs from 4 (:func:`default_layout`), 1 with
    #: ``embed_node`` (router-0 then hosts node-0, which the other routers reach over
    #: ``embed_bind``)
    direct_port: int = -1                    #: router: a second AMQP port that reaches this
    #: router alone (-1 = none, 0 = pick a free one); ``serve`` opens one per router when
    #: ``routers`` > 1 and lists them in cluster.json (tests, diagnostics)
    data_dir: str = field(default_factory=_default_data_dir)  #: node journals, runtime files
    embed_node: bool = False                 #: ``serve``: run node-0 inside the router
    #: process, link frames handed over in memory (no socket hop: about half the CPU per
    #: message and latency like RabbitMQ's for node-0's queues; the other nodes stay processes)
    pin_cpus: bool = True                    #: ``serve``: hold each router and node process
    #: (its Python thread and ZeroMQ's I/O thread) to one CPU, routers on the first share of
    #: the CPUs, nodes on the rest (:func:`cpu_plan`), as RabbitMQ binds its schedulers
    #: (``+stbt db``): a link hand-off then never crosses CPUs (docs/performance.md, issue 20)
    local_link: str = ""                     #: ``serve``: how routers reach the nodes on
    #: this host: ``unix`` (a Unix stream socket read by each side's event loop, no ZeroMQ I/O
    #: threads: less CPU per message and latency, docs/performance.md "The same-host link") or
    #: ``zmq`` (a ZeroMQ ``ipc://`` socket, design.md section 4); "" is ``unix``, or ``zmq``
    #: when the link has CURVE keys (:meth:`serve_local_link`); between hosts it is ZeroMQ
    embed_bind: str = ""                     #: router: a second endpoint that the node it
    #: hosts (an ``inproc://`` endpoint) binds, where the other routers reach it (``serve``
    #: with ``embed_node`` and ``routers`` > 1: node-0 lives in router-0)
    node_endpoints: list[str] = field(default_factory=list)  #: router: node endpoints (ZeroMQ
    #: ``tcp://``/``ipc://``, or ``unix://`` for the same-host link), in node-id order;
    #: ``ID=ENDPOINT`` names the node, a bare endpoint is ``node-<index>``
    node_id: str = "node-0"                  #: node: its id (placement hashes over ids)
    node_bind: str = "tcp://127.0.0.1:5680"  #: node: endpoint to bind (ZeroMQ, or
    #: ``unix://PATH``: the same-host link, node/unix_listener.py)
    peers: list[str] = field(default_factory=list)  #: node: the other nodes, ``ID=ENDPOINT``
    #: (the endpoint each binds for nodes: its ``peer_bind``, else its ``node_bind``),
    #: linked for quorum queues (design.md section 8); none: this node's quorum queues have
    #: one member
    peer_bind: str = ""                      #: node: an endpoint the other nodes reach it
    #: on, when ``node_bind`` is ``unix://`` ("" = ``node_bind``): ZeroMQ, or ``unix://PATH``
    #: when every peer's is too (``shoal serve``'s nodes; node/replication/links.py)
    default_queue_type: str = "classic"      #: the type of a durable queue declared without
    #: ``x-queue-type``: ``classic``, ``quorum`` or ``stream`` (RabbitMQ's
    #: ``default_queue_type``; exclusive, auto-delete and non-durable queues stay classic)
    quorum_delivery_limit: int = 20          #: node: the ``x-delivery-limit`` of a
    #: quorum queue declared without one (RabbitMQ 4.0's default, 20); -1: no limit, as
    #: RabbitMQ 3.10 (docs/replication.md)
    delivery_leases: bool = True             #: node: lend an empty plain queue's only
    #: consumer to its router, which then delivers matching publishes itself and records
    #: them here a few ms later (docs/consumers.md, "Delivery leases"; node/lease.py)
    users: dict[str, str] = field(default_factory=lambda: {"guest": "guest"})
    loopback_users: list[str] = field(default_factory=lambda: ["guest"])  #: loopback-only users
    anonymous_login_user: str = ""           #: the user an AMQP 1.0 client logging in with
    #: SASL ANONYMOUS (or no SASL layer) becomes; "" = ANONYMOUS is not offered (RabbitMQ 4's
    #: setting of that name; docs/amqp10.md)
    amqp10_announce_rabbitmq: bool = True    #: AMQP 1.0 open properties say product
    #: "RabbitMQ", version "4.0.0" (RabbitMQ's own AMQP 1.0 clients refuse any other server);
    #: off: product "Shoal" and its version. Both add ``shoal-version`` (docs/amqp10.md)
    vhosts: list[str] = field(default_factory=lambda: ["/"])
    load_definitions: str = ""               #: a RabbitMQ definitions file (JSON: users with
    #: password hashes, vhosts, permissions, topic permissions, queues, exchanges, bindings;
    #: ``rabbitmqctl export_definitions``'s output loads unchanged); when set, ``users`` and
    #: ``vhosts`` are not used (shared/definitions.py)
    tls_port: int = -1                       #: router: the amqps listener (RabbitMQ's
    #: ``listeners.ssl.default``, 5671 by convention; -1 = none); needs ``tls_certfile`` and
    #: ``tls_keyfile`` (PEM), which are reloaded when they change on disk (router/frontend/tls.py)
    tls_certfile: str = ""                   #: server certificate chain (PEM)
    tls_keyfile: str = ""                    #: its private key (PEM)
    tls_cacertfile: str = ""                 #: CAs that client certificates must chain to
    tls_verify: str = "verify_none"          #: ``verify_peer`` asks for a client certificate
    #: and checks it against ``tls_cacertfile`` (RabbitMQ's ``ssl_options.verify``)
    tls_fail_if_no_peer_cert: bool = False   #: with ``verify_peer``: refuse a client
    #: without a certificate (RabbitMQ's ``ssl_options.fail_if_no_peer_cert``)
    tls_versions: list[str] = field(default_factory=lambda: ["tlsv1.3", "tlsv1.2"])
    #: protocol versions accepted (RabbitMQ's ``ssl_options.versions``: tlsv1.3, tlsv1.2, ...)
    tls_ciphers: str = ""                    #: OpenSSL cipher list for TLS 1.2 ("" = Python's)
    ssl_cert_login_from: str = "distinguished_name"  #: the user name EXTERNAL takes from a
    #: client certificate: its subject as an RFC 4514 string or its ``common_name``
    #: (RabbitMQ's setting of that name)
    max_message_size: int = 128 * 1024 * 1024  #: bytes (RabbitMQ 3.x's default and name);
    #: a larger publish closes the channel with 406 PRECONDITION_FAILED; at most 512 MiB
    frame_max: int = 131072                  #: bytes, offered in connection.tune
    channel_max: int = 2047                  #: offered in connection.tune
    heartbeat: int = 60                      #: seconds, offered in connection.tune
    handshake_timeout: int = 10000           #: ms a client may take from its socket's
    #: accept to connection.open (RabbitMQ's name and default); a silent socket is closed
    consumer_max_per_channel: int = 0        #: consumers one channel may hold (0 = no
    #: limit, RabbitMQ's infinity); one more closes the connection with 530
    link_curve_public_key: str = ""          #: this process's CURVE key pair for the
    link_curve_secret_key: str = ""          #: router-node link (Z85, 40 characters; a
    #: node's makes it a CURVE server, a router's is its client identity; shared/linkauth.py)
    link_curve_server_key: str = ""          #: router: the nodes' public key (CURVE on)
    link_curve_clients: list[str] = field(default_factory=list)  #: node: the routers'
    #: public keys it admits (others are refused and logged)
    link_heartbeat_ms: int = 500             #: router<->node heartbeat interval, ms
    link_heartbeat_timeout: float = 5.0      #: seconds: a router or node silent this long
    #: (hung, cut off) is treated as down by its peers, on router<->node and node<->node links;
    #: a closed connection (process death) is noticed at once, without waiting for this
    vm_memory_high_watermark: float = 0.4    #: node: memory alarm above this fraction of
    #: the memory limit (the container's cgroup limit, else RAM), RabbitMQ's name and default
    vm_memory_high_watermark_absolute: int = 0  #: node: the same in bytes (0 = use the fraction)
    disk_free_limit: int = 50_000_000        #: node: disk alarm below this many bytes free on
    #: the data directory's file system (RabbitMQ's default, 50 MB); node/alarms.py
    queue_max_in_memory_bytes: int = 64 * 1024 * 1024  #: node: body bytes of ready messages
    #: a queue keeps in memory; later bodies go to page files beside the journal (RabbitMQ's
    #: paging; a queue's own ``x-max-in-memory-bytes``, or ``x-queue-mode: lazy`` = 0, wins)
    max_output_buffer: int = 4 * 1024 * 1024  #: bytes unflushed per client before pausing
    send_timeout: int = 30000                #: ms a client may leave what it is sent unread
    #: (the kernel taking none of it) before its connection is reset (RabbitMQ's
    #: ``tcp_listen_options.send_timeout``, Ranch's default; router/frontend/send_timeout.py)
    management_port: int = 15672             #: router: the management HTTP API (RabbitMQ's
    #: port; 0 = off); routers on one host share it as they share the AMQP port
    prometheus_port: int = 15692             #: router: Prometheus metrics at /metrics
    #: (RabbitMQ's rabbitmq_prometheus port; 0 = off); shared by routers on one host
    log_level: str = "info"                  #: debug, info, warning, error
    stats_file: str = ""                     #: router: rewrite counters (JSON) here each second

    def validate(self) -> "Settings":
        """Check every value; raise ConfigError naming the first bad setting. Returns self."""
        def bad(name: str, why: str) -> ConfigError:
            return ConfigError(f"invalid setting '{name}': {why} (got {getattr(self, name)!r})")

        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise bad("port", "must be an integer from 0 to 65535")
        if not isinstance(self.nodes, int) or not 1 <= self.nodes <= 256:
            raise bad("nodes", "must be an integer from 1 to 256")
        if not isinstance(self.routers, int) or not 0 <= self.routers <= 64:
            raise bad("routers", "must be an integer from 0 (by CPU count) to 64")
        if not isinstance(self.direct_port, int) or not -1 <= self.direct_port <= 65535:
            raise bad("direct_port", "must be -1 (none) or an integer from 0 to 65535")
        if not isinstance(self.frame_max, int) or not 4096 <= self.frame_max <= 2**31 - 1:
            raise bad("frame_max", "must be an integer from 4096 to 2147483647")
        if not isinstance(self.channel_max, int) or not 1 <= self.channel_max <= 65535:
            raise bad("channel_max", "must be an integer from 1 to 65535")
        if not isinstance(self.heartbeat, int) or not 0 <= self.heartbeat <= 65535:
            raise bad("heartbeat", "must be an integer from 0 to 65535 (seconds)")
        if not isinstance(self.max_message_size, int) or \
                not 1 <= self.max_message_size <= MAX_MESSAGE_SIZE_LIMIT:
            raise bad("max_message_size", f"must be an integer from 1 to "
                                          f"{MAX_MESSAGE_SIZE_LIMIT} (bytes, 512 MiB as in "
                                          f"RabbitMQ)")
        for name in ("management_port", "prometheus_port"):
            if not isinstance(getattr(self, name), int) or not 0 <= getattr(self, name) <= 65535:
                raise bad(name, "must be 0 (off) or an integer from 1 to 65535")
        if not isinstance(self.tls_port, int) or not -1 <= self.tls_port <= 65535:
            raise bad("tls_port", "must be -1 (none) or an integer from 0 to 65535")
        if self.tls_port >= 0 and not (self.tls_certfile and self.tls_keyfile):
            raise bad("tls_port", "needs tls_certfile and tls_keyfile")
        if self.tls_verify not in ("verify_none", "verify_peer"):
            raise bad("tls_verify", "must be verify_none or verify_peer")
        if self.tls_verify == "verify_peer" and self.tls_port >= 0 and not self.tls_cacertfile:
            raise bad("tls_cacertfile", "verify_peer needs the CAs to check client "
                                        "certificates against")
        if not self.tls_versions or not set(self.tls_versions) <= set(TLS_VERSIONS):
            raise bad("tls_versions", f"must be a list of {', '.join(TLS_VERSIONS)}")
        if self.ssl_cert_login_from not in ("distinguished_name", "common_name"):
            raise bad("ssl_cert_login_from", "must be distinguished_name or common_name")
        if not isinstance(self.vm_memory_high_watermark, (int, float)) or \
                not 0 < self.vm_memory_high_watermark <= 1:
            raise bad("vm_memory_high_watermark", "must be a fraction above 0, at most 1")
        for name in ("vm_memory_high_watermark_absolute", "disk_free_limit",
                     "queue_max_in_memory_bytes"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise bad(name, "must be a number of bytes (0 or more)")
        if not isinstance(self.consumer_max_per_channel, int) or \
                self.consumer_max_per_channel < 0:
            raise bad("consumer_max_per_channel", "must be 0 (no limit) or a positive integer")
        for name in ("link_heartbeat_ms", "max_output_buffer",
                     "handshake_timeout", "send_timeout"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise bad(name, "must be a positive integer")
        check_keys(self)
        if not isinstance(self.link_heartbeat_timeout, (int, float)) or \
                self.link_heartbeat_timeout * 1000 <= self.link_heartbeat_ms:
            raise bad("link_heartbeat_timeout", "must be a number of seconds, longer than "
                                                "link_heartbeat_ms")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise bad("log_level", "must be one of debug, info, warning, error")
        if not self.users or not all(isinstance(k, str) and isinstance(v, str)
                                     for k, v in self.users.items()):
            raise bad("users", "must map user names to passwords")
        if not self.vhosts:
            raise bad("vhosts", "must name at least one virtual host")
        for ep in self.node_endpoints:
            if "://" not in ep:
                raise bad("node_endpoints", "each entry must be an endpoint like "
                                            "tcp://host:port, ipc:///path or unix:///path")
        if self.embed_bind and "://" not in self.embed_bind:
            raise bad("embed_bind", "must be an endpoint like ipc:///path or unix:///path")
        if not isinstance(self.quorum_delivery_limit, int) or self.quorum_delivery_limit < -1:
            raise bad("quorum_delivery_limit", "must be an integer >= 0, or -1 for no limit")
        if self.default_queue_type not in ("classic", "quorum", "stream"):
            raise bad("default_queue_type", "must be classic, quorum or stream")
        for p in self.peers:
            if "=" not in p.split("://", 1)[0] or "://" not in p:
                raise bad("peers", f"'{p}' is not ID=ENDPOINT (e.g. node-1=tcp://host:5680)")
        if len({p.split("=", 1)[1].startswith("unix://") for p in self.peers}) > 1:
            raise bad("peers", "every endpoint unix:// (nodes on one host) or none")
        if "://" not in self.node_bind:
            raise bad("node_bind", "must be an endpoint like tcp://host:port or unix:///path")
        if self.local_link not in ("", "zmq", "unix"):
            raise bad("local_link", "must be zmq or unix")
        if self.local_link == "unix" and self.link_curve_secret_key:
            raise bad("local_link", "unix cannot carry the link's CURVE keys (its socket file's "
                                    "owner-only mode is its access control); use zmq with "
                                    "link_curve_*")
        return self

    def serve_cpus(self, routers: int, nodes: int) -> tuple[list[int], list[int]]:
        """The CPU of each router and of each node process ``serve`` starts: :func:`cpu_plan`
        over the CPUs this process may use, or ``([], [])`` with ``pin_cpus`` off."""
        if not self.pin_cpus or not hasattr(os, "sched_getaffinity"):
            return [], []
        return cpu_plan(sorted(os.sched_getaffinity(0)), routers, nodes)

    def serve_routers(self) -> int:
        """How many routers ``shoal serve`` runs: ``routers``, or when 0, half the CPUs and one
        more per 4 CPUs from 4 (:func:`default_layout`), or 1 with ``embed_node`` (node-0
        lives in the one router)."""
        if self.routers:
            return self.routers
        return 1 if self.embed_node else default_layout(os.cpu_count() or 1)[0]

    def serve_local_link(self) -> str:
        """The link ``shoal serve`` runs between its routers and nodes: ``local_link``, or
        when it is "", ``unix``, unless the link has CURVE keys, which only ZeroMQ carries
        (``zmq``). Source: docs/performance.md, "The same-host link"."""
        if self.local_link:
            return self.local_link
        return "zmq" if self.link_curve_secret_key else "unix"

    def peer_map(self) -> list[tuple[str, str]]:
        """``peers`` as ``[(node_id, endpoint), ...]``."""
        return [tuple(p.split("=", 1)) for p in self.peers]  # type: ignore[misc]

    def node_map(self) -> list[tuple[str, str]]:
        """``node_endpoints`` as ``[(node_id, endpoint), ...]`` in order."""
        out = []
        for i, ep in enumerate(self.node_endpoints):
            if "=" in ep.split("://", 1)[0]:
                node_id, ep = ep.split("=", 1)
            else:
                node_id = f"node-{i}"
            out.append((node_id, ep))
        return out


#: RabbitMQ's names of the TLS protocol versions (``ssl_options.versions``).
TLS_VERSIONS = ("tlsv1.3", "tlsv1.2", "tlsv1.1", "tlsv1")

_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def _coerce(name: str, value: Any) -> Any:
    """Turn a YAML/env/flag value into the field's type; raise ConfigError naming it."""
    proto = getattr(Settings(), name)
    try:
        if isinstance(proto, bool):
            word = str(value).strip().lower()
            if word in ("1", "true", "yes", "on"):
                return True
            if word in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if isinstance(proto, int):
            if isinstance(value, bool):
                raise ValueError
            return int(value)
        if isinstance(proto, float):
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if isinstance(proto, list):
            if isinstance(value, str):
                return [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, list):
                raise ValueError
            return [str(v) for v in value]
        if isinstance(proto, dict):
            if isinstance(value, str):
                pairs = [p.split(":", 1) for p in value.split(",") if p.strip()]
                if any(len(p) != 2 for p in pairs):
                    raise ValueError
                return {k.strip(): v for k, v in pairs}
            if not isinstance(value, dict):
                raise ValueError
            return {str(k): str(v) for k, v in value.items()}
        return str(value)
    except (TypeError, ValueError):
        kind = type(proto).__name__
        raise ConfigError(f"invalid setting '{name}': expected {kind} (got {value!r})") from None


#: What each port setting a router listens on serves, for one-line errors (:func:`listen_error`).
LISTENERS = {"port": "AMQP listener", "direct_port": "direct AMQP port of one router",
             "tls_port": "AMQP over TLS listener", "management_port": "management API",
             "prometheus_port": "Prometheus metrics"}
#: Exit code of a router that cannot listen on one of its ports (:func:`listen_error`'s line).
EXIT_CANNOT_LISTEN = 4
#: How a router started by ``shoal serve`` (``--launched``) tells it on stdout why it cannot
#: start; the launcher prints the rest of the line as its own one-line error.
LAUNCHED_FAILURE = "shoal router failed: "


def listen_error(setting: str, host: str, port: int, exc: OSError,
                 flag: str | None = None) -> str:
    """The one line for a listener (``setting`` of :data:`LISTENERS`) that cannot bind
    ``host:port``: which port, what for, and the flag (``flag``, when the command has one) or
    setting that changes it, e.g. ``port 5672 is in use (AMQP listener); choose another with
    --port or SHOAL_PORT``."""
    env = f"SHOAL_{setting.upper()}"
    how = f"{flag} or {env}" if flag else f"the {setting} setting ({env} or --config)"
    if setting in ("management_port", "prometheus_port"):
        how += ", or 0 to turn it off"
    what = LISTENERS[setting]
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} is in use ({what}); choose another with {how}"
    if exc.errno in (errno.EADDRNOTAVAIL, socket.EAI_NONAME):
        return (f"cannot listen on {host}:{port} ({what}): {exc.strerror or exc}; check --host "
                f"or SHOAL_HOST")
    return f"cannot listen on port {port} ({what}): {exc.strerror or exc}; choose another with {how}"


#: ``SHOAL_*`` environment variables that are not settings but are read elsewhere: the
#: ``shoal ctl`` client (deploy/ctl.py), diagnostics (shared/wire.py, shared/errors.py,
#: node/server.py), the test suites and their tools, and :data:`ENV_CHECKED`. Never warned about.
OTHER_ENV = frozenset({
    "SHOAL_MANAGEMENT_URL", "SHOAL_USER", "SHOAL_PASSWORD",        # shoal ctl
    "SHOAL_WIRE_CHECK", "SHOAL_INJECT_FAULTS", "SHOAL_NODE_STATS_FILE",
    "SHOAL_PARITY_RABBITMQ_URL", "SHOAL_FAULT_ROUNDS", "SHOAL_TEST_BASE_IMAGE",
    "SHOAL_ENV_CHECKED",
})
#: Prefixes of such variables: the e2e harness, the fuzz and crash campaigns, CI, the base image.
OTHER_ENV_PREFIXES = ("SHOAL_E2E_", "SHOAL_FUZZ_", "SHOAL_CRASH_", "SHOAL_CI_", "SHOAL_BASE_",
                      "SHOAL_CAMPAIGN_")
#: What Kubernetes puts in every pod for a Service named ``shoal`` or ``shoal-*`` (its "service
#: links": ``SHOAL_SERVICE_HOST``, ``SHOAL_PORT_5672_TCP_ADDR``, ``SHOAL_PORT=tcp://...``).
_SERVICE_LINK = re.compile(r"SHOAL(_[A-Z0-9_]+?)?_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|"
                           r"PORT_\d+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)")
#: Set by ``shoal serve`` for its children, which then do not repeat its warnings.
ENV_CHECKED = "SHOAL_ENV_CHECKED"


def _service_link(key: str, value: str) -> bool:
    return bool(_SERVICE_LINK.fullmatch(key)) or (
        key.endswith("_PORT") and re.fullmatch(r"(tcp|udp|sctp)://\S+:\d+", value) is not None)


def unknown_env(env: Mapping[str, str] | None = None) -> list[str]:
    """One line for each ``SHOAL_*`` variable of ``env`` that names no setting and is none of
    :data:`OTHER_ENV`: ``SHOAL_PROT is not a setting and is ignored; did you mean SHOAL_PORT?``
    (the closest setting by :func:`difflib.get_close_matches`, when one is close)."""
    env = os.environ if env is None else env
    names = [f"SHOAL_{name.upper()}" for name in _FIELDS]
    out = []
    for key in sorted(env):
        if not key.startswith("SHOAL_") or key[6:].lower() in _FIELDS or key in OTHER_ENV \
                or key.startswith(OTHER_ENV_PREFIXES) or _service_link(key, env[key]):
            continue
        close = difflib.get_close_matches(key.upper(), names, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        out.append(f"environment variable {key} is not a setting and is ignored{hint}")
    return out


def warn_unknown_env(prog: str = "shoal", env: Mapping[str, str] | None = None,
                     stream=None) -> None:
    """Print :func:`unknown_env`'s lines to stderr as ``PROG: warning: ...``, unless
    :data:`ENV_CHECKED` says that a parent (``shoal serve``) did already."""
    env = os.environ if env is None else env
    if env.get(ENV_CHECKED):
        return
    for line in unknown_env(env):
        print(f"{prog}: warning: {line}", file=stream or sys.stderr, flush=True)


def load_settings(config_file: str | os.PathLike | None = None,
                  env: Mapping[str, str] | None = None,
                  overrides: Mapping[str, Any] | None = None) -> Settings:
    """Build and validate Settings from file, environment and flags (flags win).

    ``overrides`` holds flag values; ``None`` values are ignored (flag not given).
    Raises ConfigError for an unreadable file, an unknown key or a bad value.
    """
    values: dict[str, Any] = {}
    if config_file is not None:
        import yaml     # here, not at the top: 0.03 s at every process start without a file
        path = Path(config_file)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: "
                              f"{str(exc).splitlines()[0]}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping of settings")
        for key, value in data.items():
            name = str(key).replace("-", "_")
            if name not in _FIELDS:
                raise ConfigError(f"unknown setting '{key}' in {str(path)!r}")
            values[name] = _coerce(name, value)
    env = os.environ if env is None else env
    for key, value in env.items():
        if key.startswith("SHOAL_"):
            name = key[6:].lower()
            if name in _FIELDS:
                values[name] = _coerce(name, value)
    for name, value in (overrides or {}).items():
        if value is not None:
            if name not in _FIELDS:
                raise ConfigError(f"unknown setting '{name}'")
            values[name] = _coerce(name, value)
    return Settings(**values).validate()
