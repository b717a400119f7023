"""Scenarios 5-6: publisher confirms (to queues on every node) and mandatory returns."""
from __future__ import annotations

import pytest
from pamqp import commands, header
from pamqp.body import ContentBody

from .amqp_raw import RawAMQP
from .clients import Returned, connect

pytestmark = pytest.mark.e2e


def test_every_publish_is_confirmed(make_client, names):
    c = make_client(confirms=True)
    q = c.declare_queue(names("conf"))[0]
    for i in range(50):
        c.publish("", q, b"%d" % i)     # raises Nacked / times out unless basic.ack arrives
    assert c.declare_queue(q, passive=True)[1] == 50


@pytest.mark.parametrize("nodes", [2, 3])
def test_confirms_from_queues_on_each_node(request, kind, names, nodes):
    cl = request.getfixturevalue("cluster" if nodes == 2 else "cluster3")
    c = connect(kind, cl.url, confirms=True)
    try:
        queues = cl.queues_on_distinct_nodes(nodes, "conf")
        ex = names("fan")
        c.declare_exchange(ex, "fanout")
        for q in queues:
            c.declare_queue(q)
            c.bind_queue(q, ex)
            for i in range(10):
                c.publish("", q, b"direct-%d" % i)
        for i in range(10):
            c.publish(ex, "", b"fan-%d" % i)   # one publish, confirmed by every node
        for q in queues:
            assert c.declare_queue(q, passive=True)[1] == 20
            bodies = [c.get(q, no_ack=True).body for _ in range(20)]
            assert bodies == [b"direct-%d" % i for i in range(10)] + \
                [b"fan-%d" % i for i in range(10)]
    finally:
        c.close()


def test_confirm_to_unroutable_is_acked(make_client, names):
    c = make_client(confirms=True)
    ex = names("ex")
    c.declare_exchange(ex, "direct")
    c.publish(ex, "nobody-bound", b"dropped")   # not mandatory: dropped, still confirmed


def test_mandatory_unroutable_is_returned_312(make_client, names):
    c = make_client(confirms=True)
    ex = names("ex")
    c.declare_exchange(ex, "direct")
    with pytest.raises(Returned) as e:
        c.publish(ex, "nobody-bound", b"back", mandatory=True)
    assert e.value.code == 312
    assert "NO_ROUTE" in e.value.text
    with pytest.raises(Returned) as e:
        c.publish("", names("no-such-queue"), b"back", mandatory=True)
    assert e.value.code == 312
    q = c.declare_queue(names("q"))[0]
    c.publish("", q, b"routed", mandatory=True)   # routable: no return
    assert c.get(q, no_ack=True).body == b"routed"


def test_raw_return_arrives_before_its_ack(cluster, names):
    ex = names("ex")
    with RawAMQP(cluster.host, cluster.port).open() as raw:
        raw.open_channel(1)
        raw.send_frame(commands.Exchange.Declare(exchange=ex, exchange_type="direct"), 1)
        raw.expect(commands.Exchange.DeclareOk, 1)
        raw.send_frame(commands.Confirm.Select(), 1)
        raw.expect(commands.Confirm.SelectOk, 1)
        body = b"r" * 300_000      # several body frames come back too
        raw.send(raw.publish(1, ex, "unbound", body, mandatory=True,
                             props=commands.Basic.Properties(message_id="m-1")))
        ret = raw.expect(commands.Basic.Return, 1)
        assert (ret.reply_code, ret.exchange, ret.routing_key) == (312, ex, "unbound")
        assert ret.reply_text.startswith("NO_ROUTE")
        hdr = raw.expect(header.ContentHeader, 1)
        assert hdr.body_size == len(body) and hdr.properties.message_id == "m-1"
        got = b""
        while len(got) < len(body):
            got += raw.expect(ContentBody, 1).value
        assert got == body
        ack = raw.expect(commands.Basic.Ack, 1)
        assert ack.delivery_tag == 1


def test_raw_confirm_tags_cover_every_publish(cluster, names):
    """Acks (possibly multiple=True, possibly out of order) cover delivery tags 1..N."""
    n = 200
    qa, qb = cluster.queues_on_distinct_nodes(2, "tags")
    with RawAMQP(cluster.host, cluster.port).open() as raw:
        raw.open_channel(1)
        for q in (qa, qb):
            raw.send_frame(commands.Queue.Declare(queue=q), 1)
            raw.expect(commands.Queue.DeclareOk, 1)
        raw.send_frame(commands.Confirm.Select(), 1)
        raw.expect(commands.Confirm.SelectOk, 1)
        data = b"".join(raw.publish(1, "", (qa, qb)[i % 2], b"%d" % i) for i in range(n))
        raw.send(data)
        acked: set[int] = set()
        while len(acked) < n:
            _, value = raw.read_frame()
            assert isinstance(value, commands.Basic.Ack), f"expected basic.ack, got {value!r}"
            assert 1 <= value.delivery_tag <= n, f"ack for unknown tag {value.delivery_tag}"
            if value.multiple:
                acked.update(range(1, value.delivery_tag + 1))
            else:   # acks may come out of order (two nodes), but never twice
                assert value.delivery_tag not in acked, f"tag {value.delivery_tag} acked twice"
                acked.add(value.delivery_tag)
        for q in (qa, qb):
            raw.send_frame(commands.Queue.Delete(queue=q), 1)
            assert raw.expect(commands.Queue.DeleteOk, 1).message_count == n // 2


def test_a_burst_with_confirms_gets_acks_then_nacks_in_publish_order(cluster, names):
    """20 publishes in one write to a queue that holds 5 (x-overflow reject-publish): the
    node answers them together, the first 5 accepted and the rest refused (it sends each run
    of equal answers as one message: shared/wire.py ``coalesce_results``); the client sees
    basic.ack for tags 1-5 and basic.nack for 6-20, each tag once."""
    n, room = 20, 5
    q = names("burst")
    with RawAMQP(cluster.host, cluster.port).open() as raw:
        raw.open_channel(1)
        raw.send_frame(commands.Queue.Declare(queue=q, arguments={
            "x-max-length": room, "x-overflow": "reject-publish"}), 1)
        raw.expect(commands.Queue.DeclareOk, 1)
        raw.send_frame(commands.Confirm.Select(), 1)
        raw.expect(commands.Confirm.SelectOk, 1)
        raw.send(b"".join(raw.publish(1, "", q, b"%d" % i) for i in range(n)))
        outcome: dict[int, bool] = {}
        while len(outcome) < n:
            _, value = raw.read_frame()
            assert isinstance(value, (commands.Basic.Ack, commands.Basic.Nack)), value
            ok = isinstance(value, commands.Basic.Ack)
            tags = [t for t in range(1, value.delivery_tag + 1) if t not in outcome] \
                if value.multiple else [value.delivery_tag]
            for t in tags:
                assert t not in outcome, f"tag {t} confirmed twice"
                outcome[t] = ok
        assert outcome == {t: t <= room for t in range(1, n + 1)}
        raw.send_frame(commands.Queue.Delete(queue=q), 1)
        assert raw.expect(commands.Queue.DeleteOk, 1).message_count == room
