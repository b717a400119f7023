"""What a replicated stream member keeps on disk beside its segments (docs/streams.md,
"Replication"): its Raft hard state and the start of its log.

``raft.state``: two 256-byte slots, written in turn, each ``sequence (8 bytes), term (8),
commit (8), len(vote) (2), vote (UTF-8), CRC-32 of the rest (4)`` at the slot's end. A torn
write spoils one slot; the other still holds the state before it. The newest whole slot
wins. A change of term or vote is fdatasynced before any message depending on it leaves
(``sync``); the commit index alone is written without a sync: a member that forgets some of
it relearns it from its leader. Except where it covers a membership change: a restart takes
the configuration at the commit index on disk, so that one is synced before the change is
applied (replica.py ``write``).

``base.json``: where the log starts (what Raft calls the snapshot: a stream's retention cut it
there, or a follower was reset to it): the log index and term of the last entry before the
first chunk held, the configuration then, the offset and timestamp of the next chunk, and the
stream's declaration. Replaced whole (write, fsync, rename, fsync the directory).
"""
from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

from shoal.node.durability.compact import fsync_dir
from shoal.node.replication.messages import HardState

SLOT = 256
_HEAD = struct.Struct(">QQQH")
_MAX_VOTE = SLOT - _HEAD.size - 4


class HardStateFile:
    """The hard state of one member in ``path`` (created when missing). Raises ValueError
    for a vote longer than 222 bytes of UTF-8."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        new = not self.path.exists()
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if new:
            fsync_dir(self.path.parent)     # its name must survive a crash too
        self.seq = 0
        self.state = HardState()
        self._slot = 0
        raw = os.pread(self.fd, 2 * SLOT, 0)
        best = None
        for k in range(2):
            got = _decode(raw[k * SLOT:(k + 1) * SLOT])
            if got is not None and (best is None or got[0] > best[0]):
                best = (got[0], got[1], k)
        if best is not None:
            self.seq, self.state, k = best
            self._slot = 1 - k
        self._dirty_sync = False

    def write(self, hs: HardState) -> None:
        """Write ``hs`` to the next slot (not synced: :meth:`sync`); a new term or vote marks
        the file for the next sync."""
        if hs.term != self.state.term or hs.vote != self.state.vote:
            self._dirty_sync = True
        vote = (hs.vote or "").encode()
        if len(vote) > _MAX_VOTE:
            raise ValueError(f"vote {hs.vote!r} longer than {_MAX_VOTE} bytes")
        self.seq += 1
        body = _HEAD.pack(self.seq, hs.term, hs.commit, len(vote)) + vote
        body = body.ljust(SLOT - 4, b"\0")
        os.pwrite(self.fd, body + struct.pack(">I", zlib.crc32(body)), self._slot * SLOT)
        self._slot = 1 - self._slot
        self.state = hs

    @property
    def pending_sync(self) -> bool:
        """A term or vote written (or :meth:`sync_next` asked) and not yet synced."""
        return self._dirty_sync

    def sync_next(self) -> None:
        """Make the next :meth:`sync` fdatasync whatever was written (the commit index of a
        membership change about to be applied)."""
        self._dirty_sync = True

    def sync(self) -> None:
        """fdatasync when a term or vote was written since the last sync, or when asked
        (:meth:`sync_next`)."""
        if self._dirty_sync:
            os.fdatasync(self.fd)
            self._dirty_sync = False

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def start_at(path: str | os.PathLike, hs: HardState) -> None:
    """A member about to be made in ``path``'s directory starts from ``hs``, synced: the term
    and vote of a member of this node dropped before under the same id (the tombstones of
    node/replication/store.py). Raises OSError."""
    f = HardStateFile(path)
    try:
        f.write(hs)
        f.sync()
    finally:
        f.close()


def _decode(slot: bytes) -> tuple[int, HardState] | None:
    if len(slot) < SLOT:
        return None
    body, (crc,) = slot[:SLOT - 4], struct.unpack(">I", slot[SLOT - 4:])
    if zlib.crc32(body) != crc:
        return None
    seq, term, commit, n = _HEAD.unpack_from(body)
    if seq == 0:
        return None
    vote = body[_HEAD.size:_HEAD.size + n].decode() or None
    return seq, HardState(term, vote, commit)


def read_base(path: str | os.PathLike) -> dict[str, Any] | None:
    """``base.json``'s content, or None when there is none."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None


def write_base(path: str | os.PathLike, base: dict[str, Any]) -> None:
    """Replace ``base.json`` whole and durably."""
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(base, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
