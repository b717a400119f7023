"""Resource alarms of one node (issue 22, point 4): RabbitMQ's memory high watermark and free
disk limit (https://www.rabbitmq.com/docs/alarms, /docs/memory, /docs/disk-alarms).

- memory: the node process's resident memory above ``vm_memory_high_watermark`` (a fraction of
  the memory limit: the container's cgroup limit, else the machine's RAM; default 0.4, as
  RabbitMQ) or ``vm_memory_high_watermark_absolute`` (bytes, wins when set);
- disk: less than ``disk_free_limit`` bytes free (default 50 MB, RabbitMQ's) on the file
  system of the node's data directory.

While either holds, the node tells every router (NODE_BLOCKED) with RabbitMQ's reason text
("low on memory", "low on disk", "low on disk & memory"); routers send ``connection.blocked``
and stop reading publishing connections, consumers keep draining, and ``connection.unblocked``
follows when it clears. Checked every ``CHECK_S``.
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

log = logging.getLogger("shoal.node.alarms")

CHECK_S = 1.0
_NO_LIMIT = 1 << 60     # cgroup v1 writes about 2**63 for "no limit"


def memory_limit() -> int:
    """Bytes this process may use: the cgroup's limit (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``), else the machine's RAM."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = open(path).read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < _NO_LIMIT:
            return int(text)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def resident_bytes() -> int:
    """This process's resident memory (/proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def free_disk_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def reason(alarms: set[str]) -> str | None:
    """RabbitMQ's connection.blocked reason for a set of alarms ("memory", "disk")."""
    return f"low on {' & '.join(sorted(alarms))}" if alarms else None


class ResourceAlarms:
    """Watches one node's memory and disk; calls ``on_change(reason or None)`` when the set of
    active alarms changes. ``readings`` (tests) replaces the three measurements."""

    def __init__(self, settings: Any, data_dir: str,
                 on_change: Callable[[str | None], None],
                 readings: tuple[Callable[[], int], Callable[[], int],
                                 Callable[[str], int]] | None = None) -> None:
        self.data_dir = data_dir
        self.on_change = on_change
        self._limit, self._rss, self._free = readings or (memory_limit, resident_bytes,
                                                          free_disk_bytes)
        absolute = settings.vm_memory_high_watermark_absolute
        self.memory_watermark = absolute if absolute > 0 else \
            int(self._limit() * settings.vm_memory_high_watermark)
        self.disk_free_limit = settings.disk_free_limit
        self.active: set[str] = set()

    def check(self) -> set[str]:
        """Measure now; report and return the active alarms."""
        now = set()
        rss = self._rss()
        if rss > self.memory_watermark:
            now.add("memory")
        try:
            free = self._free(self.data_dir)
        except OSError:
            free = None
        if free is not None and free < self.disk_free_limit:
            now.add("disk")
        if now != self.active:
            for name in now - self.active:
                log.warning("%s alarm set: %s", name,
                            f"resident {rss} bytes above the watermark "
                            f"{self.memory_watermark}" if name == "memory" else
                            f"{free} bytes free on {self.data_dir}, below disk_free_limit "
                            f"{self.disk_free_limit}")
            for name in self.active - now:
                log.warning("%s alarm cleared", name)
            self.active = now
            self.on_change(reason(now))
        return now

    async def run(self, every: float = CHECK_S) -> None:
        """Check every ``every`` seconds until cancelled."""
        while True:
            try:
                self.check()
            except Exception:  # noqa: BLE001 - a failed reading must not stop the watch
                log.exception("resource check failed")
            await asyncio.sleep(every)
