"""The AMQP 1.0 fuzz campaign's short run (tests/e2e/faults/fuzz_amqp10.py: mutated AMQP 1.0
streams into the sans-IO engine, in process; the million-input run is by hand,
``python -m tests.e2e.faults.fuzz_amqp10 --inputs 1000000``). ``SHOAL_FUZZ10_INPUTS`` and
``SHOAL_FUZZ10_SEED`` scale and vary it."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("proton")       # the corpus is recorded from proton's client engine

from . import fuzz_amqp10, fuzz_amqp10_checks  # noqa: E402

#: in process: the layout passes of .ci/run leave it out
pytestmark = [pytest.mark.e2e, pytest.mark.layout_free]

INPUTS = int(os.environ.get("SHOAL_FUZZ10_INPUTS", "5000"))
SEED = int(os.environ.get("SHOAL_FUZZ10_SEED", "11"))


@pytest.fixture(scope="module")
def campaign():
    res = fuzz_amqp10.in_process(INPUTS, seed=SEED)
    print("\n" + res.line())
    return res


def _report(failures: list[str], counts) -> str:
    return "\n".join(f"[{n}x] {first[:2000]}"
                     for n, first in fuzz_amqp10_checks.distinct(failures, counts).values())


def test_mutated_streams_raise_nothing_and_never_hang(campaign):
    crashes = [f for f in campaign.failures if "output:" not in f.split("\n")[0]]
    assert not crashes, _report(crashes, campaign.kinds)
    assert campaign.hangs == 0


def test_bad_frames_are_answered_with_a_close_that_ends_the_output(campaign):
    bad = [f for f in campaign.failures if "output:" in f.split("\n")[0]]
    assert not bad, _report(bad, campaign.kinds)


def test_the_recorded_sessions_are_served_without_an_error():
    """The unmutated corpus: every stream ends in a clean close (no error condition)."""
    import random
    for stream in fuzz_amqp10_checks.record_sessions():
        res = fuzz_amqp10_checks.Result()
        fuzz_amqp10_checks.run_one(stream, random.Random(0), res, "corpus")
        assert not res.failures, res.failures
        assert not res.conditions.get("close amqp:decode-error"), res.conditions
