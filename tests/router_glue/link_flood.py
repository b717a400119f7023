"""A publisher flood a link's node cannot read in time, shared by the LocalLink and UnixLink
tests: the link must pause the publishers, then resume them, and lose nothing."""
from __future__ import annotations

import asyncio

from shoal.router.link import NodeLink
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
