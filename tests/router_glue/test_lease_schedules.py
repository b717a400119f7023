"""Delivery leases under seeded schedules: the router's real ``Leases`` (router/lease.py)
against a node's real ``Shard`` (node/lease.py), with the links modelled as they behave.

What is modelled: router r1 holds the consumers (each on its own channel) and two
publishing channels, one of them with confirms; router r2 publishes through the node only
(its publishes revoke leases). r1's link sends LEASED and LEASE_END records ahead of what is
still unsent, settlements and credit next, PUBLISH, CONSUME, CANCEL and LEASE_TAKE in order
behind them (router/links/node_link.py). A node turn reads some of the batches in flight,
each router's in order, through ``feed_frames`` (node/intake.py: settlements, credit and
records ahead of the publishes of the same turn). What arrives back is handled in order.
A seeded schedule interleaves publishes, link flushes, node turns, acks, consumers coming
and cancelling, and the clock (the node's hold-off); then everything drains.

What is checked, as a client would see it: every message published is delivered, once;
each consumer gets each publishing channel's messages that are not redelivered in publish
order (AMQP 0-9-1 4.7; across consumers nothing orders what clients see); every
confirm is answered once, by the node or, for a leased delivery acknowledged before its
record left, by the router (router/links/records.py). A failing seed
replays exactly: ``LEASE_SEEDS=<first>:<count>`` picks others.
"""
from __future__ import annotations

import asyncio
import os
import random
from types import SimpleNamespace

import pytest

from shoal.node.intake import feed_frames
from shoal.node.shard import Shard
from shoal.router.consumers import Consumer, ConsumerTarget, CreditPool, on_delivered
from shoal.router.lease import Leases
from shoal.router.links.records import LeaseRecords
from shoal.shared.settings import Settings
from shoal.shared.wire import OUTCOME_ACK, OUTCOME_REQUEUE, WIRE_VERSION, T

PREFETCH = 4


class Link:
    """r1's link to the node, ordered as NodeLink orders it, its records NodeLink's own
    (router/links/records.py: an ack before a LEASED leaves makes it a LEASE_ACKED)."""

    def __init__(self) -> None:
        self.node_id = "node-0"
        self.leases = 0
        self.records = LeaseRecords()
        self.urgent: list = []
        self.outbox: list = []

    def send(self, msg: list, urgent: bool = False) -> None:
        (self.urgent if urgent else self.outbox).append(msg)

    def send_record(self, msg: list, now: bool = False) -> None:
        self.records.add(msg)

    def acked_unsent(self, delivery_id: int) -> int | None:
        return self.records.acked(delivery_id)

    def flush(self) -> list:
        batch = self.records.take() + self.urgent + self.outbox
        self.urgent, self.outbox = [], []
        return batch


class Channel:
    """A client channel of r1: what it was delivered, in order (``world.seen``)."""

    def __init__(self, world: "World", name: str) -> None:
        self.world = world
        self.vhost = "/"
        self.closed = False
        self.pool = CreditPool(prefetch_count=PREFETCH)
        self.client = SimpleNamespace(owner=f"r1/{name}")
        self.lease_pace = None
        self.unconfirmed_count = 0

    def deliver(self, c, did, redelivered, exchange, routing_key, header, body) -> None:
        on_delivered(self.pool, c)
        self.world.seen.append((body, redelivered, c.consumer_id))
        self.world.unacked.append((c, did))


class World:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        #: how often a "cancel" step cancels: half the schedules churn consumers, half
        #: hardly (so that their leases last)
        self.churn = self.rng.choice([0.2, 0.02])
        #: a "flush" step flushes r1's link every time, or every 4th time in half the seeds
        #: (more acks find their LEASED unsent: LEASE_ACKED); drawn apart from ``rng`` so
        #: that each seed's steps stay the ones they were before it
        self.flush_every = random.Random(~seed).choice([1, 4])
        self.flush_steps = 0
        self.now = 0.0
        self.shard = Shard("node-0", "inc-1", Settings(node_id="node-0",
                                                       link_heartbeat_timeout=3600.0,
                                                       delivery_leases=True))
        self.link = Link()
        self.in_flight: dict[bytes, list[list]] = {b"r1": [], b"r2": []}
        self.back: list[list] = []              # node -> r1, in order
        self.seen: list[tuple[bytes, bool, int]] = []   # what clients got: body,
        #: redelivered, consumer
        self.unacked: list = []
        self.consumers: dict[int, tuple[Channel, Consumer]] = {}
        self.next_cid = 0
        self.req = 0
        self.consuming: dict[int, int] = {}     # CONSUME's request id -> consumer id
        self.pid = 0
        self.pending: dict[int, tuple[str, bytes]] = {}     # publish id -> confirm awaited
        self.confirmed: dict[bytes, bool] = {}
        self.published: dict[str, list[bytes]] = {"a": [], "b": [], "r2": []}
        self.r2_out: list = []
        self.stats = {"routed": 0, "delivered": 0, "leased": 0}
        self.links = {"node-0": self.link}
        self.timers: list = []                  # (due ms, fn, args): the router's timers
        self.leases = Leases(self, call_later=self.call_later)
        self.pubs = {"a": Channel(self, "a"), "b": Channel(self, "b")}
        for peer in (b"r1", b"r2"):
            self.shard.handle(peer, [T.HELLO, WIRE_VERSION, peer.decode(), "node-0"], self.now)
        self.req += 1
        self.link.send([T.QUEUE_DECLARE, self.req, "/", "q", False, False, False, False, {},
                        "r1/a"])

    # ---- what router/lease.py uses of the broker ------------------------------------------
    def call_later(self, seconds, fn, *args) -> None:
        self.timers.append((self.now + seconds * 1000, fn, args))

    def tick(self, ms: float) -> None:
        """The clock moves (the node's hold-off, the router's timers: a lease's wait)."""
        self.now += ms
        due = [t for t in self.timers if t[0] <= self.now]
        self.timers = [t for t in self.timers if t[0] > self.now]
        for _, fn, args in due:
            fn(*args)

    def mark_dirty(self, client) -> None:
        pass

    def delivery_failed(self, link, ch, did) -> None:
        raise AssertionError("a leased delivery failed")

    def next_publish_id(self) -> int:
        self.pid += 1
        return self.pid

    def pending_answer(self, pid, ch, seq, ev, node_id, queue) -> None:
        self.pending[pid] = (node_id, ev.body)

    def publish(self, ch, seq, ev, queues, future=None, count=True) -> None:
        if self.leases.held:
            rest = self.leases.route(ch, seq, ev, queues, future, count)
            if rest is None:
                return
            queues = rest
        pid = 0
        if seq:
            pid = self.next_publish_id()
            self.pending[pid] = ("node-0", ev.body)
        self.link.send([T.PUBLISH, pid, "/", sorted(queues), "", "q", b"hdr", ev.body,
                        ch.client.owner])

    # ---- the schedule's steps ---------------------------------------------------------------
    def client_publish(self, name: str) -> None:
        body = f"{name}{len(self.published[name])}".encode()
        self.published[name].append(body)
        if name == "r2":
            self.r2_out.append([T.PUBLISH, 0, "/", ["q"], "", "q", b"hdr", body, "r2/c"])
            return
        ch = self.pubs[name]
        seq = len(self.published[name]) if name == "b" else 0     # b publishes with confirms
        ev = SimpleNamespace(exchange="", routing_key="q", header=b"hdr", body=body,
                             mandatory=False)
        self.publish(ch, seq, ev, {"q"})

    def consume(self) -> None:
        self.next_cid += 1
        cid = self.next_cid
        t = ConsumerTarget(f"t{cid}", cid, "/", False)
        t.registered = False                    # until CONSUME's answer
        c = Consumer(cid, "q", "node-0", t)
        t.consumers.append(c)
        self.consumers[cid] = (Channel(self, f"c{cid}"), c)
        self.req += 1
        self.consuming[self.req] = cid
        self.link.send([T.CONSUME, self.req, cid, "/", "q", f"t{cid}", False, False, {},
                        "r1/c"])

    def cancel(self) -> None:
        live = [cid for cid, (_, c) in self.consumers.items() if c.target.registered]
        if len(live) < 2:
            return
        cid = self.rng.choice(live)
        ch, c = self.consumers.pop(cid)
        c.target.cancelled = True
        self.leases.forget(c.target)
        self.req += 1
        self.link.send([T.CANCEL, self.req, cid])

    def ack(self) -> None:
        if not self.unacked:
            return
        c, did = self.unacked.pop(self.rng.randrange(len(self.unacked)))
        pid = self.link.acked_unsent(did) if did < 0 else None     # as Broker.settle
        if pid is None:
            self.link.send([T.SETTLE, OUTCOME_ACK, [did]], urgent=True)
        elif pid:                               # the router confirms it: acknowledged
            self.on_node_message([T.PUBLISH_RESULT, pid, 0, 1])
        if c.consumer_id in self.consumers:
            c.granted += 1
            self.link.send([T.CREDIT, c.consumer_id, 1, False], urgent=True)
            if self.leases.waiting:             # as Broker.replenish
                self.leases.retry()

    def flush(self) -> None:
        batch = self.link.flush()
        if batch:
            self.in_flight[b"r1"].append(batch)
        if self.r2_out:
            self.in_flight[b"r2"].append(self.r2_out)
            self.r2_out = []

    def node_turn(self, everything: bool = False) -> None:
        per_peer = []
        for peer, queued in self.in_flight.items():
            n = len(queued) if everything else self.rng.randint(0, len(queued))
            per_peer.append([(peer, b) for b in queued[:n]])
            del queued[:n]
        batches = []                            # each router's in order, the two interleaved
        while any(per_peer):
            batches.append(self.rng.choice([p for p in per_peer if p]).pop(0))
        if batches:
            feed_frames(self.shard, [], self.now, batches)
        for peer, msgs in self.shard.take_outbox().items():
            if peer == b"r1":
                self.back.extend(msgs)
            else:                               # r2 answers the declare's sync, no more
                self.r2_out += [[T.TOPOLOGY_SYNCED, m[1]] for m in msgs
                                if m[0] == T.TOPOLOGY_SYNC]

    def router_reads(self, everything: bool = False) -> None:
        n = len(self.back) if everything else self.rng.randint(0, len(self.back))
        msgs, self.back = self.back[:n], self.back[n:]
        for msg in msgs:
            self.on_node_message(msg)

    def on_node_message(self, msg: list) -> None:
        tag = msg[0]
        if tag == T.DELIVER:
            _, cid, did, redelivered, exchange, rk, header, body = msg
            entry = self.consumers.get(cid)
            if entry is None:                   # cancelled meanwhile: void, as Broker does
                self.link.send([T.SETTLE, OUTCOME_REQUEUE, [did]])
                return
            entry[0].deliver(entry[1], did, redelivered, exchange, rk, header, body)
        elif tag == T.REPLY:
            cid = self.consuming.pop(msg[1], None)
            if msg[2] == 0 and cid in self.consumers:
                c = self.consumers[cid][1]      # CONSUME's answer: credit from now on
                c.target.registered = True
                c.granted = PREFETCH
                self.link.send([T.CREDIT, cid, PREFETCH, False], urgent=True)
        elif tag == T.PUBLISH_RESULT:
            node_id, body = self.pending.pop(msg[1])
            assert body not in self.confirmed, f"{body!r} answered twice"
            self.confirmed[body] = msg[2] == 0
        elif tag == T.TOPOLOGY_SYNC:
            self.link.send([T.TOPOLOGY_SYNCED, msg[1]])
        elif tag == T.LEASE_GRANT:
            self.leases.on_grant(self.link, msg[1], msg[2])
        elif tag == T.LEASE_TAKEN:
            self.leases.on_taken(msg[1], msg[2])
        elif tag == T.LEASE_REVOKE:
            self.leases.on_revoke(self.link, msg[1], msg[2])

    # ---- a whole schedule -------------------------------------------------------------------
    def run(self, steps: int) -> None:
        for _ in range(3):                      # the queue is declared (and synced)
            self.flush()
            self.node_turn(everything=True)
            self.router_reads(everything=True)
        for _ in range(self.rng.randint(1, 3)):
            self.consume()
        choices = ["a", "a", "b", "b", "r2", "flush", "flush", "node", "node", "read", "read",
                   "ack", "ack", "ack", "consume", "cancel", "clock"]
        for _ in range(steps):
            step = self.rng.choice(choices)
            if step in ("a", "b") or (step == "r2" and self.rng.random() < 0.3):
                self.client_publish(step)
            elif step == "flush":
                self.flush_steps += 1
                if self.flush_steps % self.flush_every == 0:
                    self.flush()
            elif step == "node":
                self.node_turn()
            elif step == "read":
                self.router_reads()
            elif step == "ack":
                self.ack()
            elif step == "consume" and len(self.consumers) < 4 and \
                    self.rng.random() < self.churn * 5:
                self.consume()
            elif step == "cancel" and self.rng.random() < self.churn:
                self.cancel()
            elif step == "clock":
                self.tick(self.rng.choice([1.0, 20.0, 120.0]))
        for _ in range(500):                    # drain: everything delivered and acked
            self.flush()
            self.node_turn(everything=True)
            self.router_reads(everything=True)
            while self.unacked:
                self.ack()
            if not (self.link.records or self.link.urgent or self.link.outbox or self.back
                    or any(self.in_flight.values())) and not self.pending and \
                    len(self.seen) >= sum(map(len, self.published.values())):
                break
            self.tick(200.0)

    def check(self) -> None:
        everything = [b for bodies in self.published.values() for b in bodies]
        got = [b for b, _, _ in self.seen]
        assert sorted(got) == sorted(everything), (
            f"lost {sorted(set(everything) - set(got))[:5]}, "
            f"twice {[b for b in set(got) if got.count(b) > 1][:5]}")
        for name, bodies in self.published.items():
            order = {b: i for i, b in enumerate(bodies)}
            for cid in {c for _, _, c in self.seen}:
                firsts = [order[b] for b, redelivered, c in self.seen
                          if c == cid and not redelivered and b in order]
                assert firsts == sorted(firsts), (name, cid)
        assert not self.pending, "a confirm never answered"
        assert set(self.confirmed) == set(self.published["b"])
        assert all(self.confirmed.values())
        queue = self.shard.queues[("/", "q")]
        assert queue.available == 0 and not self.leases.held or self.leases.held
        # What the management API shows: every message published and acknowledged once,
        # and each consumer's credit at the node what the router granted it, none in use.
        assert queue.stats[0] == len(everything) and queue.stats[2] == len(everything)
        for cid, (_, c) in self.consumers.items():
            assert self.shard.peers[b"r1"].consumers[cid].credit == PREFETCH, cid


def _seeds() -> range:
    spec = os.environ.get("LEASE_SEEDS", "0:2000")
    first, count = (int(x) for x in spec.split(":"))
    return range(first, first + count)


@pytest.mark.parametrize("seed", list(_seeds()))
def test_leases_lose_repeat_and_reorder_nothing_under_a_seeded_schedule(seed):
    async def run():
        world = World(seed)
        world.run(400)
        world.check()
        return world.stats["leased"]
    asyncio.run(run())
