"""What the journal tests share (tests/node/test_journal*.py): the test queue, its segments,
the ids a recovery found, a crash image of a journal directory, and records to fill it with."""
from __future__ import annotations

import shutil
from pathlib import Path

from shoal.node.durability.journal import Journal

Q = ("/", "q")


def segs(d: Path) -> list[Path]:
    return sorted(d.glob("*.seg"))


def ids(j: Journal, q: tuple[str, str] = Q) -> list[int]:
    return [m.entry_id for m in j.recovered.messages.get(q, [])]


def crash_copy(src: Path, dst: Path) -> Path:
    """What is on disk if the process died now (no close, no flush)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("LOCK"))
    return dst


def fill(j: Journal, n: int, start: int = 1, body: bytes = b"x" * 100) -> None:
    for i in range(start, start + n):
        j.enqueue("/", "q", i, "amq.direct", "rk", b"\x00\x3c\x00\x00hdr", body,
                  enqueue_ms=1_700_000_000_000 + i)
