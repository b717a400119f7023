"""``shoal router``: run one router process (for Kubernetes, docker, or the local launcher)."""
from __future__ import annotations

import argparse
import logging
import sys

from shoal.shared.definitions import definitions_for
from shoal.shared.errors import ConfigError
from shoal.shared.settings import LAUNCHED_FAILURE, load_settings, warn_unknown_env

from shoal.router.frontend.tls import server_context


def main(argv: list[str] | None = None, host_node=None) -> int:
    """Parse flags, load settings, run the router. Exit 2 with one line on a bad setting, 4
    with one line naming the port and the flag or setting when a port cannot be bound.

    ``host_node`` runs the nodes given as ``inproc://`` endpoints inside this process (see
    ``shoal.router.server``); the ``shoal`` command passes it, ``python -m shoal.router``
    cannot (the router never imports the node package) and exits 2 for such endpoints."""
    p = argparse.ArgumentParser(prog="shoal router", description="Run one Shoal router.")
    p.add_argument("--config", help="YAML settings file")
    p.add_argument("--host", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="AMQP port (default 5672; 0 picks a free one)")
    p.add_argument("--direct-port", type=int, help="a second AMQP port that reaches this "
                                                   "router alone (0 picks a free one; default "
                                                   "none)")
    p.add_argument("--node", action="append", dest="node_endpoints", metavar="[ID=]ENDPOINT",
                   help="a node's ZeroMQ endpoint, repeatable, in node-id order")
    p.add_argument("--embed-bind", metavar="ENDPOINT",
                   help="a second endpoint the hosted node (inproc://) binds, where other "
                        "routers reach it (shoal serve --embed-node --routers R)")
    p.add_argument("--data-dir", help="hosted nodes (inproc:// endpoints) keep their journals "
                                      "in DATA_DIR/NODE_ID (default ~/.local/share/shoal)")
    p.add_argument("--max-message-size", type=int, metavar="BYTES",
                   help="largest message body accepted (default 134217728 = 128 MiB, "
                        "RabbitMQ's; at most 536870912)")
    p.add_argument("--definitions", metavar="FILE",
                   help="a RabbitMQ definitions file (JSON) with users, vhosts, permissions "
                        "and topology to load at start (rabbitmqctl export_definitions's "
                        "output loads unchanged)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    # Started by ``shoal serve``: a start-up failure goes to stdout as ``shoal router failed:
    # LINE`` for the launcher to tell in its own one line (deploy/launcher.py).
    p.add_argument("--launched", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    warn_unknown_env("shoal router")
    try:
        settings = load_settings(args.config, overrides={
            "host": args.host, "port": args.port, "node_endpoints": args.node_endpoints,
            "direct_port": args.direct_port, "embed_bind": args.embed_bind,
            "data_dir": args.data_dir, "max_message_size": args.max_message_size,
            "load_definitions": args.definitions, "log_level": args.log_level})
        if not settings.node_endpoints:
            raise ConfigError("invalid setting 'node_endpoints': the router needs at least one "
                              "node endpoint (--node or SHOAL_NODE_ENDPOINTS)")
        definitions = definitions_for(settings)
        if settings.tls_port >= 0:
            server_context(settings)    # certificate files that do not load: one line, exit 2
    except ConfigError as exc:
        print(f"shoal router: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s router %(levelname)s %(name)s: %(message)s")
    from shoal.router.server import run_router
    report = (lambda line: print(f"{LAUNCHED_FAILURE}{line}", flush=True)) if args.launched \
        else None
    return run_router(settings, host_node, definitions, report)
