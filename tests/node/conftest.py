import pytest

from node_helpers import Net


@pytest.fixture
def net() -> Net:
    return Net()
