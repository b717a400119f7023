"""AMQP 1.0 messages kept whole (router/amqp10/whole.py, issue 45): a message published over
1.0 is stored as its sections and given back to a 1.0 consumer with every section as sent
(the bare message byte for byte), to a 0-9-1 consumer converted; what a node adds (dead
letters, delivery counts, a modified outcome's annotations) reaches both."""
from __future__ import annotations

import datetime
import uuid

import pytest
from pamqp.header import ContentHeader

from tests.router.amqp10_peer import proton

from shoal.node.queues.deadletter import dead_letter_header, delivery_count_header
from shoal.router.amqp10 import convert, whole
from shoal.router.amqp10.codec import Described, Symbol, Timestamp, Typed, decode, encode

#: one application property of every AMQP 1.0 primitive type proton can write
EVERY_TYPE = {
    "null": None, "bool": True, "ubyte": proton.ubyte(200), "ushort": proton.ushort(60000),
    "uint": proton.uint(4_000_000_000), "ulong": proton.ulong(2 ** 63 + 5),
    "byte": proton.byte(-100), "short": proton.short(-30000), "int": proton.int32(-2 ** 31),
    "long": -2 ** 62, "float": proton.float32(1.5), "double": 2.25,
    "char": proton.char("é"), "timestamp": proton.timestamp(1_700_000_000_123),
    "uuid": uuid.UUID(int=77), "binary": b"\x00\xff", "string": "text ü",
    "symbol": proton.symbol("sym"), "decimal32": proton.decimal32(7),
    "decimal64": proton.decimal64(8), "decimal128": proton.decimal128(b"\x01" * 16)}


def _message(body=b"hello") -> proton.Message:
    m = proton.Message(body=body, inferred=isinstance(body, bytes), id=uuid.UUID(int=1),
                       correlation_id=proton.ulong(99), content_type="text/plain",
                       content_encoding="utf-8", priority=7, ttl=5.0, durable=True,
                       reply_to="/queues/r", user_id=b"guest", group_id="g",
                       reply_to_group_id="rg", creation_time=1700000000.0, subject="subj",
                       address="/queues/q", expiry_time=1800000000.0, group_sequence=3,
                       properties=dict(EVERY_TYPE),
                       annotations={Symbol("x-opt-a"): proton.ulong(9),
                                    Symbol("x-opt-s"): proton.symbol("s"), Symbol("k"): 1})
    m.instructions = {Symbol("x-opt-delivery-only"): "dropped"}   # delivery annotations
    return m


def _sections(payload: bytes) -> dict[int, bytes]:
    return {code: payload[at:end] for code, at, _, end in convert.sections(payload)}


def _props(header: bytes):
    ch = ContentHeader()
    ch.unmarshal(header)
    return ch.properties


def _with_footer(payload: bytes) -> bytes:
    return payload + b"\x00\x53\x78" + encode({Symbol("sig"): b"\x01\x02"})


@pytest.mark.parametrize("body", [b"hello", {"k": [1, 2]}, ["a", 1], "text"],
                         ids=["data", "amqp-value map", "amqp-value list", "amqp-value str"])
def test_every_section_and_type_comes_back_as_sent(body):
    sent = _with_footer(bytes(_message(body).encode()))
    stored = convert.to_091(sent)
    got = whole.to_amqp10(stored.header, stored.body, "", "q", False)
    a, b = _sections(sent), _sections(got)
    for code in (convert.PROPERTIES, convert.APP_PROPERTIES, convert.FOOTER):
        assert b[code] == a[code]                   # byte for byte
    body_codes = [c for c in a if c in (convert.DATA, convert.VALUE, convert.SEQUENCE)]
    assert [b[c] for c in body_codes] == [a[c] for c in body_codes]
    assert convert.DELIVERY_ANN not in b            # for one hop (part 3.2.2)
    ann = decode(b[convert.MESSAGE_ANN], 3)[0]
    assert ann == {"x-opt-a": 9, "x-opt-s": "s", "k": 1, "x-exchange": "",
                   "x-routing-key": "q"}
    ma = a[convert.MESSAGE_ANN]
    assert ma[6 if ma[3] == 0xc1 else 12:] in b[convert.MESSAGE_ANN]   # entries as sent
    back = proton.Message()
    back.decode(got)
    assert back.properties == EVERY_TYPE
    assert (back.durable, back.priority, back.ttl, back.first_acquirer) == (True, 7, 5.0, True)
    assert (back.address, back.subject, back.user_id, back.group_id, back.reply_to_group_id,
            back.group_sequence) == ("/queues/q", "subj", b"guest", "g", "rg", 3)


def test_a_redelivery_has_the_brokers_header_section():
    stored = convert.to_091(bytes(_message().encode()))
    back = proton.Message()
    back.decode(whole.to_amqp10(stored.header, stored.body, "ex", "rk", True))
    assert not back.first_acquirer and back.delivery_count == 1
    assert back.annotations["x-exchange"] == "ex" and back.annotations["x-routing-key"] == "rk"


def test_a_0_9_1_consumer_gets_it_converted():
    stored = convert.to_091(bytes(_message().encode()))
    header, body = whole.for_091(stored.header, stored.body)
    p = _props(header)
    assert body == b"hello" and p.message_type is None
    assert (p.content_type, p.priority, p.expiration, p.delivery_mode, p.app_id) == \
        ("text/plain", 7, "5000", 2, "g")
    assert p.message_id == f"urn:uuid:{uuid.UUID(int=1)}" and p.correlation_id == "99"
    assert p.headers["x-opt-a"] == 9 and p.headers["string"] == "text ü"
    ch = ContentHeader()
    ch.unmarshal(header)
    assert ch.body_size == len(body)


def test_x_basic_type_is_the_0_9_1_type():
    m = proton.Message(body=b"b", inferred=True,
                       annotations={Symbol("x-basic-type"): "order.created"})
    stored = convert.to_091(bytes(m.encode()))
    header, _ = whole.for_091(stored.header, stored.body)
    assert _props(header).message_type == "order.created"


def test_a_0_9_1_message_is_not_touched():
    header = convert.content_header(3, {"content_type": "text/plain"})
    assert whole.for_091(header, b"abc") == (header, b"abc")
    assert not whole.is_whole(header)


def test_dead_lettering_annotates_as_rabbitmq_4():
    stored = convert.to_091(bytes(_message().encode()))
    dead = dead_letter_header(stored.header, len(stored.body), "src", "rejected", "",
                              "src", 1_700_000_000_000)
    back = proton.Message()
    back.decode(whole.to_amqp10(dead, stored.body, "dlx", "src", False))
    ann = back.annotations
    assert "x-death" not in ann
    assert (ann["x-first-death-queue"], ann["x-first-death-reason"],
            ann["x-first-death-exchange"]) == ("src", "rejected", "")
    deaths = decode(_sections(whole.to_amqp10(dead, stored.body, "dlx", "src", False))
                    [convert.MESSAGE_ANN], 3)[0]["x-opt-deaths"]
    assert deaths == [{"queue": "src", "reason": "rejected", "count": 1,
                       "first-time": Timestamp(1_700_000_000_000),
                       "last-time": Timestamp(1_700_000_000_000), "exchange": "",
                       "routing-keys": ["src"], "ttl": 5000}]
    assert back.properties == EVERY_TYPE               # the bare message is untouched
    header, _ = whole.for_091(dead, stored.body)       # and 0-9-1 sees x-death as ever
    assert _props(header).headers["x-death"][0]["queue"] == "src"


def test_a_nodes_delivery_count_and_a_changed_annotation_reach_the_consumer():
    stored = convert.to_091(bytes(_message().encode()))
    header = delivery_count_header(stored.header, len(stored.body), 2)
    back = proton.Message()
    back.decode(whole.to_amqp10(header, stored.body, "", "q", True))
    assert back.delivery_count == 2 and back.annotations["x-delivery-count"] == 2
    assert back.annotations["x-opt-a"] == 9 and "string" not in back.annotations


def test_body_sections_from_a_0_9_1_publisher_get_properties_from_its_header():
    header = convert.content_header(0, {"message_type": "amqp-1.0", "message_id": "m9",
                                        "headers": {"h": "v"}})
    body = encode(Described(0x77, "value"))
    back = proton.Message()
    back.decode(whole.to_amqp10(header, body, "", "q", False))
    assert (back.body, back.id, back.properties) == ("value", "m9", {"h": "v"})


def test_a_stored_body_that_is_not_sections_is_delivered_as_stored():
    header = convert.content_header(0, {"message_type": "amqp-1.0"})
    assert whole.for_091(header, b"not sections") == (header, b"not sections")


def test_an_array_of_maps_round_trips_through_proton():
    raw = encode(Typed("array", ("map", [{Symbol("a"): 1}, {Symbol("b"): "x"}])))
    d = proton.Data()
    d.decode(raw)
    assert decode(raw)[0] == [{"a": 1}, {"b": "x"}]
    assert list(d.get_object()) == [{proton.symbol("a"): 1}, {proton.symbol("b"): "x"}]


def test_timestamps_and_datetimes():
    m = proton.Message(body=b"x", inferred=True, creation_time=1700000000.5)
    stored = convert.to_091(bytes(m.encode()))
    header, _ = whole.for_091(stored.header, stored.body)
    assert _props(header).timestamp == datetime.datetime(2023, 11, 14, 22, 13, 20,
                                                         tzinfo=datetime.timezone.utc)
    back = proton.Message()
    back.decode(whole.to_amqp10(stored.header, stored.body, "", "q", False))
    assert back.creation_time == 1700000000.5           # kept to the ms, not the second


def test_a_data_section_that_is_not_binary_is_refused():
    bad = b"\x00\x53\x75" + encode("not binary")
    with pytest.raises(convert.DecodeError, match="not binary"):
        convert.to_091(bad)


def _walked(body: bytes) -> tuple[bytes, bytes, bytes, int]:
    """What a delivery reads of a stored body, by the general walk (convert.sections):
    message annotations, properties, application properties, where the rest starts."""
    ma = props = app = b""
    rest_at = 0
    for code, _, start, end in convert.sections(body):
        if code == convert.MESSAGE_ANN:
            ma, rest_at = body[start:end], end
        elif code == convert.PROPERTIES:
            props = body[start:end]
        elif code == convert.APP_PROPERTIES:
            app = body[start:end]
        elif code != convert.FOOTER:
            break
    return ma, props, app, rest_at


@pytest.mark.parametrize("make", [
    lambda: _message(),
    lambda: _message({"a": [1, 2]}),
    lambda: proton.Message(body=b"x" * 100, inferred=True),
    lambda: proton.Message(body="text"),
    lambda: proton.Message(body=b"b", inferred=True, properties={"k": proton.char("z")}),
    lambda: proton.Message(body=b"b", inferred=True,
                           annotations={Symbol("x-opt-t"): proton.timestamp(5)}),
], ids=["every section", "amqp-value", "data only", "string value", "char", "timestamp"])
def test_a_delivery_reads_the_same_sections_as_the_general_walk(make):
    """whole.py ``Stored`` reads a delivery's sections with a short walk (stored bodies use
    short descriptors) and convert.py ``_skip`` steps over fixed-width values by their
    code: both as the general walk, with a footer too."""
    for payload in (bytes(make().encode()), _with_footer(bytes(make().encode()))):
        body = convert.to_091(payload).body
        st = whole.Stored(body)
        assert (st.ma, st.props, st.app, st.rest_at) == _walked(body)
        assert st.body_at == st.body_end == len(body)


@pytest.mark.parametrize("value", list(EVERY_TYPE.values()), ids=list(EVERY_TYPE))
def test_a_value_is_stepped_over_where_decoding_ends(value):
    """convert.py ``_skip``: by size octets or by the code's width, the end decoding finds."""
    data = proton.Data()
    data.put_object(value)
    raw = bytes(data.encode())
    assert convert._skip(raw, 0, len(raw)) == decode(raw)[1] == len(raw)
    with pytest.raises(convert.DecodeError):
        convert._skip(raw[:-1] if len(raw) > 1 else b"", 0, len(raw) - 1)
