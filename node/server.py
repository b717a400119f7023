"""The node process: asyncio (uvloop when available) + one ZeroMQ ROUTER socket (design.md 4).

Each loop turn drains every readable message, feeds the :class:`~shoal.node.shard.Shard`, then
flushes its outbox with ONE ZeroMQ send per router (a batch, shared.wire.encode_batch). The
socket's FD is edge-triggered (ZMQ_EVENTS), so after every send and before sleeping the loop
re-reads ``zmq.EVENTS`` instead of trusting the FD alone.

Durability (docs/durability.md): :func:`~shoal.node.process.run_node` opens the journal in
``<data_dir>/journal`` and rebuilds the shard from it before binding. Each turn ends with ONE
group commit (``Journal.commit_async``, on the journal's thread, so the loop keeps serving);
the answers that promised durability (PUBLISH_RESULT of persistent messages, REPLYs of durable
declares) leave when it is on disk. The server holds that as an object,
:class:`~shoal.node.durability.group_commit.GroupCommit` (also a failing disk, the resource
alarms' NODE_BLOCKED and the clean-stop marker).
"""
from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import os
import time
from pathlib import Path
from typing import Callable

import zmq

from shoal.shared import stream, wire
from shoal.shared.datadir import lock_data_dir
from shoal.shared.linkauth import serve_curve
from shoal.shared.settings import Settings
from shoal.shared.wire import encode_batch

from shoal.node.alarms import ResourceAlarms
from shoal.node.intake import feed_frames
from shoal.node.durability.group_commit import GroupCommit
from shoal.node.durability.format import unavailable
from shoal.node.durability.journal import Journal
from shoal.node.queues.paging import PageStore
from shoal.node.replication.links import UnixPeerLinks, open_peer_links
from shoal.node.replication.manager import Replication
from shoal.node.replication.store import RaftStore
from shoal.node.shard import Shard
from shoal.node.stats import write_stats_file
from shoal.node.unix_listener import UnixListener

log = logging.getLogger("shoal.node")

#: Messages read per loop turn before flushing (bounds latency under a flood).
MAX_READ_PER_TURN = 64  # batches; then tick and flush, so heartbeats flow under load


_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
#: seconds after a connection closed that the routers are probed (node/server.py ``serve``)
PROBE_S = (0.02, 0.1, 0.3)
#: Frames from an in-process router (attach_local) that may wait for a turn, as the ROUTER
#: socket's RCVHWM bounds a remote router's.
LOCAL_HWM = 16


def _now_ms() -> float:
    return time.monotonic() * 1000.0


class NodeServer:
    """Runs a Shard behind a bound ROUTER socket until :meth:`stop` is called.

    ``ctx``: a ZeroMQ context to share (a node hosted in a router process binds ``inproc://``
    in the router's context, see :func:`hosted_node`); by default the server makes its own and
    terminates it in :meth:`close`.
    """

    def __init__(self, settings: Settings, shard: Shard | None = None,
                 ctx: zmq.Context | None = None) -> None:
        self.settings = settings
        self.shard = shard or Shard(settings.node_id, None, settings)
        self.shard.links.on_full = self._send_early
        self._zmq_sent = False          # this turn sent on the ZeroMQ socket
        self._own_ctx = ctx is None
        self.ctx = zmq.Context() if ctx is None else ctx
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        # Bounded (batches): a router that outruns this node gets EAGAIN and pauses its
        # publishers instead of growing this queue without limit.
        self.sock.setsockopt(zmq.RCVHWM, 16)
        # CURVE when keys are set; the other nodes connect with the nodes' own key pair
        self._auth = serve_curve(self.sock, self.ctx, dataclasses.replace(
            settings, link_curve_clients=[*settings.link_curve_clients,
                                          settings.link_curve_public_key])
            if settings.link_curve_public_key and settings.peers else settings)
        self._stopping = False
        self._done: asyncio.Future | None = None    # serve() returns when it is set
        self._turn_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0                        # when self._timer fires (ms, _now_ms)
        self._tick_ms = settings.link_heartbeat_ms / 2
        self._loop: asyncio.AbstractEventLoop | None = None
        self.endpoint = settings.node_bind
        #: the journal from open_journal to close and its one commit per turn
        self.group_commit = GroupCommit(self.shard, self._flush, self._poke, self._call_later)
        self._commit = self.group_commit.commit     # the turn's (hot: bound once)
        #: Routers in this process (attach_local): identity -> where their batches go, and
        #: the batches they sent that wait for the next turn.
        self._local: dict[bytes, Callable[[list], None]] = {}
        self._local_in: list[tuple[bytes, list]] = []
        #: The same-host link (a ``unix://`` endpoint), its routers gone since the last turn,
        #: and whether the ZeroMQ socket is bound at all (else turns leave it alone).
        self._unix: UnixListener | None = None
        #: the other nodes' ``unix://`` connections, on ``peer_bind`` (shoal serve's nodes)
        self._unix_peers: UnixListener | None = None
        self._unix_gone: list[bytes] = []
        self._zmq_bound = False
        #: the lock on the node's data directory, from open_journal to close
        self._dir_lock: int | None = None

    def open_journal(self, directory: str | os.PathLike | None = None) -> int:
        """Open the journal (default ``<settings.data_dir>/journal``) and rebuild the shard
        from it; returns the messages restored. Raises JournalCorrupt (damage; file and
        offset named) or JournalUnavailable (directory unwritable), DataDirLocked when
        another process holds the node's data directory (the journal's parent:
        shared/datadir.py; this server holds it until :meth:`close`)."""
        path = Path(directory) if directory is not None else \
            Path(self.settings.data_dir).expanduser() / "journal"
        if self._dir_lock is None:
            try:
                self._dir_lock = lock_data_dir(path.parent)
            except OSError as exc:
                raise unavailable(f"cannot lock data directory {path.parent}", exc) from exc
        try:
            journal = self.group_commit.open(path)
            self.shard.pages = PageStore(path.parent / "pages",
                                         self.settings.queue_max_in_memory_bytes)
            self.shard.access.load(path.parent)
            try:
                n = self.shard.attach_journal(journal, self.group_commit.take_clean_marker())
                self.open_replication(path.parent / "raft")
                self.shard.open_streams(path.parent / "streams")
                return n
            except BaseException:
                self.group_commit.close()
                raise
        except BaseException:
            os.close(self._dir_lock)
            self._dir_lock = None
            raise

    def open_replication(self, directory: Path | None) -> int:
        """Serve quorum queues: their Raft log in ``directory`` (None: in memory only) and
        the groups it holds rebuilt (node/replication/). Returns how many. Raises OSError
        when the directory cannot be used."""
        if self.shard.replication is not None:
            return len(self.shard.replication.groups)
        rep = Replication(self.shard, RaftStore(directory), None)
        n = rep.restore()
        self.shard.attach_replication(rep)
        return n

    @property
    def journal(self) -> Journal | None:
        """The node's journal (None before :meth:`open_journal` and after :meth:`close`)."""
        return self.group_commit.journal

    def _call_later(self, seconds: float, fn: Callable[[], None]
                    ) -> asyncio.TimerHandle | None:
        """``fn`` in ``seconds`` on the serving loop; None (not scheduled) when it is not
        serving or stopping (the group commit's retries)."""
        if self._loop is None or self._stopping:
            return None
        return self._loop.call_later(seconds, fn)

    def stats(self) -> dict:
        """Counters for the stats file: journal commits and fsyncs, segments, bytes."""
        out: dict = {"node_id": self.shard.node_id, "queues": len(self.shard.queues)}
        if self.journal is not None:
            st = self.journal.stats()
            out.update(commits=st.commits, fsyncs=st.fsyncs, segments=st.segments,
                       bytes_on_disk=st.bytes_on_disk, live_records=st.live_records,
                       available=self.journal.available)
        return out

    def attach_local(self, identity: bytes, deliver: Callable[[list], None]
                     ) -> Callable[[list], bool]:
        """Connect a router that runs in this process and event loop, without ZeroMQ.

        Batches are the ZeroMQ link's, handed over in memory as ``shared.wire.handover`` makes
        them (hot messages as they are, the rest as msgpack copies). The returned
        ``send(batch) -> bool`` queues a batch from the router (handled at the next turn, which
        it schedules); it returns False, taking nothing, while :data:`LOCAL_HWM` batches wait
        (the router then pauses its publishers, as on a full ZeroMQ pipe). Batches for
        ``identity`` go to ``deliver(batch)``, called at the end of a turn, never from inside
        ``send``.
        """
        self._local[identity] = deliver
        # the router's clients share this loop: the journal must not hold it up on the disk
        self.group_commit.inline = False
        inbox = self._local_in

        def send(batch: list) -> bool:
            if len(inbox) >= LOCAL_HWM:
                return False
            inbox.append((identity, batch))
            if not self._turn_scheduled and self._loop is not None and not self._stopping:
                self._turn_scheduled = True
                self._loop.call_soon(self._turn, False)
            return True
        return send

    def bind(self, also: str = "") -> str:
        """Bind ``node_bind`` and, when given, ``also`` (the ``embed_bind`` of a node hosted in
        router-0, where the other routers reach it) and ``peer_bind`` (where the other nodes
        reach it): a ``unix://PATH`` endpoint on a :class:`UnixListener` (one for routers,
        one for nodes), any other on the ZeroMQ socket. Returns the first endpoint. Raises
        zmq.ZMQError or OSError (the node CLI exits 1)."""
        ends = [(e, for_peers) for e, for_peers in ((self.settings.node_bind, False),
                                                    (also, False),
                                                    (self.settings.peer_bind, True)) if e]
        for i, (endpoint, for_peers) in enumerate(ends):
            path = stream.scheme_path(endpoint)
            if path is not None and for_peers:
                # the other nodes' connections (node/replication/links.py UnixPeerLinks)
                self._unix_peers = UnixListener(path, self._poke, lambda _identity: None,
                                                prefix=b"peer:unix-")
                self._unix_peers.bind()
            elif path is not None:
                if self._unix is not None:
                    raise OSError(f"one unix:// endpoint per node, not {endpoint} too")
                self._unix = UnixListener(path, self._poke, self._unix_lost)
                self._unix.bind()
            else:
                self.sock.bind(endpoint)
                self._zmq_bound = True
                endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT) or endpoint
            log.info("shoal node %s listening on %s", self.shard.node_id, endpoint)
            if i == 0:
                self.endpoint = endpoint
        return self.endpoint

    def _unix_lost(self, identity: bytes) -> None:
        """A router's ``unix://`` connection closed: forget it in the next turn, after the
        frames it sent before closing."""
        self._unix_gone.append(identity)
        self._poke()

    def stop(self) -> None:
        """Ask the loop to say GOODBYE, flush and return (safe from signal handlers and threads)."""
        self._stopping = True
        loop = self._loop
        if loop is not None and self._done is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._poke)
            except RuntimeError:       # loop closed meanwhile: nothing to wake
                pass

    def _poke(self) -> None:
        """Wake the serve loop (the socket may be readable, or it should stop)."""
        if self._stopping:
            if self._done is not None and not self._done.done():
                self._done.set_result(None)
            return
        if not self._turn_scheduled and self._loop is not None:
            self._turn_scheduled = True
            self._loop.call_soon(self._turn)

    def _drain(self, socket: bool = True) -> int:
        """Feed the shard what waits: batches of in-process routers, frames of the ``unix://``
        link, then (``socket``) up to MAX_READ_PER_TURN frames from the ROUTER socket. Returns
        the socket messages read."""
        sock = self.sock
        n = 0
        frames = []
        local = None
        if self._local_in:
            local = self._local_in[:]
            self._local_in.clear()
            for _, batch in local:
                wire.received(batch)
        if self._unix_peers is not None:
            frames = self._unix_peers.take()
        if self._unix is not None:
            frames += self._unix.take()
        # Ask ZMQ_EVENTS first (a plain int: no enum): ending every drain with a zmq.Again
        # exception costs more.
        while socket and n < MAX_READ_PER_TURN and sock.get(_EVENTS) & _POLLIN:
            try:
                parts = sock.recv_multipart(_NOBLOCK)
            except zmq.Again:
                break
            n += 1
            if len(parts) != 2:
                log.warning("dropping ZeroMQ message with %d parts", len(parts))
                continue
            frames.append((parts[0], parts[1]))
        if frames or local:
            feed_frames(self.shard, frames, _now_ms(), local)
            for _, batch in local or ():
                wire.received(batch)
        if self._unix_gone:     # after their last frames: a router's acks before it closed
            for identity in self._unix_gone:
                self.shard.links.disconnected(identity)
            self._unix_gone.clear()
        return n

    def _flush(self) -> bool:
        """Send the shard's outbox: one batch per router, to an in-process router, over the
        ``unix://`` link or over the ZeroMQ socket. True when this turn sent anything on the
        ZeroMQ socket (an early send included: Peers.on_full)."""
        for peer, msgs in self.shard.take_outbox().items():
            self._send(peer, msgs)
        return self._zmq_sent

    def _send_early(self, peer: bytes) -> None:
        """Peers.on_full: a router's outbox filled up mid-turn; send it now, unless that
        router is in this process (its batches go at the end of a turn: attach_local)."""
        if peer not in self._local:
            self._send(peer, self.shard.links.take_box(peer))

    def _send(self, peer: bytes, msgs: list[list]) -> None:
        """Send one router its batch (``_zmq_sent`` notes a send on the ZeroMQ socket), its
        runs of answers coalesced (``wire.coalesce_results``)."""
        msgs = wire.coalesce_results(msgs)
        local = self._local.get(peer)
        unix = self._unix
        try:
            if local is not None:
                local(wire.handover(msgs))
                return
            if unix is not None and unix.send(peer, msgs):
                return
            frame = encode_batch(msgs)
        except TypeError as exc:
            log.error("cannot encode batch for %r: %s", peer, exc)
            return
        self._zmq_sent = True
        try:
            # Copying a small batch is cheaper than tracking a zero-copy frame; a large
            # message's frame goes without a copy.
            self.sock.send_multipart([peer, frame], _NOBLOCK,
                                     copy=len(frame) < wire.LARGE_FRAME)
        except zmq.ZMQError as exc:
            log.warning("cannot send %d messages to %r: %s", len(msgs), peer, exc)

    def _unreachable_routers(self) -> list[bytes]:
        """The routers this node knows whose ZeroMQ connection is gone: a HEARTBEAT sent with
        ZMQ_ROUTER_MANDATORY to an identity without a connection fails at once with
        EHOSTUNREACH (libzmq's zmq_setsockopt(3)). The live ones get one heartbeat more.
        Routers in this process or on the ``unix://`` link are not asked (that link says
        whose connection closed)."""
        beat = encode_batch([[wire.TAG_HEARTBEAT]])
        gone = []
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        try:
            for identity in list(self.shard.links.by_identity):
                if identity in self._local or (self._unix is not None
                                               and self._unix.has(identity)):
                    continue
                try:
                    self.sock.send_multipart([identity, beat], _NOBLOCK)
                except zmq.ZMQError as exc:
                    if exc.errno == errno.EHOSTUNREACH:
                        gone.append(identity)
        finally:
            self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        return gone

    def _readable(self) -> bool:
        return bool(self.sock.get(_EVENTS) & _POLLIN)

    def _turn(self, socket: bool = True) -> None:
        """One loop turn: read what waits (bounded), run due timers, commit, send. Runs from
        the socket's reader callback, so an idle-to-busy wake-up costs no task switch.

        ``socket=False`` (frames of an in-process router, attach_local): leave the ROUTER
        socket alone unless this turn sent on it. Its FD's edge is then untouched, so its
        reader still fires for whatever waits there, and two ZMQ_EVENTS calls are saved."""
        self._turn_scheduled = False
        if self._stopping:
            self._poke()
            return
        socket = socket and self._zmq_bound
        self._zmq_sent = False
        try:
            self._drain(socket)
            now = _now_ms()
            self.shard.tick(now)
            shard = self.shard      # streams first: a publish to a stream and a quorum
            # queue is answered once both have it, and a quorum answer may come this turn
            shard.streams.commit(shard.durable.defer if shard.durable is not None else None)
            rep = self.shard.replication
            if rep is not None:
                rep.process()           # quorum queues: one fsync, then send and apply
                shard.streams.process()     # replicated streams: write, sync, send, commit
            self._commit()
            sent = self._flush()
            # More than a turn's worth waits, or a send ate the FD's edge: look again.
            if (socket or sent) and self._readable():
                self._poke()
            else:
                self._arm_timer(now)
        except Exception as exc:        # a bug here must stop serve(), not leave it hanging
            if self._done is not None and not self._done.done():
                self._done.set_exception(exc)

    def _arm_timer(self, now_ms: float) -> None:
        """Keep ONE timer for the next heartbeat tick or TTL / schedule / timeout; re-armed
        only when something is due earlier than the armed one (not once per turn)."""
        at = now_ms + self._tick_ms
        due = self.shard.timers.next_due()
        if due is not None and due < at:
            at = due
        t = self._timer
        if t is not None:
            if self._timer_at <= at:
                return
            t.cancel()
        loop = self._loop
        self._timer_at = at
        self._timer = loop.call_at(loop.time() + max(0.0, at - now_ms) / 1000.0, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._turn()

    async def serve(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        fd = self.sock.getsockopt(zmq.FD)
        loop.add_reader(fd, self._turn)
        # A router's connection closing (kill -9, pod gone) is seen here at once, but ZeroMQ's
        # monitor does not say whose: the routers are probed (PROBE_S after the event: the
        # socket drops the closed connection's pipe a moment later), and one that cannot be
        # reached is forgotten, its deliveries released, well within 0.5 s (issue 43). The
        # routers still alive keep heartbeating, so after two intervals the silent ones are
        # the dead, should a probe not tell.
        mon = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        mon_fd = mon.getsockopt(zmq.FD)
        hb_ms = self.settings.link_heartbeat_ms

        def on_disconnect() -> None:
            while mon.get(_EVENTS) & _POLLIN:
                mon.recv_multipart(_NOBLOCK)
                for delay in PROBE_S:
                    loop.call_later(delay, probe)
                loop.call_later(2.5 * hb_ms / 1000.0, expire_silent)

        def probe() -> None:
            if self._stopping:
                return
            gone = self._unreachable_routers()
            for identity in gone:
                self.shard.links.disconnected(identity)
            if gone:
                self._flush()
                self._poke()

        def expire_silent() -> None:
            if self.shard.forget_silent(_now_ms(), 2 * hb_ms):
                self._flush()
                self._poke()
        loop.add_reader(mon_fd, on_disconnect)
        on_disconnect()  # reading ZMQ_EVENTS once arms the edge-triggered FD
        rep = self.shard.replication
        if rep is None:
            self.open_replication(None)
            rep = self.shard.replication
        peer_fds: list[int] = []
        if self.settings.peers and rep.links is None:
            rep.links = open_peer_links(self.ctx, self.shard.node_id, self.settings.peer_map(),
                                        self.settings)

            def lost(node: str) -> None:
                rep.peer_lost(node)
                self._poke()
            rep.links.watch(loop.add_reader, lost)
            peer_fds = rep.links.fds()
        alarms = asyncio.ensure_future(ResourceAlarms(
            self.settings, str(self.journal.directory) if self.journal is not None
            else self.settings.data_dir, self.group_commit.set_alarm).run())
        self.shard.loop_lag.start()
        for listener in (self._unix, self._unix_peers):
            if listener is not None:
                await listener.start()
        stats_path = os.environ.get("SHOAL_NODE_STATS_FILE")
        stats = asyncio.ensure_future(write_stats_file(stats_path.replace(
            "{node}", self.shard.node_id), self.stats)) if stats_path else None
        try:
            if self._stopping:
                self._poke()
            else:
                self._turn()            # also arms the FD (reads ZMQ_EVENTS) and the timer
            await self._done
            await self.group_commit.finish()
            self.shard.goodbye_all()
            self._flush()
        finally:
            alarms.cancel()
            self.shard.loop_lag.stop()
            loop.remove_reader(fd)
            loop.remove_reader(mon_fd)
            for pfd in peer_fds:
                loop.remove_reader(pfd)
            if isinstance(rep.links, UnixPeerLinks):
                rep.links.close()       # its sockets and diallers are this loop's
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self.sock.disable_monitor()
            mon.close(linger=0)
            for listener in (self._unix, self._unix_peers):
                if listener is not None:
                    listener.close()
            if stats is not None:
                stats.cancel()
            self.group_commit.cancel_retry()

    def close(self) -> None:
        for listener in (self._unix, self._unix_peers):
            if listener is not None:
                listener.close()    # serve() closed it, unless it never ran
        if self.shard.replication is not None:
            self.shard.replication.close()      # its sockets before the context ends
        self.sock.close(linger=1000)
        if self._auth is not None:
            self._auth.stop()
        if self._own_ctx:
            self.ctx.term()
        self.group_commit.close()
        self.shard.streams.close()
        if self.shard.pages is not None:
            self.shard.pages.close()
        if self._dir_lock is not None:
            os.close(self._dir_lock)
            self._dir_lock = None

