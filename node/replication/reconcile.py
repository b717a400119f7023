"""Membership reconciliation (issue 44 point 6; RabbitMQ's
``rabbit_quorum_queue_periodic_membership_reconciliation``): members that nobody else will
ever answer are removed after a grace period, with no operator action.

- **A member whose queue no longer exists.** A node that was down while its quorum queue was
  deleted (or while its member was removed by ``delete_member``/``shrink``) comes back with
  the group and no leader: the others dropped it, so nobody answers its elections. A member
  removed while it was up may instead have applied its own removal, and then it still names
  the leader that removed it, but no leader replicates to it any more. So after ``GRACE_MS``
  in which no leader replicated to it (:data:`SILENT_TICKS` ticks without an APP, SNAP or
  HEARTBEAT) it asks the nodes of the other voters it knows (GROUP_ASK).
  When a majority of its voters say the group is gone (``none``) or goes on without it
  (``removed``), and none says it is a member, it drops the group and its copy of the queue,
  quietly: the queue's name may already belong to a new queue elsewhere, which routers must
  not be told is gone.
- **A member whose node left.** A node that is no longer in the cluster's configuration (a
  restart with fewer ``--nodes`` or ``--peer``s, a smaller StatefulSet) is taken out of the
  nodes that should hold members (``wanted``) by each leader, ``GRACE_MS`` after the leader
  first finds it missing; the membership repair then removes its member.

Functions of a node's :class:`~shoal.node.replication.manager.Replication` (``rep``), called
from its tick (every second) and for the two wire messages (shared/wire.py GROUP_ASK,
GROUP_ANSWER).
"""
from __future__ import annotations

import logging
from typing import Any

from shoal.shared.wire import T

from shoal.node.replication import membership
from shoal.node.replication.group import TICK_MS, QuorumGroup
from shoal.node.replication.log import CONF, REMOVE

log = logging.getLogger("shoal.node.replication")

#: How long (ms) a member waits without a leader replicating to it, and a leader waits for a
#: node that left the configuration to come back, before reconciling.
GRACE_MS = 10_000
#: GRACE_MS in Raft ticks: a member's ``silent_ticks`` (quorum queues' QuorumGroup, streams'
#: StreamReplica) count the ticks since a leader last replicated to it.
SILENT_TICKS = GRACE_MS // TICK_MS

_ASK, _ANSWER = int(T.GROUP_ASK), int(T.GROUP_ANSWER)
MEMBER, REMOVED, NONE = "member", "removed", "none"
#: What a member's reconciliation does now (:func:`action`).
DROP, ASK = "drop", "ask"


def action(raft: Any, silent_ticks: int, leading: bool) -> str | None:
    """What the reconciliation does now with a member (a quorum queue's or a replicated
    stream's) whose Raft is ``raft`` and that no leader replicated to for ``silent_ticks``:
    None while it leads or a leader replicated to it within SILENT_TICKS; DROP when it knows
    no configuration (made for a leader's message and never given the group's snapshot: it
    holds nothing, and a leader that still wants it makes it again); else ASK the other
    voters' nodes whether the group still has it. Both simulators decide with it too."""
    if leading or silent_ticks < SILENT_TICKS:
        return None
    return DROP if not raft.voters and not raft.learners else ASK


def reconcile(rep: Any, now: float) -> None:
    """Every second: leaders drop departed nodes from ``wanted``; members that no leader
    replicated to for GRACE_MS ask whether their group still has them."""
    known = set(rep.node_ids)
    for g in list(rep.groups.values()):
        if g.leading:
            _departed(rep, g, known, now)
            continue
        act = action(g.raft, g.silent_ticks, False)
        if act is None:
            g.answers.clear()
        elif act == DROP:
            log.info("quorum queue '%s' in vhost '%s': no leader replicated to this new member "
                     "for %d s: dropped", g.key[1], g.key[0], GRACE_MS // 1000)
            rep.forget(g)
        else:
            ask(rep, g.key, g.uid, g.raft)


def gone_here(answers: dict[str, str], voters: set[str], me: str | None = None,
              out_in_log: bool = False) -> bool:
    """Whether a majority of ``voters`` answered that the group is gone or goes on without
    the asker, and none that it is a member. The asker ``me`` counts itself among them when
    its own log holds its removal (``out_in_log``: :func:`removed_in_log`), committed or not:
    the removal of a voter of a group of two is committed only once both hold it, so the
    other's answer and its own log are the majority that the other's answer alone never
    is (a queue shrunk to one member left the other for good)."""
    if MEMBER in answers.values():
        return False
    said = sum(1 for m in voters if answers.get(m) in (NONE, REMOVED))
    if out_in_log and me in voters and me not in answers:
        said += 1
    return said > len(voters) // 2


def removed_in_log(changes: Any, me: str) -> bool:
    """Whether the last of a log's membership ``changes`` (``(op, member)`` in log order)
    that names ``me`` removes it."""
    last = None
    for op, member in changes:
        if member == me:
            last = op
    return last == REMOVE


def conf_changes(raft: Any) -> Any:
    """A quorum member's membership changes held in its log (``(op, member)``)."""
    return ((e.data[0], e.data[1]) for e in raft.log.entries if e.kind == CONF)


def ask(rep: Any, key: tuple[str, str], uid: str, raft: Any) -> None:
    """GROUP_ASK to the nodes of ``raft``'s other voters."""
    msg = [_ASK, key[0], key[1], uid, raft.id]
    for m in raft.voters:
        node = membership.node_of(m)
        if m != raft.id and rep.online(node):
            rep.to_peer(node, msg)


def _departed(rep: Any, g: QuorumGroup, known: set[str], now: float) -> None:
    wanted = list(g.wanted) or sorted(membership.node_of(m) for m in g.raft.voters)
    gone = [n for n in wanted if n not in known]
    for n in list(rep.departed):
        if n in known:
            del rep.departed[n]         # configured again
    if not gone:
        return
    if any(now - rep.departed.setdefault(n, now) < GRACE_MS for n in gone):
        return
    keep = [n for n in wanted if n in known]
    if keep and g.propose(["wanted", keep]):
        log.warning("quorum queue '%s' in vhost '%s': node(s) %s left the cluster: their "
                    "members are removed", g.key[1], g.key[0], ", ".join(gone))


def on_ask(rep: Any, msg: list) -> None:
    """GROUP_ASK from another node: is its member still in this node's group (a quorum
    queue's, or a replicated stream's: node/streams/members.py asks the same)?"""
    _, vhost, name, uid, asker = msg
    g = rep.groups.get((vhost, name))
    if g is None:
        mem = rep.shard.streams.members
        g = mem.members.get((vhost, name)) if mem is not None else None
    raft = g.raft if isinstance(g, QuorumGroup) else g.rep.raft if g is not None else None
    status = answer_for(raft if g is not None and g.uid == uid else None, asker)
    rep.to_peer(membership.node_of(asker), [_ANSWER, vhost, name, uid, rep.member_id,
                                            status])


def answer_for(raft: Any, asker: str) -> str:
    """What a member whose Raft is ``raft`` (None: this node has no such group) answers
    ``asker``'s GROUP_ASK: MEMBER while its configuration counts the asker, else REMOVED;
    NONE without the group. The stream simulator answers with it too."""
    if raft is None:
        return NONE
    return MEMBER if asker in raft.voters or asker in raft.learners else REMOVED


def on_answer(rep: Any, msg: list) -> None:
    """GROUP_ANSWER: once a majority of this member's voters say the group is gone or goes
    on without it (and none says it is a member), the group is dropped here. Only a voter's
    own disk counts: a node whose disk was wiped since answers under another member id (it
    has forgotten the group, which says nothing of whether it still exists)."""
    _, vhost, name, uid, member, status = msg
    g = rep.groups.get((vhost, name))
    if g is None:
        mem = rep.shard.streams.members
        if mem is not None:
            mem.answered(vhost, name, uid, member, status)
        return
    if g.uid != uid or g.leading or g.silent_ticks < SILENT_TICKS:
        return
    g.answers[member] = status
    r = g.raft
    if gone_here(g.answers, r.voters, r.id, removed_in_log(conf_changes(r), r.id)):
        log.warning("quorum queue '%s' in vhost '%s': the other members no longer have "
                    "this node's member (the queue was deleted, or the member removed): "
                    "removed here", name, vhost)
        rep.forget(g)
