import os
from pathlib import Path

import pytest

from node_helpers import Net


@pytest.fixture
def net() -> Net:
    return Net()


@pytest.fixture
def jdir(tmp_path: Path) -> Path:
    return tmp_path / "node-0" / "journal"


@pytest.fixture
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """For long commit loops that test logic, not the disk: fdatasync becomes a no-op (the
    page cache still holds every write, which is all a copied crash image needs)."""
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)
