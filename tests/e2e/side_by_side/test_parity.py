"""Side-by-side conformance: every scenario of :mod:`.parity` runs against RabbitMQ (the
reference) and against a real Shoal cluster; the two records must be equal.

RabbitMQ's URL comes from ``SHOAL_PARITY_RABBITMQ_URL`` (default
``amqp://guest:guest@127.0.0.1:5672/``); when nothing answers an AMQP handshake there, every
test is skipped (checked once per session). ``KNOWN`` lists the scenarios where RabbitMQ 3.10
does something Shoal should not copy (some where RabbitMQ 4 answers otherwise): they run as
non-strict xfail.
"""
from __future__ import annotations

import os
import urllib.parse

import pytest

from ..amqp_raw import RawAMQP
from .parity import SCENARIOS

pytestmark = pytest.mark.e2e

RABBITMQ_URL = os.environ.get("SHOAL_PARITY_RABBITMQ_URL",
                              "amqp://guest:guest@127.0.0.1:5672/").strip()

KNOWN = {
    "frame_errors_rabbitmq_quirks": "RabbitMQ 3.10 drops the socket without connection.close "
    "on an unknown class/method (spec: 503/540) and never notices a body frame running past "
    "the header's body-size",
    "protocol_header_amqp_0_8": "RabbitMQ still speaks AMQP 0-8; Shoal is 0-9-1 only",
    "exchange_declare_unknown_type": "Shoal answers an unknown exchange type as RabbitMQ 4 "
    "does, 406 on the channel; 3.10 closes the connection with 503",
    # Deliberate (docs/conformance.md): both refuse a tune-ok above the offer, RabbitMQ by
    # dropping the socket 3 s later without a word, Shoal with 530 and the reason; a client
    # value of 0 ("no limit") is taken as the server's offer instead of refused.
    **{name: "Shoal refuses a tune-ok above its offer with 530 and a reason (RabbitMQ drops "
             "the socket silently) and reads 0 as 'the server's value' (RabbitMQ refuses it)"
       for name in ("tune_channel_max_65535", "tune_channel_max_0", "tune_frame_max_0",
                    "tune_frame_max_1024", "tune_frame_max_above_offer")},
}


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    """RabbitMQ's URL, or a skip (cached for the session) when it does not answer."""
    u = urllib.parse.urlparse(RABBITMQ_URL)
    vhost = urllib.parse.unquote(u.path[1:]) if u.path not in ("", "/") else "/"
    try:
        with RawAMQP(u.hostname or "127.0.0.1", u.port or 5672, timeout=3.0) as raw:
            raw.open(user=urllib.parse.unquote(u.username or "guest"),
                     password=urllib.parse.unquote(u.password or "guest"), vhost=vhost)
    except Exception as e:  # noqa: BLE001 - any failure means "no RabbitMQ to compare with"
        pytest.skip(f"RabbitMQ is not reachable at {RABBITMQ_URL} ({e!r}); set "
                    "SHOAL_PARITY_RABBITMQ_URL to compare Shoal with a running RabbitMQ")
    return RABBITMQ_URL


def _params():
    for name in SCENARIOS:
        marks = [pytest.mark.xfail(reason=KNOWN[name], strict=False)] if name in KNOWN else []
        yield pytest.param(name, marks=marks, id=name)


def _explain(name: str, a: list, b: list, notes_a: list, notes_b: list) -> str:
    lines = [f"{name}: {(SCENARIOS[name].__doc__ or '').strip().splitlines()[0]}",
             f"{'RabbitMQ':58} | Shoal"]
    for i in range(max(len(a), len(b))):
        ea = a[i] if i < len(a) else "-"
        eb = b[i] if i < len(b) else "-"
        lines.append(f"{'  ' if ea == eb else '≠ '}{ea!s:56} | {eb}")
    lines += [f"RabbitMQ notes: {notes_a}", f"Shoal notes: {notes_b}"]
    return "\n".join(lines)


@pytest.mark.parametrize("name", _params())
def test_parity(name, rabbitmq_url, cluster):
    notes_a, notes_b = [], []
    a = SCENARIOS[name](rabbitmq_url, notes=notes_a)
    b = SCENARIOS[name](cluster.url, notes=notes_b)
    assert b == a, _explain(name, a, b, notes_a, notes_b)
