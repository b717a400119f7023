"""Property test of the ConsumerTarget credit logic (router/consumers.py), sans-IO.

A tiny model node honours CREDIT (standing and drain), WORK and CREDIT_DRAINED as the wire
contract says; links are FIFO queues whose deliveries interleave at random with arrivals and
acks. Whatever happens, the router never holds more unacked deliveries than the per-consumer
``prefetch_count`` or the channel's ``global`` prefetch, and no message is stranded while a
consumer could take it.
"""
from collections import deque

from hypothesis import given, settings, strategies as st

from shoal.router import consumers as credit
from shoal.router.consumers import ConsumerTarget, CreditPool
from shoal.shared.wire import T


class ModelNode:
    def __init__(self):
        self.queues = {}        # queue -> count of available messages
        self.credit = {}        # consumer_id -> credit
        self.wants_work = {}
        self.queue_of = {}
        self.inbox = deque()    # router -> node
        self.outbox = deque()   # node -> router

    def step(self):
        msg = self.inbox.popleft()
        _, cid, amount, drain = msg
        self.credit[cid] = self.credit.get(cid, 0) + amount
        if amount == 0 and not drain:
            self.wants_work[cid] = True
        self.pull(cid)
        if drain:
            self.outbox.append([T.CREDIT_DRAINED, cid, self.credit[cid]])
            self.credit[cid] = 0
        self.notify(self.queue_of[cid])

    def pull(self, cid):
        q = self.queue_of[cid]
        while self.credit.get(cid, 0) > 0 and self.queues[q] > 0:
            self.queues[q] -= 1
            self.credit[cid] -= 1
            self.outbox.append([T.DELIVER, cid])

    def notify(self, q):
        for cid, qq in self.queue_of.items():
            if qq != q:
                continue
            self.pull(cid)
            if self.queues[q] > 0 and self.credit.get(cid, 0) == 0 and self.wants_work.get(cid):
                self.wants_work[cid] = False
                self.outbox.append([T.WORK, cid])


@settings(max_examples=300, deadline=None)
@given(prefetch=st.integers(0, 5), global_prefetch=st.integers(0, 6),
       n_consumers=st.integers(1, 3),
       ops=st.lists(st.tuples(st.sampled_from(["arrive", "node", "router", "ack"]),
                              st.integers(0, 2)), max_size=200))
def test_unacked_never_exceeds_prefetch(prefetch, global_prefetch, n_consumers, ops):
    pool = CreditPool(prefetch_count=prefetch, global_prefetch=global_prefetch)
    node = ModelNode()
    cons = {}
    unacked = []  # consumer ids of unacked deliveries
    for i in range(n_consumers):
        c = ConsumerTarget(i + 1, f"t{i}", 1, "/", f"q{i}", "node-0", False)
        pool.consumers[c.tag] = c
        cons[c.consumer_id] = c
        node.queues[c.queue] = 0
        node.queue_of[c.consumer_id] = c.queue
    def grant_all():
        for c in cons.values():
            node.inbox.extend(credit.credit_messages(pool, c))
    grant_all()
    delivered = 0
    published = 0

    def router_step():
        nonlocal delivered
        msg = node.outbox.popleft()
        c = cons[msg[1]]
        if msg[0] == T.DELIVER:
            credit.on_delivered(pool, c)
            unacked.append(c.consumer_id)
            delivered += 1
        elif msg[0] == T.WORK:
            credit.on_work(c)
        elif msg[0] == T.CREDIT_DRAINED:
            credit.on_drained(c, msg[2])
        grant_all()

    for op, arg in ops:
        if op == "arrive":
            q = f"q{arg % n_consumers}"
            node.queues[q] += 1
            published += 1
            node.notify(q)
        elif op == "node" and node.inbox:
            node.step()
        elif op == "router" and node.outbox:
            router_step()
        elif op == "ack" and unacked:
            c = cons[unacked.pop(arg % len(unacked))]
            credit.on_settled(pool, c)
            grant_all()
        for c in cons.values():
            if prefetch:
                assert c.unacked <= prefetch
                assert c.unacked + c.granted <= prefetch
        if global_prefetch:
            assert len(unacked) <= global_prefetch
            assert pool.unacked + pool.granted <= global_prefetch
        assert pool.unacked == len(unacked)

    # Quiesce: ack everything and let links drain; every message must then be delivered.
    for _ in range(10_000):
        if node.inbox:
            node.step()
        elif node.outbox:
            router_step()
        elif unacked:
            credit.on_settled(pool, cons[unacked.pop()])
            grant_all()
        else:
            break
    assert delivered == published, "a message was stranded although consumers had room"
