"""Reading a node journal's segments back at start (design.md section 5: replay, stopping at a
torn tail): which segment files exist, each scanned record applied to the journal's
:class:`~shoal.node.durability.state.JournalState`, torn tails of the last segment cut.

:func:`recover_segments` is called once by :meth:`Journal.open <shoal.node.durability.journal.Journal.open>`;
the record format is :mod:`shoal.node.durability.format`'s, the replay rules
:mod:`shoal.node.durability.state`'s.
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from shoal.node.durability.compact import Segment, fsync_dir
from shoal.node.durability.format import (HEADER_BYTES, TOPOLOGY_TYPES, JournalCorrupt, RecordType,
                             decode_record, scan, unavailable)
from shoal.node.durability.state import JournalState, TornTail

log = logging.getLogger("shoal.node.durability.journal")

_SEG_NAME = re.compile(r"^(\d{8})\.seg$")
_SNAPSHOT = int(RecordType.TOPOLOGY_SNAPSHOT)


def segment_files(directory: Path) -> list[tuple[int, Path]]:
    """The segment files (``00000001.seg``, ...) in ``directory``: (number, path), ascending."""
    found = []
    for p in directory.iterdir():
        m = _SEG_NAME.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


def recover_segments(directory: Path, state: JournalState, segments: dict[int, Segment]
                     ) -> tuple[int, list[TornTail]]:
    """Scan every segment of ``directory`` in order into ``state``, adding each to the empty
    ``segments`` (by number, ascending, with its live counts) as soon as it is read: a record
    that settles an earlier one makes ``state`` call back the journal, which looks the earlier
    one's segment up there. Returns (the number of the last segment holding a
    TOPOLOGY_SNAPSHOT, 0 if none; the torn tails cut).

    A torn tail of the last segment (a crash mid-write) is cut and fsync'd; a segment file
    shorter than its header is removed if it is the last. Raises JournalCorrupt(path, offset)
    for damage anywhere else, JournalUnavailable when a cut cannot be written."""
    files = segment_files(directory)
    snapshot_seg = 0
    cuts: list[TornTail] = []
    for i, (number, path) in enumerate(files):
        last = i == len(files) - 1
        data = path.read_bytes()
        if len(data) < HEADER_BYTES:
            if not last:
                raise JournalCorrupt(str(path), 0, "segment shorter than its header")
            log.warning("journal: removing %s: torn at byte %d while being created",
                        path, len(data))
            cuts.append(TornTail(str(path), 0, len(data), "torn segment header"))
            path.unlink()
            fsync_dir(directory)
            continue
        result = scan(data, str(path), last)
        seg = Segment(number, path, int.from_bytes(data[8:12], "little"), result.good_end)
        segments[number] = seg
        if result.good_end < len(data):
            dropped = len(data) - result.good_end
            log.warning("journal: cut torn tail of %s at byte %d (%d bytes dropped: %s)",
                        path, result.good_end, dropped, result.bad_reason)
            cuts.append(TornTail(str(path), result.good_end, dropped, result.bad_reason))
            try:
                with open(path, "r+b") as f:
                    f.truncate(result.good_end)
                    os.fsync(f.fileno())
            except OSError as exc:
                raise unavailable(f"cannot cut torn tail of {path}", exc) from exc
        for offset, size, rtype, payload in result.records:
            if rtype == RecordType.BATCH:
                continue
            try:
                rec = decode_record(rtype, payload)
            except ValueError as exc:
                raise JournalCorrupt(str(path), offset, str(exc)) from None
            e = state.apply(rec)
            if e is not None:
                e.segment, e.offset, e.size = number, offset, size
                seg.live_count += 1
                seg.live_bytes += size
            elif rtype in TOPOLOGY_TYPES:
                seg.topo_records += 1
                if rtype == _SNAPSHOT:
                    snapshot_seg = number
        del data, result
    return snapshot_seg, cuts
