"""CI's own rule (tests/conftest.py ``pytest_collection_modifyitems``): under pytest-xdist's
``--dist loadgroup`` each test module runs whole on one worker, and the folders that share
one outside resource (RabbitMQ on 5672, one Spark session) on one worker each. xdist groups
by the suffix its worker appends to each test's node id; a group marker added after xdist
read the markers is silently ignored, and every module's tests are then spread over every
worker, each starting its own clusters."""
from __future__ import annotations

import os

import pytest

from tests.conftest import SHARED_RESOURCE_GROUPS


def test_this_module_is_one_xdist_group(request) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER") or \
            not request.config.getoption("loadgroup", False):
        pytest.skip("runs under pytest-xdist's --dist loadgroup (the suite's addopts)")
    assert request.node.nodeid.endswith("@tests/house/test_grouping.py")


def test_the_shared_resource_folders_are_groups_of_their_own(request) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER") or \
            not request.config.getoption("loadgroup", False):
        pytest.skip("runs under pytest-xdist's --dist loadgroup (the suite's addopts)")
    items = request.session.items
    for prefix, group in SHARED_RESOURCE_GROUPS.items():
        ids = [i.nodeid for i in items if i.nodeid.startswith(prefix)]
        assert all(i.endswith(f"@{group}") for i in ids), ids[:3]
