"""The consistent-hash exchange (``x-consistent-hash``, router/consistent_hash.py) on the
router's topology cache, and what its owning node accepts (node/topology.py), with the texts
RabbitMQ 3.10.8 gave for the same keys and arguments (its plugin enabled, side by side)."""
from __future__ import annotations

import datetime
from collections import Counter

import pytest
from pamqp import commands
from pamqp.header import ContentHeader

from shoal.node.topology import Topology as TopologyStore
from shoal.router.routing import Topology
from shoal.shared import wire
from shoal.shared.errors import AMQPError

KEYS = [f"key-{i}" for i in range(4000)]


def topology(weights: dict[str, int], arguments: dict | None = None,
             order: list[str] | None = None) -> Topology:
    t = Topology(["/"])
    t.apply(wire.EV_EXCHANGE_ADDED, ["/", "chx", "x-consistent-hash", True, False, False,
                                     arguments or {}])
    for q in order or list(weights):
        t.apply(wire.EV_BINDING_ADDED, ["/", "chx", "q", q, str(weights[q]), {}])
    return t


def where(t: Topology, keys=KEYS, header: bytes | None = None) -> dict[str, str]:
    out = {}
    for k in keys:
        [q] = t.route("/", "chx", k, None, header)
        out[k] = q
    return out


def test_each_message_reaches_one_queue_in_shares_by_weight():
    t = topology({"a": 1, "b": 1, "c": 2})
    shares = Counter(where(t).values())
    assert sum(shares.values()) == len(KEYS)
    # a, b: about a quarter each; c: about half (the ring's 4 points spread unevenly, so
    # only the order and the rough size are asserted; weights of 100 below are tighter)
    assert shares["c"] > shares["a"] and shares["c"] > shares["b"]
    big = Counter(where(topology({"a": 100, "b": 100, "c": 200})).values())
    assert 0.40 < big["c"] / len(KEYS) < 0.60
    assert 0.18 < big["a"] / len(KEYS) < 0.32 and 0.18 < big["b"] / len(KEYS) < 0.32


def test_the_same_key_reaches_the_same_queue_whatever_the_order_of_the_bindings():
    weights = {"a": 50, "b": 50, "c": 50}
    assert where(topology(weights)) == where(topology(weights, order=["c", "a", "b"]))


def test_a_binding_removed_moves_only_its_own_keys():
    t = topology({"a": 50, "b": 50, "c": 50})
    before = where(t)
    t.apply(wire.EV_BINDING_REMOVED, ["/", "chx", "q", "b", "50", {}])
    after = where(t)
    assert set(after.values()) == {"a", "c"}
    assert all(after[k] == q for k, q in before.items() if q != "b")


def test_a_destination_counts_once_and_no_binding_routes_nowhere():
    t = topology({"a": 1})
    t.apply(wire.EV_BINDING_ADDED, ["/", "chx", "q", "a", "7", {}])
    assert set(where(t).values()) == {"a"}
    empty = topology({})
    assert empty.route("/", "chx", "k", None, None) == set()


def header_of(headers: dict | None = None, **props) -> bytes:
    """A content header payload with these properties (what the router routes on)."""
    return ContentHeader(0, 1, commands.Basic.Properties(headers=headers, **props)).marshal()


def test_hash_header_routes_by_the_headers_value():
    t = topology({"a": 50, "b": 50, "c": 50}, {"hash-header": "user"})
    by_user = {}
    for i, k in enumerate(KEYS[:600]):
        user = f"u{i % 30}"
        [q] = t.route("/", "chx", k, None, header_of({"user": user}))
        assert by_user.setdefault(user, q) == q         # one user, one queue, any key
    assert len(set(by_user.values())) == 3
    missing = {q for k in KEYS[:50] for q in t.route("/", "chx", k, None, header_of())}
    assert len(missing) == 1                            # no header: all to one queue


@pytest.mark.parametrize("prop, value", [
    ("message_id", lambda i: f"m{i % 20}"), ("correlation_id", lambda i: f"c{i % 20}"),
    ("timestamp", lambda i: datetime.datetime(2026, 1, 1, 0, 0, i % 20,
                                              tzinfo=datetime.timezone.utc))])
def test_hash_property_routes_by_the_property(prop, value):
    t = topology({"a": 50, "b": 50, "c": 50}, {"hash-property": prop})
    seen = {}
    for i, k in enumerate(KEYS[:400]):
        [q] = t.route("/", "chx", k, None, header_of(**{prop: value(i)}))
        assert seen.setdefault(i % 20, q) == q
    assert len(set(seen.values())) > 1


# ---- the owning node's checks (RabbitMQ's texts)

def store() -> TopologyStore:
    return TopologyStore(lambda event, data: None)


@pytest.mark.parametrize("key, text", [
    ("abc", 'The binding key must be an integer: <<"abc">>'),
    ("", 'The binding key must be an integer: <<"">>'),
    ("1_000", 'The binding key must be an integer: <<"1_000">>'),
    (" 5", 'The binding key must be an integer: <<" 5">>'),
    ("\uff15", "The binding key must be an integer: <<239,188,149>>"),     # a fullwidth 5
    ("0", "The binding key must be greater than 0"),
    ("-3", "The binding key must be greater than 0"),
    ("10001", "The binding key must not exceed 10000"),
])
def test_a_binding_key_that_is_not_a_weight_is_refused(key, text):
    s = store()
    s.declare_exchange("/", "chx", "x-consistent-hash", False, True, False, False, {})
    with pytest.raises(AMQPError) as e:
        s.bind("/", "chx", "q", "q1", key, {})
    assert (e.value.reply_code, e.value.text) == (406, text)
    s.unbind("/", "chx", "q", "q1", key, {})            # no such binding: a success
    for fine in ("10000", "+5", "05"):                  # as RabbitMQ 3.10.8 took them
        s.bind("/", "chx", "q", "q1", fine, {})


@pytest.mark.parametrize("args, text", [
    ({"hash-header": "h", "hash-property": "message_id"},
     "hash-header and hash-property are mutually exclusive"),
    ({"hash-property": "app_id"}, "Unsupported property: app_id"),
    ({"hash-property": 7}, "Unsupported property: 7"),
    ({"hash-header": 5}, "hash-header must be a string, not 5"),     # RabbitMQ 3.10: 541
])
def test_bad_hash_arguments_are_refused(args, text):
    with pytest.raises(AMQPError) as e:
        store().declare_exchange("/", "chx", "x-consistent-hash", False, True, False, False,
                                 args)
    assert (e.value.reply_code, e.value.text) == (406, text)
