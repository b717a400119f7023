"""A minimal asyncio AMQP 0-9-1 client for the load tool (one connection, one channel).

The handshake and the synchronous methods (``queue.declare``, ``basic.qos``,
``confirm.select``, ``basic.consume``, ``queue.delete``) use pamqp's full codec; once a worker
installs its fast path (``AMQPClient.fast``), every ``basic.deliver``/``basic.ack``/
``basic.nack``/``basic.return`` method frame and every content frame goes to it as raw bytes,
split with ``struct`` (``frames.split_frames``). Heartbeats are switched off (TuneOk
heartbeat = 0), so a long run never needs a timer on the client side.

Errors: a ``channel.close``/``connection.close`` from the broker, or a lost socket, raises
``BrokerClosed`` in every pending RPC and sets ``AMQPClient.closed`` with the reason.
"""
from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from pamqp import commands
from pamqp import frame as pframe
from pamqp.exceptions import UnmarshalingException
from pamqp.header import ProtocolHeader

from shoal.shared.errors import ShoalError
from . import frames as F

FAST_METHODS = {F.BASIC_DELIVER, F.BASIC_ACK, F.BASIC_NACK, F.BASIC_RETURN}
CHANNEL = 1
MAX_FRAME = 131072
#: how long a TCP connect, and then the broker's connection.start, may take (s): a broker busy
#: declaring 10,000 queues answers slowly (RabbitMQ 3.10 here took more than 30 s for some of
#: 1,000 connections: issue 46 shape G)
CONNECT_TIMEOUT_S = 120.0


class BrokerClosed(ShoalError):
    """The broker closed the channel or connection (its reply code and text in the message),
    or the socket was lost."""


@dataclass(frozen=True)
class AMQPUrl:
    """``amqp://user:password@host:port/vhost`` (RabbitMQ URI spec; vhost percent-encoded,
    an empty path means ``/``). Raises ``ValueError`` on another scheme or a bad port."""

    host: str
    port: int
    user: str
    password: str
    vhost: str

    @classmethod
    def parse(cls, url: str) -> AMQPUrl:
        u = urllib.parse.urlparse(url)
        if u.scheme != "amqp":
            raise ValueError(f"--url must start with amqp:// (got {url!r})")
        try:
            port = u.port or 5672
        except ValueError as exc:
            raise ValueError(f"--url has a bad port: {exc}") from None
        path = u.path.removeprefix("/")
        vhost = urllib.parse.unquote(path) if path else "/"
        return cls(u.hostname or "127.0.0.1", port,
                   urllib.parse.unquote(u.username or "guest"),
                   urllib.parse.unquote(u.password or "guest"), vhost)

    def public(self) -> str:
        """The URL without the password."""
        vhost = urllib.parse.quote(self.vhost, safe="")
        return f"amqp://{urllib.parse.quote(self.user)}@{self.host}:{self.port}/{vhost}"


class AMQPClient(asyncio.Protocol):
    """One AMQP connection with channel 1 open after ``open()``.

    ``fast``: a callable ``(frame_type, buf, payload_start, payload_end)`` that receives the
    hot-path frames once set; everything else is decoded by pamqp and answers ``rpc``.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.fast: Callable | None = None
        self.on_batch_end: Callable | None = None
        self.waiter: asyncio.Future | None = None
        self.closed: str | None = None
        self.frame_max = MAX_FRAME
        self.server = ""
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.lost = asyncio.Event()

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        consumed = 0
        fast = self.fast
        unpack = F.CLASS_METHOD.unpack_from
        try:
            for ftype, _ch, start, end in F.split_frames(buf):
                consumed = end + 1
                if fast is not None:
                    if ftype != F.FRAME_METHOD or unpack(buf, start) in FAST_METHODS:
                        if ftype != F.FRAME_HEARTBEAT:
                            fast(ftype, buf, start, end)
                        continue
                if ftype == F.FRAME_HEARTBEAT:
                    continue
                self._slow(bytes(buf[start - 7:end + 1]))
        except (ValueError, UnmarshalingException) as exc:
            self._fail(f"protocol error from broker: {exc}")
            if self.transport:
                self.transport.abort()
            return
        del buf[:consumed]
        if self.on_batch_end is not None:
            self.on_batch_end()

    def connection_lost(self, exc) -> None:
        self._fail(f"connection lost ({exc or 'closed by broker'})")
        self.can_write.set()
        self.lost.set()

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    # -- slow path ------------------------------------------------------------------------
    def _slow(self, raw: bytes) -> None:
        _, _, value = pframe.unmarshal(raw)
        if isinstance(value, (commands.Connection.Close, commands.Channel.Close)):
            self._fail(f"broker closed the {value.name.split('.')[0].lower()}: "
                       f"{value.reply_code} {value.reply_text}")
            if isinstance(value, commands.Channel.Close):
                self.send(commands.Channel.CloseOk(), CHANNEL)
            else:
                self.send(commands.Connection.CloseOk(), 0)
            return
        if isinstance(value, commands.Basic.Cancel):
            self._fail(f"broker cancelled consumer {value.consumer_tag!r}")
            return
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(value)

    def _fail(self, why: str) -> None:
        if self.closed is None:
            self.closed = why
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(BrokerClosed(self.closed))

    def send(self, value, channel: int = CHANNEL) -> None:
        self.transport.write(pframe.marshal(value, channel))

    async def rpc(self, value, expect: type, channel: int = CHANNEL, timeout: float = 30.0):
        """Send ``value`` and wait for a frame of type ``expect``. Raises ``BrokerClosed``."""
        if self.closed:
            raise BrokerClosed(self.closed)
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        if value is not None:
            self.send(value, channel)
        try:
            got = await asyncio.wait_for(self.waiter, timeout)
        except TimeoutError:
            raise BrokerClosed(f"no answer to {type(value).__name__} within {timeout:.0f} s") \
                from None
        if not isinstance(got, expect):
            raise BrokerClosed(f"expected {expect.__name__}, got {type(got).__name__}")
        return got

    # -- handshake ------------------------------------------------------------------------
    async def open(self, url: AMQPUrl) -> None:
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        self.transport.write(pframe.marshal(ProtocolHeader(), 0))
        try:
            start = await asyncio.wait_for(self.waiter, CONNECT_TIMEOUT_S)
        except TimeoutError:
            raise TimeoutError(f"no connection.start within {CONNECT_TIMEOUT_S:.0f} s of the "
                               f"protocol header") from None
        if not isinstance(start, commands.Connection.Start):
            raise BrokerClosed(f"expected connection.start, got {type(start).__name__}")
        props = start.server_properties or {}
        self.server = " ".join(str(props.get(k, "")) for k in ("product", "version")).strip()
        tune = await self.rpc(commands.Connection.StartOk(
            client_properties={"product": "shoal loadtest",
                               "capabilities": {"publisher_confirms": True,
                                                "consumer_cancel_notify": True}},
            mechanism="PLAIN", response=f"\0{url.user}\0{url.password}"),
            commands.Connection.Tune, channel=0)
        self.frame_max = min(tune.frame_max or MAX_FRAME, MAX_FRAME)
        self.send(commands.Connection.TuneOk(channel_max=tune.channel_max or 2047,
                                             frame_max=self.frame_max, heartbeat=0), 0)
        await self.rpc(commands.Connection.Open(virtual_host=url.vhost),
                       commands.Connection.OpenOk, channel=0)
        await self.rpc(commands.Channel.Open(), commands.Channel.OpenOk)

    async def close(self, timeout: float = 5.0) -> None:
        """Close politely (waiting ``timeout`` s at most for close-ok), then drop the socket."""
        if self.transport is None or self.transport.is_closing():
            return
        if self.closed is None:
            try:
                await self.rpc(commands.Connection.Close(reply_code=200, reply_text="bye",
                                                         class_id=0, method_id=0),
                               commands.Connection.CloseOk, channel=0, timeout=timeout)
            except BrokerClosed:
                pass
        self.transport.close()


async def connect(url: AMQPUrl) -> AMQPClient:
    """Open a connection and channel 1. Raises ``BrokerClosed``, ``OSError`` or
    ``TimeoutError`` (no TCP connection within CONNECT_TIMEOUT_S)."""
    loop = asyncio.get_running_loop()
    try:
        _, client = await asyncio.wait_for(
            loop.create_connection(AMQPClient, url.host, url.port), CONNECT_TIMEOUT_S)
    except TimeoutError:
        raise TimeoutError(f"no TCP connection to {url.host}:{url.port} within "
                           f"{CONNECT_TIMEOUT_S:.0f} s") from None
    await client.open(url)
    return client


async def declare_queue(client: AMQPClient, name: str, durable: bool, arguments: dict) -> None:
    await client.rpc(commands.Queue.Declare(queue=name, durable=durable,
                                            arguments=arguments or None),
                     commands.Queue.DeclareOk)


async def declare_exchange(client: AMQPClient, name: str, kind: str, durable: bool) -> None:
    await client.rpc(commands.Exchange.Declare(exchange=name, exchange_type=kind,
                                               durable=durable),
                     commands.Exchange.DeclareOk)


async def bind_queue(client: AMQPClient, queue: str, exchange: str, key: str) -> None:
    await client.rpc(commands.Queue.Bind(queue=queue, exchange=exchange, routing_key=key),
                     commands.Queue.BindOk)
