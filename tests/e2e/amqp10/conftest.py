"""Fixtures of the AMQP 1.0 end-to-end tests (issue 37); helpers, and how to run these tests
against another broker, are in :mod:`.helpers`."""
from __future__ import annotations

import uuid

import pytest

from tests.conftest import EXTERNAL_URL, free_port, start_cluster, stop_cluster




@pytest.fixture
def names():
    """``names("q")`` -> a unique name for this test."""
    return lambda prefix="q": f"e2e-a10-{prefix}-{uuid.uuid4().hex[:10]}"



@pytest.fixture(scope="session")
def access_cluster(tmp_path_factory):
    """A cluster of its own with the management API (to create vhosts, users and
    permissions at run time) and ``anonymous_login_user`` = guest (SASL ANONYMOUS)."""
    if EXTERNAL_URL:
        pytest.skip("needs a cluster started with its own settings (management port, "
                    "anonymous_login_user); SHOAL_E2E_URL points at an external broker")
    port = free_port()
    c = start_cluster(tmp_path_factory.mktemp("shoal-a10-access"), 2,
                      env={"SHOAL_MANAGEMENT_PORT": str(port),
                           "SHOAL_ANONYMOUS_LOGIN_USER": "guest"})
    c.mgmt_port = port
    yield c
    stop_cluster(c)
