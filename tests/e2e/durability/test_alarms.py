"""Resource alarms end to end (issue 22, point 4; node/alarms.py): a node low on disk or
memory blocks publishers as RabbitMQ does (connection.blocked with RabbitMQ's reason, the
publishing connection not read), consumers keep draining, and connection.unblocked follows
when the alarm clears. The disk is a small tmpfs the test fills and empties itself."""
from __future__ import annotations

import os
import time

import pika
import pytest

from tests.conftest import start_cluster, stop_cluster

pytestmark = pytest.mark.e2e


def pump(conn, until, seconds: float = 15.0) -> bool:
    """Process ``conn``'s events until ``until()`` or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while not until() and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.2)
    return until()


def pump_log(cl, words: str, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while words not in cl.log_path.read_text(errors="replace"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_a_disk_alarm_blocks_publishers_lets_consumers_drain_and_clears(tmpfs):
    disk = tmpfs("40m")
    cl = start_cluster(disk / "cluster", 1, env={"SHOAL_DISK_FREE_LIMIT": str(15 * 2**20)})
    try:
        pub = pika.BlockingConnection(pika.URLParameters(cl.url))
        events = []
        pub.add_on_connection_blocked_callback(
            lambda c, f: events.append(("blocked", f.method.reason)))
        pub.add_on_connection_unblocked_callback(lambda c, f: events.append(("unblocked",)))
        pch = pub.channel()
        pch.queue_declare("alarm-q")
        pch.queue_declare("alarm-backlog")
        for i in range(3):
            pch.basic_publish("", "alarm-backlog", f"b{i}".encode())
        pch.basic_publish("", "alarm-q", b"before")

        con = pika.BlockingConnection(pika.URLParameters(cl.url))
        cch = con.channel()
        got = []
        cch.basic_consume("alarm-q", lambda ch, m, p, b: got.append(b), auto_ack=True)
        assert pump(con, lambda: got == [b"before"])

        filler = disk / "filler"
        with open(filler, "wb") as f:        # 30 of 40 MiB: less than 15 MiB free
            f.write(b"\0" * 30 * 2**20)
        assert pump_log(cl, "disk alarm set"), "the node did not raise the disk alarm"
        # As RabbitMQ: the connection is blocked when it publishes during the alarm.
        pch.basic_publish("", "alarm-q", b"during-1")
        assert pump(pub, lambda: events), "no connection.blocked"
        assert events == [("blocked", "low on disk")]
        pch.basic_publish("", "alarm-q", b"during-2")      # written, not read by the broker
        backlog = []
        cch.basic_consume("alarm-backlog", lambda ch, m, p, b: backlog.append(b),
                          auto_ack=True)
        assert pump(con, lambda: len(backlog) == 3), "consumers must keep draining"
        assert not pump(con, lambda: b"during-2" in got, seconds=2.0), \
            "a blocked publisher was read"

        os.unlink(filler)
        assert pump(pub, lambda: len(events) == 2)
        assert events[1] == ("unblocked",)
        assert pump(con, lambda: b"during-2" in got), "the publish waited, then went through"
        pub.close()
        con.close()
    finally:
        stop_cluster(cl)


def test_a_memory_alarm_blocks_with_rabbitmqs_reason(tmp_path):
    cl = start_cluster(tmp_path / "cluster", 1,
                       env={"SHOAL_VM_MEMORY_HIGH_WATERMARK_ABSOLUTE": "1"})   # always over
    try:
        conn = pika.BlockingConnection(pika.URLParameters(cl.url))
        events = []
        conn.add_on_connection_blocked_callback(
            lambda c, f: events.append(f.method.reason))
        assert pump_log(cl, "memory alarm set")
        assert not pump(conn, lambda: events, seconds=1.0)   # not blocked before it publishes
        conn.channel().basic_publish("", "nowhere", b"x")
        assert pump(conn, lambda: events)
        assert events == ["low on memory"]
        # no conn.close(): a blocked connection is not read, so its connection.close would
        # wait for the alarm to clear (as with RabbitMQ); the cluster's stop closes it
    finally:
        stop_cluster(cl)
