"""Helpers for the AMQP core tests: a client side built from pamqp frames, no sockets."""
from __future__ import annotations

import struct

from pamqp import body, commands, frame, header, heartbeat

from shoal.router.amqp.connection import AMQPConnection
from shoal.router.amqp.events import ConnectionClosed

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
USERS = {"guest": "guest", "alice": "secret"}


def authenticate(user: str, password: str) -> bool:
    return USERS.get(user) == password


def make_conn(**kw) -> AMQPConnection:
    kw.setdefault("vhosts", ("/", "prod"))
    return AMQPConnection(authenticate, **kw)


def m(method, channel: int = 0) -> bytes:
    """A client method frame."""
    return frame.marshal(method, channel)


def content(channel: int, body_bytes: bytes, props=None, frame_max: int = 131072,
            size: int | None = None) -> tuple[bytes, bytes]:
    """(header payload, header + body frames) for a publish."""
    hdr = header.ContentHeader(0, len(body_bytes) if size is None else size,
                               props or commands.Basic.Properties(content_type="text/plain"))
    payload = hdr.marshal()
    frames = [frame.marshal(hdr, channel)]
    chunk = frame_max - 8
    for i in range(0, len(body_bytes), chunk):
        frames.append(frame.marshal(body.ContentBody(body_bytes[i:i + chunk]), channel))
    return payload, b"".join(frames)


def publish(channel: int, body_bytes: bytes, exchange: str = "ex", routing_key: str = "rk",
            mandatory: bool = False, props=None, frame_max: int = 131072) -> bytes:
    _, rest = content(channel, body_bytes, props, frame_max)
    return m(commands.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                    mandatory=mandatory), channel) + rest


def parse(data: bytes) -> list[tuple[int, object]]:
    """Server output -> [(channel, pamqp frame object)]; raises on any malformed frame."""
    out = []
    while data:
        if data.startswith(b"AMQP"):
            out.append((0, header.ProtocolHeader()))
            data = data[8:]
            continue
        used, channel, obj = frame.unmarshal(data)
        out.append((channel, obj))
        data = data[used:]
    return out


def methods(conn: AMQPConnection) -> list[tuple[int, object]]:
    return parse(conn.data_to_send())


#: what the usual clients (pika, the Java client, ...) announce: a refused login is then a
#: connection.close 403, not only a closed socket (router/amqp/login.py)
CAPABILITIES = {"basic.nack": True, "authentication_failure_close": True}


def start_ok_plain(user: str = "guest", password: str = "guest", caps=None):
    return commands.Connection.StartOk(
        client_properties={"product": "test", "capabilities": caps or CAPABILITIES},
        mechanism="PLAIN", response=f"\0{user}\0{password}")


def handshake(conn: AMQPConnection, user: str = "guest", password: str = "guest",
              vhost: str = "/", tune=(0, 0, 0)) -> list:
    """Run the handshake; returns all events. Output is drained."""
    events = conn.receive_data(PROTOCOL_HEADER)
    events += conn.receive_data(m(start_ok_plain(user, password)))
    channel_max, frame_max, hb = tune
    events += conn.receive_data(m(commands.Connection.TuneOk(channel_max, frame_max, hb)))
    events += conn.receive_data(m(commands.Connection.Open(vhost)))
    conn.data_to_send()
    return events


def open_conn(**kw) -> AMQPConnection:
    conn = make_conn(**kw)
    handshake(conn)
    assert not conn.is_closed and not conn.closing
    return conn


def open_channel(conn: AMQPConnection, channel: int = 1) -> None:
    conn.receive_data(m(commands.Channel.Open(), channel))
    out = methods(conn)
    assert isinstance(out[-1][1], commands.Channel.OpenOk)


def last_close(conn: AMQPConnection):
    """The last frame written, expected to be connection.close or channel.close."""
    out = methods(conn)
    assert out, "nothing written"
    return out[-1]


def closed_events(events) -> list:
    return [e for e in events if isinstance(e, ConnectionClosed)]


def hb_frame() -> bytes:
    return frame.marshal(heartbeat.Heartbeat(), 0)


def raw_frame(frame_type: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes((end,))


def start_ok_raw(mechanism: str, response: bytes, client_properties=None) -> bytes:
    """A connection.start-ok frame with a binary SASL response (pamqp wants str)."""
    from pamqp import encode
    props = client_properties or {"capabilities": CAPABILITIES}
    payload = (struct.pack(">I", 0x000A000B) + encode.field_table(props)
               + encode.short_string(mechanism) + struct.pack(">I", len(response)) + response
               + encode.short_string("en_US"))
    return raw_frame(1, 0, payload)
