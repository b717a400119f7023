"""Exchange routing on the router's topology cache (spec 3.1.3)."""
import pytest

from shoal.router.routing import Topology, headers_match
from shoal.router.topic import compile_topic
from shoal.shared import wire


@pytest.mark.parametrize("pattern,key,match", [
    ("#", "", True), ("#", "a.b", True), ("a.#", "a", True), ("a.#", "a.b.c", True),
    ("a.#", "b", False), ("#.b", "b", True), ("#.b", "a.b", True), ("#.b", "a.bc", False),
    ("a.*.c", "a.b.c", True), ("a.*.c", "a.c", False), ("a.#.c", "a.c", True),
    ("a.#.c", "a.x.y.c", True), ("a.#.c", "a.x.y.d", False), ("*", "a", True),
    ("*", "a.b", False), ("a.b", "a.b", True), ("a.b", "a.bb", False), ("#.#", "x.y", True),
    ("*.#", "a", True), ("a.*", "a.b.c", False), ("a+b.*", "a+b.c", True),
])
def test_topic_patterns(pattern, key, match):
    assert compile_topic(pattern)(key) is match


@pytest.mark.parametrize("args,headers,match", [
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 3}, True),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1}, False),
    ({"x-match": "any", "a": 1, "b": "x"}, {"a": 1}, True),
    ({"x-match": "any", "a": 1}, {"a": 2}, False),
    ({"a": 1}, {"a": 1}, True),                     # all is the default
    ({"x-match": "all", "x-k": 1}, {}, True),        # x- keys ignored by all
    ({"x-match": "all-with-x", "x-k": 1}, {}, False),
    ({"x-match": "any-with-x", "x-k": 1}, {"x-k": 1}, True),
    ({"x-match": "all", "a": None}, {"a": "anything"}, True),
])
def test_headers_match(args, headers, match):
    assert headers_match(args, headers) is match


def _topology():
    t = Topology(["/"])
    t.apply(wire.EV_EXCHANGE_ADDED, ["/", "logs", "topic", True, False, False, {}])
    t.apply(wire.EV_EXCHANGE_ADDED, ["/", "fan", "fanout", True, False, False, {}])
    t.apply(wire.EV_BINDING_ADDED, ["/", "logs", "q", "errors", "*.error", {}])
    t.apply(wire.EV_BINDING_ADDED, ["/", "logs", "q", "all", "#", {}])
    t.apply(wire.EV_BINDING_ADDED, ["/", "logs", "e", "fan", "app.#", {}])
    t.apply(wire.EV_BINDING_ADDED, ["/", "fan", "q", "f1", "", {}])
    t.apply(wire.EV_BINDING_ADDED, ["/", "fan", "e", "logs", "", {}])  # a cycle
    return t


def test_routing_follows_exchange_bindings_once():
    t = _topology()
    assert t.route("/", "logs", "app.error", lambda: None) == {"errors", "all", "f1"}
    assert t.route("/", "logs", "db.info", lambda: None) == {"all"}
    assert t.route("/", "", "anything", lambda: None) == {"anything"}


def test_queue_removal_drops_its_bindings():
    t = _topology()
    assert t.apply(wire.EV_QUEUE_REMOVED, ["/", "all"]) == [("/", "all")]
    assert t.route("/", "logs", "db.info", lambda: None) == set()


def test_binding_events_are_idempotent_and_removable():
    t = _topology()
    t.apply(wire.EV_BINDING_ADDED, ["/", "logs", "q", "errors", "*.error", {}])
    assert len(t.get("/", "logs").bindings) == 3
    t.apply(wire.EV_BINDING_REMOVED, ["/", "logs", "q", "errors", "*.error", {}])
    assert t.route("/", "logs", "x.error", lambda: None) == {"all"}


def test_headers_are_decoded_only_for_headers_exchanges():
    t = _topology()
    calls = []
    t.route("/", "logs", "a.error", lambda: calls.append(1))
    assert calls == []
    t.apply(wire.EV_BINDING_ADDED, ["/", "amq.match", "q", "h", "", {"x-match": "any", "k": 1}])
    assert t.route("/", "amq.match", "", lambda: calls.append(1) or {"k": 1}) == {"h"}
    assert calls == [1]
