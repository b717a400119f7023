"""aio-pika adapter, driven from a private event loop (no pytest-asyncio needed)."""
from __future__ import annotations

import asyncio
import contextlib
import datetime
from typing import Any, Iterator

import aio_pika
import aiormq

from .client_base import (DEFAULT_CT, PROP_NAMES, BrokerError, Client, Delivery, Nacked,
                          Returned, _norm_props)

_AIORMQ_CODES = {aiormq.exceptions.ChannelAccessRefused: 403,
                 aiormq.exceptions.ChannelNotFoundEntity: 404,
                 aiormq.exceptions.ChannelLockedResource: 405,
                 aiormq.exceptions.ChannelPreconditionFailed: 406}



def _bytes_to_bytearray(value: Any) -> Any:
    """pamqp (aio-pika) encodes a field-table byte array from ``bytearray``, not ``bytes``."""
    if isinstance(value, dict):
        return {k: _bytes_to_bytearray(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_bytes_to_bytearray(v) for v in value]
    if isinstance(value, bytes):
        return bytearray(value)
    return value



class AioPikaClient(Client):
    name = "aio_pika"

    def __init__(self, url: str, confirms: bool = False) -> None:
        super().__init__(url, confirms)
        self.loop = asyncio.new_event_loop()
        self._queues: dict[str, aio_pika.abc.AbstractQueue] = {}
        self._messages: dict[int, aio_pika.abc.AbstractIncomingMessage] = {}
        try:
            self.conn = self._run(aio_pika.connect(url, timeout=10))
            self._open()
        except BaseException:
            self._shutdown_loop()
            raise

    def _run(self, coro, timeout: float = 15.0):
        with self._errors():
            return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except aiormq.exceptions.ChannelClosed as e:
            code = _AIORMQ_CODES.get(type(e))
            if code is None and e.args and isinstance(e.args[0], int):
                code = e.args[0]
            raise BrokerError(code, str(e), hard=False) from e
        except aiormq.exceptions.ConnectionClosed as e:
            code = e.args[0] if e.args and isinstance(e.args[0], int) else None
            raise BrokerError(code, str(e), hard=True) from e
        except aiormq.exceptions.ChannelInvalidStateError as e:
            # an RPC raced with the broker's channel.close: report the close itself
            closed = getattr(getattr(self, "_raw_channel", None), "_close_exception", None)
            if not isinstance(closed, aiormq.exceptions.ChannelClosed):
                raise
            code = _AIORMQ_CODES.get(type(closed))
            if code is None and closed.args and isinstance(closed.args[0], int):
                code = closed.args[0]
            raise BrokerError(code, str(closed), hard=False) from e
        except aiormq.exceptions.DeliveryError as e:
            frame = e.frame
            if isinstance(frame, aiormq.spec.Basic.Return):
                raise Returned(frame.reply_code, frame.reply_text) from e
            raise Nacked(str(e)) from e

    def _open(self) -> None:
        async def open_channel():
            # aio-pika builds the Channel object inside a running loop, then opens it
            return await self.conn.channel(publisher_confirms=self.confirms,
                                           on_return_raises=self.confirms)
        self.ch = self._run(open_channel())
        # aiormq calls these with the consumer tag of a broker basic.cancel
        self._raw_channel = self._run(self.ch.get_underlay_channel())
        self._raw_channel.on_consumer_cancel_callbacks.add(
            lambda frame: self.cancelled.append(frame.consumer_tag))

    def declare_queue(self, name="", *, durable=False, exclusive=False, auto_delete=False,
                      passive=False, arguments=None):
        q = self._run(self.ch.declare_queue(name or None, durable=durable, exclusive=exclusive,
                                            auto_delete=auto_delete, passive=passive,
                                            arguments=arguments))
        self._queues[q.name] = q
        r = q.declaration_result
        return q.name, r.message_count, r.consumer_count

    def _queue(self, name) -> aio_pika.abc.AbstractQueue:
        q = self._queues.get(name)
        if q is None or q.channel is not self._raw_channel:
            q = aio_pika.Queue(self.ch, name, durable=False, exclusive=False,
                               auto_delete=False, arguments=None)
            self._queues[name] = q
        return q

    def _exchange(self, name) -> aio_pika.abc.AbstractExchange:
        if name == "":
            return self.ch.default_exchange
        return aio_pika.Exchange(self.ch, name, aio_pika.ExchangeType.DIRECT)

    def declare_exchange(self, name, type="direct", *, durable=False, auto_delete=False,
                         passive=False, arguments=None):
        self._run(self.ch.declare_exchange(name, type, durable=durable, auto_delete=auto_delete,
                                           passive=passive, arguments=arguments))

    def bind_queue(self, queue, exchange, routing_key="", arguments=None):
        self._run(self._queue(queue).bind(exchange, routing_key, arguments=arguments))

    def bind_exchange(self, destination, source, routing_key="", arguments=None):
        self._run(self._exchange(destination).bind(source, routing_key, arguments=arguments))

    def delete_queue(self, name, *, if_unused=False, if_empty=False):
        self._run(self.ch.queue_delete(name, if_unused=if_unused, if_empty=if_empty))

    def delete_exchange(self, name, *, if_unused=False):
        self._run(self.ch.exchange_delete(name, if_unused=if_unused))

    def purge(self, name):
        return self._run(self._queue(name).purge()).message_count

    def publish(self, exchange, routing_key, body, props=None, mandatory=False):
        props = {"content_type": DEFAULT_CT, **(props or {})}
        if "expiration" in props:      # aio-pika takes seconds, sends milliseconds
            props["expiration"] = int(props["expiration"]) / 1000
        if "timestamp" in props and isinstance(props["timestamp"], int):
            props["timestamp"] = datetime.datetime.fromtimestamp(props["timestamp"],
                                                                 datetime.timezone.utc)
        if props.get("headers"):
            props["headers"] = _bytes_to_bytearray(props["headers"])
        msg = aio_pika.Message(body, **props)
        self._run(self._exchange(exchange).publish(msg, routing_key, mandatory=mandatory))

    def _delivery(self, m: aio_pika.abc.AbstractIncomingMessage) -> Delivery:
        props = {k: getattr(m, k) for k in PROP_NAMES if k != "expiration"}
        if m.expiration is not None:
            props["expiration"] = str(int(round(m.expiration.total_seconds() * 1000))
                                      if hasattr(m.expiration, "total_seconds")
                                      else int(round(float(m.expiration) * 1000)))
        d = Delivery(m.body, m.delivery_tag, m.redelivered, m.exchange or "",
                     m.routing_key or "", _norm_props(props), m.consumer_tag, raw=m)
        return d

    def get(self, queue, no_ack=False):
        m = self._run(self._queue(queue).get(no_ack=no_ack, fail=False))
        return None if m is None else self._delivery(m)

    def consume(self, queue, no_ack=False):
        async def on_message(m):
            self.deliveries.append(self._delivery(m))
        return self._run(self._queue(queue).consume(on_message, no_ack=no_ack))

    def cancel(self, consumer_tag):
        self._run(self._raw_channel.basic_cancel(consumer_tag))

    def qos(self, prefetch_count, global_=False):
        self._run(self.ch.set_qos(prefetch_count=prefetch_count, global_=global_))

    def ack(self, d, multiple=False):
        self._run(d.raw.ack(multiple=multiple))

    def ack_tag(self, delivery_tag):
        self._run(self._raw_channel.basic_ack(delivery_tag))

    def nack(self, d, requeue=True, multiple=False):
        self._run(d.raw.nack(multiple=multiple, requeue=requeue))

    def reject(self, d, requeue=True):
        self._run(d.raw.reject(requeue=requeue))

    def recover(self):
        self._run(self._raw_channel.basic_recover(requeue=True))

    def pump(self, seconds):
        self._run(asyncio.sleep(seconds))
        if self.ch.is_closed and getattr(self._raw_channel, "_close_exception", None):
            with self._errors():
                raise self._raw_channel._close_exception  # noqa: SLF001 - surface the close

    def reopen(self):
        self.deliveries = []
        self._queues.clear()
        self._open()

    def close(self):
        try:
            if not self.conn.is_closed:
                self._run(self.conn.close())
        finally:
            self._shutdown_loop()

    def _shutdown_loop(self) -> None:
        """What asyncio.run does on exit: cancel leftover tasks, then close the loop."""
        loop = self.loop
        if loop.is_closed():
            return
        tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
