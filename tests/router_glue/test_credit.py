"""Property tests of the ConsumerTarget credit logic (router/consumers.py), sans-IO.

Model nodes honour CREDIT (standing and drain), WORK and CREDIT_DRAINED as the wire contract
says (shared/wire.py); each node's link is a FIFO whose messages interleave at random with
arrivals on random shards, acks, and qos increases. Whatever happens:

* a consumer tag never holds more unacked deliveries than ``prefetch_count``, and a channel
  never more than its ``global`` prefetch (counting credit the nodes may still use);
* no message is delivered twice, none is lost, and none is stranded while a consumer could
  take it (after quiescing, everything published was delivered).
"""
from collections import deque

from hypothesis import given, settings, strategies as st

from shoal.router import consumers as credit
from shoal.router.consumers import Consumer, ConsumerTarget, CreditPool
from shoal.shared.wire import T


class ModelNode:
    """A node as the wire contract describes it, for the credit messages only."""

    def __init__(self, name):
        self.name = name
        self.queues = {}        # queue -> deque of message ids
        self.credit = {}        # consumer_id -> credit
        self.wants_work = {}
        self.queue_of = {}      # consumer_id -> queue
        self.inbox = deque()    # router -> node
        self.outbox = deque()   # node -> router

    def step(self):
        _, cid, amount, drain = self.inbox.popleft()
        self.credit[cid] = self.credit.get(cid, 0) + amount
        if amount == 0 and not drain:
            self.wants_work[cid] = True
        self.pull(cid)
        if drain:
            self.outbox.append([T.CREDIT_DRAINED, cid, self.credit[cid]])
            self.credit[cid] = 0
        self.notify(self.queue_of[cid])

    def pull(self, cid):
        q = self.queues[self.queue_of[cid]]
        while self.credit.get(cid, 0) > 0 and q:
            self.credit[cid] -= 1
            self.outbox.append([T.DELIVER, cid, q.popleft()])

    def notify(self, queue):
        for cid, q in self.queue_of.items():
            if q == queue:
                self.pull(cid)
        for cid, q in self.queue_of.items():
            if (q == queue and self.queues[q] and self.credit.get(cid, 0) == 0
                    and self.wants_work.get(cid)):
                self.wants_work[cid] = False
                self.outbox.append([T.WORK, cid])


@settings(max_examples=300, deadline=None)
@given(prefetch=st.integers(0, 5), global_prefetch=st.integers(0, 7),
       layout=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=3, unique=True),
                       min_size=1, max_size=3),
       ops=st.lists(st.tuples(st.sampled_from(["arrive", "node", "router", "ack", "qos"]),
                              st.integers(0, 8)), max_size=250),
       no_ack=st.lists(st.booleans(), min_size=3, max_size=3))
def test_credit_is_exact_across_shards(prefetch, global_prefetch, layout, ops, no_ack):
    """``layout``: one list per consumer tag of the shards its queues live on (one queue per
    (tag, shard) pair): single-queue and x-multiqueue consumers on one channel. ``no_ack``:
    which tags need no acks (their grants count against a global limit, their deliveries
    do not; no prefetch_count applies to them)."""
    pool = CreditPool(prefetch_count=prefetch, global_prefetch=global_prefetch)
    nodes = [ModelNode(f"node-{i}") for i in range(3)]
    parts: dict[int, Consumer] = {}
    queues = []
    for ti, shards in enumerate(layout):
        t = ConsumerTarget(f"tag{ti}", 1, "/", no_ack[ti])
        for shard in shards:
            q = f"t{ti}-q{shard}"
            c = Consumer(len(parts) + 1, q, nodes[shard].name, t)
            t.consumers.append(c)
            parts[c.consumer_id] = c
            nodes[shard].queues[q] = deque()
            nodes[shard].queue_of[c.consumer_id] = q
            queues.append((shard, q))
        pool.targets[t.tag] = t
    node_of = {n.name: n for n in nodes}
    unacked = []     # (queue consumer, message id)
    seen = set()
    published = 0
    limits = {"prefetch": prefetch, "global": global_prefetch}

    def grant_all():
        for t in pool.targets.values():
            for c, msg in credit.credit_messages(pool, t):
                node_of[c.node_id].inbox.append(msg)

    def router_step(node):
        msg = node.outbox.popleft()
        c = parts[msg[1]]
        if msg[0] == T.DELIVER:
            assert msg[2] not in seen, "delivered twice"
            seen.add(msg[2])
            credit.on_delivered(pool, c)
            if not c.target.no_ack:
                unacked.append((c, msg[2]))
        elif msg[0] == T.WORK:
            credit.on_work(c)
        elif msg[0] == T.CREDIT_DRAINED:
            credit.on_drained(c, msg[2])
        grant_all()

    def check():
        for t in pool.targets.values():
            if limits["prefetch"] and not t.no_ack:
                assert t.unacked + t.granted <= limits["prefetch"]
        if limits["global"]:
            assert pool.unacked + pool.granted <= limits["global"]
        assert pool.unacked == len(unacked)

    grant_all()
    for op, arg in ops:
        if op == "arrive":
            shard, q = queues[arg % len(queues)]
            nodes[shard].queues[q].append(published)
            published += 1
            nodes[shard].notify(q)
        elif op == "node":
            node = nodes[arg % 3]
            if node.inbox:
                node.step()
        elif op == "router":
            node = nodes[arg % 3]
            if node.outbox:
                router_step(node)
        elif op == "ack" and unacked:
            c, _ = unacked.pop(arg % len(unacked))
            credit.on_settled(pool, c)
            grant_all()
        elif op == "qos" and arg % 2:
            # Raising a limit (or lifting it) never breaks the invariant retroactively.
            key = "prefetch" if arg % 4 == 1 else "global"
            if limits[key]:
                limits[key] += 1
                pool.prefetch_count, pool.global_prefetch = limits["prefetch"], limits["global"]
                grant_all()
        check()

    for _ in range(20_000):  # quiesce: ack everything, let every link drain
        busy = [n for n in nodes if n.inbox or n.outbox]
        if busy:
            n = busy[0]
            n.step() if n.inbox else router_step(n)
        elif unacked:
            credit.on_settled(pool, unacked.pop()[0])
            grant_all()
        else:
            break
        check()
    assert len(seen) == published, "a message was stranded although consumers had room"


def test_multiqueue_pull_takes_from_every_queue_with_work():
    """DG5: with work on several queues and room for one at a time, grants rotate."""
    pool = CreditPool(prefetch_count=1)
    t = ConsumerTarget("t", 1, "/", False)
    t.consumers = [Consumer(i, f"q{i}", f"node-{i}", t) for i in range(3)]
    pool.targets["t"] = t
    credit.credit_messages(pool, t)           # registers interest everywhere
    for c in t.consumers:
        credit.on_work(c)
    granted_to = []
    for _ in range(6):
        grants = credit.credit_messages(pool, t)
        assert len(grants) == 1 and grants[0][1][2] == 1 and grants[0][1][3] is True
        c = grants[0][0]
        granted_to.append(c.queue)
        credit.on_delivered(pool, c)          # the node used it ...
        credit.on_drained(c, 0)               # ... and may have more
        credit.on_settled(pool, c)            # the client acked
    assert set(granted_to) == {"q0", "q1", "q2"}


def test_no_credit_before_every_node_answered_consume():
    """A consumer whose CONSUME is still in flight gets no CREDIT, not even the interest
    registration: the link sends CREDIT ahead of queued requests, so it could reach the node
    before the CONSUME, be dropped there as unknown and leave the consumer stalled (seen as a
    global-qos consumer that stopped at 40 of 60 messages)."""
    pool = CreditPool(global_prefetch=4)
    t = ConsumerTarget("t", 1, "/", False, registered=False)
    t.consumers = [Consumer(1, "q", "node-0", t)]
    pool.targets["t"] = t
    assert credit.credit_messages(pool, t) == []
    assert not t.consumers[0].interest_sent
    t.registered = True                       # every CONSUME answered (channel.py)
    assert [m for _, m in credit.credit_messages(pool, t)] == [[T.CREDIT, 1, 0, False]]


def test_a_fast_queue_gets_no_more_than_its_share_while_the_others_have_work():
    """DG5 when one node answers much faster than the others (node-0 inside the router): once
    several queues have work, the slots the client frees go to the others' queues first, and
    the fast one holds at most ceil(prefetch / 3) again."""
    pool = CreditPool(prefetch_count=6)
    t = ConsumerTarget("t", 1, "/", False)
    a, b, c = t.consumers = [Consumer(i, f"q{i}", f"node-{i}", t) for i in range(3)]
    pool.targets["t"] = t
    credit.credit_messages(pool, t)           # registers interest everywhere
    credit.on_work(a)                         # the fast node answers first ...
    assert [(g[0], g[1][2]) for g in credit.credit_messages(pool, t)] == [(a, 6)]
    for _ in range(6):
        credit.on_delivered(pool, a)
    credit.on_drained(a, 0)                   # ... uses all of it, and may have more
    credit.on_work(b)                         # the other nodes answer later
    credit.on_work(c)
    granted = []
    for _ in range(6):                        # the client acks a's deliveries one by one
        credit.on_settled(pool, a)
        granted += [g[0].queue for g in credit.credit_messages(pool, t)]
        assert t.unacked + t.granted <= 6
    assert granted[:2] in (["q1", "q2"], ["q2", "q1"])
    assert a.granted + a.unacked <= 2


def test_queues_with_messages_at_consume_are_pulled_from_at_once_and_together():
    """DG5 from the first delivery: the nodes' CONSUME answers (available messages; None from
    an older node) start the pull on every queue that has some, spread over them, and the
    others register interest as before."""
    pool = CreditPool(prefetch_count=6)
    t = ConsumerTarget("t", 1, "/", False, registered=False)
    t.consumers = [Consumer(i, f"q{i}", f"node-{i}", t) for i in range(4)]
    pool.targets["t"] = t
    credit.on_registered(t, [5, 0, 12, None])
    assert t.registered
    grants = {c.queue: m for c, m in credit.credit_messages(pool, t)}
    assert grants["q1"] == [T.CREDIT, 1, 0, False] and grants["q3"] == [T.CREDIT, 3, 0, False]
    assert grants["q0"] == [T.CREDIT, 0, 3, True] and grants["q2"] == [T.CREDIT, 2, 3, True]


def test_a_fast_queue_gets_one_grant_ahead_of_a_slow_ones_outstanding_drain_not_more():
    """DG5 in turns: node-0 inside the router answers each drain at once, the node processes
    late (a busy machine). However fast the client acks node-0's deliveries, node-0 gets one
    grant more while the others' drains are out, then waits for them, instead of lapping
    them (CI once saw 26, 2 and 2 of the first 30 deliveries); once they answer, every queue
    with work is granted again."""
    pool = CreditPool(prefetch_count=5)
    t = ConsumerTarget("t", 1, "/", False, registered=False)
    a, b, c = t.consumers = [Consumer(i, f"q{i}", f"node-{i}", t) for i in range(3)]
    pool.targets["t"] = t
    credit.on_registered(t, [50, 50, 50])
    first = credit.credit_messages(pool, t)
    assert sorted(g[0].queue for g in first) == ["q0", "q1", "q2"]

    def fast_round() -> list:
        """node-0 delivers what it was granted and drains; the client acks it all."""
        n = a.granted
        for _ in range(n):
            credit.on_delivered(pool, a)
        credit.on_drained(a, 0)
        grants = credit.credit_messages(pool, t)
        for _ in range(n):
            credit.on_settled(pool, a)
            grants += credit.credit_messages(pool, t)
        return grants

    extra = [g[0].queue for _ in range(10) for g in fast_round()]
    assert extra == ["q0"]                   # one grant ahead, then node-0 waits
    assert b.draining and c.draining
    for slow in (b, c):                      # the node processes answer at last
        for _ in range(slow.granted):
            credit.on_delivered(pool, slow)
        credit.on_drained(slow, 0)
    again = credit.credit_messages(pool, t)
    assert {g[0].queue for g in again} >= {"q1", "q2"}
    assert t.unacked + t.granted <= 5


def test_a_global_limit_set_after_consume_takes_back_the_standing_credit():
    """``basic.qos global`` after ``basic.consume`` (the RabbitMQ Java client's
    QosTests.setLimitAfterConsume): the credit granted without a limit is drained back, and
    from then on the channel's consumers hold at most the limit; parity scenario
    ``global_qos_after_consume`` checks the same against RabbitMQ."""
    pool = CreditPool()
    node = ModelNode("node-0")
    t = ConsumerTarget("tag", 1, "/", False)
    c = Consumer(1, "q", "node-0", t)
    t.consumers.append(c)
    pool.targets[t.tag] = t
    node.queues["q"] = deque()
    node.queue_of[1] = "q"
    unacked = []

    def grant():
        node.inbox.extend(msg for _, msg in credit.credit_messages(pool, t))

    def settle_links():
        while node.inbox or node.outbox:
            if node.inbox:
                node.step()
                continue
            msg = node.outbox.popleft()
            if msg[0] == T.DELIVER:
                credit.on_delivered(pool, c)
                unacked.append(msg[2])
            elif msg[0] == T.WORK:
                credit.on_work(c)
            elif msg[0] == T.CREDIT_DRAINED:
                credit.on_drained(c, msg[2])
            grant()

    grant()
    settle_links()
    assert c.granted == credit.CHUNK           # standing credit, no limit
    pool.global_prefetch = 1
    asked = credit.credit_messages(pool, t)
    assert [m for _, m in asked if m[3]] == [[T.CREDIT, 1, 0, True]]   # asked back
    node.inbox.extend(m for _, m in asked)
    settle_links()
    assert c.granted + pool.unacked <= 1
    node.queues["q"].extend([10, 11, 12])
    node.notify("q")
    settle_links()
    assert unacked == [10]
    credit.on_settled(pool, c)
    unacked.clear()
    grant()
    settle_links()
    assert unacked == [11]
    assert c.granted + pool.unacked <= 1


def test_under_a_global_limit_the_channels_tags_take_turns():
    pool = CreditPool()
    for tag in ("a", "b", "c"):
        pool.targets[tag] = ConsumerTarget(tag, 1, "/", False)
    assert [t.tag for t in credit.in_turn(pool)] == ["a", "b", "c"]     # no global limit
    assert [t.tag for t in credit.in_turn(pool)] == ["a", "b", "c"]
    pool.global_prefetch = 1
    firsts = [credit.in_turn(pool)[0].tag for _ in range(4)]
    assert firsts == ["a", "b", "c", "a"]


def test_a_no_ack_consumer_under_a_global_limit_waits_while_it_is_reached():
    """RabbitMQ's limiter (the Java client's QosTests.noAckObeysLimit; parity scenario
    ``global_qos_with_a_no_ack_consumer``): a no_ack consumer has a delivery only while the
    channel's global limit is not reached, its deliveries do not count toward it, and the
    consumer that acks beside it is not starved by its credit."""
    pool = CreditPool(global_prefetch=1)
    node = ModelNode("node-0")
    acking = ConsumerTarget("acking", 1, "/", False)
    free = ConsumerTarget("free", 1, "/", True)
    for cid, (t, q) in enumerate(((acking, "q1"), (free, "q2")), 1):
        t.consumers.append(Consumer(cid, q, "node-0", t))
        pool.targets[t.tag] = t
        node.queues[q] = deque()
        node.queue_of[cid] = q
    parts = {1: acking.consumers[0], 2: free.consumers[0]}
    got: dict[str, list] = {"acking": [], "free": []}

    def settle_links():
        for t in credit.in_turn(pool):
            node.inbox.extend(m for _, m in credit.credit_messages(pool, t))
        while node.inbox or node.outbox:
            if node.inbox:
                node.step()
                continue
            msg = node.outbox.popleft()
            c = parts[msg[1]]
            if msg[0] == T.DELIVER:
                credit.on_delivered(pool, c)
                got[c.target.tag].append(msg[2])
            elif msg[0] == T.WORK:
                credit.on_work(c)
            elif msg[0] == T.CREDIT_DRAINED:
                credit.on_drained(c, msg[2])
            for t in credit.in_turn(pool):
                node.inbox.extend(m for _, m in credit.credit_messages(pool, t))
            assert pool.unacked + pool.granted <= 1

    def arrive(q, m):
        node.queues[q].append(m)
        node.notify(q)
        settle_links()

    settle_links()
    arrive("q1", "a1")
    assert got == {"acking": ["a1"], "free": []}
    arrive("q2", "n1")
    assert got["free"] == []                    # the limit is reached: the no_ack one waits
    credit.on_settled(pool, acking.consumers[0])
    settle_links()
    arrive("q2", "n2")
    assert got["free"] == ["n1", "n2"]          # and does not count toward it
    arrive("q1", "a2")
    assert got["acking"] == ["a1", "a2"]        # not starved by the no_ack one's credit
    arrive("q2", "n3")
    assert got["free"] == ["n1", "n2"]
    credit.on_settled(pool, acking.consumers[0])
    settle_links()
    assert got["free"] == ["n1", "n2", "n3"]
