"""A node's quorum queues: their groups, their disk, their links and their answers to routers
(design.md section 8, docs/replication.md).

:class:`Replication` is driven by the node's event loop (node/server.py) as the shard is:
:meth:`Replication.on_peer` with each message from another node, :meth:`Replication.tick`
from the shard's timers every TICK_MS, and :meth:`Replication.process` at the end of each turn,
which is where Raft's Ready is handled for every group at once: one write and one fsync of the
node's Raft log (the group commit), then the Raft messages, then the committed entries applied
to each queue (confirms and replies to routers are sent from there).

Requests from routers arrive through the shard's handlers (node/messages.py,
node/queue_requests.py), which call node/replication/requests.py, the group
(``Queue.replica``) and :meth:`Replication.announce`.
"""
from __future__ import annotations

import logging
from typing import Any

from shoal.shared.errors import AMQPError
from shoal.shared.wire import EV_QUEUE_LEADER, TAG_TOPOLOGY_EVENT, WIRE_VERSION, T

from shoal.node.replication import catalogue, dead_letters, membership, reconcile, requests
from shoal.node.replication.catalogue import Catalogue
from shoal.node.replication.group import QuorumGroup, answer_declares, new_raft
from shoal.node.replication.links import PeerLinks
from shoal.node.replication.log import Snapshot
from shoal.node.replication.machine import LAZY_MAX, QueueMachine
from shoal.node.replication.messages import FROM_LEADER
from shoal.node.replication.raft import APP, SNAP, Message
from shoal.node.replication.store import RaftStore

log = logging.getLogger("shoal.node.replication")

_RAFT, _PEER_HELLO, _GROUP_CREATE = int(T.RAFT), int(T.PEER_HELLO), int(T.GROUP_CREATE)
_CATALOGUE_TAGS = frozenset({int(T.PEER_CATALOGUE), int(T.PEER_EVENT), int(T.PEER_WANT)})
_GROUP_ASK, _GROUP_ANSWER = int(T.GROUP_ASK), int(T.GROUP_ANSWER)
#: replicated streams' messages: the shard's streams handle them (node/streams/members.py)
_STREAM_TAGS = frozenset({int(T.STREAM_RAFT), int(T.STREAM_CREATE), int(T.STREAM_DELETE),
                          int(T.STREAM_READERS)})
#: Marks a peer whose link closed as long silent (its last heard time).
OFFLINE_MS = 5000
#: Ticks a deleted group's leader keeps telling its followers the delete is committed.
RETIRE_TICKS = 20


class Replication:
    """The quorum queues of the node ``shard`` (node/shard.py), their Raft log ``store`` and
    the ``links`` to the other nodes (None: a node alone, whose groups have one member)."""

    def __init__(self, shard: Any, store: RaftStore, links: PeerLinks | None) -> None:
        self.shard = shard
        self.sink = shard
        self.node_id = shard.node_id
        self.store = store
        self.links = links
        self.member_id = membership.member_id(self.node_id, store.disk_id)
        self.groups: dict[tuple[str, str], QuorumGroup] = {}
        #: node id -> [member id, last heard (ms)]; PEER_HELLO every 500 ms is the
        #: node<->node heartbeat
        self.peers: dict[str, list] = {}
        #: peers treated as down: their link closed, or silent for ``link_heartbeat_timeout``
        #: (hung, cut off); offline in the management API until heard from again
        self.silent: set[str] = set()
        self._silence_ms = shard.settings.link_heartbeat_timeout * 1000
        self.outgoing: list[tuple[str, list]] = []     # sent after the turn's fsync
        self.ticks = 0
        self._announced: set[bytes] = set()
        #: declares that wait (at start) for the other nodes to be heard from
        self.waiting_declares: list[tuple] = []
        #: what this node knows of the others' topology, and tells them of its own
        self.catalogue = Catalogue(self.node_id, shard.incarnation, shard.catalogue_own,
                                   self.to_peer, lambda: self.links.nodes if self.links else [])
        #: deleted groups whose leader still tells the followers (``deleted``)
        self.retiring: list[QuorumGroup] = []
        self.now_ms = 0.0
        #: counters for the metrics: leader changes seen here
        self.stats_counts = {"leader_changes": 0}
        #: nodes in some group's ``wanted`` that left the configuration: first noticed (ms)
        self.departed: dict[str, float] = {}
        #: REPUBLISH confirm ids waiting for REPUBLISH_RESULT: id -> (group, discard index)
        self.confirms: dict[int, tuple[QuorumGroup, int]] = {}
        self.confirm_seq = 0

    def now(self) -> float:
        """The node's clock (ms): the shard's, set at every message and timer run."""
        return self.shard.timers.now

    @property
    def node_ids(self) -> list[str]:
        """Every node this one knows of (itself and its peers), sorted."""
        return sorted({self.node_id, *(self.links.nodes if self.links else ())})

    # ---- start -----------------------------------------------------------------------------
    def restore(self) -> int:
        """Rebuild the groups from the Raft log on disk, and the catalogue of the other nodes
        from its file; returns how many groups."""
        if self.store.directory is not None:
            catalogue.load(self.catalogue, self.store.directory / "catalogue")
        for key, disk in self.store.load().items():
            snap = disk.snapshot
            if snap is None or not isinstance(snap.data, dict):
                continue
            header = snap.data["queue"]
            raft = new_raft(self.member_id,
                            hard_state=disk.hard_state, snapshot=snap, entries=disk.entries)
            g = self.make_group(header, raft, list(snap.data.get("wanted") or []))
            if g is None:
                continue
            g.install(snap)
        return len(self.groups)

    def make_group(self, header: list, raft: Any, wanted: list[str]) -> QuorumGroup | None:
        vhost, name, args, uid = header[:4]
        try:
            cfg = requests.queue_config(header)
        except AMQPError as err:
            log.error("cannot restore quorum queue '%s': %s", name, err.text)
            return None
        old = self.shard.queues.get((vhost, name))
        if old is not None:
            self.shard.delete_queue(old)
        q = self.shard.new_queue(vhost, name, True, False, None, args, cfg)
        g = QuorumGroup(self, q, header, raft, wanted)
        q.replica = g
        self.shard.queues[(vhost, name)] = q
        self.groups[(vhost, name)] = g
        return g

    def online(self, node: str) -> bool:
        if node == self.node_id:
            return True
        p = self.peers.get(node)
        return p is not None and node not in self.silent

    def transfer(self, g: QuorumGroup, node: str | None) -> bool:
        """Hand the lead to the voter on ``node`` (``Raft.transfer_leadership``: it campaigns
        once its log is complete). Returns whether the transfer began."""
        r = g.raft
        target = next((m for m in r.voters if membership.node_of(m) == node), None)
        return target is not None and r.transfer_leadership(target)

    # ---- node links ------------------------------------------------------------------------
    def on_peer(self, identity: bytes, msg: list, now_ms: float) -> None:
        """A message from another node (PEER_HELLO, RAFT, GROUP_CREATE)."""
        self.now_ms = now_ms
        tag = msg[0]
        if tag == _RAFT:
            _, vhost, name, uid, wm = msg
            m = Message.from_wire(wm)
            self._heard(membership.node_of(m.frm), m.frm, now_ms)
            g = self.groups.get((vhost, name))
            if g is None or g.uid != uid:
                if m.to != self.member_id or m.type not in (APP, SNAP):
                    return
                # a leader replicates to this member, which has nothing of the group (a
                # new member, or this node's disk was wiped): join, empty; a snapshot follows
                g = self._join(vhost, name, uid)
                if g is None:
                    return
            if m.to != g.raft.id:
                return
            if m.type in FROM_LEADER:
                g.silent_ticks = 0
            g.raft.step(m)
            g.check_role()
            if g.heard(m.frm, m.term):
                g.queue.notify_work()       # its lease is back: deliver what waited
        elif tag == _PEER_HELLO:
            version, node, member = msg[1], msg[2], msg[3]
            if version == WIRE_VERSION:
                self._heard(node, member, now_ms)
                self.catalogue.heard(node, msg[4], now_ms)
        elif tag in _CATALOGUE_TAGS:
            self.catalogue.on_peer(msg, now_ms)
        elif tag in _STREAM_TAGS:
            if tag == int(T.STREAM_RAFT):
                frm = msg[4][1]
                self._heard(membership.node_of(frm), frm, now_ms)
            self.shard.streams.on_peer(msg, now_ms)
        elif tag == _GROUP_ASK:
            reconcile.on_ask(self, msg)
        elif tag == _GROUP_ANSWER:
            reconcile.on_answer(self, msg)
        elif tag == _GROUP_CREATE:
            _, vhost, name, uid, snap_w = msg
            snap = Snapshot.from_wire(snap_w)
            g = self.groups.get((vhost, name))
            if g is not None and g.uid == uid:
                return
            if self.member_id not in snap.voters:
                return
            raft = new_raft(self.member_id, snapshot=snap)
            g = self.make_group(snap.data["queue"], raft, list(snap.data.get("wanted") or []))
            if g is not None:
                g.snapshot = snap
                g.machine.last_active = float(snap.data.get("last_active") or 0)
                self.store.append(g.key, uid, "snap", snap_w)

    def to_peer(self, node: str, msg: list) -> None:
        """Queue ``msg`` for the link to ``node`` (sent with the turn's flush)."""
        if self.links is not None:
            self.links.queue(node, msg)

    def _join(self, vhost: str, name: str, uid: str) -> QuorumGroup | None:
        """An empty member of a group this node does not have: its queue is made when the
        leader's snapshot arrives (it carries the declaration)."""
        header = [vhost, name, {"x-queue-type": "quorum"}, uid]
        # a member dropped here and added back goes on from its term and vote (store.py)
        raft = new_raft(self.member_id, hard_state=self.store.unbury((vhost, name), uid))
        return self.make_group(header, raft, [])

    def _heard(self, node: str, member: str, now_ms: float) -> None:
        if node in self.silent:
            self.silent.discard(node)
            log.info("node %s is heard from again", node)
        p = self.peers.get(node)
        if p is None:
            self.peers[node] = [member, now_ms]
        else:
            p[0], p[1] = member, now_ms

    def peer_lost(self, node: str) -> None:
        """The link to ``node`` closed, or it was silent for ``link_heartbeat_timeout``: the
        groups it led elect a leader now."""
        self.silent.add(node)
        p = self.peers.get(node)
        if p is not None:
            p[1] = -OFFLINE_MS
        self.shard.streams.peer_lost(node)
        for g in self.groups.values():
            leader = g.raft.leader
            if leader is not None and membership.node_of(leader) == node:
                g.raft.peer_lost(leader, g.election_delay(leader))
            elif g.raft.is_leader:
                for m in list(g.raft.progress):
                    if membership.node_of(m) == node:
                        g.raft.peer_lost(m)

    # ---- the clock -------------------------------------------------------------------------
    def tick(self, now_ms: float) -> None:
        """Every TICK_MS: each group's Raft clock; PEER_HELLO every 5 ticks (the first at
        once); membership repair for the groups this node leads every 10."""
        self.ticks += 1
        self.now_ms = now_ms
        if self.waiting_declares:
            waiting, self.waiting_declares = self.waiting_declares, []
            for d in waiting:
                try:
                    requests.declare(self, *d)
                except AMQPError as err:
                    requests.reply(self, d[0], d[1], None, err.reply_code, err.text)
        for g in list(self.retiring):
            g.raft.tick()
            g.retire_ticks -= 1
            r = g.raft
            if g.retire_ticks <= 0 or not r.is_leader:
                self.retiring.remove(g)
        for g in list(self.groups.values()):
            g.raft.tick()
            g.silent_ticks += 1
            g.check_role()
            if g.leading:
                g.check_expiry()
                if g.dlx is not None:
                    g.dlx.tick(now_ms)
        if self.links is not None and self.ticks % 5 == 1:
            self.links.broadcast([_PEER_HELLO, WIRE_VERSION, self.node_id, self.member_id,
                                  self.catalogue.seq])
        for node, p in self.peers.items():
            if node not in self.silent and now_ms - p[1] > self._silence_ms:
                log.warning("node %s silent for %d ms: treating it as down", node,
                            now_ms - p[1])
                self.peer_lost(node)
        if self.ticks % 10 == 0:
            reconcile.reconcile(self, now_ms)
            self._repair()
            if self.catalogue.dirty and self.store.directory is not None:
                try:
                    catalogue.save(self.store.directory / "catalogue", self.catalogue.dump())
                except OSError as exc:
                    log.warning("cannot save the catalogue of the other nodes: %s", exc)

    def _repair(self) -> None:
        current = {n: p[0] for n, p in self.peers.items() if self.online(n)}
        current[self.node_id] = self.member_id
        for g in self.groups.values():
            step = membership.step_toward(g.raft, self.node_id, current, g.wanted)
            if step is not None and step[0] != "transfer":
                log.info("quorum queue '%s': %s %s", g.key[1], *step)

    # ---- the turn's Ready ------------------------------------------------------------------
    def process(self) -> None:
        """Handle every group's Ready: persist (one fsync), send, apply, advance."""
        if not self.groups and not self.retiring and not self.outgoing:
            if self.links is not None and self.links.out:
                self.links.flush()              # PEER_HELLOs
            return                              # a node without quorum queues: nothing
        self._announce_new_routers()
        for rnd in range(4):
            for g in self.groups.values():
                if g.has_turn_entries():
                    g.log_turn(rnd == 0)    # the turn's deliveries, dead letters: an entry
            readies = [(g, g.raft.ready()) for g in list(self.groups.values())
                       if not g.deleted and g.raft.has_ready()]
            for g in self.retiring:
                if g.raft.has_ready():
                    rd = g.raft.ready()         # only its messages: the queue is gone
                    for m in rd.messages:
                        self.outgoing.append((membership.node_of(m.to), [
                            _RAFT, g.key[0], g.key[1], g.uid, m.to_wire()]))
                    g.raft.advance(rd)
            if not readies and not self.outgoing:
                if self.links is not None and self.links.out:
                    self.links.flush()          # PEER_HELLOs
                return
            store = self.store
            for g, rd in readies:
                if rd.snapshot is not None:
                    store.append(g.key, g.uid, "snap", rd.snapshot.to_wire())
                if rd.entries:
                    store.append(g.key, g.uid, "ents", [e.to_wire() for e in rd.entries])
                if rd.hard_state is not None:
                    hs = rd.hard_state
                    store.append(g.key, g.uid, "hs", [hs.term, hs.vote, hs.commit])
            try:
                store.sync()
            except OSError as exc:      # the disk failed: send and apply nothing
                log.error("cannot write the Raft log: %s", exc)
                return
            links = self.links
            for node, msg in self.outgoing:
                if links is not None:
                    links.queue(node, msg)
            self.outgoing.clear()
            for g, rd in readies:
                if links is not None:
                    for m in rd.messages:
                        links.queue(membership.node_of(m.to),
                                    [_RAFT, g.key[0], g.key[1], g.uid, m.to_wire()])
            if links is not None:
                links.flush()
            for g, rd in readies:
                if rd.snapshot is not None:
                    self._install(g, rd.snapshot)
                for e in rd.committed:
                    if g.deleted:
                        break
                    g.apply(e)
                g.raft.advance(rd)
                g.check_role()
                snap = g.maybe_compact() if not g.deleted else None
                if snap is not None:
                    store.append(g.key, g.uid, "compact", snap.to_wire())
            if store.wants_rewrite():
                self._rewrite()

    def _install(self, g: QuorumGroup, snap: Snapshot) -> None:
        """A snapshot from the leader; a member that joined empty learns the queue's
        declaration from it and makes the queue as declared."""
        data = snap.data if isinstance(snap.data, dict) else {}
        header = data.get("queue")
        if header is not None and header != g.header:
            vhost, name, args = header[:3]
            try:
                cfg = requests.queue_config(header)
            except AMQPError as err:
                log.error("quorum queue '%s': bad declaration in snapshot: %s", name, err.text)
                return
            old = g.queue
            q = self.shard.new_queue(vhost, name, True, False, None, args, cfg)
            q.replica = g
            q.sink = None
            if self.shard.queues.get(g.key) is old:
                self.shard.queues[g.key] = q
            g.queue, g.header = q, header
            g.machine = QueueMachine(q, LAZY_MAX)
            g.wanted = list(data.get("wanted") or g.wanted)
        g.install(snap)

    def _rewrite(self) -> None:
        try:
            self.store.rewrite((g.key, g.uid, g.raft.hard_state(), g.snapshot,
                                g.raft.log.entries) for g in self.groups.values())
        except OSError as exc:
            log.error("cannot rewrite the Raft log: %s", exc)

    # ---- what the routers are told ---------------------------------------------------------
    def send(self, identity: bytes, msg: list) -> None:
        """A message to a router that is still connected (a group's held deliveries)."""
        if identity in self.shard.peers:
            self.shard.send(identity, msg)

    def dead_letter_confirm(self, g: QuorumGroup, index: int) -> int:
        """A confirm id for a REPUBLISH of ``g``'s discard ``index`` (dead_letters.py)."""
        return dead_letters.confirm_id(self, g, index)

    def dead_letter_result(self, confirm: int, ok: bool) -> None:
        """REPUBLISH_RESULT from a router (dead_letters.py)."""
        dead_letters.on_result(self, confirm, ok)

    def leader_changed(self, g: QuorumGroup) -> None:
        self.stats_counts["leader_changes"] += 1
        if g.raft.is_leader:
            for identity in list(self.shard.peers):
                self.announce(g, identity)

    def announce(self, g: QuorumGroup, identity: bytes) -> None:
        """EV_QUEUE_LEADER to one router, when the group has a leader."""
        if g.known_leader is None or identity not in self.shard.peers:
            return
        self.shard.send(identity, [TAG_TOPOLOGY_EVENT, EV_QUEUE_LEADER, self.describe(g)])

    def describe(self, g: QuorumGroup) -> list:
        """[vhost, name, leader, term, members, online]."""
        members = g.members()
        return [g.key[0], g.key[1], g.known_leader, g.leader_term, members,
                [n for n in members if self.online(n)]]

    def _announce_new_routers(self) -> None:
        peers = self.shard.peers
        if len(self._announced) == len(peers) and all(i in self._announced for i in peers):
            return
        new = [i for i in peers if i not in self._announced]
        self._announced = set(peers)
        for g in self.groups.values():
            if g.raft.is_leader:
                for identity in new:
                    self.announce(g, identity)

    def stopped_leading(self, g: QuorumGroup) -> None:
        """This member lost the lead: its consumers go (the routers register them with the
        new leader) and what they held acquired is released (redelivered)."""
        q = g.queue
        for c in list(q.qcm.all):
            c.peer.consumers.pop(c.consumer_id, None)
            q.remove_consumer(c)
        for state in self.shard.peers.values():
            for did, e in list(state.unsettled.items()):
                if e.queue is q:
                    del state.unsettled[did]
                    q.release(e)

    def deleted(self, g: QuorumGroup) -> None:
        """The delete was applied: the queue goes on this member. A leader keeps its Raft
        member a while (RETIRE_TICKS: heartbeats carry its commit index), sending only,
        so that the followers learn the delete is committed."""
        if self.groups.get(g.key) is g:
            del self.groups[g.key]
        answer_declares(g, moved=True)
        if g.leading:
            g.retire_ticks = RETIRE_TICKS
            self.retiring.append(g)
        self.store.append(g.key, g.uid, "del", None)
        q = self.shard.queues.get(g.key)
        if q is g.queue:
            q.sink = self.shard
            self.shard.delete_queue(q)

    def forget(self, g: QuorumGroup) -> None:
        """Drop a group that no longer exists elsewhere (reconcile.py), and this node's copy
        of its queue, without telling the routers: the name may be another queue's now."""
        if self.groups.get(g.key) is g:
            del self.groups[g.key]
        answer_declares(g, moved=True)
        self.store.bury(g.key, g.uid, g.raft.hard_state())
        q = self.shard.queues.get(g.key)
        if q is g.queue:
            del self.shard.queues[g.key]
            q.delete()

    def stats(self) -> dict:
        """NODE_STATS' ``raft``: ``{"leader_changes": n, "groups": [[vhost, name, role, term,
        commit, applied, last_index, snapshot_index, entries, {node: entries behind}], ...]}``
        (the lag of each member as its leader sees it; empty on followers)."""
        rows = []
        for g in self.groups.values():
            r = g.raft
            lag = {membership.node_of(m): max(0, r.log.last_index - pr.match)
                   for m, pr in r.progress.items() if m != r.id} if r.is_leader else {}
            rows.append([g.key[0], g.key[1], r.state, r.term, r.log.committed, r.log.applied,
                         r.log.last_index, r.log.snap_index, len(r.log.entries), lag])
        return {"leader_changes": self.stats_counts["leader_changes"], "groups": rows,
                "fsyncs": self.store.fsyncs}

    def close(self) -> None:
        if self.links is not None:
            self.links.close()
        self.store.close()

