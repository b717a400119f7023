"""What a node does with the frames it reads: decode each batch and hand its wire messages to
the shard, settlements and credit first (node/server.py reads them from the ZeroMQ socket, the
``unix://`` listener and routers in the same process)."""
from __future__ import annotations

import logging

from shoal.shared.wire import T, decode_batch

from shoal.node.shard import Shard

log = logging.getLogger("shoal.node")


#: Settlements and credit: handled before the publishes read in the same turn, so consumers
#: keep flowing while publishers flood (safe: a router sends CREDIT only after CONSUME's reply
#: and SETTLE only for deliveries already made). A lease's records and its end keep their
#: place among them: a SETTLE of a leased delivery always follows its LEASED, and a router
#: sends no PUBLISH to a queue it holds lent (node/lease.py).
_URGENT = frozenset({T.SETTLE, T.CREDIT, T.LEASED, T.LEASE_ACKED, T.LEASE_END})


def feed_frame(shard: Shard, peer: bytes, frame: bytes, now_ms: float) -> int:
    """Decode one ZeroMQ frame from ``peer`` and hand each wire message to ``shard``."""
    return feed_frames(shard, [(peer, frame)], now_ms)


def feed_frames(shard: Shard, frames: list[tuple[bytes, bytes]], now_ms: float,
                batches: list[tuple[bytes, list]] | None = None) -> int:
    """Decode the frames read in one turn and hand their wire messages to ``shard``:
    settlements and credit first, then everything else in arrival order. ``batches``: batches
    already decoded (handed over in memory by a router in this process, ``attach_local``),
    handled before the frames.

    This is the node's one broad catch: an undecodable frame or a message that makes a handler
    fail is logged and dropped; the node never crashes on input. Batches from the other nodes
    (quorum queues' Raft) go before the routers'. Returns messages handled.
    """
    batches = list(batches) if batches else []
    for peer, frame in frames:
        try:
            batches.append((peer, decode_batch(frame)))
        except ValueError as exc:
            log.warning("dropping frame from %r: %s", peer, exc)
    n = 0
    urgent = len(batches) > 1
    if urgent:
        # The other nodes' messages first: a quorum queue's leader that was stopped learns a
        # newer term before it serves what the routers asked meanwhile.
        batches.sort(key=lambda b: not b[0].startswith(b"peer:"))
    for first_pass in ((True, False) if urgent else (None,)):
        for peer, batch in batches:
            for msg in batch:
                if first_pass is not None and (msg[0] in _URGENT) != first_pass:
                    continue
                try:
                    shard.handle(peer, msg, now_ms)
                    n += 1
                except Exception:  # noqa: BLE001 - the one place that keeps the node alive
                    log.exception("dropping wire message from %r that failed", peer)
    return n
