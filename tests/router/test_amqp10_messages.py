"""AMQP 1.0 values, addresses and message conversion (router/amqp10/codec.py, address.py,
convert.py): round trips through python-qpid-proton's codec, RabbitMQ 4's conversion table
(docs/amqp10.md) both ways, and the address forms."""
from __future__ import annotations

import datetime
import uuid

import pytest
from hypothesis import given, settings, strategies as st
from pamqp import commands as C
from pamqp.header import ContentHeader

from tests.router.amqp10_peer import proton

from shoal.router.amqp10 import address, convert, frames, whole
from shoal.router.amqp10.codec import (DecodeError, Described, Symbol, Timestamp, Typed, decode,
                                       encode)

values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 63) - 1) | st.text(max_size=300)
    | st.binary(max_size=300) | st.floats(allow_nan=False) | st.uuids(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=5),
    max_leaves=20)


@given(values)
@settings(max_examples=300, deadline=None)
def test_values_round_trip(v):
    assert decode(encode(v))[0] == v


@given(st.binary(max_size=64))
@settings(max_examples=500, deadline=None)
def test_any_octets_decode_or_raise_decode_error(raw):
    try:
        decode(raw)
    except DecodeError:
        pass


def test_proton_reads_what_we_encode_and_we_read_protons():
    d = proton.Data()
    d.decode(encode({Symbol("k"): [1, "two", b"3", Timestamp(1000), Typed("uint", 7)]}))
    assert d.get_object() == {proton.symbol("k"): [1, "two", b"3", proton.timestamp(1000), 7]}
    p = proton.Data()
    p.put_object({"a": [1, 2.5, None, True], proton.symbol("s"): proton.ulong(2 ** 40)})
    assert decode(bytes(p.encode()))[0] == {"a": [1, 2.5, None, True], "s": 2 ** 40}


def _props(header: bytes) -> C.Basic.Properties:
    ch = ContentHeader()
    ch.unmarshal(header)
    return ch.properties


def test_a_1_0_message_becomes_0_9_1_as_rabbitmq_4_converts_it():
    cid = uuid.uuid4()
    m = proton.Message(body=b"hello", inferred=True, id="m-1", correlation_id=cid,
                       content_type="text/plain", priority=7, ttl=5.0, durable=True,
                       reply_to="/queues/r", user_id=b"guest", group_id="g",
                       creation_time=1700000000.0, subject="subj", address="/queues/q",
                       properties={"a": 1, "b": "x"},
                       annotations={proton.symbol("x-opt"): "o"})
    got = convert.to_091(bytes(m.encode()))
    assert got.to == "/queues/q" and got.subject == "subj"
    assert _props(got.header).message_type == "amqp-1.0"     # stored whole (whole.py)
    header, body = whole.for_091(got.header, got.body)      # what a 0-9-1 consumer gets
    p = _props(header)
    assert body == b"hello" and p.message_type is None
    assert (p.message_id, p.correlation_id) == ("m-1", f"urn:uuid:{cid}")
    assert (p.content_type, p.priority, p.expiration, p.delivery_mode) == \
        ("text/plain", 7, "5000", 2)
    assert (p.reply_to, p.user_id, p.app_id) == ("r", "guest", "g")    # /queues/Q -> Q
    assert p.timestamp == datetime.datetime(2023, 11, 14, 22, 13, 20,
                                            tzinfo=datetime.timezone.utc)
    assert p.headers == {"a": 1, "b": "x", "x-opt": "o"}


def test_an_amqp_value_body_stays_encoded_with_type_amqp_1_0():
    got = convert.to_091(bytes(proton.Message(body={"k": [1, 2]}).encode()))
    header, body = whole.for_091(got.header, got.body)
    assert _props(header).message_type == "amqp-1.0"
    assert decode(body)[0] == Described(0x77, {"k": [1, 2]})
    back = proton.Message()
    back.decode(whole.to_amqp10(got.header, got.body, "", "q", False))
    assert back.body == {"k": [1, 2]}
    old = proton.Message()      # a 0-9-1 publisher's encoded body sections (the contract)
    old.decode(convert.to_amqp10(header, body, "", "q", False))
    assert old.body == {"k": [1, 2]}


def test_a_0_9_1_message_becomes_1_0_as_rabbitmq_4_converts_it():
    props = C.Basic.Properties(content_type="text/plain", message_id="pm1",
                               correlation_id=f"urn:uuid:{uuid.UUID(int=5)}", priority=3,
                               expiration="60000", delivery_mode=2, message_type="t",
                               headers={"h": "v", "n": 5, "x-seen": 1, "nested": {"a": 1}},
                               app_id="app", reply_to="r",
                               timestamp=datetime.datetime(2024, 1, 1,
                                                           tzinfo=datetime.timezone.utc))
    header = ContentHeader(0, 9, props).marshal()
    m = proton.Message()
    m.decode(convert.to_amqp10(header, b"from-pika", "amq.direct", "k", True))
    assert bytes(m.body) == b"from-pika"
    assert (m.content_type, m.id, m.correlation_id) == ("text/plain", "pm1", uuid.UUID(int=5))
    assert (m.priority, m.ttl, m.durable, m.group_id, m.reply_to) == \
        (3, 60.0, True, "app", "/queues/r")     # a queue as an address, as RabbitMQ 4
    assert m.creation_time == 1704067200.0
    assert m.properties == {"h": "v", "n": 5}          # tables are not converted
    assert m.annotations == {"x-exchange": "amq.direct", "x-routing-key": "k",
                             "x-basic-type": "t", "x-seen": 1}
    assert not m.first_acquirer and m.delivery_count == 1


@pytest.mark.parametrize("addr, expected", [
    ("/queues/q", address.Target("", "q", "q")),
    ("/queues/my%20q", address.Target("", "my q", "my q")),
    ("/exchanges/amq.direct/k", address.Target("amq.direct", "k")),
    ("/exchanges/ex", address.Target("ex", "")),
    ("/amq/queue/q", address.Target("", "q", "q")),
    ("/queue/q", address.Target("", "q")),
    ("/queue", address.Target("", None)),
    ("/exchange/ex/k", address.Target("ex", "k")),
    ("/topic/a.b", address.Target("amq.topic", "a.b")),
])
def test_target_addresses(addr, expected):
    assert address.target(addr) == expected


@pytest.mark.parametrize("addr, expected", [
    ("/queues/q", address.Source("q")),
    ("/amq/queue/q", address.Source("q")),
    ("/queue/q", address.Source("q", declare=True)),
    ("/exchange/ex/k", address.Source(None, "ex", "k")),
    ("/topic/a.*", address.Source(None, "amq.topic", "a.*")),
])
def test_source_addresses(addr, expected):
    assert address.source(addr) == expected


@pytest.mark.parametrize("addr", ["q", "/queues/", "/queues/a/b", "/exchanges/amq.default/k",
                                  "", None, "/nowhere/x"])
def test_bad_addresses_say_which_forms_exist(addr):
    with pytest.raises(address.BadAddress):
        address.target(addr)


def test_application_properties_of_every_simple_type_reach_0_9_1_headers():
    m = proton.Message(body=b"x", inferred=True, properties={
        "s": "text", "i": -7, "big": proton.ulong(2 ** 40), "f": 1.5, "b": True,
        "bin": b"\x00\x01", "none": None, "ts": proton.timestamp(1700000000000),
        "sym": proton.symbol("sym")})
    headers = _props(convert.to_091(bytes(m.encode())).header).headers
    assert headers == {"s": "text", "i": -7, "big": 2 ** 40, "f": 1.5, "b": True,
                       "bin": bytearray(b"\x00\x01"), "none": None,
                       "ts": datetime.datetime(2023, 11, 14, 22, 13, 20,
                                               tzinfo=datetime.timezone.utc),
                       "sym": "sym"}


# -- frames.parse_body's fast path (flow, transfer, disposition) against the general decoder --

def _general(body: bytes):
    """What parse_body returned before its fast path: the codec's value, made a performative,
    its delivery state lifted."""
    value, pos = decode(body)
    cls = frames._registered(value.descriptor)
    perf = cls.from_list(value.value)
    for f in frames._LIFTED[cls]:
        setattr(perf, f, frames.lift(getattr(perf, f)))
    return perf, pos


def _same(a, b) -> bool:
    if isinstance(a, frames.Performative) or isinstance(b, frames.Performative):
        return type(a) is type(b) and all(_same(getattr(a, f), getattr(b, f))
                                          for f in a._fields)
    return type(a) is type(b) and a == b


_field_values = st.none() | st.booleans() | st.integers(0, (1 << 32) - 1) | st.binary(max_size=40) \
    | st.sampled_from([frames.Accepted(), frames.Released(), frames.Rejected(None),
                       frames.Modified(True, False, None)]) | st.text(max_size=5)


@given(st.sampled_from([frames.Flow, frames.Transfer, frames.Disposition]),
       st.lists(_field_values, max_size=11), st.binary(max_size=8))
@settings(max_examples=400, deadline=None)
def test_hot_performatives_parse_as_the_general_decoder_does(cls, fields, payload):
    body = bytearray()
    frames.Performative.encode_into(cls(*fields[:len(cls._fields)]), body)
    body += payload
    try:
        want = _general(bytes(body))
    except DecodeError:
        with pytest.raises(DecodeError):
            frames.parse_body(bytes(body), 0, len(body))
        return
    got = frames.parse_body(bytes(body), 0, len(body))
    assert got[1] == want[1] and _same(got[0], want[0])


@given(st.sampled_from([b"\x00\x53\x13\xc0", b"\x00\x53\x14\xc0", b"\x00\x53\x15\xc0"]),
       st.binary(max_size=40))
@settings(max_examples=500, deadline=None)
def test_hot_performatives_malformed_raise_decode_error_or_parse_as_before(head, rest):
    body = head + rest
    try:
        want = _general(body)
    except (DecodeError, AttributeError, TypeError):
        with pytest.raises(DecodeError):
            frames.parse_body(body, 0, len(body))
        return
    got = frames.parse_body(body, 0, len(body))
    assert got[1] == want[1] and _same(got[0], want[0])
