"""Answers that wait for a replicated stream's log entry to be committed (members.py): a
turn's publish answers (:class:`Barrier`, hosting.py ``commit``) and an operator's command
(:class:`Reply`). Each is told ``done(ok)`` once per entry: ok when it is committed, not ok
when the member stops leading before that (the entry may be lost). A publish sent again
and found stored (replica.py ``find_publish``) waits for an entry that is not the turn's own
proposal: :func:`done_upto`.
"""
from __future__ import annotations

from typing import Any

from shoal.shared.wire import MOVED, TAG_REPLY


class Reply:
    """An operator's command waiting for its entry's commit (``done(ok)``, as a Barrier)."""

    def __init__(self, streams: Any, peer: bytes, req_id: int, payload: Any,
                 name: str) -> None:
        self.streams, self.peer, self.req_id = streams, peer, req_id
        self.payload, self.name = payload, name

    def done(self, ok: bool) -> None:
        if ok:
            self.streams.send(self.peer, [TAG_REPLY, self.req_id, 0, "", self.payload])
        else:
            self.streams.send(self.peer, [TAG_REPLY, self.req_id, MOVED,
                                          f"stream '{self.name}' lost its leader", None])


class Barrier:
    """A turn's publish answers (hosting.py ``commit``): sent once every chunk the turn
    proposed is committed, as nacks (RESOURCE_ERROR) if one is not. ``send(answers,
    ok)``."""

    __slots__ = ("left", "ok", "answers", "send")

    def __init__(self, answers: list, send: Any) -> None:
        self.left = 0
        self.ok = True
        self.answers = answers
        self.send = send

    def done(self, ok: bool) -> None:
        self.ok = self.ok and ok
        self.left -= 1
        if self.left == 0:
            self.send(self.answers, self.ok)


def done_upto(after: list[list], applied: int) -> list[list]:
    """``after``: ``[log index, answer]`` pairs; tells ``done(True)`` to each answer whose
    entry is applied (index at or below ``applied``: committed) and returns the others."""
    keep = []
    for entry in after:
        if entry[0] <= applied:
            entry[1].done(True)
        else:
            keep.append(entry)
    return keep
