"""The measuring tools docs/performance.md quotes run and report what they say they do
(tests/benchmarks/hot_path.py, wakeup_cost.py, issue 20): every published message of the hot
path is delivered, and each mode prints its figure. Nothing here asserts a speed."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_hot_path_delivers_every_message_of_the_warm_up_and_the_five_rounds():
    out = _run("hot_path.py", "--messages", "1000")
    m = re.search(r"([\d.]+) µs of CPU per message .* bursts of 5; (\d+) delivered in all", out)
    assert m, out
    assert int(m.group(2)) == 2000 + 5 * 1000
    assert float(m.group(1)) > 0


def test_hot_path_idle_mode_prints_the_bursts_own_cpu():
    for idle in ("0", "0.1"):
        out = _run("hot_path.py", "--messages", "1000", "--idle-ms", idle)
        assert re.search(rf"[\d.]+ µs of CPU per message, work only \(bursts of 5, {idle} ms "
                         rf"idle after each; 200 messages\)", out), out


def test_wakeup_cost_prints_both_sides_and_the_idle_childs_figure():
    assert re.search(r"round trip: [\d.]+ µs wall, [\d.]+ µs CPU \(both processes\), "
                     r"[\d.]+ µs CPU per wake-up", _run("wakeup_cost.py"))
    assert re.search(r"the child, idle 0.01 ms before each wake-up: [\d.]+ µs CPU per "
                     r"wake-up \(20000 wake-ups\)", _run("wakeup_cost.py", "--gap-ms", "0.01"))
