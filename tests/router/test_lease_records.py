"""When a delivery lease's records may wait (router/links/records.py ``hold_for``): a batch
the node would only count waits, up to ACKED_HOLD_S; anything the node acts on, or a LEASED
record as old as the flush interval, sends it. The clock is passed in (no timing)."""
from __future__ import annotations

import pytest

from shoal.router.links import records as R
from shoal.router.links.records import ACKED_HOLD_S, LeaseRecords
from shoal.shared.wire import OUTCOME_ACK, T

FLUSH = 0.005


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(R.time, "monotonic", lambda: now[0])
    return now


def leased(recs, cid, did, pid=None):
    rec = [T.LEASED, cid, did, "", "q", b"h", b"m", None]
    recs.add(rec + [pid] if pid else rec)


def test_counts_and_their_consumers_credit_wait_up_to_acked_hold_s(clock):
    recs = LeaseRecords()
    leased(recs, 1, -1)
    assert recs.acked(-1) == 0
    clock[0] += 0.001
    credit = [[T.CREDIT, 1, 1, False]]
    assert recs.hold_for(credit, clock[0], FLUSH) == pytest.approx(ACKED_HOLD_S - 0.001)
    leased(recs, 1, -2)
    assert recs.acked(-2) == 0
    assert recs.hold_for(credit, clock[0] + ACKED_HOLD_S, FLUSH) == 0.0
    assert recs.take() == [[T.LEASE_ACKED, 1, 2]]
    assert recs.hold_for([], clock[0], FLUSH) == 0.0     # nothing to wait for


def test_an_unacked_record_leaves_within_the_flush_interval_of_its_queueing(clock):
    recs = LeaseRecords()
    leased(recs, 1, -1)
    assert recs.acked(-1) == 0
    clock[0] += 0.004
    leased(recs, 1, -2)                                  # not acked yet
    assert recs.hold_for([], clock[0] + 0.001, FLUSH) == pytest.approx(0.004)
    assert recs.hold_for([], clock[0] + FLUSH, FLUSH) == 0.0


@pytest.mark.parametrize("urgent", [
    [[T.SETTLE, OUTCOME_ACK, [5]]],                      # a settlement the node acts on
    [[T.CREDIT, 2, 1, False]],                           # credit of a consumer not lent here
    [[T.CREDIT, 1, 1, True]],                            # a drain
])
def test_what_the_node_acts_on_is_sent_at_once(clock, urgent):
    recs = LeaseRecords()
    leased(recs, 1, -1)
    assert recs.acked(-1) == 0
    assert recs.hold_for(urgent, clock[0], FLUSH) == 0.0


def test_a_lease_end_is_sent_at_once(clock):
    recs = LeaseRecords()
    leased(recs, 1, -1)
    leased(recs, 1, -2)
    assert recs.acked(-1) == 0 and recs.acked(-2) == 0   # one count, one emptied record
    assert recs.hold_for([], clock[0], FLUSH) > 0
    recs.add([T.LEASE_END, 1, 3])
    assert recs.hold_for([], clock[0], FLUSH) == 0.0
    assert recs.take() == [[T.LEASE_ACKED, 1, 2], [T.LEASE_END, 1, 3]]


def test_a_record_with_a_publish_id_waits_like_any_and_gives_its_id_back_when_acked(clock):
    recs = LeaseRecords()
    leased(recs, 1, -1, pid=7)
    assert recs.hold_for([], clock[0], FLUSH) == pytest.approx(FLUSH)
    assert recs.acked(-1) == 7                           # the router confirms publish 7
    assert recs.acked(-1) is None
    assert recs.take() == [[T.LEASE_ACKED, 1, 1]]
