"""The ``shoal`` command: one thin entry point that dispatches to the rooms that do the work.

``serve`` (a local cluster) goes to :mod:`shoal.deploy.launcher`, ``cluster`` to
:mod:`shoal.deploy.dockercluster`, ``loadtest`` and ``report`` to :mod:`shoal.pipeline`; each is
imported only when its command runs (``report`` alone imports pyspark). ``node`` and ``router``
(one process each) are dispatched by module name, so this package never imports
``shoal.node`` or ``shoal.router`` at import time (design.md section 1); ``python -m shoal.cli``
runs the same command (``__main__``).
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from shoal.shared.definitions import definitions_for
from shoal.shared.errors import ConfigError
from shoal.shared.settings import load_settings, warn_unknown_env

USAGE = """usage: shoal {serve,node,router,ctl,cluster,loadtest,report,keygen,version} [options]

commands:
  serve    run a local cluster: N nodes and R routers on one port (node-0 in the
           router with --embed-node)
  node     run one node process (owns a shard of queues)
  router   run one router process (speaks AMQP 0-9-1 to clients)
  ctl      manage a running broker over its management API: list, purge, delete,
           close-connection, export/import definitions, users, vhosts, permissions
  loadtest load any AMQP 0-9-1 broker and write Parquet results (PerfTest-like)
  cluster  docker clusters for load tests: build, up, loadtest, status, down
  report   Spark job over loadtest runs: HTML report + Parquet/CSV aggregates
  keygen   print a new CURVE key pair for the router-node link (docs/security.md)
  version  print the version (also: shoal --version)

'shoal COMMAND --help' shows a command's options."""


def serve_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="shoal serve",
                                description="Run a local Shoal cluster: N nodes and R routers.")
    p.add_argument("--config", help="YAML settings file")
    p.add_argument("--host", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="AMQP port (default 5672; 0 picks a free one)")
    p.add_argument("--nodes", type=int, help="node processes (default: half the CPUs, at least "
                                             "1)")
    p.add_argument("--routers", type=int, help="router processes sharing the AMQP port "
                                               "(SO_REUSEPORT), each linked to every node "
                                               "(default: half the CPUs and one more per 4 "
                                               "CPUs from 4, at least 1; 1 with --embed-node)")
    p.add_argument("--data-dir", help="where nodes keep their data (default "
                                      "~/.local/share/shoal)")
    p.add_argument("--embed-node", action=argparse.BooleanOptionalAction, default=None,
                   help="run node-0 inside the router process, its link's frames handed over "
                        "in memory (lower CPU per message and latency for its queues; default "
                        "off)")
    p.add_argument("--pin-cpus", action=argparse.BooleanOptionalAction, default=None,
                   help="hold each router and node process to one CPU, routers on the first "
                        "share, nodes on the rest (default on; a link hand-off then never "
                        "crosses CPUs)")
    p.add_argument("--local-link", choices=["zmq", "unix"],
                   help="how routers reach the nodes: unix (a Unix stream socket without "
                        "ZeroMQ's I/O threads: less CPU per message and lower latency; the "
                        "default) or zmq (ZeroMQ ipc://; the default when the link has CURVE "
                        "keys)")
    p.add_argument("--max-message-size", type=int, metavar="BYTES",
                   help="largest message body accepted (default 134217728 = 128 MiB, "
                        "RabbitMQ's; at most 536870912)")
    p.add_argument("--definitions", metavar="FILE",
                   help="a RabbitMQ definitions file (JSON) with users, vhosts, permissions "
                        "and topology to load at start (rabbitmqctl export_definitions's "
                        "output loads unchanged)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    args = p.parse_args(argv)
    warn_unknown_env("shoal serve")     # once: its children are told not to repeat it
    try:
        settings = load_settings(args.config, overrides={
            "load_definitions": args.definitions,
            "host": args.host, "port": args.port, "nodes": args.nodes,
            "routers": args.routers, "data_dir": args.data_dir, "embed_node": args.embed_node,
            "pin_cpus": args.pin_cpus, "local_link": args.local_link,
            "max_message_size": args.max_message_size,
            "log_level": args.log_level})
        definitions_for(settings)       # a bad definitions file stops start-up in one line
    except ConfigError as exc:
        print(f"shoal serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s serve %(levelname)s: %(message)s")
    from shoal.deploy.launcher import serve
    return serve(settings, args.config)


def keygen_main(argv: list[str]) -> int:
    """``shoal keygen``: a new CURVE key pair (Z85) for ``link_curve_*`` (shared/linkauth.py)."""
    argparse.ArgumentParser(prog="shoal keygen", description="Print a new CURVE key pair for "
                            "the router-node link: the public key, then the secret key "
                            "(Z85, 40 characters each).").parse_args(argv)
    import zmq
    public, secret = zmq.curve_keypair()
    print(f"public {public.decode()}\nsecret {secret.decode()}")
    return 0


def _host_node(*args):
    """The router's ``host_node``: run a node inside the router process (``inproc://``
    endpoints; ``shoal serve --embed-node``). Wired here, in the entry point, so that neither
    package imports the other (design.md section 1)."""
    return importlib.import_module("shoal.node.process").hosted_node(*args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in ("--version", "-V", "version"):
        # the version the router announces in connection.start (one source: pyproject.toml)
        print(f"shoal {importlib.import_module('shoal.router.amqp.handshake').shoal_version()}")
        return 0
    if command == "serve":
        return serve_main(rest)
    if command == "keygen":
        return keygen_main(rest)
    if command == "node":
        return importlib.import_module("shoal.node.cli").main(rest)
    if command == "router":
        return importlib.import_module("shoal.router.cli").main(rest, host_node=_host_node)
    if command == "loadtest":
        try:
            from shoal.pipeline.loadtest.cli import main as loadtest_main
        except ImportError as exc:      # pyarrow (Parquet results) is the loadtest extra's
            print(f"shoal loadtest: {exc.name or exc} is not installed: "
                  f"pip install 'shoal[loadtest]'", file=sys.stderr)
            return 2
        return loadtest_main(rest)
    if command == "ctl":
        from shoal.deploy.ctl import main as ctl_main
        return ctl_main(rest)
    if command == "cluster":
        from shoal.deploy.dockercluster import main as cluster_main
        return cluster_main(rest)
    if command == "report":
        from shoal.pipeline.spark.cli import main as report_main  # imports pyspark only when run
        return report_main(rest)
    print(f"shoal: unknown command '{command}'\n\n{USAGE}", file=sys.stderr)
    return 2
