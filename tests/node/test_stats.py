"""What a node tells routers about itself and passes between them (node/stats.py): NODE_STATS,
the routers' reports of their live objects (ROUTER_REPORT / ROUTER_REPORTS) and FORCE_CLOSE
passed on to the router it names."""
from __future__ import annotations

from node_helpers import Net

from shoal.shared.wire import T


def test_reports_are_kept_per_router_and_dropped_with_it(net: Net):
    r1, r2 = net.router("r1"), net.router("r2")
    r1.send(T.ROUTER_REPORT, "r1", {"connections": [{"name": "c1"}]})
    net.now += 250
    got = r2.ok(T.ROUTER_REPORTS)
    assert got == [["r1", {"connections": [{"name": "c1"}]}, 250]]
    r1.send(T.GOODBYE)
    assert r2.ok(T.ROUTER_REPORTS) == []


def test_force_close_goes_to_the_named_router_only(net: Net):
    r1, r2, r3 = net.router("r1"), net.router("r2"), net.router("r3")
    r1.send(T.FORCE_CLOSE, "r2", "1.2.3.4:5 -> 6.7.8.9:5672", "Closed via management plugin")
    assert r2.take() == [[T.FORCE_CLOSE, "r2", "1.2.3.4:5 -> 6.7.8.9:5672",
                          "Closed via management plugin"]]
    assert r1.take() == [] and r3.take() == []


def test_node_stats_without_a_journal(net: Net):
    r = net.router()
    r.declare("q")
    r.publish("q", b"x")
    st = r.ok(T.NODE_STATS)
    assert st["queues"] == 1 and st["messages_ready"] == 1 and st["routers"] == 1
    assert st["rss_bytes"] > 0 and "fsync_seconds" not in st
