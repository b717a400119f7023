"""A published content header whose property list does not parse is refused with 501, so
that no consumer is ever handed one (spec 4.2.6.1; router/amqp/properties.py)."""
from __future__ import annotations

import datetime
import decimal
import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from pamqp import commands
from pamqp.header import ContentHeader

from amqp_testkit import last_close, m, open_channel, open_conn, raw_frame
from shoal.router.amqp.events import MessagePublished
from shoal.router.amqp.properties import MAX_DEPTH, check_properties

PUB = m(commands.Basic.Publish(0, "", "q", False, False), 1)


def header(props_list: bytes, flags: int, body_size: int = 0) -> bytes:
    """A content header payload: class 60, weight 0, body size, flags, then ``props_list``."""
    return struct.pack(">HHQH", 60, 0, body_size, flags) + props_list


def table(raw: bytes) -> bytes:
    return struct.pack(">I", len(raw)) + raw


def check(payload: bytes) -> None:
    check_properties(payload, 0, len(payload))


def publish_with(payload: bytes):
    conn = open_conn()
    open_channel(conn, 1)
    events = conn.receive_data(PUB + raw_frame(2, 1, payload))
    return conn, events


FULL = commands.Basic.Properties(
    content_type="application/json", content_encoding="gzip",
    headers={"s": "x", "n": 1, "big": 2**40, "neg": -5, "f": 1.5, "t": True, "none": None,
             "nested": {"a": [1, "two", {"b": bytearray(b"\x00\xff")}]},
             "when": datetime.datetime(2026, 11, 23, tzinfo=datetime.timezone.utc),
             "dec": decimal.Decimal("1.25"), "ü": "ß"},
    delivery_mode=2, priority=9, correlation_id="c", reply_to="r", expiration="6000",
    message_id="m", timestamp=datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc),
    message_type="t", user_id="guest", app_id="a", cluster_id="")


@pytest.mark.parametrize("props", [
    commands.Basic.Properties(),
    commands.Basic.Properties(delivery_mode=2),
    commands.Basic.Properties(headers={}),
    FULL,
])
def test_headers_that_clients_write_pass(props):
    check(ContentHeader(0, 5, props).marshal())
    conn, events = publish_with(ContentHeader(0, 0, props).marshal())
    assert not conn.closing
    assert [type(e) for e in events] == [MessagePublished]


def _deep(depth: int) -> bytes:
    """A headers table holding a table ... ``depth`` levels below the top one."""
    inner = table(b"")
    for _ in range(depth):
        inner = table(b"\x01kF" + inner)
    return inner


@pytest.mark.parametrize("payload,why", [
    # the fuzz test's find: headers table length 0x00080161 from a shifted property list
    (header(b"\x00\x00\x00\x08\x01aS\x00\x00\x00\x01b\x03", 0x2803), "reserved bits"),
    (header(b"\x00\x00", 0x0001), "reserved bits"),                         # continuation
    (header(table(b"\x01aS\x00\x00\x00\x01b")[:-1], 0x2000), "malformed"),  # table cut short
    (header(struct.pack(">I", 99) + b"\x01aS", 0x2000), "malformed"),       # length > payload
    (header(table(b"\x01aZ\x00"), 0x2000), "malformed"),                    # unknown type 'Z'
    (header(table(b"\x01\xffS\x00\x00\x00\x00"), 0x2000), "malformed"),     # key not UTF-8
    (header(table(b"\x05abS"), 0x2000), "malformed"),                       # key past table
    (header(table(b"\x01aS\x00\x00\x00\x09xy"), 0x2000), "malformed"),      # string past table
    (header(table(b"\x01aI\x00\x01"), 0x2000), "malformed"),                # int past table
    (header(table(b"\x01aA" + table(b"Sxx")), 0x2000), "malformed"),        # array value cut
    (header(b"\x05ab", 0x8000), "malformed"),                               # content-type cut
    (header(b"\x02\xff\xfe", 0x8000), "malformed"),                         # not UTF-8
    (header(b"", 0x1000), "malformed"),                                     # delivery-mode gone
    (header(b"\x00\x00\x00\x00", 0x0040), "malformed"),                     # timestamp: 4 of 8
    (header(_deep(MAX_DEPTH + 2), 0x2000), "malformed"),                    # nested too deep
])
def test_malformed_property_lists_close_the_connection_with_501(payload, why):
    conn, events = publish_with(payload)
    assert not any(isinstance(e, MessagePublished) for e in events)
    ch, close = last_close(conn)
    assert ch == 0 and isinstance(close, commands.Connection.Close)
    assert close.reply_code == 501 and "cannot decode content header" in close.reply_text
    assert why in close.reply_text
    assert (close.class_id, close.method_id) == (60, 0)
    assert conn.closing
    # nothing more is read from a connection that is closing (spec 2.2.4)
    assert not any(isinstance(e, MessagePublished)
                   for e in conn.receive_data(PUB + raw_frame(2, 1, header(b"", 0))))


def test_nesting_up_to_the_limit_passes_and_octets_after_the_list_are_ignored():
    deepest = header(_deep(MAX_DEPTH), 0x2000)
    check(deepest)
    ContentHeader().unmarshal(deepest)                  # and a client library decodes it
    check(header(b"\x02\x03", 0x1800))                  # delivery-mode, priority
    check(header(b"\x02\x03junk", 0x1800))              # trailing octets: decoders skip them


def _pamqp_decodes(payload: bytes) -> bool:
    try:
        ContentHeader().unmarshal(payload)
    except (OverflowError, OSError):
        return True          # a timestamp beyond datetime's range: valid AMQP, pamqp's limit
    except ValueError as exc:
        return "out of range" in str(exc)       # same, as ValueError("year ... is out of range")
    return True


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(flags=st.integers(0, 0xFFFF), rest=st.binary(max_size=64),
       tail=st.sampled_from([b"", table(b"\x01aS\x00\x00\x00\x01b"), table(b"\x01kA" + table(b"b\x01"))]))
def test_whatever_passes_the_check_decodes_with_pamqp(flags, rest, tail):
    payload = header(tail + rest, flags)
    try:
        check(payload)
    except Exception:        # noqa: BLE001 - refused: nothing to compare
        return
    assert _pamqp_decodes(payload), payload
