"""A raw AMQP 0-9-1 socket for tests that must send what no client library would send.

Frames are built and parsed with pamqp; the handshake is done by hand. Every read is bounded
by a socket timeout and fails with a clear message.
"""
from __future__ import annotations

import socket
import struct
import time

from pamqp import commands, frame, header
from pamqp.body import ContentBody
from pamqp.heartbeat import Heartbeat

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = b"\xce"


def raw_frame(frame_type: int, channel: int, payload: bytes, end: bytes = FRAME_END) -> bytes:
    """One frame with an arbitrary type, payload and frame-end octet."""
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + end


def method_frame(channel: int, class_id: int, method_id: int, args: bytes = b"") -> bytes:
    """A method frame with arbitrary (possibly unknown) class and method ids."""
    return raw_frame(1, channel, struct.pack(">HH", class_id, method_id) + args)


def publish_frames(channel: int, exchange: str, routing_key: str, body: bytes,
                   frame_max: int = 131072, mandatory: bool = False,
                   props: commands.Basic.Properties | None = None) -> bytes:
    """basic.publish method + content header + body frames no larger than ``frame_max``."""
    out = frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                               mandatory=mandatory), channel)
    out += frame.marshal(header.ContentHeader(0, len(body),
                                              props or commands.Basic.Properties()), channel)
    step = frame_max - 8
    for i in range(0, len(body), step):
        out += frame.marshal(ContentBody(body[i:i + step]), channel)
    return out


class Closed(Exception):
    """The server closed the TCP connection (EOF or reset)."""


class RawAMQP:
    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.timeout = timeout
        self.buf = b""
        self.frame_max = 131072

    # -- bytes
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, value, channel: int = 0) -> None:
        self.send(frame.marshal(value, channel))

    def _fill(self, n: int, deadline: float) -> None:
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for data from the server "
                                     f"(have {len(self.buf)} bytes, need {n})")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                continue
            except ConnectionError as e:
                raise Closed(str(e)) from e
            if not chunk:
                raise Closed("EOF")
            self.buf += chunk

    def read_exactly(self, n: int, timeout: float | None = None) -> bytes:
        self._fill(n, time.monotonic() + (timeout or self.timeout))
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_frame(self, timeout: float | None = None):
        """Next frame as ``(channel, pamqp object)``; heartbeats are skipped."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            self._fill(7, deadline)
            if self.buf.startswith(b"AMQP"):
                self._fill(8, deadline)
                data, self.buf = self.buf[:8], self.buf[8:]
                return 0, data
            size = struct.unpack(">I", self.buf[3:7])[0]
            self._fill(8 + size, deadline)
            _, channel, value = frame.unmarshal(self.buf[:8 + size])
            self.buf = self.buf[8 + size:]
            if not isinstance(value, Heartbeat):
                return channel, value

    def expect(self, cls, channel: int | None = None, timeout: float | None = None):
        ch, value = self.read_frame(timeout)
        assert isinstance(value, cls), f"expected {cls.__name__}, got {value!r} on channel {ch}"
        if channel is not None:
            assert ch == channel, f"{cls.__name__} on channel {ch}, expected {channel}"
        return value

    def read_until_closed(self, timeout: float = 10.0) -> bytes:
        """Everything the server still sends until it closes the socket."""
        deadline = time.monotonic() + timeout
        data = self.buf
        self.buf = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("the server did not close the socket within "
                                     f"{timeout} s")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                continue
            except ConnectionError:
                return data
            if not chunk:
                return data
            data += chunk

    # -- protocol steps
    def handshake(self, user: str = "guest", password: str = "guest", vhost: str = "/",
                  heartbeat: int = 0, header: bytes = PROTOCOL_HEADER):
        """Protocol header (``header``, 0-9-1's unless told) .. connection.open. Returns the
        connection.tune received."""
        self.send(header)
        start = self.expect(commands.Connection.Start, 0)
        assert b"PLAIN" in start.mechanisms.encode() if isinstance(start.mechanisms, str) \
            else b"PLAIN" in start.mechanisms
        self.send_frame(commands.Connection.StartOk(
            client_properties={"product": "shoal-e2e-raw",
                               "capabilities": {"consumer_cancel_notify": True}},
            mechanism="PLAIN", response=f"\0{user}\0{password}", locale="en_US"))
        tune = self.expect(commands.Connection.Tune, 0)
        self.frame_max = tune.frame_max or 131072
        self.send_frame(commands.Connection.TuneOk(channel_max=tune.channel_max,
                                                   frame_max=self.frame_max,
                                                   heartbeat=heartbeat))
        self.send_frame(commands.Connection.Open(virtual_host=vhost))
        return tune

    def open(self, **kw) -> "RawAMQP":
        tune = self.handshake(**kw)
        self.expect(commands.Connection.OpenOk, 0)
        self.tune = tune
        return self

    def open_channel(self, channel: int = 1) -> None:
        self.send_frame(commands.Channel.Open(), channel)
        self.expect(commands.Channel.OpenOk, channel)

    def publish(self, channel: int, exchange: str, routing_key: str, body: bytes,
                mandatory: bool = False, props: commands.Basic.Properties | None = None) -> bytes:
        """The bytes of a complete basic.publish (not sent), body split to ``frame_max``."""
        return publish_frames(channel, exchange, routing_key, body, self.frame_max,
                              mandatory, props)

    def expect_connection_close(self, timeout: float = 10.0) -> commands.Connection.Close:
        """Read (skipping other frames) until connection.close; answer close-ok."""
        deadline = time.monotonic() + timeout
        seen = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no connection.close within {timeout} s; saw {seen}")
            try:
                ch, value = self.read_frame(left)
            except Closed as e:
                raise AssertionError(f"socket closed without connection.close; saw {seen}") \
                    from e
            if isinstance(value, commands.Connection.Close):
                assert ch == 0, "connection.close must come on channel 0"
                try:
                    self.send_frame(commands.Connection.CloseOk())
                except OSError:
                    pass
                return value
            seen.append(value)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
