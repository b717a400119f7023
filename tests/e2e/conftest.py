"""Client fixtures for the end-to-end suite (the cluster fixtures live in tests/conftest.py)."""
from __future__ import annotations

import contextlib
import uuid

import pytest

from .clients import CLIENTS, Unsupported, connect


def pytest_collection_modifyitems(items):
    for item in items:
        if "/e2e/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(params=CLIENTS)
def kind(request) -> str:
    """The client library a scenario runs with."""
    return request.param


@pytest.fixture
def make_client(cluster, kind):
    """``make_client(confirms=False, kind=None, url=None)``: connected adapters, closed after."""
    made = []

    def make(confirms: bool = False, kind_: str | None = None, url: str | None = None):
        c = connect(kind_ or kind, url or cluster.url, confirms=confirms)
        made.append(c)
        return c

    yield make
    for c in made:
        with contextlib.suppress(Exception):
            c.close()


@pytest.fixture
def client(make_client):
    return make_client()


@pytest.fixture
def names():
    """``names("q")`` -> a unique name for this test."""
    return lambda prefix="x": f"e2e-{prefix}-{uuid.uuid4().hex[:12]}"


def unsupported(fn, *args, **kwargs):
    """Call an adapter method; skip the test if the client cannot express it."""
    try:
        return fn(*args, **kwargs)
    except Unsupported as e:
        pytest.skip(str(e))
