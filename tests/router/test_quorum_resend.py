"""A publish sent again (router/quorum.py), sans-IO: after the leader's node is lost, a
confirmed publish to a stream waits for the next leader and goes there under a new publish
id, carrying its first one, which names it in the stream's chunks (docs/streams.md, "A
publish sent again": the new leader does not store it twice)."""
from __future__ import annotations

from types import SimpleNamespace

from shoal.router import quorum
from shoal.router.session import PendingPublish
from shoal.shared.wire import TAG_PUBLISH

VHOST, STREAM = "/", "s-1"


class Link:
    def __init__(self, node_id: str, up: bool) -> None:
        self.node_id, self.up = node_id, up
        self.sent: list[list] = []

    def send(self, msg: list) -> None:
        self.sent.append(msg)


class Broker:
    """What router/quorum.py reads and calls of the router's broker for a publish."""

    def __init__(self) -> None:
        self.quorum = quorum.QuorumLeaders()
        self.links = {"node-0": Link("node-0", up=True), "node-1": Link("node-1", up=True)}
        self.publishes: dict[int, PendingPublish] = {}
        self.consumers: dict = {}
        self.finished: list[PendingPublish] = []
        self._next = 40

    def set_queue_node(self, vhost: str, name: str, node: str) -> None:
        pass

    def next_publish_id(self) -> int:
        self._next += 1
        return self._next

    def finish_pending(self, p: PendingPublish) -> None:
        self.finished.append(p)


def test_a_publish_to_a_stream_goes_to_the_next_leader_with_its_first_id():
    b = Broker()
    quorum.on_leader(b, [VHOST, STREAM, "node-0", 1, ["node-0", "node-1"], [], "stream"])
    channel = SimpleNamespace(vhost=VHOST, closed=False, client=SimpleNamespace(owner="c/1"))
    ev = SimpleNamespace(exchange="", routing_key=STREAM, header=b"h", body=b"body")
    p = PendingPublish(channel, 1, ev, {"node-0"})
    p.pid, p.sent = 7, {"node-0": [STREAM]}
    b.publishes[7] = p
    # its leader's node is lost before the answer: the publish waits for a leader
    b.links["node-0"].up = False
    assert quorum.node_down(b, "node-0") == {7}
    assert p.waiting == {("parked", STREAM)} and not b.links["node-1"].sent
    quorum.on_leader(b, [VHOST, STREAM, "node-1", 2, ["node-0", "node-1"], [], "stream"])
    (msg,) = b.links["node-1"].sent
    assert msg[0] == TAG_PUBLISH and msg[1] < 0             # a new id: sent again
    assert msg[2:] == [VHOST, [STREAM], "", STREAM, b"h", b"body", "c/1", 7]
    assert b.publishes[msg[1]] is p and p.waiting == {msg[1]}
