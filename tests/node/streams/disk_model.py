"""The disks of the stream simulator (stream_sim.py): what a crash leaves of a member's files,
modelled from the fsyncs and fdatasyncs the code makes."""
from __future__ import annotations

import os
import random
from pathlib import Path


def _files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()}


class DiskModel:
    """What a crash leaves (installed over ``os`` for one run): an ``fsync`` or
    ``fdatasync`` of a file records its content, one of a directory its names; ``os.replace``
    carries a file's record to its new name. At a crash (:meth:`crash`) a file goes back to
    its recorded content, keeping (when torn) a prefix of what was appended since; a file
    never synced keeps any prefix or none; a name not in its directory's record may vanish
    and an unlinked file whose directory still listed it may come back."""

    def __init__(self, rng: random.Random, no_sync: bool = False) -> None:
        self.rng = rng
        self.no_sync = no_sync
        self.files: dict[str, bytes] = {}
        self.dirs: dict[str, set[str]] = {}
        self._saved: tuple = ()

    def _record(self, fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.isdir(path):
            self.dirs[path] = set(os.listdir(path))
        else:
            with open(path, "rb") as f:
                self.files[path] = f.read()

    def install(self) -> None:
        real_fsync, real_fdatasync, real_replace = os.fsync, os.fdatasync, os.replace
        self._saved = (real_fsync, real_fdatasync, real_replace)

        def fsync(fd: int) -> None:
            self._record(fd)

        def fdatasync(fd: int) -> None:
            if not self.no_sync:
                self._record(fd)

        def replace(src: str, dst: str) -> None:
            real_replace(src, dst)
            src, dst = os.path.abspath(src), os.path.abspath(dst)
            if src in self.files:
                self.files[dst] = self.files.pop(src)

        os.fsync, os.fdatasync, os.replace = fsync, fdatasync, replace

    def uninstall(self) -> None:
        if self._saved:
            os.fsync, os.fdatasync, os.replace = self._saved
            self._saved = ()

    def forget(self, root: Path) -> None:
        """A directory deleted for good (a wiped disk): nothing under it comes back."""
        top = str(root)
        for path in [f for f in self.files if f == top or f.startswith(top + os.sep)]:
            del self.files[path]
        for d in [d for d in self.dirs if d == top or d.startswith(top + os.sep)]:
            del self.dirs[d]

    def crash(self, root: Path) -> None:
        rng = self.rng
        torn = rng.random() < 0.5
        now = _files(root)
        for path, data in now.items():
            p = Path(path)
            old = self.files.get(path)
            listed = p.name in self.dirs.get(str(p.parent), ())
            if old is None:
                keep = data[:rng.randrange(len(data) + 1)] if torn else b""
                if listed or keep or rng.random() < 0.5:
                    p.write_bytes(keep)
                else:
                    p.unlink()
            elif not listed and rng.random() < 0.3:
                p.unlink()                          # its name never reached the disk
            elif data != old:
                if torn and data.startswith(old):
                    p.write_bytes(data[:len(old) + rng.randrange(len(data) - len(old) + 1)])
                else:
                    p.write_bytes(old)
        for path, data in list(self.files.items()):
            p = Path(path)
            if path in now or not path.startswith(str(root) + os.sep):
                continue
            names = self.dirs.get(str(p.parent))
            if (names is None or p.name in names) and rng.random() < 0.5:
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)                 # an unlink that did not last
        # what is on disk now is what the restart finds
        for path, data in _files(root).items():
            self.files[path] = data
        for d in [root, *(q for q in root.rglob("*") if q.is_dir())]:
            self.dirs[str(d)] = set(os.listdir(d))
        for path in [f for f in self.files if f.startswith(str(root) + os.sep)]:
            if not os.path.exists(path):
                del self.files[path]
