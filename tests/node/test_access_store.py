"""The users and permissions the first node keeps (node/access_store.py): compare-and-set,
every router told (EV_ACCESS) before the writer's reply, kept in access.json across a restart,
a damaged file set aside."""
from __future__ import annotations

from node_helpers import Net

from shoal.node.access_store import AccessStore
from shoal.shared.errors import PRECONDITION_FAILED
from shoal.shared.wire import EV_ACCESS, T

DOC = {"users": [{"name": "u", "password_hash": "", "tags": []}], "vhosts": [{"name": "/"}]}


def test_compare_and_set_and_every_router_told_first(net: Net, tmp_path):
    net.shard.access.load(tmp_path)
    r1, r2 = net.router("r1"), net.router("r2")
    assert r1.ok(T.ACCESS_GET) == [0, None]
    assert r1.ok(T.ACCESS_SET, 0, DOC) == [1]
    assert [m for m in r1.before_reply if m[0] == T.TOPOLOGY_EVENT] == \
        [[T.TOPOLOGY_EVENT, EV_ACCESS, [1, DOC]]]
    assert [T.TOPOLOGY_EVENT, EV_ACCESS, [1, DOC]] in r2.take()
    assert r2.request(T.ACCESS_SET, 0, {})[2] == PRECONDITION_FAILED     # stale version
    assert r2.ok(T.ACCESS_GET) == [1, DOC]
    again = AccessStore()
    again.load(tmp_path)
    assert (again.version, again.doc) == (1, DOC)


def test_a_damaged_file_is_set_aside(tmp_path):
    (tmp_path / "access.json").write_text("{not json")
    store = AccessStore()
    store.load(tmp_path)
    assert (store.version, store.doc) == (0, None)
    assert (tmp_path / "access.json.damaged").exists()
