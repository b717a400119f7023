"""Command line of the node: ``python -m shoal.node`` / ``shoal node`` (thin entry point).

``--node-id ID --bind ENDPOINT [--config FILE] [--data-dir DIR] [--peer ID=ENDPOINT ...]
[--peer-bind ENDPOINT]``; settings come from
shared.settings.load_settings (file < SHOAL_* env < flags). Exit codes: 0 clean stop,
1 cannot bind, 2 bad configuration or the data directory in use by another process, 3 journal corrupt or unwritable (one line on stderr).
"""
from __future__ import annotations

import argparse
import errno
import gc
import logging
import sys


from shoal.shared.datadir import DataDirLocked
from shoal.shared.errors import ConfigError
from shoal.shared.settings import load_settings, warn_unknown_env

from shoal.node.durability.journal import JournalCorrupt, JournalUnavailable
from shoal.node.process import BindFailed, run_node


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default sys.argv[1:]), run the node, return the exit code."""
    p = argparse.ArgumentParser(prog="shoal node", description="Run one Shoal node process.")
    p.add_argument("--node-id", help="this node's id (e.g. node-0)")
    p.add_argument("--bind", help="endpoint to bind: ZeroMQ tcp://host:port or ipc:///path, or "
                                  "unix:///path (the same-host link without ZeroMQ)")
    p.add_argument("--config", help="YAML settings file")
    p.add_argument("--data-dir", help="directory for the journal and runtime files")
    p.add_argument("--log-level", help="debug, info, warning or error")
    p.add_argument("--peer", action="append", metavar="ID=ENDPOINT",
                   help="another node, for quorum queues (repeat for each; setting peers)")
    p.add_argument("--peer-bind", help="an endpoint the other nodes reach this one on, "
                                       "when --bind is unix:// (a ZeroMQ one, or unix:///path "
                                       "when the other nodes' are unix:// too; setting "
                                       "peer_bind)")
    args = p.parse_args(argv)
    warn_unknown_env("shoal node")
    try:
        settings = load_settings(args.config, overrides={
            "node_id": args.node_id, "node_bind": args.bind, "data_dir": args.data_dir,
            "log_level": args.log_level, "peers": args.peer, "peer_bind": args.peer_bind})
    except ConfigError as exc:
        print(f"shoal node: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # As the router: fewer young-generation collections cost less CPU per message; what was
    # imported at start is never garbage, so the collector stops scanning it.
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)
    try:
        return run_node(settings)
    except DataDirLocked as exc:
        print(f"shoal node: {exc}", file=sys.stderr)
        return 2
    except (JournalCorrupt, JournalUnavailable) as exc:
        print(f"shoal node: cannot open the journal: {exc}", file=sys.stderr)
        return 3
    except BindFailed as exc:
        in_use = exc.errno == errno.EADDRINUSE
        print(f"shoal node: cannot bind {settings.node_bind}: "
              f"{'it is in use' if in_use else exc}; choose another with --bind or "
              f"SHOAL_NODE_BIND", file=sys.stderr)
        return 1
