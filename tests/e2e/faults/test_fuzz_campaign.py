"""The fuzz campaign's short run (tests/e2e/faults/fuzz_campaign.py; the long run, a million inputs,
is by hand, with its figures in docs/reliability.md). ``SHOAL_FUZZ_INPUTS`` and
``SHOAL_FUZZ_CLUSTER_INPUTS`` scale it."""
from __future__ import annotations

import os

import pika
import pytest

from . import fuzz_campaign

pytestmark = pytest.mark.e2e

INPUTS = int(os.environ.get("SHOAL_FUZZ_INPUTS", "20000"))
CLUSTER_INPUTS = int(os.environ.get("SHOAL_FUZZ_CLUSTER_INPUTS", "300"))


@pytest.mark.layout_free       # in process: the layout passes of .ci/run leave it out
def test_mutated_sessions_in_process_raise_nothing_and_answer_in_frames():
    res = fuzz_campaign.in_process(INPUTS, seed=int(os.environ.get("SHOAL_FUZZ_SEED", "11")))
    print("\n" + res.line("in process"))
    assert not res.exceptions, res.exceptions[:5]
    assert res.hangs == 0 and res.bad_output == 0


def test_mutated_sessions_against_a_cluster_leave_it_serving(own_cluster, uid):
    res = fuzz_campaign.against_cluster(own_cluster.host, own_cluster.port, CLUSTER_INPUTS,
                                        seed=5)
    print("\n" + res.line("against a cluster"))
    assert not res.exceptions and res.hangs == 0
    conn = pika.BlockingConnection(pika.URLParameters(own_cluster.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(f"fuzz-after-{uid}", auto_delete=True)
    ch.basic_publish("", f"fuzz-after-{uid}", b"still serving")
    assert ch.basic_get(f"fuzz-after-{uid}", auto_ack=True)[2] == b"still serving"
    conn.close()
    bad = fuzz_campaign.bad_log_lines(own_cluster.log_path.read_text(errors="replace"))
    assert not bad, bad[:10]
