"""Majority arithmetic (etcd raft ``quorum/majority.go``).

A configuration is a set of voter ids; learners never count. Pure functions, no state.
"""
from __future__ import annotations

from typing import Iterable, Mapping


def majority(voters: Iterable[str]) -> int:
    """How many of ``voters`` make a majority (``len // 2 + 1``)."""
    return len(tuple(voters)) // 2 + 1


def committed_index(voters: Iterable[str], match: Mapping[str, int]) -> int:
    """The highest log index that a majority of ``voters`` hold (``match[id]``: the highest
    index known replicated on ``id``; missing ids count as 0). etcd ``CommittedIndex``: sort
    the voters' match indexes descending and take the one at position ``majority - 1``."""
    ids = tuple(voters)
    if not ids:
        return 0
    acked = sorted((match.get(i, 0) for i in ids), reverse=True)
    return acked[len(ids) // 2]


def vote_result(voters: Iterable[str], votes: Mapping[str, bool]) -> int:
    """etcd ``VoteResult``: 1 won (a majority granted), -1 lost (a majority can no longer
    grant), 0 pending."""
    ids = tuple(voters)
    need = len(ids) // 2 + 1
    granted = sum(1 for i in ids if votes.get(i) is True)
    rejected = sum(1 for i in ids if votes.get(i) is False)
    if granted >= need:
        return 1
    if len(ids) - rejected < need:
        return -1
    return 0
