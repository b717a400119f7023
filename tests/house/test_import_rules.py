"""The import rules of docs/architecture.md (import-linter contracts in pyproject.toml): the real
tree keeps them, and a forbidden import or an import circle added to a copy of it breaks them, so
`lint-imports` in .ci/run fails CI for either."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROOMS = ("cli", "deploy", "node", "pipeline", "router", "shared")

pytest.importorskip("importlinter", reason="import-linter is in the test extra")
#: ``lint-imports`` (import-linter's console script) run by this interpreter.
LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command; " \
    "sys.exit(lint_imports_command())"


def lint_imports(tree: Path | None = None) -> subprocess.CompletedProcess:
    """``lint-imports`` with the project's contracts over ``tree`` (a folder holding ``shoal/``,
    which comes first on the path) or over the installed project."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    # This interpreter's import-linter, not whatever ``lint-imports`` is on PATH (a venv that is
    # not activated has none there); import-linter has no ``python -m`` entry, so its console
    # script's function is called.
    return subprocess.run([sys.executable, "-c", LINT_IMPORTS, "--no-cache",
                           str(ROOT / "pyproject.toml")], cwd=tree or ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of every room's Python files as ``tmp_path/shoal/<room>``."""
    for room in ROOMS:
        shutil.copytree(ROOT / room, tmp_path / "shoal" / room,
                        ignore=lambda d, names: [n for n in names if not n.endswith(".py")
                                                 and not (Path(d) / n).is_dir()]
                        + ["__pycache__", "wheelhouse"])
    return tmp_path


def add_line(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}\n")


def test_the_tree_keeps_every_contract():
    r = lint_imports()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def test_the_copy_is_what_is_checked(tree: Path):
    r = lint_imports(tree)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("module, line, says", [
    # the pipeline uses router and node only as processes
    ("pipeline/loadtest/schema.py", "import shoal.node.queues.queue",
     "shoal.pipeline.loadtest.schema -> shoal.node.queues.queue"),
    # shared is below both
    ("shared/placement.py", "import shoal.router.routing",
     "shoal.shared.placement -> shoal.router.routing"),
    # router and node are independent
    ("router/routing.py", "from shoal.node import topology",
     "shoal.router.routing -> shoal.node.topology"),
    # node/queues/queue.py imports node/queues/entry.py: the reverse closes a circle, even for types only
    ("node/queues/entry.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import queue",
     "No cycles are allowed in shoal.node"),
], ids=["pipeline-to-node", "shared-to-router", "router-to-node", "circle-in-node"])
def test_a_broken_rule_fails(tree: Path, module: str, line: str, says: str):
    add_line(tree / "shoal" / module, line)
    r = lint_imports(tree)
    assert r.returncode != 0, r.stdout
    assert says in r.stdout
