"""What a node does with the frames it reads: decode each batch and hand its wire messages to
the shard, settlements and credit first (node/server.py reads them from the ZeroMQ socket, the
``unix://`` listener and routers in the same process)."""
from __future__ import annotations

import logging
from typing import Sequence

from shoal.shared.wire import T, decode_batch

from shoal.node.shard import Shard

log = logging.getLogger("shoal.node")


#: Settlements and credit: handled before the publishes read in the same turn, so consumers
#: keep flowing while publishers flood (safe: a router sends CREDIT only after CONSUME's reply
#: and SETTLE only for deliveries already made). A lease's records and its end keep their
#: place among them: a SETTLE of a leased delivery always follows its LEASED, and a router
#: sends no PUBLISH to a queue it holds lent (node/lease.py).
#:
#: They jump over publishes only. Once a router's message of any other kind (a CANCEL, a
#: QUEUE_PURGE, ...) is read in the turn, that router's later messages keep their order: a
#: SETTLE that requeues a cancelled consumer's deliveries is sent behind its CANCEL
#: (router/broker.py ``settle``), and run ahead of it the node would deliver them to the
#: leaving consumer again, so that a count right after the detach missed them.
_URGENT = frozenset({T.SETTLE, T.CREDIT, T.LEASED, T.LEASE_ACKED, T.LEASE_END})
_PUBLISH = int(T.PUBLISH)


def feed_frame(shard: Shard, peer: bytes, frame: bytes, now_ms: float) -> int:
    """Decode one ZeroMQ frame from ``peer`` and hand each wire message to ``shard``."""
    return feed_frames(shard, [(peer, frame)], now_ms)


def feed_frames(shard: Shard, frames: list[tuple[bytes, bytes]], now_ms: float,
                batches: list[tuple[bytes, list]] | None = None) -> int:
    """Decode the frames read in one turn and hand their wire messages to ``shard``:
    settlements and credit first (ahead of publishes only: :data:`_URGENT`), then everything
    else in arrival order. ``batches``: batches already decoded (handed over in memory by a
    router in this process, ``attach_local``), handled before the frames.

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
    if len(batches) < 2:
        return _handle(shard, batches[0][0], batches[0][1], now_ms) if batches else 0
    # The other nodes' messages first: a quorum queue's leader that was stopped learns a
    # newer term before it serves what the routers asked meanwhile.
    batches.sort(key=lambda b: not b[0].startswith(b"peer:"))
    n = 0
    #: peer -> (batch number, position) of its first message that is neither urgent nor a
    #: publish: from there on its messages wait for the second pass, in order
    held: dict[bytes, tuple[int, int]] = {}
    for b, (peer, batch) in enumerate(batches):
        if peer in held:
            continue
        for i, msg in enumerate(batch):
            tag = msg[0]
            if tag in _URGENT:
                try:
                    shard.handle(peer, msg, now_ms)
                    n += 1
                except Exception:  # noqa: BLE001 - as in _handle
                    log.exception("dropping wire message from %r that failed", peer)
            elif tag != _PUBLISH:
                held[peer] = (b, i)
                break
    for b, (peer, batch) in enumerate(batches):
        mark = held.get(peer)
        if mark is None or b < mark[0]:
            n += _handle_the_rest(shard, peer, batch, now_ms)
        elif b > mark[0]:
            n += _handle(shard, peer, batch, now_ms)
        else:
            n += _handle_the_rest(shard, peer, batch[:mark[1]], now_ms)
            n += _handle(shard, peer, batch[mark[1]:], now_ms)
    return n


def _handle(shard: Shard, peer: bytes, msgs: Sequence[list], now_ms: float) -> int:
    """Hand ``msgs`` to ``shard`` in order; how many were handled (one whose handler failed is
    logged and dropped)."""
    n = 0
    for msg in msgs:
        try:
            shard.handle(peer, msg, now_ms)
            n += 1
        except Exception:  # noqa: BLE001 - the one place that keeps the node alive
            log.exception("dropping wire message from %r that failed", peer)
    return n


def _handle_the_rest(shard: Shard, peer: bytes, msgs: Sequence[list], now_ms: float) -> int:
    """As :func:`_handle`, leaving out the settlements and credit (the first pass's)."""
    return _handle(shard, peer, [m for m in msgs if m[0] not in _URGENT], now_ms)
