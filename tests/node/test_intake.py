"""The node's intake (node/intake.py): what a turn's batches are handed to the shard in.
Settlements and credit go ahead of publishes, and of nothing else: a SETTLE sent behind a
CANCEL stays behind it."""
from __future__ import annotations

from node_helpers import Net

from shoal.node.intake import feed_frames
from shoal.shared.wire import OUTCOME_ACK, OUTCOME_REQUEUE, T


class Recorder:
    """A stand-in shard: records (peer, tag, first field) of each message it is handed."""

    def __init__(self) -> None:
        self.seen: list[tuple[bytes, T, object]] = []

    def handle(self, peer: bytes, msg: list, now_ms: float) -> None:
        self.seen.append((peer, T(msg[0]), msg[1]))


def test_settlements_and_credit_jump_over_publishes_only():
    shard = Recorder()
    n = feed_frames(shard, [], 0, batches=[
        (b"peer:node-1", [[T.HEARTBEAT, "raft"]]),
        (b"r1", [[T.PUBLISH, "p1"], [T.SETTLE, "s1"], [T.CANCEL, "c1"], [T.SETTLE, "s2"],
                 [T.CREDIT, "k1"]]),
        (b"r2", [[T.PUBLISH, "p2"], [T.CREDIT, "k2"]]),
        (b"r1", [[T.SETTLE, "s3"]]),
    ])
    assert n == 9
    assert [m[2] for m in shard.seen] == [
        "s1", "k2",                 # ahead of the publishes before them
        "raft",                     # the other nodes' batches lead the rest
        "p1", "c1", "s2", "k1",     # r1 from its CANCEL on: in order
        "p2", "s3"]


def test_one_batch_is_handled_in_its_order():
    shard = Recorder()
    feed_frames(shard, [], 0, batches=[
        (b"r1", [[T.PUBLISH, "p1"], [T.SETTLE, "s1"], [T.CREDIT, "k1"]])])
    assert [m[2] for m in shard.seen] == ["p1", "s1", "k1"]


def test_a_requeue_behind_a_cancel_in_another_batch_is_not_delivered_again():
    """A link detached with unsettled deliveries: the router sends the consumer's CANCEL, then
    a SETTLE that requeues them (router/broker.py ``settle``). Read in one turn, as two
    batches, the requeue must not run first: the consumer, still there with credit, would
    get the messages again, and a count right after the detach would miss them (a quorum
    queue read 44 of 50 in RabbitMQ's AMQP 1.0 client's test)."""
    net = Net()
    r = net.router()
    r.declare("q")
    cid = r.consume("q")
    for i in range(3):
        r.publish("q", b"m%d" % i)
    ids = [m[2] for m in r.credit(cid, 10) if m[0] == T.DELIVER]
    assert len(ids) == 3
    feed_frames(net.shard, [], net.now, batches=[
        (r.identity, [[T.CANCEL, 99, cid]]),
        (r.identity, [[T.SETTLE, OUTCOME_REQUEUE, ids]]),
    ])
    net.pump()
    assert [m[0] for m in r.take()] == [T.REPLY]          # the cancel's answer, no DELIVER
    assert r.declare("q", passive=True)[4] == ["q", 3, 0]


def test_an_ack_read_with_a_flood_of_publishes_is_handled_first():
    """What the jump is for: a consumer's ack is not stuck behind the publishes read with
    it, so its credit comes back before they are queued."""
    shard = Recorder()
    flood = [[T.PUBLISH, f"p{i}"] for i in range(100)]
    feed_frames(shard, [], 0, batches=[(b"r1", flood), (b"r2", [[T.SETTLE, OUTCOME_ACK]])])
    assert shard.seen[0] == (b"r2", T.SETTLE, OUTCOME_ACK)
