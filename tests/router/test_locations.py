"""Where classic queues are, and where a new one goes while its usual node is unreachable
(router/locations.py)."""
from __future__ import annotations

import pytest

from shoal.shared.errors import AMQPError
from shoal.shared.placement import owner

from shoal.router.locations import Locations

IDS = ["node-0", "node-1", "node-2"]


def name_on(node: str, up: list[str] | None = None) -> str:
    """A queue name whose usual node is ``node`` (and, among ``up``, whose choice is
    ``up``'s first)."""
    for i in range(10_000):
        name = f"q{i}"
        if owner("/", name, IDS) == node and (up is None or owner("/", name, up) == up[0]):
            return name
    raise AssertionError


@pytest.fixture
def loc():
    up = set(IDS)
    moved: list = []
    where = Locations(IDS, lambda n: n in up, moved.append)
    where.up, where.moved_keys = up, moved
    return where


def test_a_queue_goes_to_its_usual_node_while_it_is_up(loc):
    q = name_on("node-0")
    assert loc.place("/", q, "node-0") == ("node-0", False)


def test_a_new_queue_of_a_down_node_goes_to_a_reachable_one_if_the_node_is_known(loc):
    q = name_on("node-0", ["node-2", "node-1"])
    loc.up.discard("node-0")
    with pytest.raises(AMQPError) as err:           # nothing known of node-0's queues
        loc.place("/", q, "node-0")
    assert err.value.reply_code == 404
    assert err.value.text == (f"home node 'node-0' of durable queue '{q}' in vhost '/' is "
                              "down or inaccessible")
    loc.load("node-1", [], [["node-0", [], [], [["/", "other", 1]]]])  # a peer knows it
    assert loc.place("/", q, "node-0") == ("node-2", True)
    assert loc.where[("/", q)] == "node-2" and ("/", q) in loc.moved_keys
    loc.unplace("/", q, "node-2")                   # the declare failed
    assert ("/", q) not in loc.where


def test_a_queue_known_on_a_down_node_answers_404(loc):
    loc.up.discard("node-0")
    loc.load("node-1", [], [["node-0", [], [], [["/", "kept", 1]]]])
    with pytest.raises(AMQPError) as err:
        loc.place("/", "kept", "node-1")
    assert "home node 'node-0'" in err.value.text


def test_a_nodes_own_word_replaces_what_was_known_of_it(loc):
    loc.load("node-0", [["/", "a", 1], ["/", "b", 0]], [])
    loc.load("node-0", [["/", "b", 0]], [["node-1", [], [], [["/", "c", 1]]]])
    assert loc.where == {("/", "b"): "node-0"}      # node-1 is up: it speaks for itself
    loc.added("node-1", "/", "c")
    loc.removed("node-0", "/", "c")                 # not node-0's: ignored
    assert loc.where[("/", "c")] == "node-1"
    loc.removed("node-1", "/", "c")
    assert ("/", "c") not in loc.where


def test_a_name_on_two_reachable_nodes_resolves_the_same_way_everywhere(loc):
    loc.load("node-0", [["/", "dup", 1]], [])
    loc.load("node-1", [["/", "dup", 1]], [])
    keep = owner("/", "dup", ["node-0", "node-1"])
    assert loc.where[("/", "dup")] == keep
    other = Locations(IDS, lambda n: True, lambda key: None)
    other.load("node-1", [["/", "dup", 1]], [])
    other.load("node-0", [["/", "dup", 1]], [])
    assert other.where[("/", "dup")] == keep
