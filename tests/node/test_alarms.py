"""node/alarms.py with fake readings: RabbitMQ's thresholds and reason texts."""
from __future__ import annotations

from types import SimpleNamespace

from shoal.node.alarms import ResourceAlarms, memory_limit, reason


def alarms(rss, free, fraction=0.4, absolute=0, disk_free_limit=50_000_000, limit=1000):
    seen = []
    s = SimpleNamespace(vm_memory_high_watermark=fraction,
                        vm_memory_high_watermark_absolute=absolute,
                        disk_free_limit=disk_free_limit)
    a = ResourceAlarms(s, "/data", seen.append,
                       readings=(lambda: limit, lambda: rss[0], lambda path: free[0]))
    return a, seen


def test_reasons_are_rabbitmqs():
    assert reason({"memory"}) == "low on memory"
    assert reason({"disk"}) == "low on disk"
    assert reason({"memory", "disk"}) == "low on disk & memory"   # as RabbitMQ 3.10.8 says
    assert reason(set()) is None


def test_alarms_are_raised_and_cleared_once_each():
    rss, free = [100], [10**9]
    a, seen = alarms(rss, free)                     # watermark 0.4 * 1000 = 400 bytes
    assert a.memory_watermark == 400
    a.check()
    rss[0] = 401
    a.check()
    a.check()
    free[0] = 49_999_999
    a.check()
    rss[0], free[0] = 10, 50_000_000
    a.check()
    assert seen == ["low on memory", "low on disk & memory", None]


def test_an_absolute_watermark_wins_over_the_fraction():
    a, _ = alarms([0], [10**9], absolute=12345)
    assert a.memory_watermark == 12345


def test_memory_limit_is_positive():
    assert memory_limit() > 0
