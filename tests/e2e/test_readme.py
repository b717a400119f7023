"""The README's first program works as pasted (issue 2), against a real cluster.

The only change made to the pasted code is the port: the test cluster listens on an
ephemeral port instead of 5672.
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

README = Path(__file__).resolve().parents[2] / "README.md"


def _first_python_block() -> str:
    text = README.read_text()
    section = text.split("## A first program", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.parametrize("fixture", ["cluster", "routers2"])
def test_readme_example_runs_as_pasted(fixture, request, tmp_path):
    """Against the default cluster, and against ``shoal serve --routers 2`` (its shared port:
    the kernel picks the router)."""
    cluster = request.getfixturevalue(fixture)
    code = _first_python_block()
    assert "5672" in code
    assert len(code.strip().splitlines()) <= 25
    script = tmp_path / "example.py"
    script.write_text(code.replace("5672", str(cluster.port)))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "got b'hi there' {'n': 1}"
