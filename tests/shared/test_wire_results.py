"""A node's answers in runs (shared/wire.py ``coalesce_results``): a batch's PUBLISH_RESULTs
for consecutive publish ids with one outcome travel as one message, and reading the runs back
gives the batch as it was."""
from __future__ import annotations

from hypothesis import given, strategies as st

from shoal.shared.wire import (TAG_PUBLISH_MOVED, TAG_PUBLISH_RESULT as R, TAG_WORK,
                               coalesce_results)


def expand(batch: list[list]) -> list[list]:
    """What the router reads from a coalesced batch: one answer per publish id."""
    out = []
    for m in batch:
        if m[0] == R and len(m) == 5:
            out += [[R, m[1] + i, m[2], m[3]] for i in range(m[4])]
        else:
            out.append(m)
    return out


def test_consecutive_equal_answers_become_one_run():
    batch = [[R, 1, 0, 1], [R, 2, 0, 1], [R, 3, 0, 1], [R, 4, 406, 0], [R, 5, 406, 0]]
    assert coalesce_results(batch) == [[R, 1, 0, 1, 3], [R, 4, 406, 0, 2]]
    assert batch[0] == [R, 1, 0, 1]                 # the caller's messages are left alone


def test_a_gap_another_outcome_or_another_message_ends_a_run():
    batch = [[R, 1, 0, 1], [R, 3, 0, 1], [R, 4, 0, 2], [R, 5, 0, 2], [TAG_WORK, 7],
             [R, 6, 0, 2], [TAG_PUBLISH_MOVED, 7, 0, 1, ["q"]], [R, 8, 0, 2]]
    assert coalesce_results(batch) == [
        [R, 1, 0, 1], [R, 3, 0, 1], [R, 4, 0, 2, 2], [TAG_WORK, 7], [R, 6, 0, 2],
        [TAG_PUBLISH_MOVED, 7, 0, 1, ["q"]], [R, 8, 0, 2]]


def test_a_batch_of_one_is_returned_as_it_is():
    batch = [[R, 1, 0, 1]]
    assert coalesce_results(batch) is batch


answers = st.lists(st.tuples(st.integers(1, 4), st.sampled_from([0, 406]),
                             st.integers(0, 2), st.booleans()), max_size=40)


@given(answers)
def test_reading_the_runs_back_gives_the_batch(spec):
    """Random batches: ids that step by 1-4, two codes, 0-2 queues, other messages between."""
    batch, pid = [], 0
    for step, code, routed, other in spec:
        pid += step
        batch.append([TAG_WORK, pid] if other else [R, pid, code, routed])
    before = [list(m) for m in batch]
    out = coalesce_results(batch)
    assert expand(out) == before and batch == before
    assert len(out) <= len(batch)
