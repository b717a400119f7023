"""pika (BlockingConnection) adapter."""
from __future__ import annotations

import contextlib
from typing import Iterator

import pika
import pika.exceptions

from .client_base import (DEFAULT_CT, BrokerError, Client, Delivery, Nacked, Returned,
                          _norm_props)


class PikaClient(Client):
    name = "pika"

    def __init__(self, url: str, confirms: bool = False) -> None:
        super().__init__(url, confirms)
        with self._errors():
            self.conn = pika.BlockingConnection(pika.URLParameters(url))
        self._open()

    def _open(self) -> None:
        with self._errors():
            self.ch = self.conn.channel()
            if self.confirms:
                self.ch.confirm_delivery()
            self.ch.add_on_cancel_callback(lambda frame: self.cancelled.append(
                frame.method.consumer_tag))

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except pika.exceptions.ChannelClosedByBroker as e:
            raise BrokerError(e.reply_code, e.reply_text, hard=False) from e
        except pika.exceptions.ConnectionClosedByBroker as e:
            raise BrokerError(e.reply_code, e.reply_text, hard=True) from e
        except pika.exceptions.UnroutableError as e:
            m = e.messages[0].method
            raise Returned(m.reply_code, m.reply_text) from e
        except pika.exceptions.NackError as e:
            raise Nacked(str(e)) from e

    def declare_queue(self, name="", *, durable=False, exclusive=False, auto_delete=False,
                      passive=False, arguments=None):
        with self._errors():
            r = self.ch.queue_declare(name, passive=passive, durable=durable,
                                      exclusive=exclusive, auto_delete=auto_delete,
                                      arguments=arguments)
        return r.method.queue, r.method.message_count, r.method.consumer_count

    def declare_exchange(self, name, type="direct", *, durable=False, auto_delete=False,
                         passive=False, arguments=None):
        with self._errors():
            self.ch.exchange_declare(name, type, passive=passive, durable=durable,
                                     auto_delete=auto_delete, arguments=arguments)

    def bind_queue(self, queue, exchange, routing_key="", arguments=None):
        with self._errors():
            self.ch.queue_bind(queue, exchange, routing_key, arguments=arguments)

    def bind_exchange(self, destination, source, routing_key="", arguments=None):
        with self._errors():
            self.ch.exchange_bind(destination, source, routing_key, arguments=arguments)

    def delete_queue(self, name, *, if_unused=False, if_empty=False):
        with self._errors():
            self.ch.queue_delete(name, if_unused=if_unused, if_empty=if_empty)

    def delete_exchange(self, name, *, if_unused=False):
        with self._errors():
            self.ch.exchange_delete(name, if_unused=if_unused)

    def purge(self, name):
        with self._errors():
            return self.ch.queue_purge(name).method.message_count

    def publish(self, exchange, routing_key, body, props=None, mandatory=False):
        props = {"content_type": DEFAULT_CT, **(props or {})}
        with self._errors():
            self.ch.basic_publish(exchange, routing_key, body, pika.BasicProperties(**props),
                                  mandatory=mandatory)

    def _delivery(self, method, properties, body, consumer_tag=None) -> Delivery:
        return Delivery(body, method.delivery_tag, method.redelivered, method.exchange,
                        method.routing_key, _norm_props(vars(properties)), consumer_tag)

    def get(self, queue, no_ack=False):
        with self._errors():
            method, properties, body = self.ch.basic_get(queue, auto_ack=no_ack)
        return None if method is None else self._delivery(method, properties, body)

    def consume(self, queue, no_ack=False):
        def on_message(ch, method, properties, body):
            self.deliveries.append(self._delivery(method, properties, body,
                                                  method.consumer_tag))
        with self._errors():
            return self.ch.basic_consume(queue, on_message, auto_ack=no_ack)

    def cancel(self, consumer_tag):
        with self._errors():
            self.ch.basic_cancel(consumer_tag)

    def qos(self, prefetch_count, global_=False):
        with self._errors():
            self.ch.basic_qos(prefetch_count=prefetch_count, global_qos=global_)

    def ack(self, d, multiple=False):
        with self._errors():
            self.ch.basic_ack(d.delivery_tag, multiple=multiple)

    def ack_tag(self, delivery_tag):
        with self._errors():
            self.ch.basic_ack(delivery_tag)

    def nack(self, d, requeue=True, multiple=False):
        with self._errors():
            self.ch.basic_nack(d.delivery_tag, multiple=multiple, requeue=requeue)

    def reject(self, d, requeue=True):
        with self._errors():
            self.ch.basic_reject(d.delivery_tag, requeue=requeue)

    def recover(self):
        with self._errors():
            self.ch.basic_recover(requeue=True)

    def pump(self, seconds):
        with self._errors():
            self.conn.process_data_events(time_limit=seconds)

    def reopen(self):
        self.deliveries = []
        self._open()

    def close(self):
        if self.conn.is_open:
            self.conn.close()
