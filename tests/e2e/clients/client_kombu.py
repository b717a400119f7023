"""kombu adapter (kombu.Connection, 'pyamqp' transport)."""
from __future__ import annotations

import contextlib
from typing import Iterator

import amqp
import kombu

from .client_base import (DEFAULT_CT, BrokerError, Client, Delivery, Nacked, Returned,
                          Unsupported, _norm_props)


class KombuClient(Client):
    """kombu.Connection with the 'pyamqp' transport (py-amqp underneath), the Celery stack.

    Topology goes through kombu's entities (``kombu.Queue``, ``kombu.Exchange``), messages
    through ``kombu.Producer`` / ``kombu.Consumer``; basic.qos / recover / nack through the
    kombu channel (``connection.default_channel``), as kombu users do.
    """

    name = "kombu"

    def __init__(self, url: str, confirms: bool = False) -> None:
        super().__init__(url, confirms)
        opts = {"confirm_publish": True} if confirms else {}
        self.conn = kombu.Connection(url, transport="pyamqp", transport_options=opts,
                                     connect_timeout=10)
        with self._errors():
            self.conn.connect()
        self._consumers: dict[str, kombu.Consumer] = {}
        self._returned: list[tuple[int, str]] = []
        self._open()

    def _open(self) -> None:
        with self._errors():
            self.ch = self.conn.channel()
        self.ch.events["basic_return"].add(
            lambda exc, exchange, routing_key, message: self._returned.append(
                (exc.reply_code, exc.reply_text)))
        self.producer = kombu.Producer(self.ch)
        self._consumers = {}

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except amqp.exceptions.MessageNacked as e:
            raise Nacked(str(e)) from e
        except amqp.exceptions.ChannelError as e:
            raise BrokerError(e.reply_code, e.reply_text or "", hard=False) from e
        except amqp.exceptions.ConnectionError as e:
            raise BrokerError(e.reply_code, e.reply_text or "", hard=True) from e

    def _kqueue(self, name, **kw) -> kombu.Queue:
        return kombu.Queue(name, channel=self.ch, no_declare=False, **kw)

    def declare_queue(self, name="", *, durable=False, exclusive=False, auto_delete=False,
                      passive=False, arguments=None):
        q = self._kqueue(name, durable=durable, exclusive=exclusive, auto_delete=auto_delete,
                         queue_arguments=arguments)
        with self._errors():
            r = q.queue_declare(passive=passive)
        return r.queue, r.message_count, r.consumer_count

    def declare_exchange(self, name, type="direct", *, durable=False, auto_delete=False,
                         passive=False, arguments=None):
        if name.startswith("amq.") and not passive:
            raise Unsupported("kombu's Exchange.declare() silently skips amq.* names")
        ex = kombu.Exchange(name, type, channel=self.ch, durable=durable,
                            auto_delete=auto_delete, arguments=arguments)
        with self._errors():
            ex.declare(passive=passive)

    def bind_queue(self, queue, exchange, routing_key="", arguments=None):
        q = self._kqueue(queue, exchange=kombu.Exchange(exchange), routing_key=routing_key,
                         binding_arguments=arguments)
        with self._errors():
            q.queue_bind()

    def bind_exchange(self, destination, source, routing_key="", arguments=None):
        ex = kombu.Exchange(destination, channel=self.ch)
        with self._errors():
            ex.bind_to(source, routing_key=routing_key, arguments=arguments)

    def delete_queue(self, name, *, if_unused=False, if_empty=False):
        with self._errors():
            self._kqueue(name).delete(if_unused=if_unused, if_empty=if_empty)

    def delete_exchange(self, name, *, if_unused=False):
        with self._errors():
            kombu.Exchange(name, channel=self.ch).delete(if_unused=if_unused)

    def purge(self, name):
        with self._errors():
            return self._kqueue(name).purge()

    def publish(self, exchange, routing_key, body, props=None, mandatory=False):
        props = {"content_type": DEFAULT_CT, **(props or {})}
        if "expiration" in props:  # kombu takes seconds
            props["expiration"] = int(props["expiration"]) / 1000
        headers = props.pop("headers", None)
        content_type = props.pop("content_type")
        content_encoding = props.pop("content_encoding", None) or "binary"
        self._returned.clear()
        with self._errors():
            self.producer.publish(body, exchange=exchange, routing_key=routing_key,
                                  headers=headers, content_type=content_type,
                                  content_encoding=content_encoding, mandatory=mandatory,
                                  **props)
        if self._returned:
            raise Returned(*self._returned[0])

    def _delivery(self, m) -> Delivery:
        info = m.delivery_info
        body = m.body
        if body == "":   # py-amqp leaves a str default when the body size is 0 (no body frame)
            body = b""
        props = dict(m.properties)
        props.setdefault("headers", m.headers)
        props["content_type"] = m.content_type
        props["content_encoding"] = m.content_encoding
        return Delivery(body, m.delivery_tag, bool(info.get("redelivered")),
                        info.get("exchange", ""), info.get("routing_key", ""),
                        _norm_props(props), info.get("consumer_tag"), raw=m)

    def get(self, queue, no_ack=False):
        with self._errors():
            m = self._kqueue(queue).get(no_ack=no_ack, accept=None)
        return None if m is None else self._delivery(m)

    def consume(self, queue, no_ack=False):
        c = kombu.Consumer(self.ch, queues=[kombu.Queue(queue, channel=self.ch,
                                                        no_declare=True)],
                           no_ack=no_ack, on_message=lambda m: self.deliveries.append(
                               self._delivery(m)), accept=None, auto_declare=False)
        with self._errors():
            c.consume()
        tag = next(iter(c._active_tags.values()))  # kombu keeps queue name -> consumer tag
        self._consumers[tag] = c
        return tag

    def cancel(self, consumer_tag):
        with self._errors():
            self._consumers.pop(consumer_tag).cancel()

    def qos(self, prefetch_count, global_=False):
        with self._errors():
            self.ch.basic_qos(prefetch_size=0, prefetch_count=prefetch_count, a_global=global_)

    def ack(self, d, multiple=False):
        with self._errors():
            if multiple:
                self.ch.basic_ack(d.delivery_tag, multiple=True)
            else:
                d.raw.ack()

    def ack_tag(self, delivery_tag):
        with self._errors():
            self.ch.basic_ack(delivery_tag)

    def nack(self, d, requeue=True, multiple=False):
        raise Unsupported("kombu (py-amqp) has no basic.nack; it rejects one message at a time")

    def reject(self, d, requeue=True):
        with self._errors():
            d.raw.reject(requeue=requeue)

    def recover(self):
        with self._errors():
            self.ch.basic_recover(requeue=True)

    def pump(self, seconds):
        with self._errors():
            try:
                self.conn.drain_events(timeout=seconds)
            except TimeoutError:
                pass
            except amqp.exceptions.ConsumerCancelled as e:
                # kombu.Consumer registers no on_cancel: py-amqp raises for a broker cancel
                tag = e.reply_text       # AMQPError(reply_text=consumer_tag, ...)
                self.cancelled.append(tag)
                self._consumers.pop(tag, None)
            except OSError as e:   # socket.timeout is an OSError alias on 3.11
                if "timed out" not in str(e):
                    raise

    def reopen(self):
        self.deliveries = []
        self._open()

    def close(self):
        self.conn.release()
