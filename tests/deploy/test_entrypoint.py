"""deploy/docker-entrypoint.sh without docker: the role dispatch and the node id taken from a
StatefulSet pod name (``<fullname>-node-3`` -> ``node-3``), with a stand-in ``shoal`` on PATH
that prints what it was given."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ENTRYPOINT = Path(__file__).resolve().parents[2] / "deploy" / "docker-entrypoint.sh"


@pytest.fixture
def run(tmp_path):
    fake = tmp_path / "shoal"
    fake.write_text('#!/bin/sh\necho "id=${SHOAL_NODE_ID:-unset} args=$*"\n')
    fake.chmod(0o755)

    def go(*args: str, **env: str) -> str:
        clean = {k: v for k, v in os.environ.items() if k not in ("SHOAL_NODE_ID", "POD_NAME")}
        clean["PATH"] = f"{tmp_path}:{clean['PATH']}"
        out = subprocess.run(["sh", str(ENTRYPOINT), *args], env={**clean, **env},
                             capture_output=True, text=True, check=True)
        return out.stdout.strip()
    return go


def test_node_id_from_the_pod_name(run) -> None:
    assert run("node", "--bind", "tcp://0.0.0.0:5680", POD_NAME="prod-shoal-node-3") == \
        "id=node-3 args=node --bind tcp://0.0.0.0:5680"


def test_explicit_node_id_wins(run) -> None:
    assert run("node", "--node-id", "node-7", POD_NAME="prod-shoal-node-3") == \
        "id=unset args=node --node-id node-7"
    assert run("node", POD_NAME="prod-shoal-node-3", SHOAL_NODE_ID="node-9") == \
        "id=node-9 args=node"


def test_name_without_ordinal_keeps_the_default(run) -> None:
    assert run("node", POD_NAME="shoal-node-abc") == "id=unset args=node"


def test_roles_and_other_commands(run) -> None:
    assert run("router", "--port", "5672") == "id=unset args=router --port 5672"
    assert run("--port", "5672") == "id=unset args=router --port 5672"
    assert run("loadtest", "--time", "1") == "id=unset args=loadtest --time 1"
    assert run("echo", "plain") == "plain"
