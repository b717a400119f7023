"""A queue holds more than its memory budget (issue 22, point 4; node/queues/paging.py): with
``queue_max_in_memory_bytes`` at 1 MiB, 96 MiB published to one queue go to the node's page
files instead of its memory; the persistent ones are paged again when a restarted node restores
them from its journal; every message comes back intact, in order, with pika."""
from __future__ import annotations

from pathlib import Path

import pika
import pytest

from tests.conftest import start_cluster, stop_cluster

pytestmark = pytest.mark.e2e

SIZE = 512 * 1024
COUNT = 192                                   # 96 MiB


def rss(pids: list[int]) -> int:
    """Resident bytes of ``pids`` together (VmRSS)."""
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def paged_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in data_dir.glob("node-*/pages/*.page"))


def test_a_queue_deeper_than_its_budget_lives_in_page_files(tmp_path):
    cl = start_cluster(tmp_path / "cluster", 1,
                       env={"SHOAL_QUEUE_MAX_IN_MEMORY_BYTES": str(1 << 20)})
    try:
        pids = [r.pid for r in cl.routers] + [n.pid for n in cl.nodes if n.pid]
        conn = pika.BlockingConnection(pika.URLParameters(cl.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("deep", durable=True)
        before = rss(pids)
        for i in range(COUNT):
            body = i.to_bytes(4, "big") * (SIZE // 4)
            props = pika.BasicProperties(delivery_mode=2 if i % 2 else 1)
            ch.basic_publish("", "deep", body, props)
        grown = rss(pids) - before
        on_disk = paged_bytes(cl.data_dir)
        print(f"published {COUNT * SIZE >> 20} MiB: page files {on_disk >> 20} MiB, "
              f"resident memory +{grown >> 20} MiB")
        assert on_disk >= (COUNT * SIZE) - (2 << 20), \
            f"only {on_disk} bytes in page files for {COUNT * SIZE} published"
        assert grown < COUNT * SIZE // 2, \
            f"the cluster grew {grown >> 20} MiB holding {COUNT * SIZE >> 20} MiB of paged bodies"
        assert ch.queue_declare("deep", durable=True, passive=True).method.message_count == COUNT
        got = []
        for method, props, body in ch.consume("deep", inactivity_timeout=30):
            assert method is not None, f"consumer stalled after {len(got)} messages"
            got.append(body)
            if props.delivery_mode != 2:
                ch.basic_ack(method.delivery_tag)     # the persistent ones go back at close
            if len(got) == COUNT:
                break
        assert [b[:4] for b in got] == [i.to_bytes(4, "big") for i in range(COUNT)]
        assert all(len(b) == SIZE and b == b[:4] * (SIZE // 4) for b in got)
        conn.close()
    finally:
        stop_cluster(cl)
    assert not list(cl.data_dir.glob("node-*/pages/*.page")), "page files left after stop"

    # Restarted, the journal gives back the persistent half (never acked), paged again as it
    # is restored.
    cl = start_cluster(tmp_path / "cluster", 1,
                       env={"SHOAL_QUEUE_MAX_IN_MEMORY_BYTES": str(1 << 20)})
    try:
        assert paged_bytes(cl.data_dir) >= (COUNT // 2) * SIZE - (2 << 20)
        conn = pika.BlockingConnection(pika.URLParameters(cl.url))
        ch = conn.channel()
        got = []
        for method, _props, body in ch.consume("deep", inactivity_timeout=30):
            assert method is not None, f"consumer stalled after {len(got)} messages"
            got.append(body)
            ch.basic_ack(method.delivery_tag)
            if len(got) == COUNT // 2:
                break
        ch.cancel()
        assert [b[:4] for b in got] == [i.to_bytes(4, "big") for i in range(1, COUNT, 2)]
        assert all(len(b) == SIZE and b == b[:4] * (SIZE // 4) for b in got)
        conn.close()
    finally:
        stop_cluster(cl)
