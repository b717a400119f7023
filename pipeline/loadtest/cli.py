"""``shoal loadtest``: flags in the spirit of RabbitMQ PerfTest (issue 6).

Exit status: 0 after a complete run, 1 when a worker failed (the broker refused a connection
or closed a channel: one line on stderr), 2 on a bad flag (one line on stderr), 130 on Ctrl-C.
"""
from __future__ import annotations

import argparse
import json
import secrets
import signal
import sys
import time

from .client import AMQPUrl

DESCRIPTION = ("Load an AMQP 0-9-1 broker (Shoal, RabbitMQ, ...) with producer and consumer "
               "processes; print one line per second and write Parquet results to --out.")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        print(f"shoal loadtest: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="shoal loadtest", description=DESCRIPTION)
    a = p.add_argument
    a("--url", default="amqp://guest:guest@127.0.0.1:5672/",
      help="broker URL amqp://user:pass@host:port/vhost")
    a("--producers", "-x", type=int, default=1, help="producer processes (default 1)")
    a("--consumers", "-y", type=int, default=1, help="consumer processes (default 1)")
    a("--queues", type=int, default=1, help="number of queues (default 1)")
    a("--queue-pattern", default="perf-%d",
      help="queue names, %%d = 1..QUEUES (default perf-%%d)")
    a("--size", "-s", type=int, default=100, help="message body size in bytes (>= 24)")
    a("--rate", "-r", type=float, default=0.0,
      help="msg/s per producer, 0 = as fast as possible (default)")
    a("--time", "-z", type=float, default=10.0, help="sending time in seconds (default 10)")
    a("--confirm", "-c", type=int, default=0,
      help="publisher confirms with at most N unconfirmed messages (0 = no confirms)")
    a("--qos", "-q", type=int, default=0, help="consumer prefetch count (0 = unlimited)")
    a("--multi-ack-every", "-A", type=int, default=0,
      help="ack with multiple=true every N messages (0 = ack each)")
    a("--persistent", action="store_true",
      help="delivery_mode 2 (and durable queues)")
    a("--durable", action="store_true", help="declare the queues durable")
    a("--mandatory", action="store_true", help="publish with mandatory=true")
    a("--exchange", "-e", default="",
      help="publish through this exchange, declared by every worker, each queue bound to it "
           "(default: the default exchange, to each queue by name)")
    a("--exchange-type", "-t", default="direct", choices=("direct", "topic", "fanout"),
      help="with --exchange: direct or topic route each message to one queue, fanout to every "
           "queue (received and loss count each copy); default direct")
    a("--bindings", type=int, default=0,
      help="with --exchange direct or topic: binding keys spread over the queues, key J to "
           "queue J %% QUEUES (default: one per queue)")
    a("--connections", type=int, default=1,
      help="connections per consumer process, its queues spread over them (default 1)")
    a("--queue-args", default="",
      help='queue.declare arguments: JSON object or k=v,k=v (numbers parsed)')
    a("--sample-every", type=int, default=50,
      help="keep the latency of 1 message in N in latency.parquet (default 50)")
    a("--out", default="", help="result folder (default loadtest-<run id>)")
    a("--label", default="", help="broker label stored in run.json (default host:port)")
    a("--nodes", default="",
      help="Shoal node ids (N = node-0..node-N-1, or a comma list) to record queue placement "
           "when the management API does not answer")
    a("--management-url", default="",
      help="management API that says which node holds each queue (default "
           "http://HOST:15672, the URL's host and user; 'off' to not ask)")
    return p


def parse_queue_args(text: str) -> dict:
    """``--queue-args``: a JSON object, or ``k=v,k=v`` where values that parse as JSON numbers
    or booleans become those. Raises ``ValueError``."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"--queue-args is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError("--queue-args JSON must be an object")
        return value
    out = {}
    for item in text.split(","):
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--queue-args item {item!r} is not key=value")
        try:
            value = json.loads(raw)
            if not isinstance(value, (int, float, bool)):
                value = raw
        except ValueError:
            value = raw
        out[key.strip()] = value
    return out


def node_ids(text: str) -> list[str]:
    text = text.strip()
    if not text:
        return []
    if text.isdigit():
        if int(text) < 1:
            raise ValueError("--nodes must be at least 1")
        return [f"node-{i}" for i in range(int(text))]
    return [n.strip() for n in text.split(",") if n.strip()]


def build(argv: list[str]):
    """Parse and validate ``argv``: ``(Config, out_dir, run_json, nodes)``. Raises
    ``ValueError`` with a one-line reason."""
    from .schema import FORMAT_VERSION, MIN_SIZE
    from .plan import Config
    args = _parser().parse_args(argv)
    for name in ("producers", "consumers"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name} must be >= 0")
    if args.producers + args.consumers == 0:
        raise ValueError("need at least one producer or consumer")
    if args.queues < 1:
        raise ValueError("--queues must be >= 1")
    if "%d" not in args.queue_pattern and args.queues > 1:
        raise ValueError("--queue-pattern needs %d when --queues > 1")
    if args.size < MIN_SIZE:
        raise ValueError(f"--size must be at least {MIN_SIZE} bytes (the body carries the "
                         f"timestamp and sequence number)")
    if args.rate < 0:
        raise ValueError("--rate must be >= 0")
    if args.time <= 0:
        raise ValueError("--time must be > 0")
    for name in ("confirm", "qos", "multi_ack_every"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
    if args.qos > 65535:
        raise ValueError("--qos must be <= 65535 (prefetch_count is a short)")
    if args.sample_every < 1:
        raise ValueError("--sample-every must be >= 1")
    if args.bindings < 0:
        raise ValueError("--bindings must be >= 0")
    if args.bindings and (not args.exchange or args.exchange_type == "fanout"):
        raise ValueError("--bindings needs --exchange with --exchange-type direct or topic")
    if args.bindings and args.bindings < args.queues:
        raise ValueError("--bindings must be at least --queues (each queue needs one)")
    if args.connections < 1:
        raise ValueError("--connections must be >= 1")
    if args.connections > 1 and args.queues < args.consumers * args.connections:
        raise ValueError("--connections: each connection needs a queue (--queues must be at "
                         "least --consumers x --connections)")
    if len(args.exchange.encode()) > 255:
        raise ValueError("--exchange is limited to 255 bytes")
    url = AMQPUrl.parse(args.url)
    queue_args = parse_queue_args(args.queue_args)
    ids = node_ids(args.nodes)
    if "%d" in args.queue_pattern:
        queues = [args.queue_pattern.replace("%d", str(i + 1)) for i in range(args.queues)]
    else:
        queues = [args.queue_pattern]
    if any(len(q.encode()) > 255 for q in queues):
        raise ValueError("queue names are limited to 255 bytes")
    nodes = {}
    if ids:
        from shoal.shared.placement import owner
        nodes = {q: owner(url.vhost, q, ids) for q in queues}
    run_id = secrets.token_hex(8)
    cfg = Config(url=args.url, queues=queues, size=args.size, rate=args.rate,
                 time_s=args.time, confirm=args.confirm, qos=args.qos,
                 multi_ack_every=args.multi_ack_every, persistent=args.persistent,
                 durable=args.durable, mandatory=args.mandatory, queue_args=queue_args,
                 sample_every=args.sample_every, run_token=int(run_id[:8], 16),
                 producers=args.producers, consumers=args.consumers,
                 exchange=args.exchange, exchange_type=args.exchange_type,
                 bindings=args.bindings, connections=args.connections)
    from .runner import host_info
    params = {k: v for k, v in vars(args).items() if k != "url"}
    params["queue_args"] = queue_args
    params["nodes"] = ids
    from .plan import copies
    params["copies"] = copies(cfg)      # deliveries expected per message (fanout: queues)
    management = args.management_url.strip()
    if management.lower() == "off":
        management = ""
    elif not management:
        from .placement import default_url
        management = default_url(url)
    elif not management.startswith(("http://", "https://")):
        raise ValueError("--management-url must start with http:// or https://")
    params["management_url"] = management
    run_json = {"format_version": FORMAT_VERSION, "run_id": run_id,
                "label": args.label or f"{url.host}:{url.port}", "url": url.public(),
                "created": time.time(), "host": host_info(), "params": params,
                "placement": "nodes" if nodes else "",
                "queues": [{"queue": q, "node": nodes.get(q, "")} for q in queues]}
    out = args.out or f"loadtest-{run_id}"
    return cfg, out, run_json, nodes


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg, out, run_json, nodes = build(argv)
    except ValueError as exc:
        print(f"shoal loadtest: {exc}", file=sys.stderr)
        return 2
    from .runner import LoadTestFailed, Runner

    def _terminate(signum, _frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, _terminate)   # stop like Ctrl-C: keep what was measured
    print(f"shoal loadtest: {cfg.producers} producers, {cfg.consumers} consumers, "
          f"{len(cfg.queues)} queues, {cfg.size} B, rate {cfg.rate or 'max'}, "
          f"{cfg.time_s:g} s against {run_json['url']} -> {out}", flush=True)
    try:
        Runner(cfg, out, run_json, nodes).run()
    except LoadTestFailed as exc:
        print(f"shoal loadtest: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("shoal loadtest: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
