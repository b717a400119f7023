"""Operators' commands on quorum queues, as rabbitmq-queues has them (wire QUORUM_OP,
router/management/quorum_views.py, ``shoal ctl``; docs/replication.md "Operating"): a queue's
status as its leader sees it, a member added or removed, every queue grown onto a node or
shrunk off it, a leadership handed over. Functions of a node's
:class:`~shoal.node.replication.manager.Replication` (``rep``).
"""
from __future__ import annotations

from typing import Any

from shoal.shared.errors import NOT_FOUND, PRECONDITION_FAILED, AMQPError, soft_error
from shoal.shared.wire import MOVED

from shoal.node.peers import DEFERRED
from shoal.node.replication import membership, requests
from shoal.node.replication.group import QuorumGroup


def on_quorum_op(shard: Any, state: Any, msg: list) -> Any:
    """QUORUM_OP from a router (``state``, a RouterPeer), in the shard's dispatch table.
    Raises 404 when the node has no replication."""
    _, req_id, op, vhost, name, node = msg
    if shard.replication is None:
        raise soft_error(NOT_FOUND, "node has no quorum queues")
    return quorum_op(shard.replication, state.identity, req_id, op, vhost, name, node)


def quorum_op(rep: Any, peer: bytes, req_id: int, op: str, vhost: str | None,
              name: str | None, node: str | None) -> Any:
    """QUORUM_OP (shared/wire.py). Returns the payload, or DEFERRED when it answers the
    router itself once the change is applied. Raises AMQPError: 404 no
    such quorum queue or node, 406 a change that cannot be made."""
    if op in ("grow", "shrink"):
        if node not in rep.node_ids:
            raise soft_error(NOT_FOUND, f"no node '{node}' in the cluster")
        changed = []
        for g in rep.groups.values():
            if not g.leading:
                continue
            wanted = list(g.wanted)
            if op == "grow" and node not in wanted and \
                    (name != "even" or len(wanted) % 2 == 0):
                wanted.append(node)
            elif op == "shrink" and node in wanted and len(wanted) > 1:
                wanted.remove(node)
            else:
                continue
            if g.propose(["wanted", wanted]):
                changed.append([g.key[0], g.key[1]])
        return changed
    g = rep.groups.get((vhost, name))
    mem = rep.shard.streams.members
    if g is None and mem is not None and (vhost, name) in mem.members:
        return mem.operate(peer, req_id, op, vhost, name, node)     # a replicated stream
    if g is None:
        if (vhost, name) in rep.shard.streams.streams:
            raise soft_error(NOT_FOUND, f"stream '{name}' in vhost '{vhost}' has one member "
                                        f"without replication (made by an older Shoal on a "
                                        f"node alone): it cannot get members")
        raise soft_error(NOT_FOUND, f"no quorum queue '{name}' in vhost '{vhost}'")
    if not g.leading:
        rep.announce(g, peer)
        raise AMQPError(MOVED, f"quorum queue '{name}' is led by "
                               f"{g.known_leader or 'no member yet'}")
    if op == "status":
        return status(rep, g)
    if op in ("add_member", "delete_member"):
        if node not in rep.node_ids:
            raise soft_error(NOT_FOUND, f"no node '{node}' in the cluster")
        try:
            wanted = membership.wanted_after(g.wanted, op, node)
        except ValueError:
            raise soft_error(PRECONDITION_FAILED, f"cannot delete the last member of "
                                                  f"quorum queue '{name}'") from None
        if g.propose(["wanted", wanted],
                     lambda result: requests.reply(rep, peer, req_id, sorted(wanted))):
            return DEFERRED
        raise AMQPError(MOVED, f"quorum queue '{name}' lost its leader")
    if op == "transfer":
        return rep.transfer(g, node)
    raise soft_error(PRECONDITION_FAILED, f"unknown quorum queue command '{op}'")

def status(rep: Any, g: QuorumGroup) -> list:
    """rabbitmq-queues quorum_status as the leader sees it: per member [node, member id,
    raft state, membership (voter, learner), match index, commit index, term]."""
    r = g.raft
    rows = []
    for m in sorted(r.voters | r.learners):
        pr = r.progress.get(m)
        rows.append([membership.node_of(m), m, "leader" if m == r.id else
                     ("follower" if rep.online(membership.node_of(m)) else "noproc"),
                     "voter" if m in r.voters else "learner",
                     r.log.last_index if m == r.id else (pr.match if pr else 0),
                     r.log.committed, r.term])
    return rows
