"""Channel lifecycle and method-level errors (spec 2.2.3, 1.5; reply codes spec 1.2)."""
from __future__ import annotations

import struct

import pytest
from pamqp import commands

from amqp_testkit import last_close, m, methods, open_channel, open_conn, raw_frame
from shoal.router.amqp.events import (AcksReceived, ChannelClosed, ChannelOpened,
                                      MethodReceived)
from shoal.shared.errors import AMQPError, hard_error, soft_error


def test_open_and_client_close():
    conn = open_conn()
    assert conn.receive_data(m(commands.Channel.Open(), 1)) == [ChannelOpened(1)]
    [(ch, ok)] = methods(conn)
    assert ch == 1 and isinstance(ok, commands.Channel.OpenOk)
    assert conn.channel_is_open(1) and not conn.channel_is_open(2)
    events = conn.receive_data(m(commands.Channel.Close(200, "bye", 0, 0), 1))
    assert events == [ChannelClosed(1)]
    [(ch, ok)] = methods(conn)
    assert ch == 1 and isinstance(ok, commands.Channel.CloseOk)
    assert not conn.channel_is_open(1)
    assert conn.receive_data(m(commands.Channel.Open(), 1)) == [ChannelOpened(1)]  # reuse


def test_open_ok_carries_an_empty_reserved_field_as_rabbitmq_sends_it():
    """Octet for octet RabbitMQ's channel.open-ok (its reserved longstr empty; pamqp's
    default writes "0"): @cloudamqp/amqp-client reads the field as empty and took the
    remaining octet for a frame of its own."""
    conn = open_conn()
    conn.receive_data(m(commands.Channel.Open(), 7))
    assert conn.data_to_send() == (b"\x01\x00\x07\x00\x00\x00\x08"       # method, channel 7
                                   b"\x00\x14\x00\x0b\x00\x00\x00\x00\xce")


def test_channel_flow_active_is_answered_and_inactive_is_540_as_rabbitmq():
    """RabbitMQ 3.10 answers channel.flow active=true with flow-ok and refuses active=false
    with 540 NOT_IMPLEMENTED "active=false" (a connection error)."""
    conn = open_conn()
    open_channel(conn, 1)
    assert conn.receive_data(m(commands.Channel.Flow(True), 1)) == []
    [(ch, ok)] = methods(conn)
    assert ch == 1 and isinstance(ok, commands.Channel.FlowOk) and ok.active is True
    assert conn.channel_flow_active(1)
    conn.receive_data(m(commands.Channel.Flow(False), 1))
    close = hard_close(conn)
    assert (close.reply_code, close.reply_text) == (540, "NOT_IMPLEMENTED - active=false")


def test_other_methods_become_method_received():
    conn = open_conn()
    open_channel(conn, 3)
    for method in (commands.Queue.Declare(queue="q1", durable=True,
                                          arguments={"x-max-priority": 5}),
                   commands.Exchange.Declare(exchange="e", exchange_type="topic"),
                   commands.Basic.Qos(prefetch_count=10), commands.Basic.Consume(queue="q1"),
                   commands.Basic.Nack(3, False, True), commands.Confirm.Select(),
                   commands.Tx.Select()):
        [ev] = conn.receive_data(m(method, 3))
        assert isinstance(ev, MethodReceived) and ev.channel == 3
        assert type(ev.method) is type(method) and dict(ev.method) == dict(method)
    # basic.ack takes the hot path: (delivery tag, multiple) pairs, not a pamqp object
    assert conn.receive_data(m(commands.Basic.Ack(7, True), 3)) == [AcksReceived(3, [(7, True)])]
    assert conn.data_to_send() == b""


def test_server_channel_close_then_close_ok():
    conn = open_conn()
    open_channel(conn, 1)
    conn.fail(1, soft_error(404, "no queue 'q' in vhost '/'"))
    ch, close = last_close(conn)
    assert ch == 1 and isinstance(close, commands.Channel.Close)
    assert (close.reply_code, close.reply_text) == (404, "NOT_FOUND - no queue 'q' in vhost '/'")
    assert not conn.channel_is_open(1) and not conn.closing
    # while CLOSING everything but close / close-ok is discarded
    assert conn.receive_data(m(commands.Queue.Declare(queue="q"), 1)) == []
    assert conn.receive_data(m(commands.Basic.Publish(exchange="", routing_key="q"), 1)
                             + raw_frame(2, 1, struct.pack(">HHQH", 60, 0, 3, 0))
                             + raw_frame(3, 1, b"abc")) == []
    assert conn.receive_data(m(commands.Channel.Open(), 1)) == []
    assert conn.data_to_send() == b""
    conn.fail(1, soft_error(404, "again"))  # already closing: nothing more
    conn.send_deliver(1, "c", 1, False, "", "q", struct.pack(">HHQH", 60, 0, 0, 0), b"")
    conn.send_method(1, commands.Basic.QosOk())
    assert conn.data_to_send() == b""
    assert conn.receive_data(m(commands.Channel.CloseOk(), 1)) == [ChannelClosed(1)]
    assert conn.receive_data(m(commands.Channel.Open(), 1)) == [ChannelOpened(1)]


def test_crossing_channel_closes():
    conn = open_conn()
    open_channel(conn, 1)
    conn.fail(1, soft_error(406, "x"))
    conn.data_to_send()
    assert conn.receive_data(m(commands.Channel.Close(200, "", 0, 0), 1)) == []
    assert isinstance(methods(conn)[0][1], commands.Channel.CloseOk)
    assert conn.receive_data(m(commands.Channel.CloseOk(), 1)) == [ChannelClosed(1)]


def _publish(ch: int, exchange: str) -> bytes:
    return (m(commands.Basic.Publish(exchange=exchange, routing_key="k"), ch)
            + raw_frame(2, ch, struct.pack(">HHQH", 60, 0, 1, 0)) + raw_frame(3, ch, b"x"))


def test_a_close_read_behind_a_publish_is_answered_after_the_publish_is_judged():
    """A publish and the client's channel.close in one read (rabbitmq-c's amqp-publish):
    the close waits for the broker's verdict on the publish (ChannelCloseRequested). An
    error goes out first, then the close-ok, and the channel is gone at the client's own
    close-ok, as RabbitMQ answers (Close 404, CloseOk); without an error, close-ok and the
    channel is gone at once."""
    conn = open_conn()
    open_channel(conn, 1)
    events = conn.receive_data(_publish(1, "missing")
                               + m(commands.Channel.Close(200, "bye", 0, 0), 1))
    assert [type(e).__name__ for e in events] == ["MessagePublished", "ChannelCloseRequested"]
    assert conn.data_to_send() == b""                   # nothing answered yet
    conn.fail(1, soft_error(404, "no exchange 'missing' in vhost '/'"))
    assert conn.answer_client_close(1) == (False, [])
    out = methods(conn)
    assert [type(v).__name__ for _, v in out] == ["Close", "CloseOk"]
    assert out[0][1].reply_code == 404
    assert conn.receive_data(m(commands.Channel.CloseOk(), 1)) == [ChannelClosed(1)]
    assert conn.receive_data(m(commands.Channel.Open(), 1)) == [ChannelOpened(1)]
    methods(conn)

    events = conn.receive_data(_publish(1, "") + m(commands.Channel.Close(200, "", 0, 0), 1))
    assert type(events[-1]).__name__ == "ChannelCloseRequested"
    assert conn.answer_client_close(1) == (True, [])
    assert [type(v).__name__ for _, v in methods(conn)] == ["CloseOk"]
    assert not conn.channel_is_open(1)
    assert conn.receive_data(m(commands.Channel.Open(), 1)) == [ChannelOpened(1)]


def test_a_connection_close_read_behind_a_publish_is_answered_after_the_publish_is_judged():
    """A publish and the client's connection.close in one read: the close waits for the
    broker's verdict on the publish (ConnectionCloseRequested); the channel's 404 goes out
    first, then the close-ok, as RabbitMQ's reader answers, and nothing read after the close
    is handled. A connection.close alone is answered at once, as before."""
    conn = open_conn()
    open_channel(conn, 1)
    events = conn.receive_data(_publish(1, "missing")
                               + m(commands.Connection.Close(200, "bye", 0, 0), 0)
                               + m(commands.Channel.Open(), 2))
    assert [type(e).__name__ for e in events] == ["MessagePublished",
                                                  "ConnectionCloseRequested"]
    assert conn.data_to_send() == b""                   # nothing answered yet
    assert conn.receive_data(m(commands.Channel.Open(), 3)) == []     # after the close
    conn.fail(1, soft_error(404, "no exchange 'missing' in vhost '/'"))
    closed = conn.answer_connection_close()
    assert [type(e).__name__ for e in closed] == ["ConnectionClosed"]
    assert closed[0].reply_code == 200 and conn.is_closed
    out = methods(conn)
    assert [type(v).__name__ for _, v in out] == ["Close", "CloseOk"]
    assert out[0][0] == 1 and out[0][1].reply_code == 404 and out[1][0] == 0
    assert conn.answer_connection_close() == []

    conn = open_conn()
    events = conn.receive_data(m(commands.Connection.Close(200, "bye", 0, 0), 0))
    assert [type(e).__name__ for e in events] == ["ConnectionClosed"]
    assert [type(v).__name__ for _, v in methods(conn)] == ["CloseOk"]


def test_soft_fail_on_unknown_channel_is_ignored_and_on_channel_0_is_hard():
    conn = open_conn()
    conn.fail(5, soft_error(404, "x"))
    assert conn.data_to_send() == b""
    conn.fail(0, soft_error(404, "x"))
    ch, close = last_close(conn)
    assert ch == 0 and isinstance(close, commands.Connection.Close) and close.reply_code == 404


def test_hard_fail_from_broker_closes_connection_with_ids():
    conn = open_conn()
    open_channel(conn, 1)
    err = AMQPError(541, "boom", class_id=50, method_id=10)
    conn.fail(1, err)
    ch, close = last_close(conn)
    assert ch == 0 and isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == \
        (541, "INTERNAL_ERROR - boom", 50, 10)
    assert conn.closing and not conn.channel_is_open(1)


def hard_close(conn):
    ch, close = last_close(conn)
    assert ch == 0 and isinstance(close, commands.Connection.Close), close
    assert conn.closing
    return close


@pytest.mark.parametrize("frame,code,ids", [
    (m(commands.Channel.Open(), 1), 504, (20, 10)),                  # already open
    (m(commands.Channel.Open(), 0), 504, (20, 10)),                  # channel 0
    (m(commands.Queue.Declare(queue="q"), 2), 504, (50, 10)),        # not open
    (m(commands.Channel.CloseOk(), 1), 504, (20, 41)),               # close-ok not asked
    (m(commands.Connection.Close(200, "", 0, 0), 1), 503, (10, 50)),  # connection on ch 1
    (m(commands.Queue.Declare(queue="q"), 0), 504, (50, 10)),        # non-connection on 0
    (m(commands.Basic.Deliver("c", 1, False, "", "q"), 1), 503, (60, 60)),  # server-only
    (raw_frame(1, 1, struct.pack(">HH", 60, 99)), 540, (60, 99)),    # unknown method
    (raw_frame(1, 1, struct.pack(">HH", 99, 1)), 540, (99, 1)),      # unknown class
    (raw_frame(1, 0, struct.pack(">HH", 10, 99)), 540, (10, 99)),
    # Undecodable arguments: 501 FRAME_ERROR "cannot decode", as RabbitMQ answers.
    (raw_frame(1, 1, struct.pack(">HH", 50, 10) + b"\x00"), 501, (50, 10)),  # truncated
    (raw_frame(1, 1, b"\x00"), 501, (0, 0)),                         # no method id
    (raw_frame(1, 1, struct.pack(">HH", 60, 80) + b"\x00" * 4), 501, (60, 80)),  # short ack
    (raw_frame(1, 1, struct.pack(">HHH", 60, 40, 0) + b"\x05ab"), 501, (60, 40)),  # publish
    (raw_frame(1, 1, struct.pack(">HHH", 60, 40, 0) + b"\x01\xff\x00\x00"), 501, (60, 40)),
])
def test_method_errors_close_the_connection(frame, code, ids):
    conn = open_conn(channel_max=10)
    open_channel(conn, 1)
    conn.receive_data(frame)
    close = hard_close(conn)
    assert close.reply_code == code, close.reply_text
    assert (close.class_id, close.method_id) == ids


def test_after_a_hard_close_only_close_ok_matters():
    conn = open_conn()
    open_channel(conn, 1)
    conn.receive_data(m(commands.Channel.Open(), 1))
    hard_close(conn)
    assert conn.receive_data(m(commands.Queue.Declare(queue="q"), 1)) == []
    assert conn.receive_data(raw_frame(1, 1, b"\x00\x63\x00\x01")) == []  # unknown: ignored
    assert conn.data_to_send() == b""
    conn.fail(1, hard_error(541, "later"))  # no second close
    assert conn.data_to_send() == b""
    [ev] = conn.receive_data(m(commands.Connection.CloseOk()))
    assert ev.reply_code == 504


def test_channel_max_is_the_negotiated_one():
    conn = open_conn(channel_max=2047)
    assert conn.channel_max == 2047
    assert conn.receive_data(m(commands.Channel.Open(), 2047)) == [ChannelOpened(2047)]


def test_channel_max_counts_open_channels_not_channel_numbers():
    """RabbitMQ's rule (rabbit_reader create_channel): any channel number 1-65535 may be
    opened while fewer than channel_max channels are open; one more is 530 NOT_ALLOWED and
    closes the connection."""
    conn = open_conn(channel_max=2)
    assert conn.receive_data(m(commands.Channel.Open(), 65535)) == [ChannelOpened(65535)]
    assert conn.receive_data(m(commands.Channel.Open(), 3000)) == [ChannelOpened(3000)]
    conn.data_to_send()
    conn.receive_data(m(commands.Channel.Open(), 1))
    close = hard_close(conn)
    assert close.reply_code == 530
    assert "reached the negotiated channel_max (2)" in close.reply_text
    assert (close.class_id, close.method_id) == (20, 10)


def test_a_closed_channel_frees_its_place_under_channel_max():
    conn = open_conn(channel_max=1)
    open_channel(conn, 7)
    conn.receive_data(m(commands.Channel.Close(200, "", 0, 0), 7))
    assert conn.receive_data(m(commands.Channel.Open(), 9)) == [ChannelOpened(9)]


def test_basic_cancel_ok_from_client_is_ignored():
    conn = open_conn()
    open_channel(conn, 1)
    assert conn.receive_data(m(commands.Basic.CancelOk("ctag"), 1)) == []
    assert not conn.closing
