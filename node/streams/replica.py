"""One member of a replicated stream: a Raft member whose log is the stream's segments
(docs/streams.md, "Replication: the design chosen, and why").

Each Raft entry is one chunk (node/streams/chunk.py): a leader's turn of publishes is a USER
chunk, built by the leader with the chunk id that follows its log and its term as epoch, and
every member writes the same bytes at the same offset. An entry that is not a publish (a new
leader's empty entry, a membership change) is a CONTROL chunk that each member builds alike
(one entry, ``msgpack([kind, data])``, and no record; the epoch is its term, the timestamp
the previous chunk's) and that takes no offset: readers never meet it. The segments' index keeps
each chunk's log index, so the Raft log reads its persisted entries back from them
(node/streams/entries.py): in memory are only the entries not yet applied or persisted.

The log's start (Raft's snapshot) is where retention cut it, or where a follower that was
behind it was reset to: ``base.json`` (raftstate.py). A follower behind the leader's start
gets that point as its snapshot, resets its segments to the leader's first offset and then
receives the chunks by the ordinary append path, read from the leader's segments.

Like the Raft core this is driven by its host, with no clock and no network: the host calls
:meth:`StreamReplica.tick`, :meth:`StreamReplica.step` and :meth:`StreamReplica.publish`, and
then, while :meth:`StreamReplica.has_ready`: :meth:`StreamReplica.write` (the Ready's
snapshot, chunks and hard state, not yet durable), :meth:`StreamReplica.sync` (fdatasync),
sends ``ready.messages``, and :meth:`StreamReplica.finish` (commit: readers may read further,
a leader's proposals are confirmed). The disk is the only I/O here.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from shoal.node.replication.log import ADD_LEARNER, ADD_VOTER, CONF, REMOVE, Snapshot
from shoal.node.replication.messages import APP, FROM_LEADER, Message, Ready
from shoal.node.replication.raft import Raft, bootstrap
from shoal.node.streams import chunk as chunks
from shoal.node.streams.entries import APPEND_BYTES, SegmentReader, control_chunk, entry_of
from shoal.node.streams.raftstate import HardStateFile, read_base, write_base
from shoal.node.streams.segments import DEFAULT_MAX_SEGMENT_BYTES, SegmentLog

#: How many chunks back from the log's end :meth:`StreamReplica.find_publish` looks.
FIND_CHUNKS = 4096


def _is_wanted(data: Any) -> bool:
    return isinstance(data, list) and len(data) == 2 and data[0] == "wanted"


def _conf(voters: set, learners: set, op: str, member: str) -> None:
    """Apply one membership change as raft.py applies it."""
    if op == ADD_VOTER:
        learners.discard(member)
        voters.add(member)
    elif op == ADD_LEARNER:
        if member not in voters:
            learners.add(member)
    elif op == REMOVE:
        voters.discard(member)
        learners.discard(member)


class StreamReplica:
    """The member ``member_id`` of a stream, its files in ``directory``.

    ``voters``: the first members of a new stream (bootstrap); omitted for a member that
    joins later (it starts empty and gets the leader's log) or one reopened from disk.
    ``header``: the stream's declaration ([vhost, name, arguments, ...]) that a new member
    learns from its snapshot. Sizes in bytes, times epoch ms.
    """

    def __init__(self, member_id: str, directory: str | Path, *, voters: list | None = None,
                 header: Any = None, rng: random.Random | None = None,
                 election_ticks: int = 10, heartbeat_ticks: int = 1,
                 max_segment_bytes: int = DEFAULT_MAX_SEGMENT_BYTES,
                 max_segment_chunks: int | None = None) -> None:
        self.id = member_id
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        kw = {} if max_segment_chunks is None else {"max_segment_chunks": max_segment_chunks}
        self.segments = SegmentLog(self.directory / "segments", max_segment_bytes, **kw)
        self.hs_file = HardStateFile(self.directory / "raft.state")
        self._base_path = self.directory / "base.json"
        base = read_base(self._base_path)
        if base is None:
            snap = bootstrap(voters) if voters else None
            base = self._base_of(snap, 0, 0, header)
            if snap is not None:
                write_base(self._base_path, base)
        self.base = base
        self.header = base.get("header")
        self._fit_base()
        #: membership changes held in the log after its start: [log index, op, member]; the
        #: operators' ["wanted", nodes] entries: [log index, nodes]
        self.confs: list[list] = []
        self.wanted_ops: list[list] = []
        self._scan_confs()
        disk_last = self._disk_last()
        hs = self.hs_file.state
        applied = min(hs.commit, disk_last)
        voters_now, learners_now = self.config_at(applied)
        snap = None if base["index"] == 0 else Snapshot(
            base["index"], base["term"], tuple(sorted(voters_now)),
            tuple(sorted(learners_now)), None)
        self.raft = Raft(member_id, election_ticks=election_ticks,
                         heartbeat_ticks=heartbeat_ticks, rng=rng or random.Random(),
                         hard_state=hs, snapshot=snap, reader=SegmentReader(self.segments),
                         disk_last=disk_last, applied=applied,
                         peer_snapshot=self.peer_snapshot, max_append_bytes=APPEND_BYTES)
        #: readers may read offsets below this: the offset after the last applied entry
        self.committed_offset = self.offset_after(self.raft.log.applied)
        #: the nodes an operator wants members on (add_member, delete_member), as of the
        #: applied index; None: those of the members
        self.wanted: list[str] | None = self.wanted_at(self.raft.log.applied)
        #: the timestamp of the last chunk written (a CONTROL chunk's), and the publish clock
        #: (a leader's chunks' timestamps never go back)
        self._tail_ts = self._tail_timestamp()
        self._pub_ts = self._tail_ts
        #: this leader's proposals waiting for commit: log index -> term proposed in
        self.proposed: dict[int, int] = {}
        #: ticks since a leader's APP, SNAP or heartbeat reached this member (the host's
        #: reconciliation asks the other members about one silent too long: members.py)
        self.silent_ticks = 0
        #: as leader: members whose removal was applied (the host tells them to go)
        self.dropped: list[str] = []

    # ---- the log's start and configuration --------------------------------------------------
    @staticmethod
    def _base_of(snap: Snapshot | None, next_offset: int, timestamp: int,
                 header: Any) -> dict[str, Any]:
        if snap is None:
            return {"index": 0, "term": 0, "voters": [], "learners": [], "next": next_offset,
                    "ts": timestamp, "header": header}
        return {"index": snap.index, "term": snap.term, "voters": list(snap.voters),
                "learners": list(snap.learners), "next": next_offset, "ts": timestamp,
                "header": header}

    def config_at(self, index: int) -> tuple[set, set]:
        """The voters and learners as of log ``index`` (at or after the log's start)."""
        voters, learners = set(self.base["voters"]), set(self.base["learners"])
        for i, op, member in self.confs:
            if i > index:
                break
            _conf(voters, learners, op, member)
        return voters, learners

    def wanted_at(self, index: int) -> list[str] | None:
        wanted = self.base.get("wanted")
        for i, nodes in self.wanted_ops:
            if i > index:
                break
            wanted = nodes
        return wanted

    def peer_snapshot(self) -> Snapshot | None:
        """What a follower behind this log's start (or new) gets: the start itself."""
        b = self.base
        if b["index"] == 0:
            return None
        return Snapshot(b["index"], b["term"], tuple(b["voters"]), tuple(b["learners"]),
                        {"next": b["next"], "ts": b["ts"], "header": self.header,
                         "wanted": b.get("wanted")})

    def _fit_base(self) -> None:
        """At open: segments wholly before the log's start go (a crash can bring back a
        file that retention had unlinked), and segments that do not continue the log from
        its start (a reset to a leader's start that a crash undid) are reset to it."""
        b = self.base
        if b["index"] == 0:
            return
        seg = self.segments
        n = 0
        while n < len(seg.segments) - 1 and (
                not seg.segments[n].chunks or
                seg.segments[n].log_index(seg.segments[n].chunks - 1) <= b["index"]):
            n += 1
        seg.drop_front(n)
        at = seg.locate_index(b["index"] + 1)
        if at is not None:
            fits = at[0].chunk_id(at[1]) == b["next"]
        else:
            fits = self._disk_last() <= b["index"] and seg.next_offset == b["next"]
            s0 = seg.segments[0] if seg.segments else None
            if s0 is not None and s0.chunks and s0.log_index(s0.chunks - 1) <= b["index"]:
                fits = False            # only chunks before the start are left
        if not fits:
            seg.reset(b["next"])

    def _scan_confs(self) -> None:
        self.confs = []
        self.wanted_ops = []
        for s in self.segments.segments:
            for i in range(s.chunks):
                if s.record(i)[4] == chunks.CONTROL and s.log_index(i) > self.base["index"]:
                    e = entry_of(self.segments.read_at(s, i), s.log_index(i))
                    if e.kind == CONF:
                        self.confs.append([e.index, e.data[0], e.data[1]])
                    elif _is_wanted(e.data):
                        self.wanted_ops.append([e.index, list(e.data[1])])

    def _disk_last(self) -> int:
        for s in reversed(self.segments.segments):
            if s.chunks:
                return s.log_index(s.chunks - 1)
        return self.base["index"]

    def _tail_timestamp(self) -> int:
        for s in reversed(self.segments.segments):
            if s.chunks:
                return s.timestamp(s.chunks - 1)
        return self.base["ts"]

    def offset_after(self, index: int) -> int:
        """The offset of the chunk that follows log entry ``index`` (in memory or on disk)."""
        log = self.raft.log
        i = index
        while i > log.mem_base:
            data = log.entries[i - log.mem_base - 1].data
            if isinstance(data, bytes):
                return chunks.ChunkHeader(data).next_offset
            i -= 1                      # a CONTROL chunk takes no offset
        if i <= self.base["index"]:
            return self.base["next"]
        at = self.segments.locate_index(i)
        assert at is not None, f"log index {i} neither in memory nor on disk"
        s, k = at
        pos = s.record(k)[3]
        return chunks.ChunkHeader(s.read(pos, pos + chunks.HEADER_SIZE)).next_offset

    # ---- driving ----------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        return self.raft.is_leader

    def tick(self) -> None:
        """The clock. A member that applies its own removal does not drop itself: a member
        added again (delete_member, then add_member, of the same node) replays that old
        removal as it catches up, while its leader counts it (tests/node/streams/
        stream_sim.py found it). A member removed goes when its leader tells its host
        (:attr:`dropped`), or when the host's reconciliation finds a majority of the other
        voters no longer counts it (node/streams/members.py ``reconcile``)."""
        self.raft.tick()
        self.silent_ticks += 1

    def step(self, m: Message) -> None:
        if m.type in FROM_LEADER:
            self.silent_ticks = 0
        self.raft.step(m)

    def publish(self, records: list[bytes], now_ms: int,
                filter_values: list[bytes | None] | None = None,
                filter_size: int = chunks.DEFAULT_FILTER_SIZE,
                trailer: bytes = b"") -> tuple[int, int] | None:
        """As leader: ``records`` (chunk.encode_record's) become one chunk, proposed, with
        ``trailer`` (chunk.encode_trailer's: which publishes they are). Returns ``(log
        index, first offset)``, or None when not leader (the publisher's host sends it to
        the leader, or nacks)."""
        r = self.raft
        if not r.is_leader or r.transferee is not None:
            return None
        first = self.offset_after(r.log.last_index)
        ts = max(now_ms, self._pub_ts, self._tail_ts)
        self._pub_ts = ts
        c = chunks.build(records, first, r.term, ts,
                         filter_values if filter_values and any(filter_values) else None,
                         filter_size, trailer=trailer)
        index = r.propose(c)
        if index is None:
            return None
        self.proposed[index] = r.term
        return index, first

    def find_publish(self, writer: str, seq: int) -> int | None:
        """The log index of the chunk that holds publish ``seq`` of ``writer`` (a router's
        id; chunk.py's trailer), looked for from the log's end back, committed or not; None
        when it is not there.

        A leader asks before it stores a publish sent again (a router resends one whose
        answer was lost with a leader): found, it is stored already, and confirmed once that
        chunk is committed, as Osiris deduplicates a writer's sequence. The look stops at a
        chunk with a first send of ``writer`` below ``seq`` (a router's publish ids rise, and
        it sends them in order), or :data:`FIND_CHUNKS` chunks back, or at the log's start.
        Every way of missing it stores the message twice; none loses it: a writer's
        ``(id, seq)`` names one message."""
        log = self.raft.log
        i = log.last_index
        stop = max(self.base["index"], i - FIND_CHUNKS)
        while i > stop:
            got = self._trailer(i).get(writer)
            if got is not None:
                sent, resent = got
                if seq in sent or seq in resent:
                    return i
                if sent and sent[0] < seq:
                    return None
            i -= 1
        return None

    def _trailer(self, index: int) -> dict:
        """The trailer of the chunk at log ``index`` (chunk.decode_trailer's), empty for a
        CONTROL chunk or a chunk without one; read from memory or the segments' files."""
        log = self.raft.log
        if index > log.mem_base:
            data = log.entries[index - log.mem_base - 1].data
            if not isinstance(data, bytes):
                return {}
            h = chunks.ChunkHeader(data)
            return chunks.decode_trailer(chunks.trailer_of(data, h)) if h.trailer_length \
                else {}
        at = self.segments.locate_index(index)
        if at is None:
            return {}
        s, k = at
        rec = s.record(k)
        if rec[4] == chunks.CONTROL:
            return {}
        pos = rec[3]
        h = chunks.ChunkHeader(s.read(pos, pos + chunks.HEADER_SIZE))
        if not h.trailer_length:
            return {}
        lo = pos + h.data_at + h.data_length
        return chunks.decode_trailer(s.read(lo, lo + h.trailer_length))

    def propose_wanted(self, nodes: list[str]) -> int | None:
        """As leader: log the nodes an operator wants members on; returns the log index
        (in :meth:`finish`'s answer once committed), or None when not leader."""
        r = self.raft
        if not r.is_leader or r.transferee is not None:
            return None
        index = r.propose(["wanted", sorted(nodes)])
        if index is not None:
            self.proposed[index] = r.term
        return index

    def has_ready(self) -> bool:
        return self.raft.has_ready()

    def write(self) -> Ready:
        """Take the Ready and write it: a snapshot (reset to the leader's start), the chunks
        (cutting the log first where they begin) and the hard state; nothing is durable
        before :meth:`sync`."""
        rd = self.raft.ready()
        seg = self.segments
        if rd.snapshot is not None:
            s = rd.snapshot
            data = s.data if isinstance(s.data, dict) else {}
            self.header = data.get("header", self.header)
            self.base = self._base_of(s, int(data.get("next", 0)), int(data.get("ts", 0)),
                                      self.header)
            self.base["wanted"] = data.get("wanted")
            write_base(self._base_path, self.base)
            seg.reset(self.base["next"])
            self.confs = []
            self.wanted_ops = []
            self.wanted = self.base["wanted"]
            self._tail_ts = self.base["ts"]
        if rd.entries:
            first = rd.entries[0].index
            at = seg.locate_index(first)
            if at is not None:
                seg.cut(*at)
                self.confs = [c for c in self.confs if c[0] < first]
                self.wanted_ops = [w for w in self.wanted_ops if w[0] < first]
                self._tail_ts = self._tail_timestamp()
            leader = self.raft.is_leader
            for e in rd.entries:
                if isinstance(e.data, bytes):
                    self._tail_ts = seg.append(e.data, e.index, verify=not leader).timestamp
                else:
                    seg.append(control_chunk(e, seg.next_offset, self._tail_ts), e.index)
                    if e.kind == CONF:
                        self.confs.append([e.index, e.data[0], e.data[1]])
                    elif _is_wanted(e.data):
                        self.wanted_ops.append([e.index, list(e.data[1])])
        if rd.hard_state is not None:
            self.hs_file.write(rd.hard_state)
        if any(e.kind == CONF for e in rd.committed):
            # A restart takes the configuration at the commit index on disk, which is
            # otherwise written without a sync: a membership change about to be applied must
            # not be forgotten, or a restarted member may name only voters that were wiped
            # since and never elect again (tests/node/streams/stream_sim.py, seed 427).
            self.hs_file.sync_next()
        return rd

    def early_messages(self, rd: Ready) -> list:
        """The messages of ``rd`` (written) that its host may send before :meth:`sync`,
        taken out of ``rd.messages`` (the rest go after it): a leader's appends, while its
        term and vote are already on disk. The Raft thesis, 10.2.1: a leader may write its
        log in parallel with replicating it, as long as its own entries count toward a
        commit only once they are on its disk; the hosts (node/streams/members.py
        ``process``, tests/node/streams/stream_sim.py ``drive``) take no answer before the
        sync ends, and a commit is only computed from answers. The follower's fdatasync then
        runs while the leader's does, instead of after it."""
        if not self.raft.is_leader or rd.snapshot is not None or self.hs_file.pending_sync:
            return []
        early = [m for m in rd.messages if m.type == APP]
        if early:
            rd.messages = [m for m in rd.messages if m.type != APP]
        return early

    def sync(self) -> None:
        """Make what :meth:`write` wrote durable: the segments, then the hard state."""
        self.segments.sync()
        self.hs_file.sync()

    def finish(self, rd: Ready) -> list[int]:
        """After :meth:`sync` and sending ``rd.messages``: apply the committed entries.
        Returns the log indexes of this member's own proposals now committed (a leader
        confirms their publishes); drops from memory what is applied and on disk."""
        confirmed = []
        for e in rd.committed:
            if self.proposed.pop(e.index, None) == e.term:
                confirmed.append(e.index)
            if _is_wanted(e.data):
                self.wanted = list(e.data[1])
            elif e.kind == CONF and e.data[0] == REMOVE and e.data[1] != self.id and \
                    self.raft.is_leader and not self._added_after(e.data[1], e.index):
                self.dropped.append(e.data[1])  # it may never learn it: the host tells it
        self.raft.advance(rd)
        log = self.raft.log
        if rd.committed or rd.snapshot is not None:
            self.committed_offset = self.offset_after(log.applied)
        for i in [i for i in self.proposed if i <= log.applied]:
            del self.proposed[i]            # replaced by another leader's entry
        log.release(min(log.applied, log.stable))
        return confirmed

    def conf_changes(self) -> list[tuple[str, str]]:
        """The membership changes held in the log, ``(op, member)`` in log order (as
        reconcile.py's ``conf_changes`` of a quorum member)."""
        return [(op, member) for _, op, member in self.confs]

    def _added_after(self, member: str, index: int) -> bool:
        """Whether this log adds ``member`` again after ``index`` (a removal applied from
        the log's history, by a leader catching up on its own log, is not current)."""
        return any(c[0] > index and c[2] == member and c[1] != REMOVE for c in self.confs)

    def lost_proposals(self) -> list[int]:
        """Once no longer leader: the proposals that may never be confirmed (the host
        tells their publishers; a new leader may still commit them, as RabbitMQ's
        publishers may then see a message twice after resending)."""
        if self.raft.is_leader:
            return []
        lost = sorted(self.proposed)
        self.proposed.clear()
        return lost

    def retain(self, max_bytes: int | None, max_age_ms: int | None, now_ms: int) -> int:
        """Retention: remove the oldest whole segments (none holding an entry not applied
        yet), moving the log's start past them; returns how many went. ``base.json`` is
        rewritten before any file goes."""
        seg = self.segments
        n = seg.retention_plan(max_bytes, max_age_ms, now_ms, self.raft.log.applied)
        if not n:
            return 0
        last = next((g.record(g.chunks - 1) for g in reversed(seg.segments[:n]) if g.chunks),
                    None)
        if last is None:                # only empty segments
            return seg.drop_front(n)
        index, term, ts = last[5], last[2], last[1]
        voters, learners = self.config_at(index)
        nxt = seg.segments[n].chunk_id(0) if seg.segments[n].chunks else seg.next_offset
        self.base = {"index": index, "term": term, "voters": sorted(voters),
                     "learners": sorted(learners), "next": nxt, "ts": ts,
                     "header": self.header, "wanted": self.wanted_at(index)}
        write_base(self._base_path, self.base)
        self.confs = [c for c in self.confs if c[0] > index]
        self.wanted_ops = [w for w in self.wanted_ops if w[0] > index]
        removed = seg.drop_front(n)
        self.raft.log.compact(index, term)
        return removed

    def close(self) -> None:
        self.segments.close()
        self.hs_file.close()
