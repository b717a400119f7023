"""Replicated streams on a node (docs/streams.md, "Replication"): the members of each stream
that has more than one, their Raft traffic, and what the routers are told.

A stream declared on a node with other nodes gets ``x-initial-cluster-size`` members
(default 3, at most the nodes there are; rabbit_stream_queue.erl), on this node and the
others that rank highest for it (node/replication/requests.py ``choose_nodes``, as a quorum
queue's). Each member is a :class:`~shoal.node.streams.replica.StreamReplica` in the stream's
directory. The creator tells the others (STREAM_CREATE) and campaigns; the declare is
answered once a leader is known.

The leader takes the stream's publishes: a turn's publishes become one chunk, proposed to
the log, and their answers wait until it is committed (on a majority's disks: hosting.py's
turn barrier). The leader announces itself to every router as a quorum queue's does
(EV_QUEUE_LEADER, flagged "stream", again when the members change), so routers send it the
publishes; a member that does not lead answers PUBLISH_MOVED or MOVED. When it stops leading
its proposals not committed are nacked.

Consumers read from any member, each up to that member's commit (readers.py): a member keeps
its consumers when the leader changes. A router moves a consumer only when its member leaves
the stream or its node is lost, to another member, from the offset after the last one it
delivered (router/quorum.py).

Node to node (shared/wire.py): STREAM_CREATE ``[T, vhost, name, uid, arguments, voters]``,
STREAM_RAFT ``[T, vhost, name, uid, message]``, STREAM_DELETE ``[T, vhost, name, uid(,
member id)]`` and STREAM_READERS (readers.py).
"""
from __future__ import annotations

import hashlib
import logging
import random
from typing import Any

from shoal.shared.errors import NOT_FOUND, PRECONDITION_FAILED, AMQPError, soft_error
from shoal.shared.wire import EV_QUEUE_LEADER, MOVED, TAG_TOPOLOGY_EVENT, T

from shoal.node.peers import DEFERRED
from shoal.node.replication import membership, reconcile
from shoal.node.replication.group import ELECTION_TICKS, HEARTBEAT_TICKS, answer_declares
from shoal.node.replication.membership import node_of
from shoal.node.replication.raft import APP, SNAP, Message
from shoal.node.replication.requests import STARTUP_TICKS
from shoal.node.streams import chunk as chunks
from shoal.node.streams.answers import Reply, done_upto
from shoal.node.streams.readers import STREAM_READERS, Readers, send_reports
from shoal.node.streams.replica import StreamReplica

log = logging.getLogger("shoal.node")

STREAM_RAFT, STREAM_CREATE, STREAM_DELETE = (int(T.STREAM_RAFT), int(T.STREAM_CREATE),
                                             int(T.STREAM_DELETE))
#: RabbitMQ's default member count for a stream, at most the nodes there are.
DEFAULT_CLUSTER_SIZE = 3
#: Ticks without a leader's message after which a member asks whether it is still one
#: (reconcile.GRACE_MS: 10 s).
SILENT_TICKS = reconcile.SILENT_TICKS


class Member:
    """A replicated stream's member on this node (``StreamQueue.replica``): its replica
    ``rep``, the stream's ``uid`` (every member's), and who leads as last seen."""

    def __init__(self, host: "StreamMembers", s: Any, rep: Any, uid: str) -> None:
        self.host = host
        self.stream = s
        self.rep = rep
        self.uid = uid
        self.leading = False
        self.known_leader: str | None = None
        self.leader_term = 0
        #: declare answers waiting for a leader (replication/requests.py declare_answer)
        self.pending_declares: list = []
        #: log index -> the turn barrier (hosting.py) waiting for it
        self.waiting: dict[int, Any] = {}
        #: [log index, barrier]: publishes sent again and found stored (replica.py
        #: find_publish) in a chunk not yet committed, confirmed once it is
        self.after: list[list] = []
        #: reconciliation (node/replication/reconcile.py): the other members' answers
        self.answers: dict[str, str] = {}
        #: who reads from which member (readers.py); the voters last announced
        self.readers = Readers()
        self.announced: frozenset = frozenset()

    def lists_here(self) -> bool:
        """Whether this member reports the stream (QUEUE_LIST, management): the leader, or
        while there is none the member on the first node in id order."""
        return self.leading or (self.known_leader is None and
                                self.host.node_id == min(self.members() or
                                                         [self.host.node_id]))

    def members(self) -> list[str]:
        """The node ids of the voters, sorted."""
        return sorted(node_of(m) for m in self.rep.raft.voters)

    def offsets(self) -> dict[str, int]:
        """As leader: each member's last offset written as far as this leader knows (its
        own, and what each follower acknowledged), by node; {} on a follower."""
        r = self.rep.raft
        if not r.is_leader:
            return {}
        out = {}
        for m in r.voters | r.learners:
            index = r.log.last_index if m == r.id else r.progress[m].match \
                if m in r.progress else 0
            try:
                out[node_of(m)] = self.rep.offset_after(max(index, r.log.snap_index)) - 1
            except (AssertionError, LookupError):
                out[node_of(m)] = -1
        return out

    def describe(self) -> list:
        """EV_QUEUE_LEADER's data: [vhost, name, leader, term, members, online, "stream"]."""
        members = self.members()
        return [self.stream.vhost, self.stream.name, self.known_leader, self.leader_term,
                members, [n for n in members if self.host.rep.online(n)], "stream"]

    def reader_rows(self, committed: int) -> list[list]:
        """Every consumer of the stream as ``[tag, offset, offset_lag, node]`` (readers.py
        ``Readers.rows``): the other members' as last reported while this one leads."""
        host = self.host
        return self.readers.rows(self.stream, host.node_id, self.members(), committed,
                                 host.rep.ticks)


class StreamMembers:
    """The replicated streams of one node (``Streams.members``), over the node's quorum
    queue replication ``rep`` (node/replication/manager.py: its member id, peers and links).
    """

    def __init__(self, streams: Any, rep: Any) -> None:
        self.streams = streams
        self.rep = rep
        self.node_id = rep.node_id
        self.members: dict[tuple[str, str], Member] = {}
        self._announced: set[bytes] = set()
        #: declares waiting (at start) to hear from the nodes they would choose
        self.waiting: list[tuple] = []

    def starting(self) -> bool:
        """Just started: the other nodes may not have said PEER_HELLO yet (a declare waits
        for them rather than make a stream of fewer members, as a quorum queue's)."""
        return self.rep.ticks < STARTUP_TICKS

    # ---- making members ---------------------------------------------------------------------
    def cluster_size(self, cfg: Any) -> int:
        """How many members a new stream gets: ``x-initial-cluster-size`` (default 3), at
        most the nodes this node knows of."""
        want = cfg.initial_cluster_size or DEFAULT_CLUSTER_SIZE
        return max(1, min(want, len(self.rep.node_ids)))

    def nodes_for(self, vhost: str, name: str, size: int) -> list[str]:
        """This node and the ``size - 1`` online others that rank highest for the stream."""
        key = f"stream\x00{vhost}\x00{name}".encode()
        others = [n for n in self.rep.node_ids if n != self.node_id and self.rep.online(n)
                  and n in self.rep.peers]
        others.sort(key=lambda n: hashlib.blake2b(key, digest_size=8,
                                                   key=n.encode()[:64]).digest(), reverse=True)
        return [self.node_id] + others[:max(0, size - 1)]

    def member_ids(self, nodes: list[str]) -> list[str]:
        return [self.rep.member_id if n == self.node_id else self.rep.peers[n][0]
                for n in nodes]

    def attach(self, s: Any, rep: Any, uid: str) -> Member:
        m = Member(self, s, rep, uid)
        s.replica = m
        self.members[(s.vhost, s.name)] = m
        return m

    def created(self, m: Member, voters: list[str], answer: Any) -> None:
        """This node made a new stream (Streams.declare): tell the other first members,
        campaign, and answer (``answer()``) once a leader is known."""
        s = m.stream
        for v in voters:
            if v != self.rep.member_id:
                self.rep.to_peer(node_of(v), [STREAM_CREATE, s.vhost, s.name, m.uid,
                                              s.arguments, voters])
        if answer is not None:
            m.pending_declares.append(answer)
        m.rep.raft.campaign()
        self.check_role(m)

    # ---- from other nodes ------------------------------------------------------------------
    def on_peer(self, msg: list, now_ms: float) -> None:
        tag = msg[0]
        vhost, name, uid = msg[1], msg[2], msg[3]
        m = self.members.get((vhost, name))
        if tag == STREAM_RAFT:
            wm = Message.from_wire(msg[4])
            if m is None and wm.to == self.rep.member_id and wm.type in (APP, SNAP):
                # a leader replicates to this member, which has nothing of the stream (added
                # by add_member, or this node's disk was wiped): join, empty; the leader's
                # start (a snapshot, with the declaration) follows; a member dropped here and
                # added back goes on from its term and vote (store.py's tombstones)
                hs = self.rep.store.unbury((vhost, name), uid)
                try:
                    s = self.streams.create_member(vhost, name, {"x-queue-type": "stream"},
                                                   uid, None, hs)
                except Exception:  # noqa: BLE001 - must not stop the node
                    log.exception("cannot join stream '%s' in vhost '%s'", name, vhost)
                    return
                m = s.replica
            if m is None or m.uid != uid or wm.to != m.rep.raft.id:
                return
            m.rep.step(wm)
            self.check_role(m)
        elif tag == STREAM_CREATE:
            if m is not None or self.rep.member_id not in msg[5]:
                return
            try:
                self.streams.create_member(vhost, name, msg[4], uid, list(msg[5]))
            except Exception:  # noqa: BLE001 - a bad create must not stop the node
                log.exception("cannot make a member of stream '%s' in vhost '%s'", name, vhost)
        elif tag == STREAM_READERS:
            if m is not None and m.uid == uid and m.leading:
                m.readers.on_report(msg[4], msg[5], self.rep.ticks)
        elif tag == STREAM_DELETE:
            member = msg[4] if len(msg) > 4 else None       # one member removed, or all
            if m is not None and m.uid == uid and member in (None, m.rep.raft.id):
                self._drop(m, bury=member is not None)

    def peer_lost(self, node: str) -> None:
        """The link to ``node`` closed: the streams it led elect a leader now."""
        for m in self.members.values():
            r = m.rep.raft
            if r.leader is not None and node_of(r.leader) == node:
                others = sorted((v for v in r.voters if v != r.leader),
                                key=lambda v: hashlib.blake2b(f"{m.uid}/{v}".encode(),
                                                              digest_size=8).digest())
                rank = others.index(r.id) if r.id in others else len(others)
                r.peer_lost(r.leader, 1 + 2 * rank)
            elif r.is_leader:
                for v in list(r.progress):
                    if node_of(v) == node:
                        r.peer_lost(v)

    def _drop(self, m: Member, bury: bool = True) -> None:
        """This node's member goes, quietly (removed, or the stream deleted: the others
        know). With ``bury``, its last term and vote stay in the node's Raft log for the
        member a leader may make again under the same id, which must not vote twice in a
        term (node/replication/store.py's tombstones); a stream deleted whole is not."""
        if bury:
            self.rep.store.bury((m.stream.vhost, m.stream.name), m.uid, m.rep.raft.hard_state())
        self.streams.delete(m.stream, tell=False)

    def deleted(self, s: Any, tell: bool) -> None:
        m = self.members.pop((s.vhost, s.name), None)
        if m is None:
            return
        if tell:
            for v in m.rep.raft.voters | m.rep.raft.learners:
                if v != self.rep.member_id:
                    self.rep.to_peer(node_of(v), [STREAM_DELETE, s.vhost, s.name, m.uid])
        self._fail(m)
        answer_declares(m, moved=True)     # made here, gone before it had a leader
        m.rep.close()

    # ---- the clock and the turn ------------------------------------------------------------
    def operate(self, peer: bytes, req_id: int, op: str, vhost: str, name: str,
                node: str | None) -> Any:
        """QUORUM_OP on a replicated stream (node/replication/operations.py hands it
        here): ``add_member`` / ``delete_member`` (rabbitmq-streams add_replica /
        delete_replica: the nodes wanted are logged, and the leader changes the members
        one at a time, a new one first a learner that catches up) answered with the nodes
        wanted once that is committed; ``transfer`` hands the lead over. Raises 404 (no
        such node), 406 (the last member; an unknown command), MOVED."""
        m = self.members[(vhost, name)]
        if not m.leading:
            raise self.moved(m, peer)
        if op == "transfer":
            target = next((v for v in m.rep.raft.voters if node_of(v) == node), None)
            return target is not None and m.rep.raft.transfer_leadership(target)
        if op not in ("add_member", "delete_member"):
            raise soft_error(PRECONDITION_FAILED, f"'{op}' is not a command for stream "
                                                  f"'{name}' in vhost '{vhost}'")
        if node not in self.rep.node_ids:
            raise soft_error(NOT_FOUND, f"no node '{node}' in the cluster")
        try:
            wanted = membership.wanted_after(m.rep.wanted or m.members(), op, node)
        except ValueError:              # rabbit_stream_coordinator: last_stream_member
            raise soft_error(PRECONDITION_FAILED, f"cannot delete the last member of stream "
                                                  f"'{name}' in vhost '{vhost}'") from None
        index = m.rep.propose_wanted(wanted)
        if index is None:
            raise AMQPError(MOVED, f"stream '{name}' lost its leader")
        m.waiting[index] = Reply(self.streams, peer, req_id, sorted(wanted), name)
        return DEFERRED

    def repair(self) -> None:
        """As leader, every 10 ticks: the next membership change toward the nodes wanted
        (membership.py's ``repair``: add a wanted node's member as a learner, promote it
        once caught up, remove a member not wanted or whose node's disk was wiped); a
        leader whose node is not wanted hands the lead to one that is."""
        current = {n: p[0] for n, p in self.rep.peers.items() if self.rep.online(n)}
        current[self.node_id] = self.rep.member_id
        for m in self.members.values():
            if not m.leading:
                continue
            step = membership.step_toward(m.rep.raft, self.node_id, current, m.rep.wanted)
            if step is not None and step[0] != "transfer":
                log.info("stream '%s' in vhost '%s': %s %s", m.stream.name, m.stream.vhost,
                         *step)

    def reconcile(self) -> None:
        """Every second, as a quorum queue's member (reconcile.py): a member that no leader
        has replicated to for GRACE_MS (:data:`SILENT_TICKS`) asks the other voters' nodes
        whether the stream still has it (it was down while the stream was deleted, or its
        member was removed: it may still name the leader that removed it)."""
        for m in list(self.members.values()):
            action = reconcile.action(m.rep.raft, m.rep.silent_ticks, m.leading)
            if action is None:
                m.answers.clear()
            elif action == reconcile.DROP:
                log.info("stream '%s' in vhost '%s': no leader replicated to this new member "
                         "for %d s: dropped", m.stream.name, m.stream.vhost,
                         reconcile.GRACE_MS // 1000)
                self._drop(m)
            else:
                reconcile.ask(self.rep, (m.stream.vhost, m.stream.name), m.uid, m.rep.raft)

    def answered(self, vhost: str, name: str, uid: str, member: str, status: str) -> None:
        """GROUP_ANSWER about a stream: once a majority of its voters say it is gone or
        goes on without this member, the member and its files go here, quietly (the name
        may be another stream's now)."""
        m = self.members.get((vhost, name))
        if m is None or m.uid != uid or m.leading or m.rep.silent_ticks < SILENT_TICKS:
            return
        m.answers[member] = status
        r = m.rep.raft
        if reconcile.gone_here(m.answers, r.voters, r.id,
                               reconcile.removed_in_log(m.rep.conf_changes(), r.id)):
            log.warning("stream '%s' in vhost '%s': the other members no longer have this "
                        "node's member (the stream was deleted, or the member removed): "
                        "removed here", name, vhost)
            self._drop(m)

    def tick(self) -> None:
        if self.rep.ticks % 10 == 0:
            self.repair()
            self.reconcile()
        send_reports(self)
        if self.waiting:
            waiting, self.waiting = self.waiting, []
            for d in waiting:
                if (d[0], d[1]) in self.streams.streams:
                    if d[6] is not None:
                        d[6](False)
                    continue
                s = self.streams.declare(*d)
                if s is not None and s.replica is None and d[6] is not None:
                    d[6](False)         # one member after all: served at once
        for m in list(self.members.values()):
            m.rep.tick()
            self.check_role(m)

    def propose(self, s: Any, records: list[bytes], filters: list, now_ms: int,
                sent: dict | None = None) -> int | None:
        """The turn's chunk of ``s`` as leader: its log index, or None (not leading).
        ``sent``: which publishes the records are (chunk.encode_trailer's argument)."""
        got = s.replica.rep.publish(records, now_ms, filters, s.cfg.filter_size,
                                    chunks.encode_trailer(sent) if sent else b"")
        return None if got is None else got[0]

    def process(self) -> list[Any]:
        """Every member's Ready: write, fdatasync, send, commit (a leader's appends leave
        before its fdatasync: replica.py ``early_messages``; no answer is read until the
        next turn). Returns the streams whose commit moved (their consumers may read
        further)."""
        if not self.members:
            return []
        self._announce_new_routers()
        moved = []
        links = self.rep.links
        for m in list(self.members.values()):
            rep = m.rep
            before = rep.committed_offset
            try:
                while rep.has_ready():
                    rd = rep.write()
                    early = rep.early_messages(rd)
                    if early and links is not None:
                        self._queue(m, early, links)
                        links.flush()   # the followers write while this sync runs
                    rep.sync()
                    if links is not None:
                        self._queue(m, rd.messages, links)
                    for index in rep.finish(rd):
                        b = m.waiting.pop(index, None)
                        if b is not None:
                            b.done(True)
                    if m.after:
                        m.after = done_upto(m.after, rep.raft.log.applied)
                cfg = m.stream.cfg
                if rep.committed_offset != before and \
                        (cfg.max_bytes is not None or cfg.max_age is not None):
                    rep.retain(cfg.max_bytes, cfg.max_age, self.streams.now_ms())
            except Exception:  # noqa: BLE001 - a failing disk (or a bug) must not stop the node
                log.exception("stream '%s' in vhost '%s': cannot write its log",
                              m.stream.name, m.stream.vhost)
                self._fail(m)
            self.check_role(m)
            if rep.header is not None and rep.header[2] != m.stream.arguments:
                self.streams.learned(m.stream, rep.header[2])   # a joiner's snapshot
            if rep.dropped:
                dropped, rep.dropped = rep.dropped, []
                for v in dropped:
                    self.rep.to_peer(node_of(v), [STREAM_DELETE, m.stream.vhost,
                                                  m.stream.name, m.uid, v])
            if rep.committed_offset != before:
                moved.append(m.stream)
        if links is not None:
            links.flush()
        return moved

    @staticmethod
    def _queue(m: Member, msgs: list, links: Any) -> None:
        for msg in msgs:
            links.queue(node_of(msg.to), [STREAM_RAFT, m.stream.vhost, m.stream.name, m.uid,
                                          msg.to_wire()])

    def _fail(self, m: Member) -> None:
        """The member's proposals waiting will not be confirmed here: nack them."""
        waiting, m.waiting = m.waiting, {}
        after, m.after = m.after, []
        for b in [*waiting.values(), *(b for _, b in after)]:
            b.done(False)

    # ---- roles and routers -----------------------------------------------------------------
    def check_role(self, m: Member) -> None:
        r = m.rep.raft
        if r.is_leader and not m.leading:
            m.leading = True
            log.info("stream '%s' in vhost '%s': %s leads (term %d)", m.stream.name,
                     m.stream.vhost, self.node_id, r.term)
        elif m.leading and not r.is_leader:
            m.leading = False           # its consumers stay: they read here as from any member
            lost = m.rep.lost_proposals()
            for index in lost:
                b = m.waiting.pop(index, None)
                if b is not None:
                    b.done(False)
            after, m.after = m.after, []    # the chunks they wait for may be cut
            for _, b in after:
                b.done(False)
        leader = node_of(r.leader) if r.leader else None
        if leader is not None and (leader, r.term) != (m.known_leader, m.leader_term):
            m.known_leader, m.leader_term = leader, r.term
            answer_declares(m, moved=False)
            if m.leading:
                self.announce_all(m)
        elif leader is None:
            m.known_leader = None
        elif m.leading and m.announced != r.voters:
            self.announce_all(m)        # the members changed: the routers move its readers

    def announce_all(self, m: Member) -> None:
        """EV_QUEUE_LEADER for ``m`` to every router."""
        m.announced = frozenset(m.rep.raft.voters)
        for identity in list(self.streams.routers()):
            self.announce(m, identity)

    def announce(self, m: Member, identity: bytes) -> None:
        """EV_QUEUE_LEADER to one router, when the stream has a leader."""
        if m.known_leader is None:
            return
        self.streams.send(identity, [TAG_TOPOLOGY_EVENT, EV_QUEUE_LEADER, m.describe()])

    def moved(self, m: Member, identity: bytes) -> AMQPError:
        """The MOVED answer to a request this member cannot serve (it does not lead)."""
        self.announce(m, identity)
        return AMQPError(MOVED, f"stream '{m.stream.name}' is led by "
                                f"{m.known_leader or 'no member yet'}")

    def _announce_new_routers(self) -> None:
        peers = self.streams.routers()
        if len(self._announced) == len(peers) and all(i in self._announced for i in peers):
            return
        new = [i for i in peers if i not in self._announced]
        self._announced = set(peers)
        for m in self.members.values():
            if m.leading:
                for identity in new:
                    self.announce(m, identity)


def new_replica(member_id: str, directory: Any, voters: list | None, header: Any,
                max_segment_bytes: int) -> StreamReplica:
    """A stream member with the node's Raft clock settings."""
    return StreamReplica(member_id, directory, voters=voters, header=header,
                         rng=random.Random(), election_ticks=ELECTION_TICKS,
                         heartbeat_ticks=HEARTBEAT_TICKS,
                         max_segment_bytes=max_segment_bytes)
