"""The sans-IO Raft core (design.md section 8; the Raft paper and dissertation; modelled on
etcd's raft library, ``raft.go``).

A :class:`Raft` is one member of one group. It does no I/O and reads no clock: the host calls
:meth:`Raft.tick` at a fixed interval, :meth:`Raft.step` with each message received,
:meth:`Raft.propose` with new commands, and then, while :meth:`Raft.has_ready`, takes a
:class:`Ready` and must, in this order:

1. persist ``ready.snapshot`` (when not None), ``ready.entries`` (cutting its log from
   ``entries[0].index`` first) and then ``ready.hard_state`` (when not None), in that order
   (as etcd's WAL: a torn write must never keep a commit index past the entries it covers),
   and make them durable (fsync; one group commit for every group of the node);
2. send ``ready.messages``;
3. apply ``ready.committed`` in order (a snapshot first, when there is one);
4. call :meth:`Raft.advance` with the Ready.

What it implements: leader election with randomized timeouts and pre-vote (dissertation 9.6),
check-quorum (a leader that has not heard from a majority for an election timeout steps down),
log replication with log matching and commit by majority of the current term's entries
(paper 5.3, 5.4.2), term fencing (a message from an older term is never acted on; a deposed
leader learns the new term from the first answer), snapshots and log compaction (paper 7),
learners and membership changes one member at a time (dissertation 4.1, with etcd's rule that a
leader proposes no change until the previous one and its own first entry are applied).
A lost peer's link (the host's disconnect event) starts an election at once instead of waiting
out the election timeout: :meth:`Raft.peer_lost`.

Messages are :class:`Message`; ``to_wire``/``from_wire`` give msgpack-ready lists.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from shoal.node.replication import quorum
from shoal.node.replication.messages import (  # noqa: F401 (the core's names, re-exported)
    APP, APP_RESP, HEARTBEAT, HEARTBEAT_RESP, PRE_VOTE, PRE_VOTE_RESP, SNAP, TIMEOUT_NOW, VOTE,
    VOTE_RESP, HardState, Message, Ready)
from shoal.node.replication.progress import PROBE, REPLICATE, SNAPSHOT, Progress
from shoal.node.replication.log import (ADD_LEARNER, ADD_VOTER, CONF, NORMAL, REMOVE, Entry,
                                        RaftLog, Snapshot)

FOLLOWER, PRE_CANDIDATE, CANDIDATE, LEADER = "follower", "pre_candidate", "candidate", "leader"

#: Entries per MsgApp.
MAX_APPEND = 256


def bootstrap(voters: tuple | list, data: Any = None) -> Snapshot:
    """The snapshot every first member of a new group starts from (the host persists it):
    index 1, term 1, the configuration and the host's initial state. A member that joins
    later starts empty and is sent a snapshot (a leader never sends entries after index 0)."""
    return Snapshot(1, 1, tuple(sorted(voters)), (), data)


class Raft:
    """One member ``id`` of a group.

    ``voters``/``learners``: the configuration when there is no ``snapshot`` (a member that
    joins starts empty; a first member starts from :func:`bootstrap`; a member restored from
    disk passes its snapshot, and its configuration comes from it and the CONF entries in
    ``entries``). ``hard_state``, ``snapshot``, ``entries``: what the
    host had persisted. ``election_ticks``: the election timeout in ticks (randomized per
    election in ``[election_ticks, 2 * election_ticks)``); ``heartbeat_ticks``: the leader's
    heartbeat interval. ``rng``: the only randomness (seeded in the simulator).
    ``snapshot_source()``: the host's state machine as of the last entry it applied (the data
    of a Snapshot sent to a follower that is behind the log, or new and empty).

    ``max_append_bytes``: a byte budget per APP. A stream's member (node/streams/replica.py)
    keeps its log in its segments: ``reader``
    reads back the persisted entries up to ``disk_last`` (none in memory at start),
    ``applied`` says how far its state already reflects the log (its configuration, given in
    ``snapshot``, is as of that index), and ``peer_snapshot()`` gives the Snapshot a follower
    behind the log gets (its log's start, where retention cut it, not the applied index).
    """

    def __init__(self, id: str, voters: tuple | list = (), learners: tuple | list = (), *,
                 election_ticks: int = 10, heartbeat_ticks: int = 1,
                 rng: random.Random | None = None, hard_state: HardState | None = None,
                 snapshot: Snapshot | None = None, entries: list[Entry] | None = None,
                 pre_vote: bool = True, check_quorum: bool = True,
                 snapshot_source: Callable[[], Any] = lambda: None,
                 reader: Any = None, disk_last: int = 0, applied: int = 0,
                 peer_snapshot: Callable[[], Snapshot | None] | None = None,
                 max_append_bytes: int | None = None) -> None:
        self.id = id
        self.rng = rng or random.Random()
        self.election_ticks = election_ticks
        self.heartbeat_ticks = heartbeat_ticks
        self.pre_vote = pre_vote
        self.check_quorum = check_quorum
        self.log = RaftLog(reader=reader)
        self.peer_snapshot = peer_snapshot
        #: an APP carries entries of at most this many bytes of data (at least one entry):
        #: a stream's entries are chunks
        self.max_append_bytes = max_append_bytes
        self.voters: set[str] = set(voters)
        #: counts configuration changes (a cache of the voters knows when it is stale)
        self.conf_seq = 0
        self.learners: set[str] = set(learners)
        self.snapshot_source = snapshot_source
        if snapshot is not None:
            self.log.restore(snapshot)
            self.voters, self.learners = set(snapshot.voters), set(snapshot.learners)
        if entries:
            self.log.append([e for e in entries if e.index > self.log.snap_index])
            self.log.stable = self.log.last_index
        if reader is not None and disk_last > self.log.snap_index:
            self.log.mem_base = self.log.stable = disk_last
        hs = hard_state or HardState()
        self.term = hs.term
        self.vote = hs.vote
        # The host rebuilds its state machine from the snapshot and then every committed
        # entry, which come out in the first Ready (CONF entries take effect as they do).
        self.log.committed = max(self.log.committed, min(hs.commit, self.log.last_index))
        if applied > self.log.applied:      # a stream's: its state is as of ``applied``
            self.log.applied = min(applied, self.log.committed)
        self.state = FOLLOWER
        self.leader: str | None = None
        self.progress: dict[str, Progress] = {}
        self.votes: dict[str, bool] = {}
        self.msgs: list[Message] = []
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_timeout = 0
        self.pending_conf_index = 0
        self._pending_snapshot: Snapshot | None = None
        self._append_dirty = False      # entries proposed since the last broadcast
        #: a leadership transfer under way: its target, and ticks since it began
        self.transferee: str | None = None
        self.transfer_elapsed = 0
        self._prev_hs = HardState(self.term, self.vote, self.log.committed)
        self._reset_timeout()

    # ---- queries ---------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        return self.state == LEADER

    @property
    def commit(self) -> int:
        return self.log.committed

    @property
    def last_index(self) -> int:
        return self.log.last_index

    def promotable(self) -> bool:
        """A voter (not a learner, not removed) may campaign."""
        return self.id in self.voters

    def hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.log.committed)

    # ---- input -----------------------------------------------------------------------------
    def tick(self) -> None:
        """One tick of the host's clock."""
        if self.state == LEADER:
            self.heartbeat_elapsed += 1
            self.election_elapsed += 1
            if self.transferee is not None:
                self.transfer_elapsed += 1
                if self.transfer_elapsed >= self.election_ticks:
                    self.transferee = None          # given up: proposals again
            if self.election_elapsed >= self.election_ticks:
                self.election_elapsed = 0
                if self.check_quorum and not self._quorum_active():
                    self._become_follower(self.term, None)
                    return
                for pr in self.progress.values():   # a snapshot lost on the way: resend
                    if pr.state == SNAPSHOT:
                        pr.state, pr.pending_snapshot, pr.paused = PROBE, 0, False
            if self.heartbeat_elapsed >= self.heartbeat_ticks:
                self.heartbeat_elapsed = 0
                self._broadcast_heartbeat()
        else:
            self.election_elapsed += 1
            if self.promotable() and self.election_elapsed >= self.randomized_timeout:
                self.election_elapsed = 0
                self.campaign()

    def transfer_leadership(self, to: str) -> bool:
        """Hand the lead to voter ``to`` (etcd's leader transfer, dissertation 3.10): no new
        proposal is taken meanwhile; once ``to``'s log is complete it gets TIMEOUT_NOW and
        campaigns at once, without pre-vote, with a vote its peers grant inside this leader's
        lease. Given up after an election timeout. False when it cannot start."""
        if self.state != LEADER or to == self.id or to not in self.voters or \
                to not in self.progress:
            return False
        self.transferee, self.transfer_elapsed = to, 0
        if self.progress[to].match == self.log.last_index:
            self._send(Message(TIMEOUT_NOW, self.id, to, self.term))
        else:
            self._send_append(to)
        return True

    def peer_lost(self, peer: str, delay_ticks: int = 0) -> None:
        """The host's link to ``peer`` closed (a crashed process: a closed socket is a death
        certificate). A follower whose leader it was forgets the leader and campaigns after
        ``delay_ticks`` (the host staggers members so that one wins at once) instead of the
        election timeout; its peers, which saw the same, grant its pre-vote."""
        if self.state == LEADER:
            pr = self.progress.get(peer)
            if pr is not None:
                pr.recent_active = False
            return
        if peer == self.leader:
            self.leader = None
            self.election_elapsed = 0
            self.randomized_timeout = max(1, delay_ticks)

    def campaign(self, pre_vote_won: bool = False, transfer: bool = False) -> None:
        """Start an election now: a pre-vote first when enabled, the real vote once a
        majority granted it (``pre_vote_won``); a transfer's vote at once."""
        if not self.promotable():
            return
        if self.pre_vote and not pre_vote_won and not transfer:
            self._become_pre_candidate()
            kind, term = PRE_VOTE, self.term + 1
        else:
            self._become_candidate()
            kind, term = VOTE, self.term
        self.votes = {self.id: True}
        if quorum.vote_result(self.voters, self.votes) == 1:
            if kind == PRE_VOTE:
                self.campaign(True)
            else:
                self._become_leader()
            return
        for v in sorted(self.voters):
            if v != self.id:
                self._send(Message(kind, self.id, v, term, self.log.last_term,
                                   self.log.last_index, transfer=transfer))

    def propose(self, data: Any) -> int | None:
        """Append a command as leader; returns its index (it is committed when an entry with
        that index and this term is in a Ready's ``committed``), or None when not leader."""
        if self.state != LEADER or self.transferee is not None:
            return None
        return self._append_entry(NORMAL, data)

    def propose_conf(self, op: str, member: str) -> int | None:
        """Propose one membership change (``ADD_VOTER``, ``ADD_LEARNER``, ``REMOVE``); None
        when not leader, when a change is still pending, when it changes nothing, or when it
        would remove the leader itself."""
        if self.state != LEADER or self.pending_conf_index > self.log.applied or \
                self.transferee is not None:
            return None
        if op == REMOVE and (member == self.id or member not in self.voters | self.learners):
            return None
        if op == ADD_VOTER and member in self.voters:
            return None
        if op == ADD_LEARNER and member in self.voters | self.learners:
            return None
        index = self._append_entry(CONF, [op, member])
        self.pending_conf_index = index
        return index

    def step(self, m: Message) -> None:
        """Handle one message from a peer (etcd ``Step``)."""
        if m.term > self.term:
            if m.type in (PRE_VOTE, VOTE):
                in_lease = self.check_quorum and self.leader is not None and \
                    self.election_elapsed < self.election_ticks and not m.transfer
                if in_lease:
                    return          # a leader is alive: ignore a disruptive candidate
            if m.type == PRE_VOTE or (m.type == PRE_VOTE_RESP and not m.reject):
                pass                # pre-votes never change the term
            else:
                leader = m.frm if m.type in (APP, HEARTBEAT, SNAP) else None
                self._become_follower(m.term, leader)
        elif m.term < self.term:
            if m.type in (APP, HEARTBEAT) and (self.check_quorum or self.pre_vote):
                # a deposed leader (or one cut off) learns the term and steps down
                self._send(Message(APP_RESP, self.id, m.frm, self.term))
            elif m.type == PRE_VOTE:
                self._send(Message(PRE_VOTE_RESP, self.id, m.frm, self.term, reject=True))
            return
        if m.type in (VOTE, PRE_VOTE):
            self._on_vote_request(m)
        elif self.state == LEADER:
            self._step_leader(m)
        elif self.state in (CANDIDATE, PRE_CANDIDATE):
            self._step_candidate(m)
        else:
            self._step_follower(m)

    # ---- roles -----------------------------------------------------------------------------
    def _reset(self, term: int) -> None:
        if term != self.term:
            self.term = term
            self.vote = None
        self.leader = None
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self._reset_timeout()
        self.votes = {}
        self.progress = {}
        self.pending_conf_index = 0
        self.transferee = None

    def _reset_timeout(self) -> None:
        self.randomized_timeout = self.election_ticks + self.rng.randrange(self.election_ticks)

    def _become_follower(self, term: int, leader: str | None) -> None:
        self._reset(term)
        self.state = FOLLOWER
        self.leader = leader

    def _become_pre_candidate(self) -> None:
        # etcd: no term change, no vote change; but no leader either, and a normal randomized
        # timeout before trying again (one peer_lost shortened it once, not for good)
        self.state = PRE_CANDIDATE
        self.votes = {}
        self.leader = None
        self._reset_timeout()

    def _become_candidate(self) -> None:
        self._reset(self.term + 1)
        self.vote = self.id
        self.state = CANDIDATE

    def _become_leader(self) -> None:
        self._reset(self.term)
        self.state = LEADER
        self.leader = self.id
        last = self.log.last_index
        for p in self.voters | self.learners:
            self.progress[p] = Progress(match=0, next=last + 1, learner=p in self.learners)
        if self.id in self.progress:
            self.progress[self.id].match = last
            self.progress[self.id].recent_active = True
        # No membership change until this term's first entry is applied (etcd): a single-
        # member change proposed before it could overlap an uncommitted one of an old term.
        self.pending_conf_index = last
        self._append_entry(NORMAL, None)

    # ---- voting ----------------------------------------------------------------------------
    def _on_vote_request(self, m: Message) -> None:
        resp = PRE_VOTE_RESP if m.type == PRE_VOTE else VOTE_RESP
        can_vote = self.vote == m.frm or (self.vote is None and self.leader is None) or \
            (m.type == PRE_VOTE and m.term > self.term)
        if can_vote and self.log.is_up_to_date(m.index, m.log_term):
            self._send(Message(resp, self.id, m.frm, m.term))
            if m.type == VOTE:
                self.election_elapsed = 0
                self.vote = m.frm
        else:
            self._send(Message(resp, self.id, m.frm, self.term, reject=True))

    def _step_candidate(self, m: Message) -> None:
        my_resp = PRE_VOTE_RESP if self.state == PRE_CANDIDATE else VOTE_RESP
        if m.type in (APP, HEARTBEAT, SNAP):
            self._become_follower(m.term, m.frm)
            self._step_follower(m)
        elif m.type == my_resp:
            self.votes.setdefault(m.frm, not m.reject)
            result = quorum.vote_result(self.voters, self.votes)
            if result == 1:
                if self.state == PRE_CANDIDATE:
                    self.campaign(True)
                else:
                    self._become_leader()
                    self._broadcast_append()
            elif result == -1:
                self._become_follower(self.term, None)

    # ---- follower --------------------------------------------------------------------------
    def _step_follower(self, m: Message) -> None:
        if m.type in (APP, HEARTBEAT, SNAP) and self.randomized_timeout < self.election_ticks:
            # peer_lost shortened the timeout for a member without a leader; one is heard
            # again (the link only flapped, or a new leader won): back to a randomized timeout,
            # or two lost heartbeats would depose a healthy leader (the paper's 5.2 timeouts)
            self._reset_timeout()
        if m.type == APP:
            self.election_elapsed = 0
            self.leader = m.frm
            self._handle_append(m)
        elif m.type == HEARTBEAT:
            self.election_elapsed = 0
            self.leader = m.frm
            self.log.commit_to(min(m.commit, self.log.last_index))
            self._send(Message(HEARTBEAT_RESP, self.id, m.frm, self.term))
        elif m.type == SNAP:
            self.election_elapsed = 0
            self.leader = m.frm
            self._handle_snapshot(m)
        elif m.type == TIMEOUT_NOW and m.frm == self.leader:
            self.campaign(transfer=True)        # the leader hands over: no pre-vote

    def _handle_append(self, m: Message) -> None:
        if m.index < self.log.committed:
            self._send(Message(APP_RESP, self.id, m.frm, self.term, index=self.log.committed))
            return
        last = self.log.maybe_append(m.index, m.log_term, m.commit, m.entries)
        if last is not None:
            self._send(Message(APP_RESP, self.id, m.frm, self.term, index=last))
        else:
            self._send(Message(APP_RESP, self.id, m.frm, self.term, index=m.index,
                               reject=True, reject_hint=self.log.last_index))

    def _handle_snapshot(self, m: Message) -> None:
        s = m.snapshot
        if s is None or s.index <= self.log.committed:
            self._send(Message(APP_RESP, self.id, m.frm, self.term, index=self.log.committed))
            return
        if self.log.match_term(s.index, s.term):
            # we have it: just fast-forward the commit index, and acknowledge only that
            # (etcd: the entries after it are not known to match the leader's)
            self.log.commit_to(s.index)
            self._send(Message(APP_RESP, self.id, m.frm, self.term, index=self.log.committed))
            return
        self.log.restore(s)
        self.voters, self.learners = set(s.voters), set(s.learners)
        self.conf_seq += 1
        self._pending_snapshot = s
        self._send(Message(APP_RESP, self.id, m.frm, self.term, index=self.log.last_index))

    # ---- leader ----------------------------------------------------------------------------
    def _step_leader(self, m: Message) -> None:
        pr = self.progress.get(m.frm)
        if pr is None:
            return
        pr.recent_active = True
        if m.type == APP_RESP:
            if m.reject:
                if pr.state == PROBE and m.index == pr.next - 1 and m.index <= pr.match \
                        and m.reject_hint == 0:
                    # the answer to the probe in flight, from a member that holds nothing
                    # though it acknowledged entries: made again, empty, under its id
                    # (added back after its removal: membership.py) while an
                    # acknowledgement of its old self was still on its way. Start it over
                    # (stream simulator, seed 5515: else the leader takes every probe's
                    # rejection as stale and never sends it anything again). Only an empty
                    # log's hint: a late copy of an older rejection from a member that
                    # held part of the log would rewind it for nothing (seeds 987, 1831).
                    # A match only lowered never lowers the commit index.
                    pr.match = 0
                elif m.index <= pr.match or (pr.state == PROBE and m.index != pr.next - 1):
                    # a stale rejection (etcd MaybeDecrTo): of an index already matched, or
                    # of an older probe than the one in flight
                    return
                if pr.state == REPLICATE:
                    pr.state = PROBE
                # back up to the follower's last index, at most one before the rejected one
                pr.next = max(pr.match + 1, min(m.index, m.reject_hint + 1))
                pr.paused = False
                self._send_append(m.frm)
                return
            if m.index > pr.match:
                pr.match = m.index
                pr.next = max(pr.next, m.index + 1)
                pr.paused = False
                if pr.state == SNAPSHOT and pr.match >= pr.pending_snapshot:
                    pr.state, pr.pending_snapshot = PROBE, 0
                if pr.state == PROBE:
                    pr.state = REPLICATE
                if self._maybe_commit():
                    self._broadcast_append()
                elif pr.match < self.log.last_index:
                    self._send_append(m.frm)
                if m.frm == self.transferee and pr.match == self.log.last_index:
                    self._send(Message(TIMEOUT_NOW, self.id, m.frm, self.term))
            elif pr.state == SNAPSHOT and m.index >= pr.pending_snapshot:
                pr.state, pr.pending_snapshot, pr.paused = PROBE, 0, False
        elif m.type == HEARTBEAT_RESP:
            if pr.state != SNAPSHOT:
                pr.paused = False
            if pr.match < self.log.last_index:
                if pr.state == REPLICATE and pr.next > self.log.last_index:
                    # Everything was sent and nothing more was acknowledged over a whole
                    # heartbeat: an append was lost. Probe from the match again (etcd gets
                    # there through an empty append that the follower rejects).
                    if pr.stalled_at == pr.match:
                        pr.state, pr.next, pr.stalled_at = PROBE, pr.match + 1, -1
                    else:
                        pr.stalled_at = pr.match
                self._send_append(m.frm)

    def _maybe_commit(self) -> bool:
        match = {p: pr.match for p, pr in self.progress.items()}
        match[self.id] = self.log.last_index if self.id in self.voters else 0
        index = quorum.committed_index(self.voters, match)
        # Raft 5.4.2: only an entry of the current term is committed by counting replicas.
        if index > self.log.committed and self.log.term(index) == self.term:
            self.log.commit_to(index)
            return True
        return False

    def _quorum_active(self) -> bool:
        active = {p: pr.recent_active for p, pr in self.progress.items()}
        active[self.id] = True
        for pr in self.progress.values():
            pr.recent_active = False
        return quorum.vote_result(self.voters, active) == 1

    def _append_entry(self, kind: int, data: Any) -> int:
        index = self.log.last_index + 1
        self.log.append([Entry(self.term, index, kind, data)])
        if self.id in self.progress:
            self.progress[self.id].match = index
        if len(self.voters) == 1:
            # the commit index is the median of the voters' matches, and the leader's own is
            # the highest: it moves the median only when it is the only voter
            self._maybe_commit()
        self._append_dirty = True       # sent by the next ready(): one APP per peer per turn
        return index

    def _broadcast_append(self) -> None:
        for p in sorted(self.progress):
            if p != self.id:
                self._send_append(p)

    def _broadcast_heartbeat(self) -> None:
        for p, pr in sorted(self.progress.items()):
            if p != self.id:
                pr.paused = False if pr.state == PROBE else pr.paused
                if pr.state == PROBE and pr.match == 0:
                    # never heard from (a member just added, whose host knows nothing of the
                    # group yet and ignores heartbeats): probe it with an append instead
                    self._send_append(p)
                    continue
                self._send(Message(HEARTBEAT, self.id, p, self.term,
                                   commit=min(pr.match, self.log.committed)))

    def _send_append(self, to: str) -> None:
        pr = self.progress[to]
        if pr.state == SNAPSHOT or pr.paused:
            return
        prev = pr.next - 1
        prev_term = self.log.term(prev)
        if prev_term is None or pr.next <= self.log.snap_index or prev == 0:
            # behind our log, or new and empty (it needs the configuration too)
            snap = self.snapshot_for_peer()
            if snap is None:
                return
            pr.state, pr.pending_snapshot = SNAPSHOT, snap.index
            self._send(Message(SNAP, self.id, to, self.term, snapshot=snap))
            return
        last = min(self.log.last_index, prev + MAX_APPEND)
        entries = self.log.slice(pr.next, last) if pr.next <= last else []
        if self.max_append_bytes is not None and len(entries) > 1:
            size = 0
            for k, e in enumerate(entries):
                size += len(e.data) if isinstance(e.data, bytes) else 16
                if size > self.max_append_bytes and k:
                    del entries[k:]
                    break
        if not entries and pr.state == REPLICATE and prev >= self.log.last_index and \
                pr.match >= self.log.committed:
            return          # nothing new for it: heartbeats carry the commit index
        self._send(Message(APP, self.id, to, self.term, prev_term, prev, list(entries),
                           self.log.committed))
        if pr.state == REPLICATE and entries:
            pr.next = entries[-1].index + 1
        elif pr.state == PROBE:
            pr.paused = True

    def snapshot_for_peer(self) -> Snapshot | None:
        """A snapshot of the state machine as of the applied index (``snapshot_source``),
        with the configuration then; None before anything was applied."""
        if self.peer_snapshot is not None:
            return self.peer_snapshot()
        index = self.log.applied
        if index == 0:
            return None
        return Snapshot(index, self.log.term(index) or 0, tuple(sorted(self.voters)),
                        tuple(sorted(self.learners)), self.snapshot_source())

    # ---- host interface --------------------------------------------------------------------
    def compact(self, index: int, data: Any) -> Snapshot:
        """The host took a snapshot of its state machine as of the applied ``index`` (``<=``
        what it has applied): drop the log up to it. Returns the Snapshot, which the host
        persists (then truncates its log file up to ``index``)."""
        term = self.log.term(index)
        assert term is not None, f"compact at unknown index {index}"
        assert index == self.log.applied, "the configuration is known at the applied index"
        snap = Snapshot(index, term, tuple(sorted(self.voters)), tuple(sorted(self.learners)),
                        data)
        self.log.compact(index)
        return snap

    def _send(self, m: Message) -> None:
        self.msgs.append(m)

    def has_ready(self) -> bool:
        return bool(self.msgs or self._append_dirty or self.log.unstable() or self.log.to_apply() or
                    self._pending_snapshot is not None or self.hard_state() != self._prev_hs)

    def ready(self) -> Ready:
        """The host's work now (see the module docstring). Call :meth:`advance` after it."""
        if self._append_dirty:
            self._append_dirty = False
            if self.state == LEADER:
                self._broadcast_append()
        hs = self.hard_state()
        msgs, self.msgs = self.msgs, []
        return Ready(hs if hs != self._prev_hs else None, self._pending_snapshot,
                     self.log.unstable(), msgs, self.log.to_apply())

    def advance(self, rd: Ready) -> None:
        """The host did what ``rd`` asked: its entries are durable, its committed entries
        applied. CONF entries take effect here (on apply, as in etcd)."""
        if rd.hard_state is not None:
            self._prev_hs = rd.hard_state
        if rd.snapshot is not None and self._pending_snapshot is rd.snapshot:
            self._pending_snapshot = None
        if rd.entries:
            self.log.stable = max(self.log.stable, rd.entries[-1].index)
        for e in rd.committed:
            if e.kind == CONF:
                self._apply_conf(e.data)
            self.log.applied = e.index
        if rd.committed and self.state == LEADER and self.id not in self.voters:
            self._become_follower(self.term, None)   # removed: step down

    def _apply_conf(self, change: list) -> None:
        op, member = change
        self.conf_seq += 1
        if op == ADD_VOTER:
            self.learners.discard(member)
            self.voters.add(member)
        elif op == ADD_LEARNER:
            if member not in self.voters:
                self.learners.add(member)
        elif op == REMOVE:
            self.voters.discard(member)
            self.learners.discard(member)
        if self.state == LEADER:
            if member in self.voters | self.learners:
                new = member not in self.progress
                pr = self.progress.setdefault(
                    member, Progress(next=self.log.last_index + 1, recent_active=True))
                pr.learner = member in self.learners
                if new and member != self.id:
                    self._send_append(member)   # probe it now: an idle group sends nothing else
            else:
                self.progress.pop(member, None)
            if self._maybe_commit():
                self._broadcast_append()
