"""Shoal's sans-IO AMQP 1.0 engine against python-qpid-proton's client engine, in memory: SASL,
open, links, credit and drain, transfers split over frames both ways, session windows,
settlement, and the error conditions of bad input (OASIS AMQP 1.0 parts 2 and 5)."""
from __future__ import annotations

from tests.router.amqp10_peer import Peer, proton

from shoal.router.amqp10.engine import (ConnectionClosed, ConnectionOpened, CreditChanged,
                                        DeliveriesSettled, Engine, LinkDetached,
                                        MessageReceived, SessionEnded)
from shoal.router.amqp10.frames import Accepted, Begin, Transfer, frame


def _open(peer: Peer) -> None:
    peer.conn.open()
    peer.pump()


def test_sasl_plain_logs_in_and_open_reports_the_hostname():
    peer = Peer(hostname="vhost:v1")
    _open(peer)
    opened = [e for e in peer.events if type(e) is ConnectionOpened]
    assert opened and opened[0].user == "guest" and opened[0].hostname == "vhost:v1"
    assert peer.conn.state & proton.Endpoint.REMOTE_ACTIVE


def test_a_wrong_password_fails_sasl_and_closes():
    peer = Peer(password="wrong")
    _open(peer)
    assert peer.engine.closed
    assert peer.transport.condition is not None
    assert peer.transport.condition.name == "amqp:unauthorized-access"


def test_no_sasl_layer_is_refused_unless_anonymous_is_allowed():
    peer = Peer(sasl=False)
    _open(peer)
    assert peer.engine.closed and peer.engine.user is None
    anon = Peer(Engine(lambda *a: None, ["PLAIN", "ANONYMOUS"], anonymous_user="guest"),
                sasl=False)
    _open(anon)
    assert [e.user for e in anon.events if type(e) is ConnectionOpened] == ["guest"]


def test_a_receiving_link_gets_credit_and_split_transfers_reassemble():
    peer = Peer(max_frame_size=512)
    _open(peer)
    ssn = peer.conn.session()
    ssn.open()
    rcv = ssn.receiver("r")
    rcv.source.address = "/queues/q"
    rcv.open()
    peer.pump()
    link = peer.links[0]
    rcv.flow(3)
    evs = peer.pump()
    assert any(type(e) is CreditChanged for e in evs) and link.credit == 3
    body = bytes(range(256)) * 20          # 5120 octets: 11 frames of at most 512
    payload = proton.Message(body=body, inferred=True).encode()
    link.session.send_message(link, bytes(payload), "tag-1")
    peer.pump()
    d = rcv.current
    assert d is not None and not d.partial
    got = proton.Message()
    got.decode(rcv.recv(d.pending))
    assert bytes(got.body) == body
    assert link.credit == 2
    d.update(proton.Delivery.ACCEPTED)
    d.settle()
    evs = peer.pump()
    settled = [e for e in evs if type(e) is DeliveriesSettled]
    assert settled and settled[0].deliveries == [(0, "tag-1")]
    assert type(settled[0].state) is Accepted


def test_drain_uses_up_the_credit_and_tells_the_client():
    peer = Peer()
    _open(peer)
    ssn = peer.conn.session()
    ssn.open()
    rcv = ssn.receiver("r")
    rcv.source.address = "/queues/q"
    rcv.open()
    peer.pump()
    link = peer.links[0]
    rcv.drain(5)
    peer.pump()
    assert link.drain and link.credit == 5
    link.session.send_message(link, b"\x00Su\xa0\x01x", 1)
    link.session.drained(link)
    peer.pump()
    assert not rcv.draining()
    assert rcv.credit == rcv.queued == 1      # the one message; the rest was drained


def test_a_sending_link_split_over_small_frames_arrives_whole():
    engine = Engine(lambda m, r, h: "guest", ["PLAIN"], max_frame_size=512)
    peer = Peer(engine)
    _open(peer)
    ssn = peer.conn.session()
    ssn.open()
    snd = ssn.sender("s")
    snd.target.address = "/queues/q"
    snd.open()
    peer.pump()
    assert snd.credit == 10
    body = b"y" * 3000
    d = snd.delivery(b"t1")
    snd.send(proton.Message(body=body, inferred=True).encode())
    snd.advance()
    evs = peer.pump()
    got = [e for e in evs if type(e) is MessageReceived]
    assert len(got) == 1 and not got[0].settled
    m = proton.Message()
    m.decode(got[0].payload)
    assert bytes(m.body) == body
    got[0].link.session.settle_received(got[0].link, [got[0].delivery_id], Accepted())
    peer.pump()
    assert d.remote_state == proton.Delivery.ACCEPTED and d.settled


def test_transfers_wait_for_the_clients_session_window():
    peer = Peer()
    _open(peer)
    ssn = peer.conn.session()
    ssn.open()
    rcv = ssn.receiver("r")
    rcv.source.address = "/queues/q"
    rcv.open()
    rcv.flow(10)
    peer.pump()
    link = peer.links[0]
    session = link.session
    session.remote_incoming_window = 2         # as if the client allowed two transfers
    for i in range(4):
        link.session.send_message(link, b"\x00Su\xa0\x01x", i)
    assert len(session.pending) == 2
    peer.pump()
    assert rcv.queued == 2
    rcv.flow(1)                                 # a flow from the client opens the window
    peer.pump()
    assert rcv.queued == 4 and not session.pending


def test_garbage_closes_with_decode_error():
    peer = Peer()
    _open(peer)
    evs = peer.engine.receive_data(b"\x00\x00\x00\x0c\x02\x00\x00\x00\x00\x53\x10\x99")
    closed = [e for e in evs if type(e) is ConnectionClosed]
    assert closed and closed[0].error.condition == "amqp:decode-error"
    assert b"amqp:decode-error" in peer.engine.data_to_send()


def test_an_oversized_frame_closes_with_framing_error():
    peer = Peer()
    _open(peer)
    evs = peer.engine.receive_data(b"\xff\xff\xff\xff\x02\x00\x00\x00")
    closed = [e for e in evs if type(e) is ConnectionClosed]
    assert closed and closed[0].error.condition == "amqp:connection:framing-error"


def test_a_transfer_on_an_unknown_handle_ends_the_session():
    peer = Peer()
    _open(peer)
    ssn = peer.conn.session()
    ssn.open()
    peer.pump()
    evs = peer.engine.receive_data(frame(0, Transfer(7, 0, b"t", 0, True)))
    assert not peer.engine.closed and [type(e) for e in evs] == [SessionEnded]
    assert b"amqp:session:unattached-handle" in peer.engine.data_to_send()


def test_begin_on_a_channel_in_use_is_a_framing_error():
    peer = Peer()
    _open(peer)
    ssn = peer.conn.session()
    ssn.open()
    peer.pump()
    evs = peer.engine.receive_data(frame(0, Begin(None, 0, 100, 100)))
    assert [e.error.condition for e in evs if type(e) is ConnectionClosed] == \
        ["amqp:connection:framing-error"]


def test_a_client_detach_is_answered_and_reported():
    peer = Peer()
    _open(peer)
    ssn = peer.conn.session()
    ssn.open()
    rcv = ssn.receiver("r")
    rcv.source.address = "/queues/q"
    rcv.open()
    peer.pump()
    rcv.close()
    evs = peer.pump()
    assert [type(e) for e in evs] == [LinkDetached]
    assert rcv.state & proton.Endpoint.REMOTE_CLOSED


def test_frames_after_the_open_wait_for_the_brokers_answer():
    peer = Peer(auto=False)
    peer.conn.open()
    peer.conn.session().open()          # pipelined behind the open
    evs = peer.pump()
    assert [type(e) for e in evs] == [ConnectionOpened] and not peer.engine.sessions
    peer.engine.close("amqp:unauthorized-access", "refused")
    assert peer.engine.resume() == [] and not peer.engine.sessions   # begin ignored
    out = peer.engine.data_to_send()
    assert b"amqp:unauthorized-access" in out and out.index(b"\x53\x10") < out.index(b"\x53\x18")


def test_a_client_that_never_opens_is_dropped_after_the_handshake_timeout():
    import time
    engine = Engine(lambda *a: "guest", ["PLAIN"], handshake_timeout_s=5)
    engine.receive_data(b"AMQP\x03\x01\x00\x00")           # then nothing
    assert engine.tick(time.monotonic()) == []
    evs = engine.tick(time.monotonic() + 6)
    assert [type(e) for e in evs] == [ConnectionClosed] and engine.closed


def test_a_close_during_sasl_sends_no_amqp_frame():
    engine = Engine(lambda *a: "guest", ["PLAIN"])
    engine.receive_data(b"AMQP\x03\x01\x00\x00")
    engine.data_to_send()
    engine.close("amqp:internal-error", "x")
    assert engine.closed and engine.data_to_send() == b""
