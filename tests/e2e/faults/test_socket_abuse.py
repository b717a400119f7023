"""Socket abuse, small (tests/e2e/faults/socket_abuse.py; the full run, 2,000 idle sockets and its
latency ratio, is by hand with figures in docs/reliability.md). What is asserted is what a
user sees: the normal client's every message comes back while idle sockets, a flooder, a
reader that never reads and a 1 GiB announcement hit the broker; the silent sockets are
closed by the broker; the 1 GiB header is refused. Latency is printed, never asserted."""
from __future__ import annotations

import pytest

from . import socket_abuse

pytestmark = pytest.mark.e2e


@pytest.mark.layout_free   # the router's own sockets: no layout changes how it treats them
def test_a_normal_client_is_served_through_socket_abuse(own_cluster):
    figures = socket_abuse.campaign(own_cluster, idle=100, seconds=12.0)
    print("\n" + ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in figures.items()))
    assert figures["abuse_n"] > 0 and figures["missing"] == 0
    assert figures["idle_opened"] == 100
    assert figures["idle_closed_by_broker"] == 100     # handshake_timeout (10 s)
    assert figures["huge_refused"]
