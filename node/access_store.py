"""The cluster's users, virtual hosts and permissions, kept by the first node (issue 22, point
1 and issue 23, point 1: changed at run time through the management API, seen by every router
at once).

The store is a RabbitMQ definitions document (``users``, ``vhosts``, ``permissions``,
``topic_permissions``, ``parameters`` of ``vhost-limits``; shared/definitions.py) with a
version. Routers read it (wire ACCESS_GET) and replace it by compare-and-set (ACCESS_SET with
the version they read: a change made meanwhile by another router is 406, read again). A new
version goes to every router as a TOPOLOGY_EVENT (``EV_ACCESS``) and the ACCESS_SET reply
waits until every router applied it, as for declares (read-your-writes across routers).

On disk: ``<data_dir>/<node>/access.json`` beside the journal, replaced atomically (written to
a temporary file, fsynced, renamed, directory fsynced) before the reply, so a change survives a
crash of the node. A node without a data directory (unit tests) keeps it in memory.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from shoal.shared.errors import PRECONDITION_FAILED, soft_error
from shoal.shared.wire import EV_ACCESS

log = logging.getLogger("shoal.node.access")

FILE = "access.json"


class AccessStore:
    """``version`` (0: nothing stored yet) and ``doc`` (the definitions document or None)."""

    def __init__(self) -> None:
        self.version = 0
        self.doc: dict | None = None
        self.path: Path | None = None

    def load(self, directory: str | os.PathLike) -> None:
        """Use ``directory``/access.json (read it if it exists). A damaged file is logged and
        left aside (renamed ``.damaged``); routers then seed the store again."""
        self.path = Path(directory) / FILE
        if not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self.version, self.doc = int(data["version"]), dict(data["definitions"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("access store %s is damaged (%s): set aside as %s.damaged", self.path,
                      exc, FILE)
            self.path.replace(self.path.with_suffix(".json.damaged"))
            self.version, self.doc = 0, None

    def _save(self, version: int, doc: dict) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".json.tmp")
        data = json.dumps({"version": version, "definitions": doc}).encode("utf-8")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def on_access_get(shard: Any, state: Any, msg: list) -> list:
    """ACCESS_GET -> [version, definitions document or None]."""
    store = shard.access
    return [store.version, store.doc]


def on_access_set(shard: Any, state: Any, msg: list) -> list:
    """ACCESS_SET [T, req_id, expected_version, doc] -> [new version]. Raises 406 when the
    store's version is not ``expected_version`` (another router changed it meanwhile)."""
    _, _, expected, doc = msg
    store = shard.access
    if expected != store.version:
        raise soft_error(PRECONDITION_FAILED, f"the users and permissions changed meanwhile "
                                              f"(version {store.version}, not {expected}): "
                                              f"read them again")
    version = store.version + 1
    store._save(version, doc)           # OSError: the request answers 541 and nothing changed
    store.version, store.doc = version, doc
    shard._emit(EV_ACCESS, [version, doc])
    return [version]
