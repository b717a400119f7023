"""Content assembly of basic.publish, frame errors, and the hot outbound frames
(spec 2.3.5 frame details, 4.2.6.1 content header)."""
from __future__ import annotations

import struct

import pika.frame
import pika.spec
import pytest
from pamqp import body, commands, header

from amqp_testkit import (content, hb_frame, last_close, m, open_channel, open_conn,
                          parse, publish, raw_frame)
from shoal.router.amqp.events import (AcksReceived, ChannelClosed, ConnectionClosed,
                                      MessagePublished)
from shoal.router.amqp.fastpath import parse_properties

PROPS = commands.Basic.Properties(content_type="application/json", delivery_mode=2,
                                  headers={"a": 1, "b": "x"}, priority=3, message_id="m1")


def published(conn, data, chunk=None):
    events = []
    if chunk is None:
        events = conn.receive_data(data)
    else:
        for i in range(0, len(data), chunk):
            events += conn.receive_data(data[i:i + chunk])
    assert not conn.closing, last_close(conn)
    return events


@pytest.mark.parametrize("chunk", [None, 1, 7, 8, 13, 4095, 4096, 4097, 100000])
def test_publish_split_across_frames_and_chunks(chunk):
    conn = open_conn()
    open_channel(conn, 1)
    payload = bytes(range(256)) * 100  # 25600 octets -> 7 body frames at frame_max 4096
    hdr, _ = content(1, payload, PROPS)
    data = publish(1, payload, "amq.topic", "a.b.c", True, PROPS, frame_max=4096)
    data += publish(1, b"second", "", "q", False)
    events = published(conn, data, chunk)
    assert len(events) == 2
    ev = events[0]
    assert ev == MessagePublished(1, "amq.topic", "a.b.c", True, False, hdr, payload)
    assert isinstance(ev.header, bytes) and isinstance(ev.body, bytes)
    assert parse_properties(ev.header) == PROPS
    assert events[1].body == b"second" and events[1].routing_key == "q"


def test_publish_with_empty_body_has_no_body_frames():
    conn = open_conn()
    open_channel(conn, 1)
    [ev] = published(conn, publish(1, b""))
    assert ev.body == b"" and struct.unpack(">Q", ev.header[4:12]) == (0,)


def test_publishes_interleaved_on_two_channels_and_immediate_flag():
    conn = open_conn()
    open_channel(conn, 1)
    open_channel(conn, 2)
    h1, c1 = content(1, b"one")
    h2, c2 = content(2, b"two")
    data = (m(commands.Basic.Publish(exchange="e1", routing_key="r1"), 1)
            + m(commands.Basic.Publish(exchange="e2", routing_key="r2", immediate=True), 2)
            + c2 + c1)
    events = published(conn, data)
    assert [(e.channel, e.body, e.immediate) for e in events] == [(2, b"two", True),
                                                                  (1, b"one", False)]


def test_heartbeat_between_content_frames_is_fine():
    conn = open_conn()
    open_channel(conn, 1)
    hdr, frames = content(1, b"abc")
    data = m(commands.Basic.Publish(exchange="", routing_key="q"), 1) + hb_frame() + frames
    [ev] = published(conn, data)
    assert ev.body == b"abc"


def test_ack_fast_path_event():
    conn = open_conn()
    open_channel(conn, 1)
    # delivery tags are unsigned 64-bit (pamqp's encoder is signed: build the frame by hand)
    ack = raw_frame(1, 1, struct.pack(">HHQB", 60, 80, 2**64 - 1, 1))
    [ev] = conn.receive_data(ack)
    assert isinstance(ev, AcksReceived) and ev.channel == 1
    assert ev.acks == [(2**64 - 1, True)]


def test_a_run_of_acks_is_one_event_per_channel_in_order():
    """Acks read in one go become one AcksReceived per run on a channel; anything between
    (another channel's ack, a publish) starts a new run, so the order is kept."""
    conn = open_conn()
    open_channel(conn, 1)
    open_channel(conn, 2)

    def ack(ch, tag, multiple=False):
        return raw_frame(1, ch, struct.pack(">HHQB", 60, 80, tag, int(multiple)))
    data = (ack(1, 1) + ack(1, 2, True) + ack(2, 7) + ack(1, 3) + publish(1, b"x")
            + ack(1, 4))
    evs = conn.receive_data(data)
    assert [(type(e).__name__, e.channel) for e in evs] == [
        ("AcksReceived", 1), ("AcksReceived", 2), ("AcksReceived", 1),
        ("MessagePublished", 1), ("AcksReceived", 1)]
    assert [e.acks for e in evs if isinstance(e, AcksReceived)] == [
        [(1, False), (2, True)], [(7, False)], [(3, False)], [(4, False)]]


def hard(conn, code):
    ch, close = last_close(conn)
    assert ch == 0 and isinstance(close, commands.Connection.Close), close
    assert close.reply_code == code, close.reply_text
    return close


PUB = m(commands.Basic.Publish(exchange="", routing_key="q"), 1)
HDR3 = raw_frame(2, 1, struct.pack(">HHQH", 60, 0, 3, 0))


@pytest.mark.parametrize("data,code", [
    (HDR3, 505),                                                     # header, no publish
    (raw_frame(3, 1, b"abc"), 505),                                  # body, no publish
    (PUB + raw_frame(3, 1, b"abc"), 505),                            # body before header
    (PUB + PUB, 505),                                                # method, header expected
    (PUB + HDR3 + m(commands.Basic.Qos(0, 1, False), 1), 505),       # method, body expected
    (PUB + HDR3 + HDR3, 505),                                        # second header
    (PUB + HDR3 + m(commands.Channel.Close(200, "", 0, 0), 1), 505),  # close mid-content
    (PUB + HDR3 + raw_frame(3, 1, b"abcd"), 501),                    # body larger than size
    (PUB + HDR3 + raw_frame(3, 1, b"ab") + raw_frame(3, 1, b"cd"), 501),
    (PUB + raw_frame(2, 1, struct.pack(">HHQH", 50, 0, 3, 0)), 505),  # class 50 header
    (PUB + raw_frame(2, 1, b"\x00\x3c\x00"), 501),                   # truncated header
    (raw_frame(2, 0, struct.pack(">HHQH", 60, 0, 3, 0)), 505),        # header on channel 0
    (raw_frame(3, 5, b"x"), 504),                                    # body on closed channel
    (raw_frame(8, 1, b""), 505),                                     # heartbeat on channel 1
])
def test_content_errors(data, code):
    conn = open_conn()
    open_channel(conn, 1)
    events = conn.receive_data(data)
    assert not any(isinstance(e, MessagePublished) for e in events)
    hard(conn, code)


@pytest.mark.parametrize("data,text", [
    (raw_frame(1, 1, b"\x00\x14\x00\x28", end=0xCF), "frame end"),     # bad end octet
    (raw_frame(9, 0, b""), "unknown frame type"),                     # unknown type
    (struct.pack(">BHI", 3, 1, 131072 + 1), "frame_max"),             # too large: header only
])
def test_frame_errors_close_at_once(data, text):
    conn = open_conn()
    open_channel(conn, 1)
    events = conn.receive_data(data)
    close = hard(conn, 501)
    assert text in close.reply_text
    assert conn.is_closed and [type(e) for e in events] == [ConnectionClosed]
    assert events[0].reply_code == 501
    assert conn.receive_data(m(commands.Connection.CloseOk())) == []


def test_frame_max_is_checked_before_buffering():
    conn = open_conn()
    conn.receive_data(struct.pack(">BHI", 3, 1, 2**31))
    assert conn.is_closed
    conn = open_conn()
    handshake_max = conn.frame_max
    ok = raw_frame(3, 1, b"x" * (handshake_max - 8))  # exactly frame_max: allowed framing
    conn.receive_data(ok)
    assert hard(conn, 504)  # (no channel open) but not a frame error


@pytest.mark.parametrize("payload, closes", [(131072 - 8, False), (131072 - 7, False),
                                             (131072, False), (131072 + 1, True)])
def test_a_frame_may_run_past_frame_max_by_its_framing_as_rabbitmq_allows(payload, closes):
    """rabbit_reader's FRAME_SIZE_FUDGE: a payload of up to frame_max octets is read (clients
    such as AMQPStorm send body frames of frame_max octets); one octet more is 501."""
    conn = open_conn()
    open_channel(conn, 1)
    data = b"x" * payload
    events = conn.receive_data(
        m(commands.Basic.Publish(exchange="", routing_key="q"), 1)
        + raw_frame(2, 1, header.ContentHeader(0, payload, commands.Basic.Properties()).marshal())
        + raw_frame(3, 1, data))
    if closes:
        close = hard(conn, 501)
        assert close.reply_text == (f"FRAME_ERROR - frame size {payload + 8} on channel 1 is "
                                    f"larger than frame_max 131072")
    else:
        assert [e.body for e in events if isinstance(e, MessagePublished)] == [data]


def test_frame_max_follows_tune_ok():
    from amqp_testkit import handshake, make_conn
    conn = make_conn()
    handshake(conn, tune=(0, 4096, 0))
    open_channel(conn, 1)
    conn.receive_data(raw_frame(3, 1, b"x" * (4096 + 1)))
    assert hard(conn, 501) and conn.is_closed
    # the socket is left to the client a moment (client.py), so the rest of the frame it is
    # still writing does not reset the connection before it reads our close (the Java
    # client's FrameMax rejectExceedingFrameMax)
    assert conn.linger_on_close


def test_before_tune_ok_frames_are_limited_to_4096_octets():
    """Spec 4.2.3 and RabbitMQ (rabbit_reader's initial frame_max): until tune-ok a peer
    may send no frame over 4096 octets; Shoal read one of its own frame_max (the Java
    client's FrameMax ``rejectLargeFramesDuringConnectionNegotiation``)."""
    from amqp_testkit import PROTOCOL_HEADER, make_conn, start_ok_plain
    conn = make_conn()
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    big = start_ok_plain()
    big.client_properties["too_long"] = "x" * 4096
    conn.receive_data(m(big))
    close = hard(conn, 501)
    assert close.reply_text.endswith("is larger than frame_max 4096")


def test_message_larger_than_max_size_is_soft_406_and_body_discarded():
    conn = open_conn(max_message_size=1000)
    open_channel(conn, 1)
    data = publish(1, b"x" * 5000, frame_max=4096) + publish(1, b"y" * 1000, frame_max=4096)
    events = conn.receive_data(data)
    assert events == []
    ch, close = last_close(conn)
    assert ch == 1 and isinstance(close, commands.Channel.Close)
    assert close.reply_code == 406 and close.reply_text == \
        "PRECONDITION_FAILED - message size 5000 is larger than configured max size 1000"
    assert (close.class_id, close.method_id) == (60, 40)
    assert not conn.closing
    assert conn.receive_data(m(commands.Channel.CloseOk(), 1)) == [ChannelClosed(1)]
    open_channel(conn, 1)
    [ev] = conn.receive_data(publish(1, b"z" * 1000))
    assert ev.body == b"z" * 1000


# ---------------------------------------------------------------- outbound hot frames

def pika_parse(data: bytes) -> list:
    frames = []
    while data:
        used, frame = pika.frame.decode_frame(data)
        assert used and frame is not None, "pika could not parse what we wrote"
        frames.append(frame)
        data = data[used:]
    return frames


@pytest.mark.parametrize("size", [0, 1, 4088, 4089, 10000, 3 * 4088])
def test_send_deliver_splits_body_at_frame_max(size):
    from amqp_testkit import handshake, make_conn
    conn = make_conn()
    handshake(conn, tune=(0, 4096, 0))
    open_channel(conn, 1)
    payload = bytes(i % 251 for i in range(size))
    hdr, _ = content(1, payload, PROPS)
    conn.send_deliver(1, "ctag-ü", 2**40 + 5, True, "amq.direct", "rk.1", hdr, payload)
    data = conn.data_to_send()
    frames = parse(data)
    ch, deliver = frames[0]
    assert ch == 1 and isinstance(deliver, commands.Basic.Deliver)
    assert dict(deliver) == dict(commands.Basic.Deliver("ctag-ü", 2**40 + 5, True,
                                                        "amq.direct", "rk.1"))
    ch, content_header = frames[1]
    assert isinstance(content_header, header.ContentHeader)
    assert content_header.body_size == size and content_header.properties == PROPS
    bodies = frames[2:]
    assert all(isinstance(f, body.ContentBody) and c == 1 for c, f in bodies)
    assert len(bodies) == -(-size // 4088)
    assert b"".join(f.value for _, f in bodies) == payload
    chunk = 4096 - 8
    assert [len(f.value) for _, f in bodies] == [min(chunk, size - i)
                                                 for i in range(0, size, chunk)]
    # a real client's parser agrees
    pframes = pika_parse(data)
    assert isinstance(pframes[0].method, pika.spec.Basic.Deliver)
    assert pframes[0].method.consumer_tag == "ctag-ü" and pframes[0].method.redelivered
    assert pframes[1].body_size == size and pframes[1].properties.headers == {"a": 1, "b": "x"}
    assert b"".join(f.fragment for f in pframes[2:]) == payload


@pytest.mark.parametrize("size", [0, 100, 4089])
def test_deliver_bytes_match_pamqp_on_every_channel_and_repeat(size):
    """fastpath.deliver caches a consumer's fixed frame parts per (channel, consumer tag,
    exchange, routing key): every delivery, first or repeated, is what pamqp marshals."""
    from pamqp import frame as pframe
    from shoal.router.amqp import fastpath
    payload = bytes(i % 251 for i in range(size))
    hdr, _ = content(1, payload, PROPS)
    for _round in range(2):
        for channel, ctag, exchange, rk in [(1, "ctag-ü", "amq.direct", "rk.1"),
                                            (2, "ctag-ü", "amq.direct", "rk.1"),
                                            (1, "ctag-ü", "", "rk.2"), (300, "c", "", "")]:
            # pamqp encodes a longlong as signed: 2**63 - 1 is its largest tag
            for tag, redelivered in [(1, False), (2**63 - 1, True)]:
                want = pframe.marshal(commands.Basic.Deliver(ctag, tag, redelivered, exchange,
                                                             rk), channel)
                want += content(channel, payload, PROPS, frame_max=4096)[1]
                got = fastpath.deliver(channel, ctag, tag, redelivered, exchange, rk, hdr,
                                       payload, 4096)
                assert got == want


def test_delivery_tags_are_unsigned_64_bit():
    conn = open_conn()
    open_channel(conn, 1)
    hdr, _ = content(1, b"")
    conn.send_deliver(1, "c", 2**64 - 1, False, "", "q", hdr, b"")
    conn.send_confirm(1, 2**64 - 1, True, True)
    deliver, _, ack = pika_parse(conn.data_to_send())
    assert deliver.method.delivery_tag == 2**64 - 1 == ack.method.delivery_tag


def test_send_get_ok_return_and_confirms():
    conn = open_conn()
    open_channel(conn, 1)
    hdr, _ = content(1, b"hello")
    conn.send_get_ok(1, 9, False, "ex", "rk", 42, hdr, b"hello")
    conn.send_return(1, 312, "NO_ROUTE", "ex", "nowhere", hdr, b"hello")
    conn.send_confirm(1, 7, False, True)
    conn.send_confirm(1, 8, True, False)
    data = conn.data_to_send()
    frames = [f for _, f in parse(data)]
    assert dict(frames[0]) == dict(commands.Basic.GetOk(9, False, "ex", "rk", 42))
    assert frames[2].value == b"hello"
    assert dict(frames[3]) == dict(commands.Basic.Return(312, "NO_ROUTE", "ex", "nowhere"))
    assert frames[4].body_size == 5 and frames[5].value == b"hello"
    assert dict(frames[6]) == dict(commands.Basic.Ack(7, False))
    assert isinstance(frames[7], commands.Basic.Nack)
    assert (frames[7].delivery_tag, frames[7].multiple, frames[7].requeue) == (8, True, False)
    pframes = pika_parse(data)
    assert isinstance(pframes[0].method, pika.spec.Basic.GetOk)
    assert pframes[0].method.message_count == 42
    assert isinstance(pframes[7].method, pika.spec.Basic.Nack)


def test_sends_on_unknown_channel_are_dropped():
    conn = open_conn()
    conn.send_deliver(4, "c", 1, False, "", "q", struct.pack(">HHQH", 60, 0, 0, 0), b"")
    conn.send_get_ok(4, 1, False, "", "q", 0, struct.pack(">HHQH", 60, 0, 0, 0), b"")
    conn.send_return(4, 312, "NO_ROUTE", "", "q", struct.pack(">HHQH", 60, 0, 0, 0), b"")
    conn.send_confirm(4, 1, False, True)
    conn.send_method(4, commands.Basic.QosOk())
    assert conn.data_to_send() == b"" and conn.pending_output == 0


def test_pending_output_counts_buffered_bytes():
    conn = open_conn()
    open_channel(conn, 1)
    conn.send_confirm(1, 1, False, True)
    conn.send_method(1, commands.Basic.QosOk())
    n = conn.pending_output
    assert n == len(conn.data_to_send()) and n > 0 and conn.pending_output == 0


def test_everything_written_during_a_session_parses_with_pika():
    conn = open_conn()
    out = []
    conn.receive_data(m(commands.Channel.Open(), 1))
    conn.receive_data(m(commands.Channel.Flow(True), 1))
    conn.send_method(1, commands.Queue.DeclareOk("q", 1, 2))
    conn.send_method(1, commands.Basic.ConsumeOk("ctag"))
    conn.send_method(1, commands.Basic.Cancel("ctag", nowait=True))
    conn.send_method(0, commands.Connection.Blocked("mem"))
    conn.send_method(0, commands.Connection.Unblocked())
    conn.fail(1, AMQPErrorSoft)
    conn.receive_data(m(commands.Channel.CloseOk(), 1))
    conn.close()
    out.append(conn.data_to_send())
    frames = pika_parse(b"".join(out))
    names = [f.method.NAME for f in frames]
    assert names == ["Channel.OpenOk", "Channel.FlowOk", "Queue.DeclareOk", "Basic.ConsumeOk",
                     "Basic.Cancel", "Connection.Blocked", "Connection.Unblocked",
                     "Channel.Close", "Connection.Close"]


from shoal.shared.errors import soft_error  # noqa: E402

AMQPErrorSoft = soft_error(404, "no exchange 'x' in vhost '/'")


def test_a_publish_in_the_same_read_as_the_handshake_is_taken():
    """The handshake, channel.open and a publish arriving in one read (a client that writes
    them back to back): the publish is a message, not a 505 (found by the fuzz campaign)."""
    from pamqp import commands as C
    from amqp_testkit import PROTOCOL_HEADER, m, make_conn, publish, start_ok_plain
    conn = make_conn(heartbeat=0)
    data = (PROTOCOL_HEADER + m(start_ok_plain()) + m(C.Connection.TuneOk(2047, 131072, 0))
            + m(C.Connection.Open("/")) + m(C.Channel.Open(), 1) + publish(1, b"hello"))
    events = conn.receive_data(data)
    assert [type(e).__name__ for e in events] == ["ConnectionOpened", "ChannelOpened",
                                                  "MessagePublished"]
    assert events[-1].body == b"hello"
