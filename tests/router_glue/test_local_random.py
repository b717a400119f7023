"""The local-random exchange (``x-local-random``, RabbitMQ 4's
rabbit_exchange_type_local_random) on the router's topology cache (router/routing.py), and
what its owning node accepts (node/topology.py) with RabbitMQ 4's texts."""
from __future__ import annotations

from collections import Counter

import pytest

from shoal.node.topology import Topology as TopologyStore
from shoal.router.routing import Topology
from shoal.shared import wire
from shoal.shared.errors import AMQPError
from shoal.shared.topology import check_local_random_binding


def topology(queues: list[str]) -> Topology:
    t = Topology(["/"])
    t.apply(wire.EV_EXCHANGE_ADDED, ["/", "lrx", "x-local-random", True, False, False, {}])
    for q in queues:
        t.apply(wire.EV_BINDING_ADDED, ["/", "lrx", "q", q, "", {}])
    return t


def test_each_message_reaches_one_bound_queue_chosen_at_random():
    t = topology(["a", "b", "c"])
    picks = Counter()
    for i in range(600):
        out = t.route("/", "lrx", f"k{i}", None)
        assert len(out) == 1
        picks.update(out)
    assert set(picks) == {"a", "b", "c"}     # 600 picks of 3 leave none out (p ~ 1e-105)


def test_only_queues_the_router_may_use_are_picked_and_none_is_unroutable():
    t = topology(["a", "b", "c"])
    t.usable = lambda vhost, name: name == "b"     # a, c: replicated or on a node down
    assert {q for i in range(50) for q in t.route("/", "lrx", "k", None)} == {"b"}
    t.usable = lambda vhost, name: False
    assert t.route("/", "lrx", "k", None) == set()


def test_an_unbound_queue_is_no_longer_picked():
    t = topology(["a", "b"])
    t.apply(wire.EV_BINDING_REMOVED, ["/", "lrx", "q", "a", "", {}])
    assert {q for _ in range(50) for q in t.route("/", "lrx", "", None)} == {"b"}
    t.apply(wire.EV_QUEUE_REMOVED, ["/", "b"])
    assert t.route("/", "lrx", "", None) == set()


def store() -> TopologyStore:
    s = TopologyStore(lambda event, data: None)
    s.declare_exchange("/", "lrx", "x-local-random", False, True, False, False, {})
    s.declare_exchange("/", "other", "fanout", False, True, False, False, {})
    return s


@pytest.mark.parametrize("kind, dest, key, text", [
    ("q", "q1", "rk", "PRECONDITION_FAILED - Non empty binding 'rk' key not permitted"),
    ("e", "other", "rk", "PRECONDITION_FAILED - Non empty binding 'rk' key not permitted"),
    ("e", "other", "", "PRECONDITION_FAILED - Destination not found"),
])
def test_the_owning_node_refuses_a_key_and_an_exchange_destination(kind, dest, key, text):
    with pytest.raises(AMQPError) as e:
        store().bind("/", "lrx", kind, dest, key, {})
    assert (e.value.reply_code, e.value.reply_text) == (406, text)


def test_the_owning_node_accepts_a_queue_with_the_empty_key_and_any_binding_to_it():
    s = store()
    s.bind("/", "lrx", "q", "q1", "", {})
    s.bind("/", "other", "e", "lrx", "anything", {})     # as a destination it is any exchange
    s.unbind("/", "lrx", "q", "q1", "", {})


@pytest.mark.parametrize("qtype", ["quorum", "stream"])
def test_a_replicated_queue_is_refused_with_rabbitmqs_text(qtype):
    with pytest.raises(AMQPError) as e:
        check_local_random_binding("q", "", qtype)
    assert (e.value.reply_code, e.value.reply_text) == (
        406, f"PRECONDITION_FAILED - Queue type rabbit_{qtype}_queue not valid for this "
             f"exchange type")
