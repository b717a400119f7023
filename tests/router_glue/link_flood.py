"""A publisher flood a link's node cannot read in time, shared by the LocalLink and UnixLink
tests: the link must pause the publishers, then resume them, and lose nothing."""
from __future__ import annotations

import asyncio

from shoal.router.links.node_link import NodeLink
from shoal.shared.wire import T

DECLARE = [T.QUEUE_DECLARE, "/", "q1", False, False, False, False, {}, None]
PASSIVE = [T.QUEUE_DECLARE, "/", "q1", True, False, False, False, {}, None]


async def flood(link: NodeLink, n: int, size: int = 0, flush_every: int = 0
                ) -> tuple[bool, list]:
    """Declare q1, queue ``n`` publishes (bodies of ``size`` bytes after a 6-digit number)
    in one event-loop turn, flushing every ``flush_every`` (0: once, at the end), wait
    (bounded) until the link caught up. Returns (whether the link had paused the publishers
    right after the flood, the passive declare's reply: [name, message_count, consumers])."""
    await link.request(DECLARE)
    for i in range(n):                   # one loop turn: the node cannot read in between
        link.send([T.PUBLISH, 0, "/", ["q1"], "", "q1", b"", b"%06d" % i + b"x" * size, None])
        if flush_every and i % flush_every == flush_every - 1:
            link._flush()                # a batch per flush_every, as loop turns would send
    link._flush()
    paused = link.congested
    for _ in range(500):
        if not link.congested and not link._outbox:
            break
        await asyncio.sleep(0.01)
    return paused, await link.request(PASSIVE)


def check_paused_and_lossless(paused: bool, reply: list, events: list, n: int) -> None:
    """What :func:`flood` of ``n`` publishes must show: the link paused the publishers
    (``events`` holds its on_congestion calls), resumed them last, and q1 holds all ``n``."""
    assert paused, "the link did not notice the node falling behind"
    assert ("congested", True) in events and events[-1] == ("congested", False)
    assert reply[1] == n             # every publish was enqueued, none dropped
