"""Bodies over a queue's memory budget go to page files and come back intact (issue 22,
point 4: RabbitMQ's paging / lazy queues; node/queues/paging.py)."""
from __future__ import annotations

import gc

import pytest
from node_helpers import Net, bodies

from shoal.node.queues.paging import PagedBody, PageStore
from shoal.shared.errors import PRECONDITION_FAILED
from shoal.shared.wire import OUTCOME_ACK, OUTCOME_REJECT, OUTCOME_REQUEUE, T


@pytest.fixture
def paged(tmp_path) -> Net:
    net = Net()
    net.shard.pages = PageStore(tmp_path / "pages", default_budget=100, segment_bytes=64)
    return net


def resident(net: Net, name: str) -> list[bytes]:
    q = net.shard.queues[("/", name)]
    return [e.body for e in q.entries if not isinstance(e.body, PagedBody) and not e.is_dead]


def test_store_round_trip_and_segments_deleted_when_unused(tmp_path):
    store = PageStore(tmp_path / "p", segment_bytes=16)
    a, b, c = store.page_out(b"x" * 8), store.page_out(b"y" * 8), store.page_out(b"z" * 3)
    assert (a.read(), b.read(), c.read()) == (b"x" * 8, b"y" * 8, b"z" * 3)
    assert len(a) == 8 and store.paged_messages == 3 and store.paged_bytes == 19
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == \
        ["00000001.page", "00000002.page"]
    del a
    gc.collect()
    assert len(list((tmp_path / "p").iterdir())) == 2        # b still lives in segment 1
    del b
    gc.collect()
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["00000002.page"]
    assert store.paged_messages == 1
    store.close()
    assert not (tmp_path / "p").exists()


def test_a_deep_queue_keeps_only_its_budget_in_memory_and_delivers_everything(paged: Net):
    r = paged.router()
    r.declare("q")
    sent = [b"%02d" % i + b"." * 18 for i in range(40)]      # 20 bytes each, budget 100
    for body in sent:
        r.publish("q", body)
    kept = resident(paged, "q")
    assert 0 < sum(map(len, kept)) <= 100
    assert paged.shard.pages.paged_messages == 40 - len(kept)
    cid = r.consume("q")
    got = bodies(r.credit(cid, 100))
    assert got == sent                                       # every body, in order
    ids = list(range(1, 41))
    r.send(T.SETTLE, OUTCOME_ACK, ids)
    gc.collect()
    assert paged.shard.pages.paged_messages == 0
    assert paged.shard.queues[("/", "q")].ready_bytes == 0


def test_requeued_and_fetched_paged_bodies_come_back(paged: Net):
    r = paged.router()
    r.declare("q", args={"x-queue-mode": "lazy"})          # lazy: every body paged
    r.publish("q", b"first")
    r.publish("q", b"second")
    assert resident(paged, "q") == []
    got = r.ok(T.GET, "/", "q", False, None)
    assert got[5] == b"first"
    r.send(T.SETTLE, OUTCOME_REQUEUE, [got[0]])
    cid = r.consume("q")
    msgs = r.credit(cid, 5)
    assert [(m[7], m[3]) for m in msgs] == [(b"first", True), (b"second", False)]
    r.send(T.SETTLE, OUTCOME_REJECT, [m[2] for m in msgs])
    assert paged.shard.queues[("/", "q")].ready_bytes == 0


def test_queue_budget_argument_and_its_errors(paged: Net):
    r = paged.router()
    r.declare("big", args={"x-max-in-memory-bytes": 10_000})
    for i in range(10):
        r.publish("big", b"m" * 50)
    assert len(resident(paged, "big")) == 10                 # its own budget wins
    assert r.declare("bad", args={"x-queue-mode": "eager"})[2] == PRECONDITION_FAILED
    assert r.declare("bad2", args={"x-max-in-memory-bytes": -1})[2] == PRECONDITION_FAILED


def test_one_publish_to_two_queues_is_paged_once(paged: Net):
    r = paged.router()
    r.declare("a", args={"x-queue-mode": "lazy"})
    r.declare("b", args={"x-queue-mode": "lazy"})
    r.publish("a", b"shared", queues=["a", "b"])
    assert paged.shard.pages.page_outs == 1
    for name in ("a", "b"):
        assert r.ok(T.GET, "/", name, True, None)[5] == b"shared"


def test_max_length_bytes_counts_paged_bodies(paged: Net):
    r = paged.router()
    r.declare("q", args={"x-queue-mode": "lazy", "x-max-length-bytes": 30})
    for i in range(5):
        r.publish("q", b"%d" % i * 10)
    assert r.declare("q", passive=True, args={"x-queue-mode": "lazy",
                                              "x-max-length-bytes": 30})[4][1] == 3
    cid = r.consume("q", no_ack=True)
    assert bodies(r.credit(cid, 10)) == [b"2" * 10, b"3" * 10, b"4" * 10]
