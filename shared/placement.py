"""Queue and exchange placement: which node owns a queue or an exchange (design.md section 1).

Rendezvous (highest-random-weight) hashing over node ids: every router computes the same owner
from the same node id list, and adding a node moves only the queues the new node wins
(about 1/N of them). The hash is BLAKE2b, so the answer does not depend on the Python process
(``hash()`` is salted per process and must never be used here).
"""
from __future__ import annotations

import hashlib
from typing import Sequence


def _weight(node_id: str, key: bytes) -> int:
    digest = hashlib.blake2b(key, digest_size=8, key=node_id.encode()[:64]).digest()
    return int.from_bytes(digest, "big")


def owner(vhost: str, name: str, node_ids: Sequence[str], kind: str = "q") -> str:
    """Return the id of the node that owns ``name`` in ``vhost``.

    ``kind`` is ``"q"`` for queues, ``"e"`` for exchanges (their namespaces are separate).
    Raises ``ValueError`` when ``node_ids`` is empty.
    """
    if not node_ids:
        raise ValueError("no nodes to place on")
    key = f"{kind}\x00{vhost}\x00{name}".encode()
    return max(node_ids, key=lambda n: (_weight(n, key), n))
