"""What routers ask of a node's quorum queues (wire QUEUE_DECLARE, QUEUE_DELETE, QUEUE_PURGE
and the MOVED answer; node/queue_requests.py and node/messages.py call these): a new queue's
checks (RabbitMQ 3.10's 406 texts), its members and its group, a delete or purge through the
log, and the answer of a member that does not lead. Functions of a node's
:class:`~shoal.node.replication.manager.Replication` (``rep``).
"""
from __future__ import annotations

import hashlib
import logging
import uuid
from typing import Any

from shoal.shared.errors import PRECONDITION_FAILED, soft_error
from shoal.shared.wire import MOVED, TAG_REPLY, T

from shoal.node.queues.args import Overflow, as_int, parse_queue_arguments
from shoal.node.replication import membership
from shoal.node.replication.group import LOST, QuorumGroup, new_raft
from shoal.node.replication.raft import bootstrap

log = logging.getLogger("shoal.node.replication")

_GROUP_CREATE = int(T.GROUP_CREATE)
#: ``x-dead-letter-strategy`` values (RabbitMQ's; anything else: 406 invalid_dlx_strategy)
DLX_STRATEGIES = ("at-most-once", "at-least-once")
DEFAULT_GROUP_SIZE = 3
#: Ticks after start during which a declare waits for every chosen node's PEER_HELLO.
STARTUP_TICKS = 30


# ---- declares --------------------------------------------------------------------------
def declare(rep: Any, peer: bytes, req_id: int, vhost: str, name: str, durable: bool,
            exclusive: bool, auto_delete: bool, args: dict) -> None:
    """Create quorum queue ``name``: refuse what a quorum queue cannot be (406, RabbitMQ
    3.10's texts: ``rabbit_quorum_queue``'s checks), choose its members, make the group
    and answer the router (REPLY) once it has a leader. Raises AMQPError."""
    for prop, bad in (("non-durable", not durable), ("exclusive-owner", exclusive),
                      ("auto-delete", auto_delete)):
        if bad:
            raise soft_error(PRECONDITION_FAILED, f"invalid property '{prop}' for queue "
                                                  f"'{name}' in vhost '{vhost}'")
    strategy = args.get("x-dead-letter-strategy")
    if strategy is not None and strategy not in DLX_STRATEGIES:
        raise soft_error(PRECONDITION_FAILED, f"invalid arg 'x-dead-letter-strategy' for "
                                              f"queue '{name}' in vhost '{vhost}': "
                                              f"invalid_dlx_strategy")
    size = as_int(args, "x-quorum-initial-group-size", 1, None, (name, vhost)) or \
        DEFAULT_GROUP_SIZE
    cfg = parse_queue_arguments(vhost, name, args)       # 406 for bad values
    if cfg.overflow is Overflow.REJECT_PUBLISH_DLX:      # rabbit_quorum_queue:overflow/3
        log.warning("Invalid overflow strategy <<\"reject-publish-dlx\">> for quorum queue: "
                    "queue '%s' in vhost '%s' (drop-head applies)", name, vhost)
    if strategy == "at-least-once":                     # rabbit_quorum_queue:dlh/5
        if cfg.dlx is None:
            log.warning("Disabling dead-lettering for queue '%s' in vhost '%s' despite "
                        "configured dead-letter-strategy 'at-least-once' because "
                        "dead-letter-exchange is not configured.", name, vhost)
        elif cfg.overflow is not Overflow.REJECT_PUBLISH:
            log.warning("Falling back to dead-letter-strategy at-most-once for queue '%s' in "
                        "vhost '%s' because configured dead-letter-strategy at-least-once is "
                        "incompatible with effective overflow strategy drop-head. To enable "
                        "dead-letter-strategy at-least-once, set overflow strategy to "
                        "reject-publish.", name, vhost)
    wanted = choose_nodes(rep, vhost, name, size)
    if any(n not in rep.peers for n in wanted) and rep.ticks < STARTUP_TICKS:
        # Just started: the other nodes have not said PEER_HELLO yet (their first comes
        # within a tick). Wait for them rather than make a group of fewer members.
        rep.waiting_declares.append((peer, req_id, vhost, name, durable, exclusive,
                                       auto_delete, args))
        return
    create(rep, peer, req_id, vhost, name, args, wanted)

def create(rep: Any, peer: bytes, req_id: int, vhost: str, name: str, args: dict,
            wanted: list[str]) -> None:
    """Make the group of a new quorum queue (its members: ``wanted`` nodes heard from),
    tell the other members (GROUP_CREATE), campaign, and answer the declare once a
    leader is known."""
    if (vhost, name) in rep.groups:            # declared twice while waiting
        reply(rep, peer, req_id, [name, 0, 0])
        return
    members = [rep.member_id] + [rep.peers[n][0] for n in wanted[1:]
                                  if n in rep.peers and rep.online(n)]
    uid = uuid.uuid4().hex[:12]
    header = [vhost, name, args, uid, defaults(rep.shard.settings, args)]
    created = rep.shard.timers.now + rep.shard.timers.wall_offset_ms
    snap = bootstrap(members, {"queue": header, "messages": [], "wanted": wanted,
                               "last_active": created})
    raft = new_raft(rep.member_id, snapshot=snap)
    g = rep.make_group(header, raft, wanted)
    assert g is not None
    g.snapshot = snap
    g.machine.last_active = created
    rep.store.append(g.key, uid, "snap", snap.to_wire())
    for m in members[1:]:
        rep.outgoing.append((membership.node_of(m), [_GROUP_CREATE, vhost, name, uid,
                                                        snap.to_wire()]))
    g.pending_declares.append(declare_answer(rep, peer, req_id, name))
    raft.campaign()
    g.check_role()

def defaults(settings: Any, args: dict) -> dict:
    """The arguments a quorum queue has that its declare did not give, fixed at declare
    and the same on every member (the group's header): ``x-delivery-limit`` from the
    setting ``quorum_delivery_limit`` (RabbitMQ 4.0's default of 20; -1: none, as 3.10)."""
    limit = settings.quorum_delivery_limit
    if limit >= 0 and "x-delivery-limit" not in args and \
            "x-qpid-maximum-delivery-count" not in args:
        return {"x-delivery-limit": limit}
    return {}


def queue_config(header: list, restored: bool = True) -> Any:
    """The QueueConfig of a quorum queue's header ``[vhost, name, args, uid(, defaults)]``:
    its declared arguments over the defaults of its declare; ``x-overflow:
    reject-publish-dlx`` is drop-head, as in RabbitMQ (rabbit_quorum_queue:overflow/3).
    Raises AMQPError 406."""
    vhost, name, args = header[0], header[1], header[2]
    fixed = header[4] if len(header) > 4 and isinstance(header[4], dict) else {}
    cfg = parse_queue_arguments(vhost, name, {**fixed, **(args or {})}, restored=restored)
    if cfg.overflow is Overflow.REJECT_PUBLISH_DLX:
        cfg.overflow = Overflow.DROP_HEAD
    return cfg


def choose_nodes(rep: Any, vhost: str, name: str, size: int) -> list[str]:
    """This node and the ``size - 1`` others that rank highest for the queue
    (rendezvous hashing, as placement). Those not heard from yet join later
    (:meth:`_repair` adds them as learners, then voters)."""
    key = f"qq\x00{vhost}\x00{name}".encode()
    others = [n for n in rep.node_ids if n != rep.node_id]
    others.sort(key=lambda n: hashlib.blake2b(key, digest_size=8,
                                               key=n.encode()[:64]).digest(), reverse=True)
    return [rep.node_id] + others[:max(0, size - 1)]

def reply(rep: Any, peer: bytes, req_id: int, payload: Any, code: int = 0,
           text: str = "") -> None:
    if peer in rep.shard.peers:
        rep.shard.send(peer, [TAG_REPLY, req_id, code, text, payload])

def declare_answer(rep: Any, peer: bytes, req_id: int, name: str) -> Any:
    """The answer to a declare that made a replicated queue or stream, run once:
    ``answer(False)`` declare-ok ([name, 0, 0]) when its group has a leader;
    ``answer(True)`` MOVED when the group it made is dropped here before that (a node
    whose disk was wiped made it anew while the queue's other members go on: the router
    asks the leader again, which answers for the queue that exists)."""
    def answer(moved: bool = False) -> None:
        if moved:
            reply(rep, peer, req_id, None, MOVED,
                  f"queue '{name}' is not on this node any more; ask its leader")
        else:
            reply(rep, peer, req_id, [name, 0, 0])
    return answer


def moved(rep: Any, peer: bytes, req_id: int, g: QuorumGroup) -> None:
    """REPLY MOVED to a request this member cannot answer as a follower, after telling
    the router who leads (when it is known)."""
    rep.announce(g, peer)
    reply(rep, peer, req_id, g.known_leader, MOVED,
                f"quorum queue '{g.key[1]}' is led by {g.known_leader or 'no member yet'}")

# ---- router requests on a group --------------------------------------------------------
def delete(rep: Any, peer: bytes, req_id: int, g: QuorumGroup) -> None:
    """QUEUE_DELETE as leader: replicate it; the REPLY [message_count] when applied."""
    def done(result: Any) -> None:
        if result is LOST:
            moved(rep, peer, req_id, g)
        else:
            reply(rep, peer, req_id, [result or 0])
    if not g.propose(["delete"], done):
        moved(rep, peer, req_id, g)

def purge(rep: Any, peer: bytes, req_id: int, g: QuorumGroup) -> None:
    """QUEUE_PURGE as leader: the messages AVAILABLE now are dropped on every member."""
    idx = [g.machine.index_of[e.entry_id] for e in g.queue.entries
           if e.is_available and e.entry_id in g.machine.index_of]

    def done(result: Any) -> None:
        if result is LOST:
            moved(rep, peer, req_id, g)
        else:
            reply(rep, peer, req_id, [result or 0])
    if not g.propose(["purge", idx], done):
        moved(rep, peer, req_id, g)
