"""A producer that ends its run with publishes still in its transport's buffer (a broker that
reads slowly, or applies flow control) does not count them as sent: it waits for them up to
``FLUSH_S``, then drops them with the connection and takes them off its totals, so that a
flooding load's "lost" counts only publishes the broker was handed."""
from __future__ import annotations

import asyncio

import pytest

from shoal.pipeline.loadtest import workers
from shoal.pipeline.loadtest.workers import Producer, unsent_tail


def test_unsent_tail_counts_the_publishes_not_wholly_out_of_the_buffer():
    assert unsent_tail(0, 10, [100]) == 0
    assert unsent_tail(100, 10, [100]) == 1
    assert unsent_tail(101, 10, [100]) == 2         # one byte of the one before: not whole
    assert unsent_tail(10_000, 10, [100]) == 10     # never more than were written
    # two routes of different sizes, alternating: publish 9 is route 1 (30 B), 8 route 0
    assert unsent_tail(30, 10, [50, 30]) == 1
    assert unsent_tail(31, 10, [50, 30]) == 2
    assert unsent_tail(80, 10, [50, 30]) == 2
    assert unsent_tail(81, 10, [50, 30]) == 3


class _Transport:
    def __init__(self, buffered: int, drains: bool) -> None:
        self.buffered, self.drains, self.aborted = buffered, drains, False

    def is_closing(self) -> bool:
        return self.aborted

    def get_write_buffer_size(self) -> int:
        if self.drains:
            self.buffered = max(0, self.buffered - 100)
        return self.buffered

    def abort(self) -> None:
        self.aborted = True


def _producer(transport: _Transport) -> Producer:
    p = Producer.__new__(Producer)
    p.client = type("Client", (), {"transport": transport})()
    p.total = [[5, 0, 0, 0], [5, 0, 0, 0]]       # 10 publishes over two queues, alternating
    p.window = [[2, 0, 0, 0], [1, 0, 0, 0]]
    return p


def test_publishes_left_in_the_buffer_are_dropped_and_not_counted_sent(monkeypatch):
    monkeypatch.setattr(workers, "FLUSH_S", 0.05)
    t = _Transport(buffered=250, drains=False)
    p = _producer(t)
    asyncio.run(p._flush_or_drop(10, [100, 100], [0, 1]))
    assert t.aborted
    # publishes 7, 8, 9 (queues 1, 0, 1) never left: 2 off queue 1, 1 off queue 0
    assert [row[0] for row in p.total] == [4, 3]
    assert [row[0] for row in p.window] == [1, 0]


@pytest.mark.parametrize("buffered", [0, 350])
def test_a_buffer_that_empties_in_time_leaves_the_counts_alone(monkeypatch, buffered):
    monkeypatch.setattr(workers, "FLUSH_S", 5.0)
    t = _Transport(buffered=buffered, drains=True)
    p = _producer(t)
    asyncio.run(p._flush_or_drop(10, [100, 100], [0, 1]))
    assert not t.aborted
    assert [row[0] for row in p.total] == [5, 5]
