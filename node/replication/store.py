"""The Raft log on disk: one append-only file for every group of a node (design.md section 8).

Records are ``[length u32][crc32 u32][msgpack payload]``; a payload is ``[vhost, name, uid,
kind, data]`` with ``kind``:

- ``"hs"``: the hard state ``[term, vote, commit]``;
- ``"snap"``: a snapshot received from the leader (``Snapshot.to_wire``); it replaces the
  group's whole log;
- ``"compact"``: a snapshot this member took of its own state; entries after it stay;
- ``"ents"``: entries (``Entry.to_wire``), which cut the group's log from the first one's index;
- ``"del"``: the group is gone. Its value, when not None, is the member's last ``[term,
  vote]`` (a *tombstone*: the member was dropped by the reconciliation, and a leader may add
  this node back under the same member id; it must then go on from that term and vote, or it
  could vote twice in one term, as a disk wiped under its old id would. Raft's persistent
  state, paper 5.2 and figure 2). A rewrite keeps the tombstones.

A turn's records go in one ``write`` and one ``fsync`` (:meth:`RaftStore.sync`): the group
commit of every quorum queue of the node. Reading stops at the first damaged record: that is a
torn write of a turn that was never synced, so nothing in it was ever answered or sent.
When the file has grown to four times its size after the last rewrite (and at least
``REWRITE_BYTES``), :meth:`RaftStore.rewrite` writes each group's snapshot, entries and hard
state to a new file and renames it over the old one.

``<dir>/disk_id`` names this disk: a node whose data directory is new or wiped gets a new one,
hence new member ids (node/replication/membership.py).
"""
from __future__ import annotations

import logging
import os
import struct
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import msgpack

from shoal.node.durability.compact import fsync_dir
from shoal.node.replication.log import Entry, Snapshot
from shoal.node.replication.raft import HardState

log = logging.getLogger("shoal.node.replication")

_HEAD = struct.Struct("<II")
#: Never rewrite a log smaller than this (bytes).
REWRITE_BYTES = 64 * 1024 * 1024


@dataclass
class GroupDisk:
    """What the file says of one group: its uid, hard state, snapshot and entries."""

    uid: str
    hard_state: HardState = field(default_factory=HardState)
    snapshot: Snapshot | None = None
    entries: list[Entry] = field(default_factory=list)

    def add_entries(self, entries: list[Entry]) -> None:
        if not entries:
            return
        first = entries[0].index
        floor = self.snapshot.index if self.snapshot else 0
        entries = [e for e in entries if e.index > floor]
        if not entries:
            return
        first = entries[0].index
        keep = [e for e in self.entries if e.index < first]
        self.entries = keep + entries


class RaftStore:
    """The node's Raft log file in ``directory`` (created), or in memory only when None."""

    def __init__(self, directory: str | os.PathLike | None) -> None:
        self.directory = Path(directory) if directory is not None else None
        self._buf: list[bytes] = []
        self._fd: int | None = None
        self.size = 0
        self._rewritten_at = 0
        self.disk_id = uuid.uuid4().hex[:10]
        self.fsyncs = 0
        #: ((vhost, name), uid) -> (term, vote) of a member dropped by the reconciliation
        self.tombstones: dict[tuple[tuple[str, str], str], tuple[int, str | None]] = {}
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            id_file = self.directory / "disk_id"
            if id_file.exists():
                self.disk_id = id_file.read_text().strip() or self.disk_id
            else:
                _write_synced(id_file, self.disk_id.encode())

    @property
    def path(self) -> Path | None:
        return self.directory / "raft.log" if self.directory is not None else None

    def load(self) -> dict[tuple[str, str], GroupDisk]:
        """Read the file: (vhost, name) -> GroupDisk. Then opens it for appending (truncated
        after the last whole record)."""
        groups: dict[tuple[str, str], GroupDisk] = {}
        path = self.path
        if path is None:
            return groups
        good = 0
        if path.exists():
            data = path.read_bytes()
            off = 0
            while off + _HEAD.size <= len(data):
                length, crc = _HEAD.unpack_from(data, off)
                body = data[off + _HEAD.size: off + _HEAD.size + length]
                if len(body) != length or zlib.crc32(body) != crc:
                    break
                off += _HEAD.size + length
                try:
                    vhost, name, uid, kind, value = msgpack.unpackb(body, raw=False,
                                                                    strict_map_key=False)
                except Exception:  # noqa: BLE001 - damage: stop reading here
                    break
                good = off
                _replay(groups, (vhost, name), uid, kind, value, self.tombstones)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.ftruncate(self._fd, good)
        os.lseek(self._fd, good, os.SEEK_SET)
        self.size = self._rewritten_at = good
        return groups

    def append(self, key: tuple[str, str], uid: str, kind: str, value: Any) -> None:
        """Queue one record for the next :meth:`sync`."""
        if self.directory is None:
            return
        body = msgpack.packb([key[0], key[1], uid, kind, value], use_bin_type=True)
        self._buf.append(_HEAD.pack(len(body), zlib.crc32(body)))
        self._buf.append(body)

    def bury(self, key: tuple[str, str], uid: str, hs: HardState) -> None:
        """A member of group ``uid`` (a quorum queue's, or a replicated stream's) is dropped
        from this node: keep its tombstone (its last term and vote), synced, for the member a
        leader may make again under the same member id. A failed write is logged; the
        caller drops the member all the same (a quorum queue's is asked again after a
        restart, as the drop was not written either)."""
        self.tombstones[(key, uid)] = (hs.term, hs.vote)
        self.append(key, uid, "del", [hs.term, hs.vote])
        try:
            self.sync()
        except OSError as exc:
            log.error("cannot write the Raft log: %s", exc)

    def unbury(self, key: tuple[str, str], uid: str) -> HardState | None:
        """The hard state a member of group ``uid`` made again on this node starts from: the
        term and vote of its tombstone (:meth:`bury`), which it takes; None without one."""
        tomb = self.tombstones.pop((key, uid), None)
        return HardState(tomb[0], tomb[1], 0) if tomb is not None else None

    def sync(self) -> None:
        """Write the queued records and fsync them: on return they survive a crash.
        Raises OSError (the node stops serving its quorum queues' publishes)."""
        if not self._buf or self._fd is None:
            self._buf.clear()
            return
        data = b"".join(self._buf)
        self._buf.clear()
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        os.fsync(self._fd)
        self.fsyncs += 1
        self.size += len(data)

    def wants_rewrite(self) -> bool:
        return self._fd is not None and self.size >= max(REWRITE_BYTES, 4 * self._rewritten_at)

    def rewrite(self, groups: Iterable[tuple[tuple[str, str], str, HardState,
                                             Snapshot | None, list[Entry]]]) -> None:
        """Replace the file by one holding only each group's current state, after the
        tombstones of groups that are not live again."""
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        groups = list(groups)
        live = {(key, uid) for key, uid, *_ in groups}
        parts = []
        for (key, uid), (term, vote) in self.tombstones.items():
            if (key, uid) not in live:
                body = msgpack.packb([key[0], key[1], uid, "del", [term, vote]],
                                     use_bin_type=True)
                parts += [_HEAD.pack(len(body), zlib.crc32(body)), body]
        for key, uid, hs, snap, entries in groups:
            for kind, value in (("compact", snap.to_wire() if snap else None),
                                ("ents", [e.to_wire() for e in entries]),
                                ("hs", [hs.term, hs.vote, hs.commit])):
                if value is None:
                    continue
                body = msgpack.packb([key[0], key[1], uid, kind, value], use_bin_type=True)
                parts += [_HEAD.pack(len(body), zlib.crc32(body)), body]
        data = b"".join(parts)
        _write_synced(tmp, data)
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.size = self._rewritten_at = len(data)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _replay(groups: dict, key: tuple[str, str], uid: str, kind: str, value: Any,
            tombstones: dict) -> None:
    if kind == "del":
        g = groups.get(key)
        if g is not None and g.uid == uid:
            del groups[key]
        if value:
            tombstones[(key, uid)] = (value[0], value[1])
        return
    g = groups.get(key)
    if g is None or g.uid != uid:
        g = groups[key] = GroupDisk(uid)
    if kind == "hs":
        g.hard_state = HardState(value[0], value[1], value[2])
    elif kind == "snap":
        g.snapshot = Snapshot.from_wire(value)
        g.entries = []
    elif kind == "compact":
        g.snapshot = Snapshot.from_wire(value)
        g.entries = [e for e in g.entries if e.index > g.snapshot.index]
    elif kind == "ents":
        g.add_entries([Entry.from_wire(e) for e in value])


def _write_synced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(path.parent)
