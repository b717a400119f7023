"""``shoal loadtest`` as a user runs it: bad flags, an unreachable broker, and a short run
against a real Shoal cluster (no assertion on speed)."""
from __future__ import annotations

import subprocess
import sys

import pyarrow.compute as pc
import pytest
from shoal.pipeline.loadtest import schema as S
from shoal.pipeline.loadtest.writer import loss_and_duplicates, read_run

CMD = [sys.executable, "-m", "shoal.cli", "loadtest"]


def _run(args, timeout=90):
    return subprocess.run(CMD + args, capture_output=True, text=True, timeout=timeout,
                          check=False)


@pytest.mark.parametrize("args,why", [
    (["--size", "10"], "--size must be at least 24"),
    (["--rate", "-1"], "--rate must be >= 0"),
    (["--queue-args", "{bad"], "--queue-args is not valid JSON"),
    (["--url", "http://x/"], "--url must start with amqp://"),
    (["--producers", "many"], "invalid int value"),
    (["--queues", "2", "--queue-pattern", "fixed"], "needs %d"),
])
def test_bad_flags_exit_non_zero_with_one_line(args, why):
    r = _run(args)
    assert r.returncode == 2
    assert why in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_unreachable_broker_fails_with_one_line(tmp_path):
    r = _run(["--url", "amqp://guest:guest@127.0.0.1:1/", "--time", "1",
              "--out", str(tmp_path / "run")])
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].startswith("shoal loadtest: ")
    assert "Traceback" not in r.stderr


@pytest.mark.e2e
def test_short_run_against_a_cluster(cluster, tmp_path, uid):
    out = tmp_path / "run"
    r = _run(["--url", cluster.url, "--producers", "2", "--consumers", "2", "--queues", "2",
              "--queue-pattern", f"lt-{uid}-%d", "--rate", "300", "--time", "4",
              "--qos", "50", "--multi-ack-every", "10", "--confirm", "100",
              "--sample-every", "7", "--nodes", ",".join(cluster.node_ids),
              "--label", "shoal", "--out", str(out)], timeout=100)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("time ")]
    assert len(lines) >= 4 and "sent" in lines[0] and "p50/p95/p99" in lines[0]
    assert all(ln.endswith("errors 0") for ln in lines)     # no nack, no return
    assert "summary:" in r.stdout

    run = read_run(out)
    assert run["run"]["label"] == "shoal" and "guest@" in run["run"]["url"]
    assert "guest:guest" not in run["run"]["url"]
    summary = run["run"]["summary"]
    ps, prod = run["per_second"], run["producers"]
    sent = pc.sum(prod["sent"]).as_py()
    assert sent > 0 and sent == summary["sent"]
    assert pc.sum(ps["sent"]).as_py() == sent
    assert pc.sum(prod["confirmed"]).as_py() == sent       # every publish confirmed
    received = pc.sum(ps["received"]).as_py()
    assert received <= sent
    assert loss_and_duplicates(run["received"]) == (0, 0)  # everything acked: nothing lost
    assert received == sent and summary["lost"] == 0
    owners = {q: cluster.owner(q) for q in (f"lt-{uid}-1", f"lt-{uid}-2")}
    assert dict(zip(ps["queue"].to_pylist(), ps["node"].to_pylist())) == owners
    assert set(ps["role"].to_pylist()) == {S.ROLE_PRODUCER, S.ROLE_CONSUMER}
    lat = run["latency"]
    assert lat.num_rows > 0
    assert all(s % 7 == 0 for s in lat["seq"].to_pylist())
    assert pc.min(lat["latency_us"]).as_py() >= 0


def test_without_pyarrow_it_names_the_extra_in_one_line():
    """Issue 23, point 5: after a plain ``pip install .`` (no pyarrow) the command says which
    extra it needs instead of a ModuleNotFoundError traceback."""
    code = ("import sys; sys.modules['pyarrow'] = None\n"
            "from shoal.cli import main\n"
            "raise SystemExit(main(['loadtest', '--time', '1']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "shoal loadtest: pyarrow is not installed: pip install 'shoal[loadtest]'"]
