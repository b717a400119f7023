"""Issue 5's crash test, as issue 22's fault loop (tests/e2e/faults/fault_loop.py): a confirmed
persistent message is never lost through kill -9 of random nodes and routers.

``SHOAL_FAULT_ROUNDS`` rounds (10 by default, as CI runs it) on a cluster of 3 nodes and 2
routers; ``SHOAL_CRASH_SEED`` fixes the victims. Every process of the cluster is gone after it
stops (stop_cluster checks).
"""
from __future__ import annotations

import os

import pytest

from tests.conftest import EXTERNAL_URL, start_cluster, stop_cluster

from . import fault_loop

pytestmark = pytest.mark.e2e

ROUNDS = int(os.environ.get("SHOAL_FAULT_ROUNDS", "10"))


def test_confirmed_messages_survive_repeated_kill_9(tmp_path):
    if EXTERNAL_URL:
        pytest.skip("kills the cluster's own processes")
    cl = start_cluster(tmp_path / "cluster", 3, routers=2)
    try:
        seed = os.environ.get("SHOAL_CRASH_SEED")
        report = fault_loop.run(cl, ROUNDS, int(seed) if seed else None)
    finally:
        stop_cluster(cl)     # exit 0 and no process left behind
    print("\n" + report.line())
    assert len(report.rounds) == ROUNDS
    assert report.confirmed > 100, "too few confirms to mean anything"
    assert not report.lost, f"confirmed but never delivered: {report.lost[:20]}"
    assert not report.unknown, f"delivered but never published: {report.unknown[:20]}"
    assert not report.fresh_duplicates, \
        f"duplicates without redelivered: {report.fresh_duplicates[:20]}"
