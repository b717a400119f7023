"""Connection negotiation, heartbeats and connection close (spec 4.10, 4.2.7, 1.4.2.7)."""
from __future__ import annotations

from importlib.metadata import version

import pytest
from pamqp import commands, encode

from amqp_testkit import (CAPABILITIES, PROTOCOL_HEADER, closed_events, handshake, hb_frame,
                          last_close, m, make_conn, methods, open_conn, start_ok_plain,
                          start_ok_raw)
from shoal.router.amqp.events import ConnectionClosed, ConnectionOpened
from shoal.router.amqp.states import ConnectionState


def test_start_offers_server_properties_and_mechanisms():
    conn = make_conn()
    assert conn.receive_data(PROTOCOL_HEADER) == []
    [(ch, start)] = methods(conn)
    assert ch == 0 and isinstance(start, commands.Connection.Start)
    assert (start.version_major, start.version_minor) == (0, 9)
    assert start.mechanisms == "PLAIN AMQPLAIN" and start.locales == "en_US"
    props = start.server_properties
    assert props["product"] == "Shoal" and props["version"] == version("shoal")
    assert "platform" in props and "copyright" in props and "information" in props
    caps = props["capabilities"]
    for name in ("publisher_confirms", "exchange_exchange_bindings", "basic.nack",
                 "consumer_cancel_notify", "connection.blocked", "consumer_priorities",
                 "authentication_failure_close", "per_consumer_qos"):
        assert caps[name] is True, name
    assert caps["direct_reply_to"] is True        # direct_reply.py


def test_extra_server_properties_are_merged():
    conn = make_conn(server_properties={"cluster_name": "c1", "capabilities": {"x": True}})
    conn.receive_data(PROTOCOL_HEADER)
    props = methods(conn)[0][1].server_properties
    assert props["cluster_name"] == "c1" and props["capabilities"]["x"] is True
    assert props["capabilities"]["publisher_confirms"] is True


def test_plain_handshake_emits_connection_opened_and_negotiates():
    conn = make_conn()
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    assert conn.receive_data(m(start_ok_plain(caps={"consumer_cancel_notify": True}))) == []
    [(_, tune)] = methods(conn)
    assert isinstance(tune, commands.Connection.Tune)
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)
    assert conn.receive_data(m(commands.Connection.TuneOk(100, 8192, 10))) == []
    assert (conn.channel_max, conn.frame_max, conn.heartbeat) == (100, 8192, 10)
    events = conn.receive_data(m(commands.Connection.Open("prod")))
    assert events == [ConnectionOpened("prod", "guest", conn.client_properties)]
    assert isinstance(methods(conn)[0][1], commands.Connection.OpenOk)
    assert conn.capabilities == {"consumer_cancel_notify": True}
    assert conn.client_properties["product"] == "test"
    assert conn.state == ConnectionState.OPEN


def test_tune_ok_zero_means_our_limits():
    conn = make_conn(frame_max=65536, channel_max=99, heartbeat=5)
    handshake(conn, tune=(0, 0, 0))
    assert (conn.channel_max, conn.frame_max, conn.heartbeat) == (99, 65536, 0)


@pytest.mark.parametrize("tune", [(0, 200000, 0), (0, 4095, 0), (5000, 0, 0)])
def test_tune_ok_out_of_range_is_530(tune):
    conn = make_conn()
    conn.receive_data(PROTOCOL_HEADER)
    conn.receive_data(m(start_ok_plain()))
    conn.data_to_send()
    conn.receive_data(m(commands.Connection.TuneOk(*tune)))
    ch, close = last_close(conn)
    assert ch == 0 and isinstance(close, commands.Connection.Close)
    assert close.reply_code == 530 and close.reply_text.startswith("NOT_ALLOWED - negotiated")
    assert (close.class_id, close.method_id) == (10, 31)
    assert conn.closing


def amqplain(user, password):
    table = encode.field_table({"LOGIN": user, "PASSWORD": password})
    return table[4:]  # AMQPLAIN: the table without its length prefix


def test_amqplain_handshake():
    conn = make_conn()
    conn.receive_data(PROTOCOL_HEADER)
    conn.receive_data(start_ok_raw("AMQPLAIN", amqplain("alice", "secret")))
    assert isinstance(methods(conn)[-1][1], commands.Connection.Tune)
    conn.receive_data(m(commands.Connection.TuneOk(0, 0, 0)))
    [ev] = conn.receive_data(m(commands.Connection.Open("/")))
    assert ev.user == "alice"


def _refused(conn, start_ok):
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    assert conn.receive_data(start_ok if isinstance(start_ok, bytes) else m(start_ok)) == []
    ch, close = last_close(conn)
    assert ch == 0 and isinstance(close, commands.Connection.Close)
    assert close.reply_code == 403
    assert conn.closing
    # the client answers close-ok: now the connection is over
    [ev] = conn.receive_data(m(commands.Connection.CloseOk()))
    assert isinstance(ev, ConnectionClosed) and ev.reply_code == 403
    assert conn.is_closed
    return close


def test_bad_password_is_403_access_refused():
    close = _refused(make_conn(), start_ok_plain("guest", "nope"))
    assert close.reply_text == ("ACCESS_REFUSED - Login was refused using authentication "
                                "mechanism PLAIN. For details see the broker logfile.")


def test_a_client_without_authentication_failure_close_sees_the_socket_close():
    """RabbitMQ's rabbit_reader ``auth_fail``: connection.close 403 only for a client that
    announces the capability; for any other the connection just ends (spec 1.4.2.2), which
    the Java client reports as a PossibleAuthenticationFailureException (its own suite's
    SaslMechanisms ``connectionCloseAuthFailure``)."""
    conn = make_conn()
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    [ev] = conn.receive_data(m(start_ok_plain("guest", "nope", caps={"basic.nack": True})))
    assert isinstance(ev, ConnectionClosed) and ev.reply_code == 403
    assert conn.data_to_send() == b"" and conn.is_closed


def test_bad_amqplain_password_is_403():
    close = _refused(make_conn(), start_ok_raw("AMQPLAIN", amqplain("alice", "x")))
    assert "AMQPLAIN" in close.reply_text


def test_unknown_mechanism_is_403():
    _refused(make_conn(), commands.Connection.StartOk({"capabilities": CAPABILITIES},
                                                      "EXTERNAL", ""))


def test_malformed_plain_response_is_403():
    _refused(make_conn(), commands.Connection.StartOk({"capabilities": CAPABILITIES},
                                                      "PLAIN", "guest"))


def test_guest_from_non_loopback_is_403_but_other_users_are_fine():
    _refused(make_conn(peer_is_loopback=False), start_ok_plain("guest", "guest"))
    conn = make_conn(peer_is_loopback=False)
    events = handshake(conn, "alice", "secret")
    assert isinstance(events[-1], ConnectionOpened)


def test_unknown_vhost_is_530():
    conn = make_conn()
    conn.receive_data(PROTOCOL_HEADER)
    conn.receive_data(m(start_ok_plain()))
    conn.receive_data(m(commands.Connection.TuneOk(0, 0, 0)))
    conn.data_to_send()
    assert conn.receive_data(m(commands.Connection.Open("nope"))) == []
    _, close = last_close(conn)
    assert close.reply_code == 530 and close.reply_text == "NOT_ALLOWED - vhost nope not found"
    assert (close.class_id, close.method_id) == (10, 40)
    assert conn.closing


@pytest.mark.parametrize("sequence", [
    [commands.Connection.TuneOk(0, 0, 0)],                         # tune-ok before start-ok
    [start_ok_plain(), commands.Connection.Open("/")],              # open before tune-ok
    [start_ok_plain(), commands.Connection.TuneOk(0, 0, 0),
     commands.Connection.TuneOk(0, 0, 0)],                          # tune-ok twice
    [start_ok_plain(), start_ok_plain()],                           # start-ok twice
    [start_ok_plain(), commands.Connection.TuneOk(0, 0, 0), commands.Connection.Open("/"),
     commands.Connection.Open("/")],                                # open twice
    [commands.Connection.Tune(1, 4096, 0)],                         # a server-only method
    [commands.Connection.CloseOk()],                                # close-ok unasked
])
def test_connection_methods_out_of_order_are_503(sequence):
    conn = make_conn()
    conn.receive_data(PROTOCOL_HEADER)
    for method in sequence:
        conn.receive_data(m(method))
    _, close = last_close(conn)
    assert isinstance(close, commands.Connection.Close) and close.reply_code == 503
    assert conn.closing


def test_channel_frames_before_open_are_503():
    conn = make_conn()
    conn.receive_data(PROTOCOL_HEADER)
    conn.receive_data(m(commands.Channel.Open(), 1))
    _, close = last_close(conn)
    assert close.reply_code == 503


# ---------------------------------------------------------------- protocol header

def test_protocol_header_in_pieces():
    conn = make_conn()
    for byte in PROTOCOL_HEADER[:-1]:
        assert conn.receive_data(bytes([byte])) == []
        assert conn.data_to_send() == b""
    conn.receive_data(PROTOCOL_HEADER[-1:])
    assert isinstance(methods(conn)[0][1], commands.Connection.Start)


def test_protocol_header_with_following_frames_in_one_chunk():
    conn = make_conn()
    conn.receive_data(PROTOCOL_HEADER + m(start_ok_plain()))
    out = methods(conn)
    assert isinstance(out[0][1], commands.Connection.Start)
    assert isinstance(out[1][1], commands.Connection.Tune)


def test_the_amqp_0_9_header_is_served_as_0_9_1_as_rabbitmq_does():
    """``AMQP 1 1 0 9`` (AMQP 0-9; Perl's AnyEvent::RabbitMQ): RabbitMQ's rabbit_reader
    serves it as 0-9-1, and so does Shoal (parity scenario protocol_header_amqp_0_9)."""
    conn = make_conn()
    for byte in b"AMQP\x01\x01\x00":
        assert conn.receive_data(bytes([byte])) == []
    conn.receive_data(b"\x09" + m(start_ok_plain()))
    out = methods(conn)
    assert isinstance(out[0][1], commands.Connection.Start)
    assert (out[0][1].version_major, out[0][1].version_minor) == (0, 9)
    assert isinstance(out[1][1], commands.Connection.Tune)


@pytest.mark.parametrize("data", [b"AMQP\x00\x00\x08\x00", b"AMQP\x01\x01\x08\x00",
                                  b"AMQP\x01\x01\x09\x01", b"AMQP\x00\x00\x09\x02",
                                  b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x00" * 8, b"XYZ"])
def test_bad_protocol_header_is_answered_with_ours_and_closed(data):
    conn = make_conn()
    events = conn.receive_data(data)
    assert conn.data_to_send() == PROTOCOL_HEADER
    assert len(closed_events(events)) == 1 and conn.is_closed
    assert conn.receive_data(PROTOCOL_HEADER) == []


def test_bad_protocol_header_detected_from_a_prefix():
    conn = make_conn()
    assert conn.receive_data(b"AMQ") == []
    events = conn.receive_data(b"X")
    assert closed_events(events) and conn.data_to_send() == PROTOCOL_HEADER


# ---------------------------------------------------------------- heartbeats and time

def test_heartbeat_sent_when_idle_and_peer_dropped_after_two_intervals():
    conn = make_conn(heartbeat=10)
    handshake(conn, tune=(0, 0, 10))
    assert conn.heartbeat == 10
    assert conn.tick(100.0) == []
    assert conn.data_to_send() == b""
    assert conn.tick(104.0) == [] and conn.data_to_send() == b""
    assert conn.tick(105.0) == []
    assert conn.data_to_send() == hb_frame()           # idle for heartbeat/2: send one
    conn.receive_data(hb_frame())                       # client heartbeats keep it alive
    assert conn.tick(115.0) == []
    assert conn.data_to_send() == hb_frame()
    assert conn.tick(130.0) == []                       # last receipt seen at 115
    events = conn.tick(135.0)                           # 20 s = 2 * heartbeat of silence
    assert len(events) == 1 and events[0].reply_code == 320
    assert "missed heartbeats" in events[0].reply_text
    assert conn.is_closed and conn.tick(200.0) == []


def test_a_heartbeat_of_one_second_is_kept_by_a_clock_at_half_of_it():
    """The router's clock ticks as often as its connections need (client.py tick_period:
    half a heartbeat); with a heartbeat of 1 s a heartbeat leaves every 0.5 s of silence,
    as RabbitMQ sends them, so a client that drops the link after 1 s without a read
    (@cloudamqp/amqp-client) stays connected. A 1 s clock left 1 s gaps."""
    from shoal.router.frontend.client import tick_period
    conn = make_conn(heartbeat=1)
    handshake(conn, tune=(0, 131072, 1))
    conn.data_to_send()
    now, sent_at = 100.0, []
    conn.tick(now)
    for _ in range(8):
        now += tick_period([conn.heartbeat / 2])
        conn.receive_data(hb_frame())               # the client answers each heartbeat
        conn.tick(now)
        if conn.data_to_send() == hb_frame():
            sent_at.append(now)
    assert sent_at == [100.5 + 0.5 * i for i in range(8)]
    assert tick_period([None, 30.0, 0.5]) == 0.5 and tick_period([]) == 1.0
    assert tick_period([0.01]) == 0.1                  # an AMQP 1.0 idle time-out of 20 ms


def test_traffic_counts_as_heartbeat_both_ways():
    conn = make_conn(heartbeat=10)
    handshake(conn, tune=(0, 0, 10))
    conn.tick(0.0)
    for t in range(1, 60):
        conn.receive_data(m(commands.Channel.Open(), t))  # any frame counts
        conn.data_to_send()
        assert conn.tick(float(t)) == []
        assert conn.data_to_send() == b""


def test_heartbeat_zero_disables_heartbeats():
    conn = make_conn(heartbeat=10)
    handshake(conn, tune=(0, 0, 0))
    conn.tick(0.0)
    assert conn.tick(1000.0) == [] and conn.data_to_send() == b""


def test_handshake_timeout():
    conn = make_conn(handshake_timeout=10.0)
    conn.tick(0.0)
    conn.receive_data(PROTOCOL_HEADER)
    assert conn.tick(9.0) == []
    [ev] = conn.tick(10.0)
    assert ev.reply_code == 320 and conn.is_closed


def test_close_timeout_after_server_close():
    conn = open_conn(close_timeout=30.0)
    conn.close()
    assert conn.closing
    assert conn.tick(0.0) == [] and conn.tick(29.0) == []
    [ev] = conn.tick(30.0)
    assert ev.reply_code == 320 and conn.is_closed


# ---------------------------------------------------------------- close

def test_client_close_is_answered_and_ends_the_connection():
    conn = open_conn()
    events = conn.receive_data(m(commands.Connection.Close(200, "bye", 0, 0)))
    assert [type(e) for e in events] == [ConnectionClosed] and events[0].reply_code == 200
    assert isinstance(methods(conn)[-1][1], commands.Connection.CloseOk)
    assert conn.is_closed and conn.linger_on_close   # the client closes the socket
    assert conn.receive_data(m(commands.Channel.Open(), 1)) == []
    assert conn.receive_data(b"") == []


def test_server_close_waits_for_close_ok_and_ignores_other_input():
    conn = open_conn()
    conn.close()
    ch, close = last_close(conn)
    assert (ch, close.reply_code) == (0, 320)
    assert close.reply_text == "CONNECTION_FORCED - broker shutdown"
    assert conn.closing and not conn.is_closed
    assert conn.receive_data(m(commands.Channel.Open(), 1)) == []
    assert conn.receive_data(m(commands.Queue.Declare(queue="x"), 1)) == []
    assert conn.data_to_send() == b""
    conn.send_method(0, commands.Connection.Blocked("x"))  # dropped while closing
    assert conn.data_to_send() == b""
    [ev] = conn.receive_data(m(commands.Connection.CloseOk()))
    assert ev == ConnectionClosed(320, "CONNECTION_FORCED - broker shutdown")
    assert conn.is_closed and not conn.linger_on_close    # ours to close at once


def test_crossing_closes():
    conn = open_conn()
    conn.close(320, "CONNECTION_FORCED - bye")
    conn.data_to_send()
    [ev] = conn.receive_data(m(commands.Connection.Close(200, "client bye", 0, 0)))
    assert isinstance(methods(conn)[-1][1], commands.Connection.CloseOk)
    assert ev.reply_code == 320 and conn.is_closed


def test_memoryview_and_bytearray_input_give_bytes_in_events():
    from amqp_testkit import open_channel, publish
    conn = open_conn()
    open_channel(conn, 1)
    data = publish(1, b"payload")
    [ev] = conn.receive_data(memoryview(bytearray(data))[:len(data)])
    assert type(ev.header) is bytes and type(ev.body) is bytes and ev.body == b"payload"


def test_eof_emits_connection_closed_once():
    conn = open_conn()
    [ev] = conn.receive_data(b"")
    assert isinstance(ev, ConnectionClosed) and conn.is_closed
    assert conn.receive_data(b"") == [] and conn.tick(1.0) == []


def test_eof_while_closing_reports_our_reason():
    conn = open_conn()
    conn.receive_data(m(commands.Channel.Open(), 0))  # 504 hard
    [ev] = conn.receive_data(b"")
    assert ev.reply_code == 504


def test_close_before_protocol_header_emits_closed_on_next_call():
    conn = make_conn()
    conn.close()
    assert conn.is_closed and conn.data_to_send() == b""
    [ev] = conn.tick(0.0)
    assert isinstance(ev, ConnectionClosed)
    assert conn.tick(1.0) == []


def test_connection_blocked_can_be_sent_on_channel_0():
    conn = open_conn()
    conn.send_method(0, commands.Connection.Blocked("low on memory"))
    [(ch, blocked)] = methods(conn)
    assert ch == 0 and blocked.reason == "low on memory"


def test_start_ok_response_with_binary_password_is_403():
    _refused(make_conn(), start_ok_raw("PLAIN", b"\0guest\0\xff"))


def test_amqplain_undecodable_table_is_502():
    conn = make_conn()
    conn.receive_data(PROTOCOL_HEADER)
    conn.receive_data(start_ok_raw("AMQPLAIN", b"\x05LOGINZ\x00"))
    _, close = last_close(conn)
    assert close.reply_code == 502


def test_update_secret_for_a_password_user_is_accepted_unchecked():
    """RabbitMQ 3.10's internal user store does not use secrets after login, so it answers
    connection.update-secret with update-secret-ok whatever the new secret (its
    rabbit_auth_backend_internal update_state); a password user's connection stays open."""
    conn = make_conn()
    handshake(conn, user="alice", password="secret")
    for secret in ("secret", "not-the-password"):
        conn.receive_data(m(commands.Connection.UpdateSecret(secret, "token refresh")))
        [(ch, ok)] = methods(conn)
        assert ch == 0 and isinstance(ok, commands.Connection.UpdateSecretOk)
        assert not conn.closing


def test_update_secret_is_checked_by_a_backend_that_validates_secrets():
    """A backend that validates the new secret (a token backend) still decides: accepted,
    update-secret-ok; refused, connection.close 530 with RabbitMQ's wording."""
    checked = []

    def check_secret(user, secret):
        checked.append((user, secret))
        return secret == "fresh-token"

    conn = make_conn(check_secret=check_secret)
    handshake(conn, user="alice", password="secret")
    conn.receive_data(m(commands.Connection.UpdateSecret("fresh-token", "token refresh")))
    [(ch, ok)] = methods(conn)
    assert isinstance(ok, commands.Connection.UpdateSecretOk) and not conn.closing
    conn.receive_data(m(commands.Connection.UpdateSecret("stale-token", "token refresh")))
    ch, close = last_close(conn)
    assert ch == 0 and close.reply_code == 530 and conn.closing
    assert close.reply_text == "NOT_ALLOWED - New secret was refused by one of the backends"
    assert (close.class_id, close.method_id) == (10, 70)
    assert checked == [("alice", "fresh-token"), ("alice", "stale-token")]


def test_update_secret_before_open_is_a_command_error():
    conn = make_conn()
    conn.receive_data(PROTOCOL_HEADER)
    conn.receive_data(m(start_ok_plain("guest", "guest")))
    conn.data_to_send()
    conn.receive_data(m(commands.Connection.UpdateSecret("guest", "early")))
    assert last_close(conn)[1].reply_code == 503
