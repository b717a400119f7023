"""At-least-once dead-lettering of a quorum queue (issue 44 point 4;
``x-dead-letter-strategy: at-least-once``, RabbitMQ's ``rabbit_fifo_dlx``): a dead-lettered
message leaves the source queue only once the queues its dead-letter exchange routes it to
have confirmed it.

- The leader dead-letters (rejection, expiry, the delivery limit) by logging ``dlx``
  ([index, reason]): on every member the message moves from the queue to its *discards*
  (machine.py), where it still counts towards ``x-max-length``/``-bytes`` (RabbitMQ's
  ``is_over_limit`` counts them too: with reject-publish, a dead-letter target that is down
  pushes back on the source's publishers).
- Once that is applied, the leader sends each discard to a router as a REPUBLISH with a
  confirm id (router/dead_letters.py); the router publishes it with confirms and answers
  REPUBLISH_RESULT. A confirmed one is logged ``dlx-done`` and is gone everywhere; one not
  confirmed (no route, a missing exchange, a nack, no answer within RETRY_MS) is sent again
  after RETRY_MS.
- A new leader sends every discard again: a leader change of the source or of a target
  never loses one (it may deliver one twice, which is what at-least-once allows).

RabbitMQ accepts the strategy only with ``x-overflow: reject-publish`` and a dead-letter
exchange; otherwise it falls back (at-most-once, or no dead-lettering) with a warning, and
so does Shoal (requests.py).
"""
from __future__ import annotations

import logging
from typing import Any

from shoal.node.queues.args import Overflow
from shoal.node.queues.deadletter import republish
from shoal.node.queues.paging import body_bytes

log = logging.getLogger("shoal.node.replication")

#: A discard not confirmed (or not answered) within this long (ms) is sent again.
RETRY_MS = 5000


def at_least_once(args: dict, cfg: Any) -> bool:
    """Whether a quorum queue declared with ``args`` (checked into ``cfg``) dead-letters at
    least once: the strategy, a dead-letter exchange and reject-publish (rabbit_quorum_queue
    ``dlh/5``)."""
    return args.get("x-dead-letter-strategy") == "at-least-once" and cfg.dlx is not None \
        and cfg.overflow is Overflow.REJECT_PUBLISH


class DeadLetters:
    """The leader's side for one group (``group``, node/replication/group.py)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        #: dead letters of this turn to log: [index, reason]
        self.to_log: list[list] = []
        #: confirmed discards whose dlx-done is to be logged
        self.confirmed: list[int] = []
        #: index -> when it was last sent (ms); absent: not sent by this leader yet
        self.sent: dict[int, float] = {}
        #: index -> the confirm id of its last send (manager.py ``dead_letter_confirm``)
        self.confirm_ids: dict[int, int] = {}

    def dead_letter(self, entry: Any, reason: str) -> bool:
        """The leader dead-letters ``entry`` (it is leaving its queue): keep its message
        for the log's ``dlx``. False when it is not the log's (then at most once)."""
        g = self.group
        index = g.machine.index(entry)
        if index is None or not g.leading:
            return False
        g.machine.captured[index] = [entry.exchange, entry.routing_key, entry.header,
                                     body_bytes(entry.body), reason]
        self.to_log.append([index, reason])
        return True

    def log_turn(self) -> None:
        """Log the turn's dead letters and confirmations (one entry each)."""
        g = self.group
        if self.to_log:
            batch, self.to_log = self.to_log, []
            g.propose(["dlx", batch])
        if self.confirmed:
            done, self.confirmed = self.confirmed, []
            g.propose(["dlx-done", done])

    def send(self, indexes: Any, now: float) -> None:
        """REPUBLISH these discards with confirm ids, to any one router."""
        g = self.group
        host = g.host
        shard = host.sink
        if not shard.peers:
            return                      # no router: the tick sends them once one is back
        router = next(iter(shard.peers))
        discards = g.machine.discards
        for index in indexes:
            d = discards.get(index)
            if d is None:
                continue
            exchange, routing_key, header, body, reason = d
            confirm = host.dead_letter_confirm(g, index)
            msg = republish(shard, g.queue, exchange, routing_key, header, body, reason,
                            confirm)
            self.sent[index] = now
            shard.send(router, msg)

    def result(self, index: int, ok: bool, now: float) -> None:
        """REPUBLISH_RESULT for discard ``index``."""
        if index not in self.group.machine.discards:
            return
        if ok:
            if index not in self.confirmed:
                self.confirmed.append(index)
            self.sent.pop(index, None)
        else:
            self.sent[index] = now      # again after RETRY_MS

    def tick(self, now: float) -> None:
        """Send again what was not confirmed within RETRY_MS, or never sent."""
        waiting = [i for i in self.group.machine.discards
                   if i not in self.confirmed and now - self.sent.get(i, -RETRY_MS) >= RETRY_MS]
        if waiting:
            self.send(waiting, now)

    def lead(self, now: float) -> None:
        """This member became leader: every discard is sent again."""
        self.sent.clear()
        self.send(list(self.group.machine.discards), now)

    def follow(self) -> None:
        self.to_log.clear()
        self.confirmed.clear()
        self.sent.clear()
        self.group.machine.captured.clear()


# ---- the node's confirm ids (a node's Replication ``rep`` holds ``confirms``) -------------
def confirm_id(rep: Any, g: Any, index: int) -> int:
    """A new confirm id for a REPUBLISH of ``g``'s discard ``index``; the id of its earlier
    send, if any, is forgotten (its answer is moot)."""
    rep.confirm_seq += 1
    old = g.dlx.confirm_ids.get(index) if g.dlx is not None else None
    if old is not None:
        rep.confirms.pop(old, None)
    if g.dlx is not None:
        g.dlx.confirm_ids[index] = rep.confirm_seq
    rep.confirms[rep.confirm_seq] = (g, index)
    return rep.confirm_seq


def on_result(rep: Any, confirm: int, ok: bool) -> None:
    """REPUBLISH_RESULT from a router: the discard's fate, if its group still leads."""
    waiting = rep.confirms.pop(confirm, None)
    if waiting is None:
        return
    g, index = waiting
    if g.dlx is None:
        return
    g.dlx.confirm_ids.pop(index, None)
    if g.leading and rep.groups.get(g.key) is g:
        g.dlx.result(index, bool(ok), rep.now())
