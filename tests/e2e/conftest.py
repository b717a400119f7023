"""Client fixtures for the end-to-end suite (the cluster fixtures live in tests/conftest.py)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import uuid

import pytest

from .clients import CLIENTS, Unsupported, connect


def pytest_collection_modifyitems(items):
    for item in items:
        if "/e2e/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.e2e)


#: ``SHOAL_E2E_QUEUE_TYPE=quorum`` (by hand): the client scenarios declare their named queues
#: as quorum queues (durable), to run the real-client tests against quorum queues
#: (docs/replication.md); scenarios that need what a quorum queue refuses then fail with 406.
QUEUE_TYPE = os.environ.get("SHOAL_E2E_QUEUE_TYPE", "").strip()


def as_quorum(c) -> None:
    declare = c.declare_queue

    def declare_queue(name: str = "", *, durable=False, exclusive=False, auto_delete=False,
                      passive=False, arguments=None):
        if name and not exclusive and not auto_delete and not passive:
            durable = True
            arguments = {"x-queue-type": "quorum", **(arguments or {})}
        return declare(name, durable=durable, exclusive=exclusive, auto_delete=auto_delete,
                       passive=passive, arguments=arguments)
    c.declare_queue = declare_queue


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
        if QUEUE_TYPE == "quorum":
            as_quorum(c)
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


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(size)``: a directory on a tmpfs of ``size`` ("3m"), unmounted after the test
    (needs root and mount; the test is skipped otherwise)."""
    mounted = []

    def mount(size: str):
        mnt = tmp_path / f"disk{len(mounted)}"
        mnt.mkdir()
        if os.geteuid() != 0:
            pytest.skip("mounting a small tmpfs needs root")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
