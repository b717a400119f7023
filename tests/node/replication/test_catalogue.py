"""What nodes know of each other's topology (node/replication/catalogue.py), sans-IO: events
keep a peer's copy current, a gap or a restart makes it ask for the whole, and the copy
survives in its file."""
from __future__ import annotations

from shoal.shared.wire import (EV_BINDING_ADDED, EV_EXCHANGE_ADDED, EV_EXCHANGE_REMOVED,
                               EV_QUEUE_ADDED, EV_QUEUE_REMOVED)

from shoal.node.replication.catalogue import Catalogue, load, save

EX = ["/", "x", "direct", True, False, False, {}]
BIND = ["/", "x", "q", "q1", "k", {}]


class Pair:
    """Node a's catalogue as node b keeps it; messages between them are delivered by hand."""

    def __init__(self, incarnation: str = "a1") -> None:
        self.wire: list[tuple[str, list]] = []
        self.own = [[], [], []]
        self.b = Catalogue("b", "b1", lambda: [[], [], []], self._send("b"), lambda: ["a"])
        self.start_a(incarnation)

    def start_a(self, incarnation: str) -> None:
        self.a = Catalogue("a", incarnation, lambda: self.own, self._send("a"), lambda: ["b"])

    def _send(self, frm: str):
        return lambda to, msg: self.wire.append((to, msg))

    def deliver(self, drop: bool = False) -> None:
        while self.wire:
            to, msg = self.wire.pop(0)
            if not drop:
                (self.a if to == "a" else self.b).on_peer(msg, 10_000)

    def hello(self) -> None:                     # a's PEER_HELLO reaches b
        self.b.heard("a", self.a.seq, 10_000)
        self.deliver()

    def b_knows(self) -> list:
        return [r for r in self.b.rows() if r[0] == "a"]


def test_a_peer_copy_follows_events_and_asks_for_the_whole_after_a_gap():
    p = Pair()
    p.hello()                                   # b knows nothing: it asks, a sends it all
    assert p.b_knows() == [["a", [], [], []]]
    p.a.own_event(EV_EXCHANGE_ADDED, EX)
    p.a.own_event(EV_QUEUE_ADDED, ["/", "q1", 1])
    p.deliver()
    assert p.b_knows() == [["a", [EX], [], [["/", "q1", 1]]]]
    p.a.own_event(EV_BINDING_ADDED, BIND)
    p.deliver(drop=True)                        # lost on the way
    p.own = [[EX], [BIND], [["/", "q1", 1], ["/", "q2", 0]]]
    p.a.own_event(EV_QUEUE_ADDED, ["/", "q2", 0])
    p.deliver()                                 # a gap: b asks for the whole
    assert p.b_knows() == [["a", [EX], [BIND], [["/", "q1", 1], ["/", "q2", 0]]]]
    p.a.own_event(EV_EXCHANGE_REMOVED, ["/", "x"])   # its bindings go with it
    p.a.own_event(EV_QUEUE_REMOVED, ["/", "q2"])
    p.deliver()
    assert p.b_knows() == [["a", [], [], [["/", "q1", 1]]]]


def test_a_restarted_peer_is_asked_again_and_the_copy_survives_in_its_file(tmp_path):
    p = Pair()
    p.own = [[], [], [["/", "q1", 1]]]
    p.hello()
    assert p.b_knows()[0][3] == [["/", "q1", 1]]
    save(tmp_path / "catalogue", p.b.dump())
    assert not p.b.dirty
    again = Catalogue("b", "b2", lambda: [[], [], []], lambda to, m: None, lambda: [])
    load(again, tmp_path / "catalogue")         # b restarted while a is down: still known
    assert [r for r in again.rows() if r[0] == "a"] == p.b_knows()
    p.own = [[], [], []]
    p.start_a("a2")                             # a restarted, its queue gone
    p.hello()
    assert p.b_knows() == [["a", [], [], []]]


def test_a_damaged_file_is_ignored(tmp_path):
    (tmp_path / "catalogue").write_bytes(b"\xc1 not msgpack")
    c = Catalogue("b", "b1", lambda: [[], [], []], lambda to, m: None, lambda: [])
    load(c, tmp_path / "catalogue")
    assert c.rows() == []
