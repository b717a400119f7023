"""Transactions on a channel (AMQP 0-9-1 spec 1.9, class tx): tx.select, tx.commit and
tx.rollback, and what a transactional channel holds back until then.

After ``tx.select`` a channel (router/frontend/channel.py's ``Channel``) holds a
:class:`Transaction`: its ``publish`` appends routed publishes to it and its ``settle`` appends
acks, nacks and rejects, instead of sending them to the nodes. ``tx.commit`` sends them all;
``tx.rollback`` forgets the publishes and makes the settled deliveries unacked again, under
their delivery tags (RabbitMQ 3.10's behaviour, which the side-by-side tests check). The
handlers are the ``on_tx_<method>`` handlers the channel finds by name (``_handler_for``).

Atomicity: at commit each node gets its share of the transaction in one batch and applies it in
one event-loop turn (one journal write, docs/durability.md "Transactions"), so on each node a
transaction is all-or-nothing and no other client sees half of it. Across nodes it is not
atomic: if a node holding a target queue is down, the commit fails with 404 NOT_FOUND (soft,
the channel closes) while the other nodes may already have applied their share.

Errors (soft, the channel closes): 406 PRECONDITION_FAILED for tx.select on a confirm channel,
and for tx.commit / tx.rollback on a channel that is not transactional, worded as RabbitMQ.
"""
from __future__ import annotations

import asyncio
from typing import Any, Protocol

from pamqp import commands as C

from shoal.shared.errors import NOT_FOUND, PRECONDITION_FAILED, soft_error

from shoal.router.broker import Broker
from shoal.router.session import Delivery


class Transaction:
    """What a transactional channel did since its last commit or rollback: ``publishes``,
    ``(publish event, target queues)`` in publish order; ``settles``, ``(outcome, [(delivery
    tag, Delivery)])`` in settle order (outcome: ``shared.wire.OUTCOME_*``)."""

    __slots__ = ("publishes", "settles")

    def __init__(self) -> None:
        self.publishes: list[tuple[Any, set[str]]] = []
        self.settles: list[tuple[int, list[tuple[int, Delivery]]]] = []

    def undo(self, unacked: dict[int, Delivery]) -> None:
        """Forget the held publishes and put the held settlements' deliveries back into
        ``unacked`` under their tags (a rollback, or the channel closing uncommitted)."""
        for _, items in self.settles:
            unacked.update(items)
        self.settles.clear()
        self.publishes.clear()


class TxChannel(Protocol):
    """What these handlers use of a channel (router/frontend/channel.py's ``Channel``)."""

    broker: Broker
    confirm: bool
    tx: Transaction | None
    unacked: dict[int, Delivery]

    def send(self, method: Any) -> None: ...


def on_tx_select(ch: TxChannel, m: Any) -> None:
    """tx.select (spec 1.9.2.1): publishes and settlements on ``ch`` now wait for tx.commit.
    Raises 406 on a confirm channel (as RabbitMQ). A second select keeps what is held."""
    if ch.confirm:
        raise soft_error(PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
    if ch.tx is None:
        ch.tx = Transaction()
    ch.send(C.Tx.SelectOk())


async def on_tx_commit(ch: TxChannel, m: Any) -> None:
    """tx.commit (spec 1.9.2.3): send the held publishes and settlements; commit-ok once every
    node accepted every publish. Raises 406 when the channel is not transactional, 404 when a
    node holding a target queue is down."""
    tx = ch.tx
    if tx is None:
        raise soft_error(PRECONDITION_FAILED, "channel is not transactional")
    publishes, tx.publishes = tx.publishes, []
    settles, tx.settles = tx.settles, []
    broker = ch.broker
    loop = asyncio.get_running_loop()
    futures = []
    for ev, queues in publishes:
        fut = loop.create_future()
        broker.publish(ch, 0, ev, queues, fut)
        futures.append(fut)
    for outcome, items in settles:
        broker.settle(ch, [d for _, d in items], outcome)
    results = await asyncio.gather(*futures)
    if any(p.failed for p in results):
        raise soft_error(NOT_FOUND, "a node holding a queue of this transaction is down; "
                                    "part of the transaction may not have been applied")
    ch.send(C.Tx.CommitOk())


def on_tx_rollback(ch: TxChannel, m: Any) -> None:
    """tx.rollback (spec 1.9.2.5): discard the held publishes; settlements are undone (the
    deliveries are unacked again, under their delivery tags, in tag order). Raises 406 when
    not transactional."""
    if ch.tx is None:
        raise soft_error(PRECONDITION_FAILED, "channel is not transactional")
    ch.tx.undo(ch.unacked)
    ch.unacked = dict(sorted(ch.unacked.items()))
    ch.send(C.Tx.RollbackOk())
