"""Disk full (issue 5): never a false confirm; connection.blocked; resume when space returns.

The node's data directory sits on a small tmpfs (needs root and mount; skipped otherwise).
Persistent messages on a durable queue fill it; the node's journal cannot write, so the
publisher's confirms are withheld (neither acked nor nacked) and clients that announce the
``connection.blocked`` capability get ``connection.blocked``. Growing the filesystem (tmpfs
remount) lets the journal write again: every withheld confirm becomes a basic.ack, clients get
``connection.unblocked``, and the queue holds exactly the confirmed messages.
"""
import asyncio
import subprocess
import time

import aio_pika
import pika
import pytest

from tests.conftest import start_cluster, stop_cluster

pytestmark = pytest.mark.e2e


@pytest.fixture
def small_disk(tmpfs):
    return tmpfs("3m")


def test_full_disk_withholds_confirms_blocks_and_resumes(small_disk):
    # the disk alarm off (disk_free_limit 0): this test is about a journal that cannot write
    cl = start_cluster(small_disk / "cluster", 1, env={"SHOAL_DISK_FREE_LIMIT": "0"})
    try:
        observer = pika.BlockingConnection(pika.URLParameters(cl.url))
        events = []
        observer.add_on_connection_blocked_callback(lambda c, f: events.append("blocked"))
        observer.add_on_connection_unblocked_callback(lambda c, f: events.append("unblocked"))
        q = "disk-full-q"
        body = b"x" * 32 * 1024

        async def fill():
            conn = await aio_pika.connect(cl.url)
            ch = await conn.channel(publisher_confirms=True)
            await ch.declare_queue(q, durable=True)
            confirmed, pending = 0, []
            for _ in range(400):    # at most 12.5 MiB: far more than the 3 MiB disk
                batch = [asyncio.ensure_future(ch.default_exchange.publish(
                    aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    routing_key=q)) for _ in range(10)]
                done, not_done = await asyncio.wait(batch, timeout=3)
                confirmed += sum(1 for f in done if f.exception() is None)
                assert all(f.exception() is None for f in done), "a publish was nacked"
                if not_done:
                    pending = list(not_done)
                    break
            assert pending, "the disk never filled up"
            await asyncio.sleep(2)
            assert not any(f.done() for f in pending), "a confirm came while the disk was full"
            return conn, confirmed, pending

        loop = asyncio.new_event_loop()
        try:
            conn, confirmed, pending = loop.run_until_complete(fill())
            # RabbitMQ blocks a connection when it publishes during an alarm: the observer
            # publishes (a transient message, to another queue) and is told it is blocked.
            observer.channel().basic_publish("", "disk-full-elsewhere", b"x")
            deadline = time.monotonic() + 15
            while "blocked" not in events and time.monotonic() < deadline:
                observer.process_data_events(time_limit=0.2)
            assert events[:1] == ["blocked"], "no connection.blocked while the disk was full"

            subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)

            async def resume():
                await asyncio.wait_for(asyncio.gather(*pending), 30)
                await conn.close()
            loop.run_until_complete(resume())
        finally:
            loop.close()
        deadline = time.monotonic() + 15
        while "unblocked" not in events and time.monotonic() < deadline:
            observer.process_data_events(time_limit=0.2)
        assert events == ["blocked", "unblocked"]
        ch = observer.channel()
        count = ch.queue_declare(q, durable=True, passive=True).method.message_count
        assert count == confirmed + len(pending)
        observer.close()
    finally:
        stop_cluster(cl)
