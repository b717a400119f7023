"""Delivery leases, the router's side (router/lease.py): which offers it takes, what it holds
while taking one, which publishes it delivers itself, and what it tells the node, in which
order."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from shoal.router.consumers import Consumer, ConsumerTarget, CreditPool
from shoal.router import lease as lease_mod
from shoal.router.lease import STALL_S, WAIT_S, ConfirmPace, Leases
from shoal.shared.wire import T

PLAIN = b"\x00\x3c\x00\x00" + bytes(8) + b"\x00\x00"       # no properties
EXPIRING = b"\x00\x3c\x00\x00" + bytes(8) + b"\x01\x00" + b"\x0560000"


class FakeLink:
    def __init__(self):
        self.node_id = "node-0"
        self.leases = 0
        self.records: list = []
        self.sent: list = []
        self.messages: list = []        # send(): in order with PUBLISH

    def send_record(self, msg, now=False):
        self.records.append((msg[0], msg[1], now))
        self.sent.append(msg)

    def send(self, msg, urgent=False):
        assert not urgent
        self.messages.append(msg)


class FakeChannel:
    def __init__(self):
        self.vhost = "/"
        self.closed = False
        self.pool = CreditPool(prefetch_count=10)
        self.client = SimpleNamespace(owner="r1/c1")
        self.delivered: list = []
        self.lease_pace = None
        self.unconfirmed_count = 0

    def deliver(self, c, did, redelivered, exchange, routing_key, header, body):
        self.delivered.append((did, body))


def setup(queues=("q",), more=0, timers=None):
    """Leases, a link, a channel and its consumer target (consumer 7 on ``queues``); with
    ``more``, that many more consumers of "q" (ids 8...), each on its own channel; with
    ``timers`` (a list), the leases' timers are kept there as (seconds, fn, args)."""
    link = FakeLink()
    ch = FakeChannel()
    t = ConsumerTarget("ctag", 1, "/", False)
    for i, q in enumerate(queues):
        t.consumers.append(Consumer(7 + i, q, "node-0", t, granted=5))
    consumers = {c.consumer_id: (ch, c) for c in t.consumers}
    for i in range(more):
        other = ConsumerTarget(f"ctag{i}", 1, "/", False)
        other.consumers.append(Consumer(8 + i, "q", "node-0", other, granted=5))
        consumers[8 + i] = (FakeChannel(), other.consumers[0])
    published: list = []            # through the node: (seq, body, counted)
    broker = SimpleNamespace(consumers=consumers,
                             links={"node-0": link}, stats={"routed": 0, "delivered": 0,
                                                            "leased": 0},
                             mark_dirty=lambda client: None,
                             delivery_failed=lambda *a: None, published=published)
    leases = Leases(broker, call_later=None if timers is None else
                    lambda seconds, fn, *args: timers.append((seconds, fn, args)))

    def publish(ch, seq, ev, queues, future=None, count=True):     # Broker.publish's part
        if leases.route(ch, seq, ev, queues, future, count) is not None:
            published.append((seq, ev.body, count))
    broker.publish = publish
    ids = iter(range(100, 10**6))
    broker.next_publish_id = lambda: next(ids)
    broker.answers = {}                                 # publish id -> (seq, node id)
    broker.pending_answer = lambda pid, ch, seq, ev, node_id, queue: \
        broker.answers.__setitem__(pid, (seq, node_id))
    return leases, link, ch, t


def take(leases, link, cids):
    """The node's offer, taken (LEASE_TAKE sent), then started (LEASE_TAKEN)."""
    leases.on_grant(link, cids, 1)
    assert link.messages[-1] == [T.LEASE_TAKE, cids, 1]
    leases.on_taken(cids[0], 1)


def publish(body, header=PLAIN):
    return SimpleNamespace(exchange="", routing_key="q", header=header, body=body,
                           mandatory=False)


def test_a_grant_is_taken_and_publishes_are_delivered_then_recorded():
    leases, link, ch, t = setup()
    take(leases, link, [7])
    assert leases.holds(t.consumers[0]) and link.leases == 1 and link.records == []
    assert leases.deliver(ch, publish(b"a"), "q") and leases.deliver(ch, publish(b"b"), "q")
    assert ch.delivered == [(-1, b"a"), (-2, b"b")]
    assert link.records == [(T.LEASED, 7, False), (T.LEASED, 7, False)]
    assert leases._broker.stats["leased"] == 2


def test_publishes_are_held_while_the_lease_is_taken_then_delivered_in_order():
    async def run():
        leases, link, ch, t = setup()
        leases.on_grant(link, [7], 1)
        assert link.messages == [[T.LEASE_TAKE, [7], 1]]
        broker = leases._broker
        broker.publish(ch, 0, publish(b"a"), {"q"})
        broker.publish(ch, 3, publish(b"b"), {"q"})   # with a confirm
        assert ch.delivered == [] and link.sent == [] and broker.published == []
        leases.on_taken(7, 1)
        assert ch.delivered == [(-1, b"a"), (-2, b"b")]
        assert [m[0] for m in link.sent] == [T.LEASED, T.LEASED]
        # the confirmed one's record names its publish id, which the node's answer finishes
        assert len(link.sent[0]) == 8 and link.sent[1][8] == 100
        assert broker.answers == {100: (3, "node-0")}
    asyncio.run(run())


def test_publishes_held_for_a_lease_the_node_refuses_go_through_the_node_in_order():
    leases, link, ch, t = setup()
    leases.on_grant(link, [7], 1)
    broker = leases._broker
    broker.publish(ch, 0, publish(b"a"), {"q"})
    broker.publish(ch, 0, publish(b"b"), {"q"})
    leases.on_revoke(link, 7, 1)                     # the TAKE's answer: refused
    assert link.records == [(T.LEASE_END, 7, True)] and not leases.held
    assert broker.published == [(0, b"a", True), (0, b"b", True)]
    assert ch.delivered == []
    leases.on_taken(7, 1)                            # a late answer for it changes nothing
    assert ch.delivered == []


def test_a_publish_the_lease_cannot_take_ends_the_take_behind_what_was_held():
    leases, link, ch, t = setup()
    leases.on_grant(link, [7], 1)
    broker = leases._broker
    broker.publish(ch, 0, publish(b"a"), {"q"})
    broker.publish(ch, 0, publish(b"b", EXPIRING), {"q"})
    assert broker.published == [(0, b"a", True), (0, b"b", True)]
    assert link.records == [(T.LEASE_END, 7, False)] and not leases.held


def test_a_multi_queue_consumer_or_a_gone_one_declines():
    leases, link, ch, t = setup(queues=("q", "q2"))
    leases.on_grant(link, [7], 1)
    leases.on_grant(link, [99], 1)
    assert link.records == [(T.LEASE_END, 7, True), (T.LEASE_END, 99, True)]


def test_an_expiration_or_another_route_ends_the_lease_first():
    for case in ("expiration", "through the node"):
        leases, link, ch, t = setup()
        take(leases, link, [7])
        if case == "expiration":
            assert not leases.deliver(ch, publish(b"a", EXPIRING), "q")
        else:
            leases.end_for("/", {"q", "other"})
        assert link.records == [(T.LEASE_END, 7, False)], case
        assert not leases.holds(t.consumers[0]) and link.leases == 0 and not leases.held


def test_a_revoke_is_answered_at_once_and_a_cancel_forgets_quietly():
    leases, link, ch, t = setup()
    take(leases, link, [7])
    leases.on_revoke(link, 7, 1)
    leases.on_revoke(link, 7, 1)                     # already returned: nothing more
    assert link.records == [(T.LEASE_END, 7, True)]
    take(leases, link, [7])
    leases.forget(t)
    assert link.records == [(T.LEASE_END, 7, True)] and not leases.held


def test_several_consumers_are_served_in_turn_skipping_those_without_credit_or_room():
    leases, link, ch, t = setup(more=2, timers=[])
    take(leases, link, [7, 8, 9])
    chans = {cid: leases._broker.consumers[cid] for cid in (7, 8, 9)}
    for body in (b"a", b"b", b"c", b"d"):
        assert leases.deliver(ch, publish(body), "q")
    assert [m[1] for m in link.sent] == [7, 8, 9, 7]
    chans[8][1].granted = 0                       # no credit left at the node
    chans[9][0].pool.paused = True                # its socket is backed up
    assert leases.deliver(ch, publish(b"e"), "q")
    assert link.sent[-1][1] == 7
    chans[7][1].granted = 0
    assert leases.deliver(ch, publish(b"f"), "q") is None   # nobody can take it: it waits
    assert leases.waiting and link.sent[-1][1] == 7 and len(link.sent) == 5


def test_a_grant_naming_consumers_of_two_queues_is_declined():
    leases, link, ch, t = setup(queues=("q", "q2"))
    t.consumers[1].target = ConsumerTarget("other", 1, "/", False)
    t.consumers[1].target.consumers.append(t.consumers[1])
    del t.consumers[1]
    leases.on_grant(link, [7, 8], 1)
    assert link.records == [(T.LEASE_END, 7, True)] and not leases.held


def test_a_confirmed_publish_carries_its_id_and_leaves_at_once_once_its_window_is_learned():
    async def run():
        leases, link, ch, t = setup()
        take(leases, link, [7])
        # a publisher that waits for each confirm: its first record waits for company...
        ch.unconfirmed_count = 1
        assert leases.deliver(ch, publish(b"a"), "q", count=False, pid=41)
        assert link.sent[-1][-1] == 41 and link.records[-1][2] is False
        # ...and when the flush comes due it has sent nothing since: its window is 1
        ch.lease_pace.last = time.monotonic() - STALL_S
        leases._check_stalls()
        assert ch.lease_pace.window == 1
        assert leases.deliver(ch, publish(b"b"), "q", count=False, pid=42)
        assert link.records[-1][2] is True        # its confirm is not held back
        assert leases._broker.stats["routed"] == 0    # counted when the node answers
    asyncio.run(run())


def test_confirm_pace_learns_a_window_only_from_a_stall_and_raises_it_when_passed():
    pace = ConfirmPace()
    assert not pace.now(25)                       # nothing learned: records may wait
    pace.check(25, pace.last + STALL_S / 2)       # still publishing: no window
    assert pace.window > 1000
    # silent with 25 outstanding, past STALL_S (at exactly STALL_S, "now - last" read from
    # the machine's monotonic clock rounds below it for some readings: a flaky test)
    pace.check(25, pace.last + 2 * STALL_S)
    assert pace.window == 25
    # from half the window on, records leave at once: one half's confirms come back while
    # the publisher sends the other
    assert not pace.now(12) and pace.now(13) and pace.now(25)
    assert pace.now(30) and pace.window == 30     # it went past: not its window
    assert not pace.now(14) and pace.now(15)


def test_a_publish_to_several_queues_is_held_for_a_lease_being_taken_and_counted_once():
    leases, link, ch, t = setup()
    leases.on_grant(link, [7], 1)
    assert leases.deliver_each(ch, publish(b"fan"), ["q", "other"]) == ["other"]
    leases.on_taken(7, 1)
    assert ch.delivered == [(-1, b"fan")]
    assert leases._broker.stats["routed"] == 0    # the caller counted the publish


def test_answers_naming_another_offer_are_ignored():
    leases, link, ch, t = setup()
    leases.on_grant(link, [7], 5)
    leases.on_taken(7, 4)                         # an older offer's: still taking
    leases.on_revoke(link, 7, 4)
    assert leases.held and leases.held[("/", "q")].held == []
    leases.on_taken(7, 5)
    assert leases.held[("/", "q")].held is None   # started
    leases.on_revoke(link, 7, 5)
    assert link.sent[-1] == [T.LEASE_END, 7, 5] and not leases.held


def test_a_publish_no_consumer_can_take_waits_for_credit_then_the_lease_goes_on_in_order():
    timers: list = []
    leases, link, ch, t = setup(timers=timers)
    take(leases, link, [7])
    broker, c = leases._broker, t.consumers[0]
    c.granted = 0                                   # the client's prefetch is full
    broker.publish(ch, 0, publish(b"a"), {"q"})
    broker.publish(ch, 3, publish(b"b"), {"q"})     # with a confirm
    assert ch.delivered == [] and broker.published == [] and link.sent == []
    assert list(leases.waiting) == [("/", "q")] and [x[0] for x in timers] == [WAIT_S]
    leases.retry()                                  # credit still none: they go on waiting
    assert ch.delivered == [] and leases.waiting
    c.granted = 5                                   # acks brought credit (Broker.replenish)
    leases.retry()
    assert ch.delivered == [(-1, b"a"), (-2, b"b")] and broker.published == []
    assert [m[0] for m in link.sent] == [T.LEASED, T.LEASED] and broker.answers == {
        100: (3, "node-0")}
    assert leases.holds(c) and not leases.waiting
    _, fn, args = timers[0]
    fn(*args)                                       # that wait's timer: over, changes nothing
    assert leases.holds(c) and T.LEASE_END not in [m[0] for m in link.sent]


def test_a_wait_past_wait_s_returns_the_lease_soon_and_sends_what_waited_through_the_node():
    timers: list = []
    leases, link, ch, t = setup(timers=timers)
    take(leases, link, [7])
    broker = leases._broker
    t.consumers[0].granted = 0
    broker.publish(ch, 3, publish(b"a"), {"q"})
    broker.publish(ch, 0, publish(b"b"), {"q"})
    _, fn, args = timers.pop()
    fn(*args)
    assert link.sent == [[T.LEASE_END, 7, 1, True]]  # soon: lent again once it is empty
    assert broker.published == [(3, b"a", True), (0, b"b", True)] and ch.delivered == []
    assert not leases.held and not leases.waiting
    broker.publish(ch, 0, publish(b"c"), {"q"})      # behind them
    assert broker.published[-1] == (0, b"c", True)


def test_a_wait_ends_at_wait_max_publishes(monkeypatch):
    monkeypatch.setattr(lease_mod, "WAIT_MAX", 3)
    leases, link, ch, t = setup(timers=[])
    take(leases, link, [7])
    broker = leases._broker
    t.consumers[0].granted = 0
    for body in (b"a", b"b", b"c"):
        broker.publish(ch, 0, publish(body), {"q"})
    assert link.sent == [[T.LEASE_END, 7, 1, True]] and not leases.held
    assert [p[1] for p in broker.published] == [b"a", b"b", b"c"]


def test_a_later_wait_outlives_an_earlier_waits_timer_and_a_cancel_sends_what_waited():
    timers: list = []
    leases, link, ch, t = setup(timers=timers)
    take(leases, link, [7])
    broker, c = leases._broker, t.consumers[0]
    c.granted = 0
    broker.publish(ch, 0, publish(b"a"), {"q"})
    c.granted = 1
    leases.retry()                                   # a delivered
    c.granted = 0                                    # (Channel.deliver spends the credit)
    broker.publish(ch, 0, publish(b"b"), {"q"})      # waits again: a second wait
    assert ch.delivered == [(-1, b"a")] and len(timers) == 2
    _, fn, args = timers[0]
    fn(*args)                                        # the first wait's timer
    assert leases.waiting and leases.holds(c)
    leases.forget(t)                                 # the consumer is cancelled
    assert broker.published == [(0, b"b", True)] and not leases.held and not leases.waiting
