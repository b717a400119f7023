"""Streams on a node, through its wire messages (node/streams/hosting.py): declare, publish
confirmed once on disk, consume from offsets with credit, x-stream-offset on every delivery,
filters, RabbitMQ's refusals, and a restarted node that serves what it held."""
from __future__ import annotations

import sys
from pathlib import Path

from pamqp.commands import Basic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node_helpers import Net  # noqa: E402

from shoal.node.queues.message import encode_header, parse_properties  # noqa: E402
from shoal.shared.errors import (NOT_IMPLEMENTED, PRECONDITION_FAILED,  # noqa: E402
                                 RESOURCE_ERROR)
from shoal.shared.wire import T  # noqa: E402

STREAM = {"x-queue-type": "stream"}


def header(body: bytes, **headers) -> bytes:
    return encode_header(Basic.Properties(headers=headers or None), len(body))


def publish(r, body: bytes, seq: int = 0, **headers) -> None:
    r.send(T.PUBLISH, seq, "/", ["s"], "", "s", header(body, **headers), body, None)


def commit(net: Net) -> None:
    net.shard.streams.commit(None)
    net.pump()


def consume(r, args=None, qos=(10, 0), cid=None) -> list:
    r.next_consumer += 1
    return r.request(T.CONSUME, cid or r.next_consumer, "/", "s", "t", False, False,
                     args or {}, None, list(qos) if qos is not None else None)


def offsets(msgs: list[list]) -> list[int]:
    """The x-stream-offset header of each delivery."""
    return [parse_properties(m[6]).headers["x-stream-offset"] for m in msgs
            if m[0] == T.DELIVER]


def stream_net(tmp_path) -> tuple[Net, object]:
    net = Net()
    net.shard.open_streams(tmp_path / "streams")
    r = net.router()
    assert r.declare("s", durable=True, args=STREAM)[2] == 0
    return net, r


def test_a_publish_is_confirmed_once_its_chunk_is_on_disk(tmp_path) -> None:
    net, r = stream_net(tmp_path)
    publish(r, b"a", seq=1)
    publish(r, b"b", seq=2)
    assert r.take() == []                 # not yet: the turn's chunk is not written
    commit(net)
    assert r.take() == [[T.PUBLISH_RESULT, 1, 0, 1], [T.PUBLISH_RESULT, 2, 0, 1]]
    assert r.declare("s", durable=True, args=STREAM)[4] == ["s", 2, 0]


def test_consumers_read_from_their_offsets_with_credit(tmp_path) -> None:
    net, r = stream_net(tmp_path)
    for turn in range(3):
        for i in range(3):
            publish(r, f"{turn}{i}".encode())
        commit(net)
    assert consume(r, {"x-stream-offset": "first"})[4] == [9, "stream"]
    first = r.next_consumer
    got = r.credit(first, 4)
    assert [m[7] for m in got] == [b"00", b"01", b"02", b"10"]
    assert offsets(got) == [0, 1, 2, 3]
    assert all(m[3] is False for m in got)
    assert consume(r, {"x-stream-offset": 7})[4] == [2, "stream"]
    assert offsets(r.credit(r.next_consumer, 10)) == [7, 8]
    assert consume(r, {"x-stream-offset": "last"})[4] == [3, "stream"]
    assert offsets(r.credit(r.next_consumer, 10)) == [6, 7, 8]
    assert consume(r)[4] == [0, "stream"]   # next: only what comes
    nxt = r.next_consumer
    assert r.credit(nxt, 10) == []
    publish(r, b"new")
    commit(net)
    msgs = r.take()     # to every consumer with credit left (not the first: it used its 4)
    assert sorted(m[1] for m in msgs) == [first + 1, first + 2, nxt]
    assert offsets([m for m in msgs if m[1] == nxt]) == [9]


def test_credit_zero_asks_for_work_and_drain_returns_what_is_left(tmp_path) -> None:
    net, r = stream_net(tmp_path)
    consume(r, {"x-stream-offset": "first"})
    cid = r.next_consumer
    assert r.credit(cid, 0) == []
    publish(r, b"x")
    commit(net)
    assert r.take() == [[T.WORK, cid]]
    got = r.credit(cid, 5, drain=True)
    assert [m[0] for m in got] == [T.DELIVER, T.CREDIT_DRAINED]
    assert got[-1] == [T.CREDIT_DRAINED, cid, 4]


def test_filters_select_by_filter_value(tmp_path) -> None:
    net, r = stream_net(tmp_path)
    publish(r, b"r1", **{"x-stream-filter-value": "red"})
    publish(r, b"b1", **{"x-stream-filter-value": "blue"})
    commit(net)
    publish(r, b"plain")
    commit(net)
    consume(r, {"x-stream-offset": "first", "x-stream-filter": "red"})
    assert [m[7] for m in r.credit(r.next_consumer, 10)] == [b"r1"]
    consume(r, {"x-stream-offset": "first", "x-stream-filter": ["blue"],
                "x-stream-match-unfiltered": True})
    assert [m[7] for m in r.credit(r.next_consumer, 10)] == [b"b1", b"plain"]


def test_rabbitmq_refusals(tmp_path) -> None:
    net, r = stream_net(tmp_path)
    reply = consume(r, qos=(0, 0))
    assert reply[2:4] == [PRECONDITION_FAILED, "consumer prefetch count is not set for "
                                               "stream queue 's' in vhost '/'"]
    reply = consume(r, qos=(5, 10))
    assert reply[2:4] == [NOT_IMPLEMENTED, "queue 's' in vhost '/' does not support global qos"]
    r.next_consumer += 1
    reply = r.request(T.CONSUME, r.next_consumer, "/", "s", "t", True, False, {}, None, [5, 0])
    assert reply[2:4] == [NOT_IMPLEMENTED, "automatic acknowledgement not supported by stream "
                                           "queue 's' in vhost '/'"]
    reply = consume(r, {"x-stream-offset": "3 hours"})
    assert reply[2:4] == [PRECONDITION_FAILED, "failed consuming from stream queue 's' in "
                                               "vhost '/': invalid_max_age"]
    reply = r.request(T.GET, "/", "s", False, None)
    assert reply[2:4] == [NOT_IMPLEMENTED, "basic.get not supported by stream queues queue "
                                           "'s' in vhost '/'"]
    reply = r.request(T.QUEUE_PURGE, "/", "s", None)
    assert reply[2:4] == [NOT_IMPLEMENTED, "queue.purge not supported by stream queues queue "
                                           "'s' in vhost '/'"]
    reply = r.declare("s2", durable=False, args=STREAM)
    assert reply[2:4] == [PRECONDITION_FAILED, "invalid property 'non-durable' for queue 's2' "
                                               "in vhost '/'"]
    reply = r.declare("s", durable=True, args={"x-queue-type": "classic"})
    assert reply[2] == PRECONDITION_FAILED and "inequivalent arg 'x-queue-type'" in reply[3]
    # AMQP 1.0 links have no qos: credit is theirs
    assert consume(r, qos=None)[2] == 0


def test_a_restarted_node_serves_its_streams(tmp_path) -> None:
    net, r = stream_net(tmp_path)
    for i in range(5):
        publish(r, b"m%d" % i)
    commit(net)
    net.shard.streams.close()
    again = Net()
    assert again.shard.open_streams(tmp_path / "streams") == 1
    r2 = again.router()
    assert r2.declare("s", durable=True, args=STREAM)[4] == ["s", 5, 0]
    consume(r2, {"x-stream-offset": 2})
    assert [m[7] for m in r2.credit(r2.next_consumer, 10)] == [b"m2", b"m3", b"m4"]
    publish(r2, b"m5", seq=9)
    commit(again)
    assert r2.take()[0] == [T.PUBLISH_RESULT, 9, 0, 1]


def test_delete_cancels_consumers_and_removes_the_files(tmp_path) -> None:
    net, r = stream_net(tmp_path)
    publish(r, b"x")
    commit(net)
    consume(r)
    cid = r.next_consumer
    assert r.request(T.QUEUE_DELETE, "/", "s", False, False, None)[4] == [1]
    assert [T.CONSUMER_CANCELLED, cid, "queue deleted"] in r.pending
    assert list((tmp_path / "streams").iterdir()) == []
    assert r.request(T.QUEUE_DECLARE, "/", "s", True, True, False, False, {}, None)[2] == 404


def test_a_lost_router_takes_its_stream_consumers(tmp_path) -> None:
    net, r = stream_net(tmp_path)
    consume(r)
    net.shard._forget(net.shard.peers[r.identity])
    assert net.shard.streams.consumers == {}
    assert net.shard.streams.streams[("/", "s")].consumers == []


def test_a_disk_that_fails_nacks_the_turns_publishes(tmp_path, monkeypatch) -> None:
    net, r = stream_net(tmp_path)
    publish(r, b"a", seq=1)

    def broken(fd):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr("os.fdatasync", broken)
    commit(net)
    assert r.take() == [[T.PUBLISH_RESULT, 1, RESOURCE_ERROR, 1]]
    monkeypatch.undo()
    publish(r, b"b", seq=2)
    commit(net)
    assert r.take() == [[T.PUBLISH_RESULT, 2, 0, 1]]


def test_a_publish_to_a_stream_and_a_quorum_queue_waits_for_the_chunk(tmp_path) -> None:
    """One publish to a quorum queue this node does not lead and to a stream on it: the
    quorum part is answered at once (PUBLISH_MOVED), but the answer waits until the stream's
    chunk of the turn is on disk."""
    from tests.node.replication.test_quorum_nodes import HEADER, Cluster, declare
    c = Cluster(tmp_path)
    try:
        declare(c)
        leader = c.leader()
        node = next(n for n in c.ids if n != leader)
        one = {**STREAM, "x-initial-cluster-size": 1}     # a stream of one member
        assert c.request(node, T.QUEUE_DECLARE, "/", "s", 0, 1, 0, 0, one, None)[2] == 0
        c.inbox[node].clear()
        c.send(node, T.PUBLISH, 7, "/", ["q", "s"], "", "q", HEADER, b"x", None)
        assert c.take(node, T.PUBLISH_MOVED) == []
        c.shards[node].streams.commit(None)
        c.pump()
        assert c.take(node, T.PUBLISH_MOVED) == [[T.PUBLISH_MOVED, 7, 0, 1, ["q"]]]
    finally:
        for shard in c.shards.values():
            shard.streams.close()
