"""A node's streams: declared, published to, consumed from offsets, deleted (docs/streams.md).

The shard (node/shard.py) keeps its streams here, beside its queues: :class:`Streams` is
``shard.streams``, and the wire handlers (node/messages.py, node/queue_requests.py) hand it
what names a stream. Each stream lives in ``<data dir>/streams/<id>/``: its segments
(segments.py) and ``meta.json`` (vhost, name, arguments), from which a restarted node opens
it again.

What a consumer sees is RabbitMQ's (rabbit_stream_queue.erl):

- ``basic.consume`` needs a consumer prefetch (``basic.qos``, not global) and manual acks:
  else 406 "consumer prefetch count is not set for stream ...", 540 "automatic
  acknowledgement not supported by stream ...", 540 "... does not support global qos";
- it starts at ``x-stream-offset`` (offsets.py); a bad one is 406 "failed consuming from
  stream ...: <reason>";
- each delivery carries ``x-stream-offset`` (a signed 64-bit integer) in its headers;
- an ack gives credit back (the router's prefetch) and removes nothing; a nack or reject
  does nothing either;
- ``x-stream-filter`` (a string or an array of them) and ``x-stream-match-unfiltered``
  select by each message's ``x-stream-filter-value`` header;
- ``basic.get`` is 540 "basic.get not supported by stream queues ..."; a purge removes
  nothing.

A publish is confirmed once its chunk is on disk on a majority of the stream's members: at
the end of the node's turn (:meth:`Streams.commit`) the leader proposes each stream's chunk
of the turn to its log (members.py; a stream of one member is a log of one voter), and the
turn's answers wait until it is committed (:meth:`Streams.process`), which then feeds the
consumers. A stream made by an older Shoal with one member has no log: its one writer
writes and fdatasyncs the chunk in :meth:`Streams.commit` (so does a shard without
replication, in tests).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from shoal.shared.errors import (NOT_IMPLEMENTED, PRECONDITION_FAILED, RESOURCE_ERROR,
                                 hard_error, soft_error)
from shoal.shared.wire import TAG_DELIVER, T

from shoal.shared.header_table import Long, add_header
from shoal.node.replication.messages import HardState
from shoal.node.streams import chunk as chunks
from shoal.node.streams.answers import Barrier
from shoal.node.streams.members import StreamMembers, new_replica
from shoal.node.streams.offsets import parse_offset_spec
from shoal.node.streams.raftstate import start_at
from shoal.node.streams.readers import BehindLeader, reader_start
from shoal.node.streams.stream import StreamError, StreamReader, parse_stream_arguments
from shoal.node.streams.stream_queue import StreamConsumer, StreamQueue, filter_value, rs as _rs

log = logging.getLogger("shoal.node")

def _wall_ms() -> int:
    return int(time.time() * 1000)


class Streams:
    """The streams of one node (``streams``: (vhost, name) -> :class:`StreamQueue`), in
    ``directory`` (None: a temporary one, for tests and nodes without a data dir).
    ``send(identity, msg)`` queues a wire message to a router; ``next_id()`` gives delivery
    ids unique in the node (the shard's entry ids)."""

    def __init__(self, send: Callable[[bytes, list], None], next_id: Callable[[], int],
                 directory: str | os.PathLike | None) -> None:
        self.send = send            #: ``send(identity, msg)``: the shard's, to a router
        self.next_id = next_id      #: delivery ids, from the shard's entry ids
        self._temp = directory is None
        self.directory = Path(directory) if directory is not None else \
            Path(os.environ.get("TMPDIR", "/tmp")) / f"shoal-streams-{uuid.uuid4().hex}"
        self.streams: dict[tuple[str, str], StreamQueue] = {}
        #: (router identity, consumer id) -> consumer
        self.consumers: dict[tuple[bytes, int], StreamConsumer] = {}
        self._written: dict[StreamQueue, None] = {}
        #: the turn's publish answers: (identity, answer, journal lsn or 0)
        self._held: list[tuple[bytes, list, int]] = []
        #: commits that wrote or answered something (a publish's answer made before the
        #: commit of its turn waits for it: node/messages.py's publish_quorum)
        self.turns = 0
        #: the replicated streams (members.py), on a node with replication
        self.members: StreamMembers | None = None
        self.routers: Callable[[], Any] = lambda: ()

    def attach_replication(self, rep: Any, routers: Callable[[], Any]) -> None:
        """Serve streams of several members over the node's replication ``rep``;
        ``routers()``: the identities of the routers connected."""
        self.members = StreamMembers(self, rep)
        self.routers = routers

    @staticmethod
    def now_ms() -> int:
        return _wall_ms()

    # -- life -----------------------------------------------------------------------------

    def restore(self) -> int:
        """Open every stream found in the directory (a restarted node); returns how many."""
        if not self.directory.is_dir():
            return 0
        for d in sorted(self.directory.iterdir()):
            meta = d / "meta.json"
            if not meta.is_file():
                continue
            m = json.loads(meta.read_text())
            cfg = parse_stream_arguments(m["vhost"], m["name"], m["arguments"], True, False,
                                         False)
            if m.get("uid"):
                if self.members is None:
                    log.error("stream '%s' in vhost '%s' has several members and this node "
                              "has no replication: not opened", m["name"], m["vhost"])
                    continue
                r = new_replica(self.members.rep.member_id, d, None, None,
                                cfg.max_segment_bytes)
                s = StreamQueue(m["vhost"], m["name"], m["arguments"], cfg, d, r)
                self.members.attach(s, r, m["uid"])
            else:
                s = StreamQueue(m["vhost"], m["name"], m["arguments"], cfg, d)
            self.streams[(s.vhost, s.name)] = s
        return len(self.streams)

    def declare(self, vhost: str, name: str, durable: bool, exclusive: bool,
                auto_delete: bool, arguments: dict,
                answer: Callable[[bool], None] | None = None) -> StreamQueue | None:
        """A new stream. On a node that serves quorum queues (members.py) it is
        replicated, even with one member (``x-initial-cluster-size: 1``, the others
        offline, or a node alone), so that ``add_member`` can grow it later, as RabbitMQ's
        add_replica: ``answer(False)`` runs once it has a leader (``s.replica`` is then set:
        the declare's answer waits), ``answer(True)`` if its member here is dropped before
        (replication/requests.py declare_answer), and None is returned while the node, just started, waits
        to hear from the nodes it would choose. A shard without replication (tests) serves
        it at once with one writer. Raises 406 with RabbitMQ's text (stream.py)."""
        try:
            cfg = parse_stream_arguments(vhost, name, arguments, durable, exclusive,
                                         auto_delete)
        except StreamError as err:
            raise soft_error(PRECONDITION_FAILED, str(err)) from None
        mem = self.members
        size = mem.cluster_size(cfg) if mem is not None else 1
        nodes = mem.nodes_for(vhost, name, size) if size > 1 else []
        if size > 1 and len(nodes) < size and mem.starting():
            mem.waiting.append((vhost, name, durable, exclusive, auto_delete, arguments,
                                answer))
            return None
        if mem is not None:
            voters = mem.member_ids(nodes or [mem.node_id])
            s = self.create_member(vhost, name, arguments, uuid.uuid4().hex[:12], voters)
            mem.created(s.replica, voters, answer)
            return s
        s = StreamQueue(vhost, name, arguments, cfg, self._new_dir(vhost, name, arguments))
        self.streams[(vhost, name)] = s
        return s

    def create_member(self, vhost: str, name: str, arguments: dict, uid: str,
                      voters: list[str] | None, hard_state: HardState | None = None
                      ) -> StreamQueue:
        """A member of a replicated stream on this node: a first one (``voters``: its
        creator's, or STREAM_CREATE from it), or one that joins empty (None: added later;
        its arguments come with the leader's snapshot, :meth:`learned`), starting from
        ``hard_state`` (the term and vote of a member of this node dropped before)."""
        cfg = parse_stream_arguments(vhost, name, arguments, True, False, False)
        d = self._new_dir(vhost, name, arguments, uid)
        if hard_state is not None:
            start_at(d / "raft.state", hard_state)
        r = new_replica(self.members.rep.member_id, d, voters, [vhost, name, arguments, uid],
                        cfg.max_segment_bytes)
        s = StreamQueue(vhost, name, arguments, cfg, d, r)
        self.members.attach(s, r, uid)
        self.streams[(vhost, name)] = s
        return s

    def learned(self, s: StreamQueue, arguments: dict) -> None:
        """A member that joined empty learned the stream's declaration (its snapshot)."""
        try:
            s.cfg = parse_stream_arguments(s.vhost, s.name, arguments, True, False, False)
        except StreamError as err:
            log.error("stream '%s' in vhost '%s': bad declaration from its leader: %s",
                      s.name, s.vhost, err)
            return
        s.arguments = arguments
        _write_meta(s.directory, {"vhost": s.vhost, "name": s.name, "arguments": arguments,
                                  "uid": s.replica.uid})

    def _new_dir(self, vhost: str, name: str, arguments: dict, uid: str | None = None
                 ) -> Path:
        d = self.directory / uuid.uuid4().hex
        d.mkdir(parents=True)
        meta = {"vhost": vhost, "name": name, "arguments": arguments}
        if uid:
            meta["uid"] = uid
        _write_meta(d, meta)
        return d

    def delete(self, s: StreamQueue, tell: bool = True) -> int:
        """Delete ``s`` and its files; its consumers are cancelled (CONSUMER_CANCELLED);
        with several members, ``tell`` the others (STREAM_DELETE). Returns the messages it
        held."""
        count = s.message_count
        if s.replica is not None and self.members is not None:
            self.members.deleted(s, tell)
        for c in list(s.consumers):
            self.consumers.pop((c.peer.identity, c.consumer_id), None)
            self.send(c.peer.identity, [int(T.CONSUMER_CANCELLED), c.consumer_id,
                                              "queue deleted"])
        s.consumers.clear()
        self.streams.pop((s.vhost, s.name), None)
        self._written.pop(s, None)
        s.log.destroy()
        shutil.rmtree(s.directory, ignore_errors=True)
        return count

    def close(self) -> None:
        for s in self.streams.values():
            if s.rep is not None:
                s.rep.close()
            else:
                s.log.close()
        if self._temp:
            shutil.rmtree(self.directory, ignore_errors=True)

    # -- publishing -----------------------------------------------------------------------

    def publish(self, s: StreamQueue, exchange: str, routing_key: str, header: bytes,
                body: bytes, writer: str | None = None, seq: int = 0,
                resend: bool = False) -> None:
        """Take a message for ``s``'s chunk of this turn (confirmed at :meth:`commit`).
        ``writer``, ``seq``: the router's id and its publish id (0: no answer wanted); a
        replicated stream's chunk names them in its trailer. ``resend``: sent again after
        a leader change; if the log holds it already (replica.py ``find_publish``) it is
        not stored twice, and its answer waits for that chunk's commit."""
        fv = filter_value(header)
        if s.rep is None:
            s.writer.add(exchange, routing_key, header, body, fv)
        else:
            if seq and writer and len(writer) < 256:
                lists = s.sent.get(writer)      # this turn's publishes of the writer
                if resend:
                    at = s.rep.find_publish(writer, seq)
                    if at is not None or (lists is not None and
                                          (seq in lists[0] or seq in lists[1])):
                        s.found = max(s.found, at or 0)
                        self._written[s] = None
                        return
                if lists is None:
                    lists = s.sent[writer] = ([], [])
                lists[resend].append(seq)
            s.batch.append(chunks.encode_record(exchange, routing_key, header, body, fv))
            s.filters.append(fv)
        s.stats[0] += 1
        self._written[s] = None

    def hold(self, identity: bytes, answer: list, lsn: int) -> None:
        """Send ``answer`` (a PUBLISH_RESULT) once this turn's chunks are on disk, and, with
        ``lsn``, once the journal has that record too."""
        self._held.append((identity, answer, lsn))

    def commit(self, defer: Callable[[int, bytes, list], None] | None) -> None:
        """End of the node's turn: write and sync each stream's chunk, answer the turn's
        publishes (``defer(lsn, identity, answer)`` for those that wait for the journal
        too), then deliver to consumers with credit and tell those waiting (WORK)."""
        if not self._written and not self._held:
            return
        self.turns += 1
        now = _wall_ms()
        written = list(self._written)
        self._written.clear()
        failed = False
        proposed = []
        after = []
        for s in written:
            if s.rep is not None:
                batch, filters, s.batch, s.filters = s.batch, s.filters, [], []
                sent, s.sent, found, s.found = s.sent, {}, s.found, 0
                index = self.members.propose(s, batch, filters, now, sent) if batch \
                    else None
                if index is not None:   # after any chunk it found (sent again): covers it
                    proposed.append((s.replica, index))
                elif batch or (found and not s.rep.is_leader):
                    failed = True       # no longer leading: the turn is nacked
                elif found > s.rep.raft.log.applied:
                    after.append((s.replica, found))
                continue
            try:
                s.writer.flush(now)
                s.writer.sync()
                s.writer.retain(now)
            except Exception:  # noqa: BLE001 - a failing disk (or a bug) nacks, never stops
                # the node: the turn's publishes are refused, as a journal that cannot write
                log.exception("stream '%s' in vhost '%s': cannot write its chunk; refusing "
                              "the turn's publishes", s.name, s.vhost)
                failed = True
        held, self._held = self._held, []
        send = self.send

        def answer(held: list, ok: bool) -> None:
            for identity, res, lsn in held:
                if not ok:      # PUBLISH_RESULT's code: basic.nack (shared/wire.py)
                    res[2] = RESOURCE_ERROR
                if lsn:
                    defer(lsn, identity, res)
                else:
                    send(identity, res)
        if (proposed or after) and not failed:  # once each chunk is committed (process)
            b = Barrier(held, answer)
            b.left = len(proposed) + len(after)
            for m, index in proposed:
                m.waiting[index] = b
            for m, index in after:
                m.after.append([index, b])
        else:
            answer(held, not failed)
        for s in written:
            if s.rep is None:
                for c in s.consumers:
                    self._feed(c)

    # -- replicated streams (members.py) --------------------------------------------------

    def process(self) -> None:
        """End of the turn: every replicated stream's Raft work, then its consumers fed."""
        if self.members is None:
            return
        for s in self.members.process():
            for c in s.consumers:
                self._feed(c)

    def tick(self) -> None:
        if self.members is not None:
            self.members.tick()

    def on_peer(self, msg: list, now_ms: float) -> None:
        if self.members is not None:
            self.members.on_peer(msg, now_ms)

    def peer_lost(self, node: str) -> None:
        if self.members is not None:
            self.members.peer_lost(node)

    # -- consuming ------------------------------------------------------------------------

    def consume(self, peer: Any, cid: int, s: StreamQueue, tag: str, no_ack: bool,
                args: dict, qos: list | None) -> list:
        """A consumer of ``s`` from its ``x-stream-offset``; returns ``[the messages it may
        read now, "stream"]`` (CONSUME's answer: the router learns the queue is a stream).
        ``qos``: ``[consumer prefetch, global prefetch]`` of a 0-9-1 channel, None for an
        AMQP 1.0 link (credit). Raises 406, 540 as RabbitMQ (module docstring); MOVED from
        a member that does not lead for a numeric offset past its log's end."""
        known = self.consumers.get((peer.identity, cid))
        if known is not None and known.stream is s:     # registered again: credit back to 0
            known.credit = 0
            known.wants_work = False
            return [max(0, s.committed - known.reader.offset), "stream"]
        rs = _rs(s.vhost, s.name)
        if qos is not None:
            prefetch, global_prefetch = (list(qos) + [0, 0])[:2]
            if not prefetch:
                raise soft_error(PRECONDITION_FAILED,
                                 f"consumer prefetch count is not set for stream {rs}")
            if no_ack:
                raise hard_error(NOT_IMPLEMENTED,
                                 f"automatic acknowledgement not supported by stream {rs}")
            if global_prefetch:
                raise hard_error(NOT_IMPLEMENTED, f"{rs} does not support global qos")
        args = args or {}
        try:
            spec = parse_offset_spec(args.get("x-stream-offset"), _wall_ms())
        except ValueError as err:
            raise soft_error(PRECONDITION_FAILED,
                             f"failed consuming from stream {rs}: {err}") from None
        values, unfiltered = _filter_args(args)
        lg = s.log
        # the log's end, not its commit: a new leader learns the commit of what it holds
        # only once it commits an entry of its term (a consumer coming back at the next
        # offset after its last delivery must not be sent that one again)
        try:
            start = reader_start(spec, lg, s.replica is None or s.replica.leading)
        except BehindLeader:            # the leader holds every committed offset
            raise self.members.moved(s.replica, peer.identity) from None
        c = StreamConsumer(cid, peer, tag, s, StreamReader(lg, start, values, unfiltered),
                           args)
        s.consumers.append(c)
        self.consumers[(peer.identity, cid)] = c
        return [max(0, s.committed - start), "stream"]

    def consumer(self, identity: bytes, cid: int) -> StreamConsumer | None:
        return self.consumers.get((identity, cid))

    def cancel(self, c: StreamConsumer) -> None:
        self.consumers.pop((c.peer.identity, c.consumer_id), None)
        if c in c.stream.consumers:
            c.stream.consumers.remove(c)

    def forget(self, identity: bytes) -> None:
        """Router ``identity`` is gone: its consumers go."""
        for key in [k for k in self.consumers if k[0] == identity]:
            self.cancel(self.consumers[key])

    def credit(self, c: StreamConsumer, credit: int, drain: bool) -> int | None:
        """CREDIT for a stream consumer: deliver what it may read; with ``drain``, returns
        the credit left (then 0); ``credit`` 0 without drain: a WORK when there is more."""
        if credit:
            c.credit += credit
            c.wants_work = False
        if credit or drain:
            self._feed(c)
        if drain:
            left, c.credit = c.credit, 0
            return left
        if not credit:
            c.wants_work = True
            self._feed(c)
        return None

    def _feed(self, c: StreamConsumer) -> None:
        s = c.stream
        committed = s.committed
        if c.credit <= 0:
            if c.wants_work and c.reader.offset < committed:
                c.wants_work = False
                self.send(c.peer.identity, [int(T.WORK), c.consumer_id])
            return
        msgs = c.reader.read(c.credit, committed)
        if not msgs:
            return
        c.credit -= len(msgs)
        s.stats[1] += len(msgs)
        send = self.send
        ident = c.peer.identity
        next_id = self.next_id
        for m in msgs:
            send(ident, [TAG_DELIVER, c.consumer_id, next_id(), False, m.exchange,
                         m.routing_key,
                         add_header(bytes(m.header), "x-stream-offset", Long(m.offset)),
                         bytes(m.body)])


def _write_meta(d: Path, meta: dict) -> None:
    """``meta.json`` (vhost, name, arguments, uid of a replicated stream), replaced whole."""
    tmp = d / "meta.json.tmp"
    tmp.write_text(json.dumps(meta))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    tmp.rename(d / "meta.json")


def _filter_args(args: dict) -> tuple[list[bytes] | None, bool]:
    """``x-stream-filter`` (a string or an array of strings; others ignored, as RabbitMQ
    does) and ``x-stream-match-unfiltered``."""
    raw = args.get("x-stream-filter")
    if raw is None:
        return None, False
    items = raw if isinstance(raw, list) else [raw]
    values = []
    for v in items:
        if isinstance(v, str):
            values.append(v.encode())
        elif isinstance(v, (bytes, bytearray)):
            values.append(bytes(v))
    unfiltered = args.get("x-stream-match-unfiltered") in (True, 1, "true")
    return (values or None), unfiltered
