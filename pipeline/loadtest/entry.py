"""The entry point of each ``shoal loadtest`` worker process (``multiprocessing`` spawn)."""
from __future__ import annotations

import asyncio

from .client import BrokerClosed
from .consumer import Consumer
from .plan import Config
from .schema import ROLE_PRODUCER
from .workers import ERROR, Producer


def run_worker(role: str, index: int, cfg: Config, reports, go, start_ns, stop) -> None:
    """Run one producer or consumer until done, report, exit. A failure (the broker refused
    the connection, closed a channel; a socket error) is reported as ``ERROR`` with a one-line
    reason, never raised."""
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run
    worker = (Producer if role == ROLE_PRODUCER else Consumer)(index, cfg, reports)
    try:
        runner(worker.main(go, start_ns, stop))
    except (TimeoutError, BrokerClosed, OSError, ValueError) as exc:
        reports.put((ERROR, role, index, f"{type(exc).__name__}: {exc}" if not isinstance(
            exc, BrokerClosed) else str(exc)))
    except KeyboardInterrupt:
        pass
