"""One data directory, one broker: the lock that ``shoal serve`` takes on its data directory
and ``shoal node`` on its own, before anything in it is read or written (issue 43; RabbitMQ
refuses a second node on one node name the same way).

The lock is ``flock(2)`` on ``<data_dir>/shoal.lock``, which holds the pid of the process that
has it. The kernel lets it go when that process ends, however it ends (kill -9 included), so a
lock never outlives its broker and nothing needs cleaning up by hand.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = "shoal.lock"


class DataDirLocked(Exception):
    """Another live process holds the data directory ``path`` (its ``pid``, or None when it
    has not written it yet)."""

    def __init__(self, path: Path, pid: int | None) -> None:
        self.path, self.pid = path, pid
        holder = f"pid {pid}" if pid is not None else "another process"
        super().__init__(f"data directory {path} is in use by another Shoal ({holder}); "
                         f"stop it first, or choose another with --data-dir or SHOAL_DATA_DIR")


def lock_data_dir(data_dir: str | Path) -> int:
    """Create ``data_dir`` if needed and lock it for this process. Returns the lock's file
    descriptor: keep it open for as long as the process runs (it is not inherited by child
    processes). Raises DataDirLocked when another process holds it; OSError when the
    directory cannot be created or the lock file opened."""
    path = Path(data_dir).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise DataDirLocked(path, int(text) if text.isdigit() else None) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
