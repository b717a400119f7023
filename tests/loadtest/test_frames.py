"""The load tool's pre-encoded frames and struct parsers agree with pamqp's full codec."""
from __future__ import annotations

import pytest
from pamqp import commands
from pamqp import frame as pframe
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from shoal.pipeline.loadtest import frames as F
from shoal.pipeline.loadtest.schema import BODY_HEADER


def _unmarshal_all(data: bytes) -> list:
    out = []
    while data:
        n, channel, value = pframe.unmarshal(data)
        out.append((channel, value))
        data = data[n:]
    return out


@pytest.mark.parametrize("size,frame_max", [(24, 4096), (100, 131072), (5000, 4096),
                                            (4088, 4096), (4089, 4096)])
@pytest.mark.parametrize("persistent", [False, True])
def test_publish_template_decodes_with_pamqp(size, frame_max, persistent):
    t = F.PublishTemplate(3, "amq.direct", "perf-1", size, persistent, mandatory=True,
                          frame_max=frame_max)
    data = t.frame(0xDEADBEEF, 7, 1_700_000_000_123_456_789, 2**40 + 5)
    frames = _unmarshal_all(data)
    method, header, bodies = frames[0][1], frames[1][1], [f[1] for f in frames[2:]]
    assert {c for c, _ in frames} == {3}
    assert isinstance(method, commands.Basic.Publish)
    assert (method.exchange, method.routing_key, method.mandatory) == ("amq.direct", "perf-1",
                                                                        True)
    assert isinstance(header, ContentHeader) and header.body_size == size
    assert header.properties.delivery_mode == (2 if persistent else 1)
    assert all(isinstance(b, ContentBody) for b in bodies)
    assert all(len(b.value) <= frame_max - 8 for b in bodies)
    body = b"".join(b.value for b in bodies)
    assert len(body) == size
    assert BODY_HEADER.unpack_from(body) == (0xDEADBEEF, 7, 1_700_000_000_123_456_789,
                                             2**40 + 5)
    assert body[BODY_HEADER.size:] == bytes(size - BODY_HEADER.size)
    assert t.pre + BODY_HEADER.pack(1, 2, 3, 4) + t.post == t.frame(1, 2, 3, 4)


def test_too_small_size_is_refused():
    with pytest.raises(ValueError, match="at least 24"):
        F.PublishTemplate(1, "", "q", 23)


@pytest.mark.parametrize("tag,multiple", [(1, False), (2**62 + 1, True)])
def test_encode_ack_matches_pamqp(tag, multiple):
    ours = F.encode_ack(5, tag, multiple)
    assert ours == pframe.marshal(commands.Basic.Ack(delivery_tag=tag, multiple=multiple), 5)


def _payload(raw: bytes) -> tuple[int, bytes]:
    ((ftype, _ch, start, end),) = list(F.split_frames(raw))
    return ftype, raw[start:end]


@pytest.mark.parametrize("redelivered", [False, True])
def test_parse_deliver_matches_pamqp(redelivered):
    raw = pframe.marshal(commands.Basic.Deliver(consumer_tag="ctag-é", delivery_tag=99,
                                                redelivered=redelivered, exchange="ex",
                                                routing_key="perf-3"), 1)
    ftype, payload = _payload(raw)
    assert ftype == F.FRAME_METHOD
    assert F.CLASS_METHOD.unpack_from(payload) == F.BASIC_DELIVER
    assert F.parse_deliver(payload) == ("ctag-é".encode(), 99, redelivered, b"ex", b"perf-3")


@pytest.mark.parametrize("cls,expect", [(commands.Basic.Ack, F.BASIC_ACK),
                                        (commands.Basic.Nack, F.BASIC_NACK)])
@pytest.mark.parametrize("multiple", [False, True])
def test_parse_ack_and_nack_match_pamqp(cls, expect, multiple):
    _, payload = _payload(pframe.marshal(cls(delivery_tag=12345, multiple=multiple), 1))
    assert F.CLASS_METHOD.unpack_from(payload) == expect
    assert F.parse_ack(payload) == (12345, multiple)


def test_parse_return_and_header_match_pamqp():
    _, payload = _payload(pframe.marshal(commands.Basic.Return(
        reply_code=312, reply_text="NO_ROUTE", exchange="", routing_key="nowhere"), 1))
    assert F.CLASS_METHOD.unpack_from(payload) == F.BASIC_RETURN
    assert F.parse_return(payload) == (312, b"NO_ROUTE", b"", b"nowhere")
    _, payload = _payload(pframe.marshal(ContentHeader(0, 70000, commands.Basic.Properties(
        content_type="x/y", headers={"a": 1})), 1))
    assert F.parse_header_body_size(payload) == 70000


def test_split_frames_keeps_partial_frames_and_rejects_bad_end():
    raw = (pframe.marshal(commands.Basic.Ack(delivery_tag=1), 1)
           + pframe.marshal(commands.Basic.Ack(delivery_tag=2), 1))
    assert len(list(F.split_frames(raw[:-1]))) == 1
    assert len(list(F.split_frames(raw))) == 2
    with pytest.raises(ValueError, match="frame end"):
        list(F.split_frames(raw[:-1] + b"\x00"))
