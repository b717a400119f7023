"""Who should be a member of a group, one change at a time (sans-IO, design.md section 8).

A member id is ``"<node_id>@<disk id>"``: the disk id is made when a node's data directory is
created. A node whose disk was wiped comes back with a new id, so it can never vote with the
votes and log it forgot (Raft's safety needs a voter's disk). The leader replaces it: the new
id is added as a learner (it catches up, from a snapshot, without counting toward any majority),
the old id is removed, and the new one is promoted to voter once it has caught up.
"""
from __future__ import annotations

from shoal.node.replication.log import ADD_LEARNER, ADD_VOTER, REMOVE
from shoal.node.replication.raft import Raft


def member_id(node_id: str, disk_id: str) -> str:
    return f"{node_id}@{disk_id}"


def node_of(member: str) -> str:
    """The node id of a member id."""
    return member.rpartition("@")[0] or member


def repair(raft: Raft, current: dict[str, str], wanted_nodes: set[str] | None = None
           ) -> tuple[str, str] | None:
    """The next membership change the leader ``raft`` should propose, or None.

    ``current``: node id -> that node's member id now (from its link's hello; nodes not in it
    are unknown or down). ``wanted_nodes``: the nodes that should hold a member (default: the
    nodes of the present members). In order: remove a member whose node is not wanted; add a
    wanted node's current id as a learner when it is not a member yet; remove a member whose
    node now has another id (a wiped disk: its replacement is a member by then); promote a
    learner whose log reached the leader's commit index.

    The new id goes in as a learner *before* the stale id goes out: with the default
    ``wanted_nodes`` a node whose only member was removed would no longer be wanted and would
    never come back (the raft simulator's liveness check, tests/node/replication, found it).
    A learner counts toward no majority, so adding it first changes no quorum (the dissertation,
    4.2.1, adds a new server as non-voting until it has caught up).
    """
    if not raft.is_leader or raft.pending_conf_index > raft.log.applied:
        return None
    members = raft.voters | raft.learners
    nodes = {node_of(m) for m in members}
    wanted = nodes if wanted_nodes is None else wanted_nodes
    for m in sorted(members):
        if m != raft.id and node_of(m) not in wanted:
            return (REMOVE, m)
    for node in sorted(wanted):
        mid = current.get(node)
        if mid is not None and mid not in members:
            return (ADD_LEARNER, mid)
    for m in sorted(members):
        node = node_of(m)
        if m != raft.id and node in current and current[node] != m:
            return (REMOVE, m)
    for m in sorted(raft.learners):
        pr = raft.progress.get(m)
        if pr is not None and pr.match >= raft.log.committed:
            return (ADD_VOTER, m)
    return None


def step_toward(raft: Raft, node_id: str, current: dict[str, str],
                wanted: list[str] | None) -> tuple[str, str] | None:
    """As leader of a group (a quorum queue or a stream) on node ``node_id``: begin the next
    step toward the nodes an operator wants (``wanted``; None or empty: the nodes of the
    present members). A leader whose own node is not wanted hands the lead to a voter whose
    node is (returns ``("transfer", member)``); otherwise the change :func:`repair` names is
    proposed (returns ``(op, member)``). None when there is nothing to do, or it cannot be
    begun now. Called every 10 ticks by node/replication/manager.py and
    node/streams/members.py, and by the simulators (tests/node/streams/stream_sim.py)."""
    if not raft.is_leader:
        return None
    if wanted and node_id not in wanted:        # delete_member of this node: hand over first
        for m in sorted(raft.voters):
            if node_of(m) in wanted and raft.transfer_leadership(m):
                return ("transfer", m)
        return None
    change = repair(raft, current, set(wanted) if wanted else None)
    if change is not None and raft.propose_conf(*change) is not None:
        return change
    return None


def wanted_after(wanted: list[str], op: str, node: str) -> list[str]:
    """The nodes wanted after an operator's ``add_member`` or ``delete_member`` of ``node``
    (rabbitmq-queues and rabbitmq-streams: add_member / add_replica, delete_member /
    delete_replica), from those wanted now. Raises ValueError when it would leave none
    (the caller answers 406, as RabbitMQ refuses to delete the last member)."""
    out = [n for n in wanted if n != node]
    if op == "add_member":
        out.append(node)
    elif not out:
        raise ValueError(node)
    return out
