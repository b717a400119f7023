"""A small synchronous facade over pika, aio-pika and kombu, so one scenario runs on all three.

Each adapter does only what the client library itself offers; no protocol work happens here.
aio-pika is driven from a private event loop (``loop.run_until_complete``) so tests stay plain
functions (pytest-asyncio is not used). Broker errors become :class:`BrokerError` with the
AMQP reply code the client received; after a channel error call :meth:`Client.reopen`.

Where a client cannot express a scenario, the adapter raises :class:`Unsupported` and the test
skips with that reason.
"""
from __future__ import annotations

from .client_aio_pika import AioPikaClient
from .client_base import (CLIENTS, DEFAULT_CT, PROP_NAMES, BrokerError, Client, Delivery,
                          Nacked, Returned, Unsupported)
from .client_kombu import KombuClient
from .client_pika import PikaClient

__all__ = ["CLIENTS", "DEFAULT_CT", "PROP_NAMES", "BrokerError", "Client", "Delivery",
           "Nacked", "Returned", "Unsupported", "ADAPTERS", "connect"]

ADAPTERS = {"pika": PikaClient, "aio_pika": AioPikaClient, "kombu": KombuClient}


def connect(kind: str, url: str, confirms: bool = False) -> Client:
    return ADAPTERS[kind](url, confirms=confirms)

