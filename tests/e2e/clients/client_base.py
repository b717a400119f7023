"""Base of the client adapters: a small synchronous facade over pika, aio-pika and kombu, so one scenario runs on all three.

Each adapter does only what the client library itself offers; no protocol work happens here.
aio-pika is driven from a private event loop (``loop.run_until_complete``) so tests stay plain
functions (pytest-asyncio is not used). Broker errors become :class:`BrokerError` with the
AMQP reply code the client received; after a channel error call :meth:`Client.reopen`.

Where a client cannot express a scenario, the adapter raises :class:`Unsupported` and the test
skips with that reason.
"""
from __future__ import annotations

import contextlib
import datetime
import time
from dataclasses import dataclass, field
from typing import Any

CLIENTS = ["pika", "aio_pika", "kombu"]
DEFAULT_CT = "application/octet-stream"
PROP_NAMES = ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
              "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type",
              "app_id")


class Unsupported(Exception):
    """The client library cannot express this scenario (the reason is the message)."""


class BrokerError(Exception):
    """The broker closed the channel (``hard=False``) or the connection (``hard=True``)."""

    def __init__(self, code: int | None, text: str, hard: bool) -> None:
        super().__init__(f"{'connection' if hard else 'channel'} closed {code}: {text}")
        self.code, self.text, self.hard = code, text, hard


class Returned(Exception):
    """A mandatory publish came back (``basic.return``)."""

    def __init__(self, code: int | None, text: str = "") -> None:
        super().__init__(f"returned {code} {text}")
        self.code, self.text = code, text


class Nacked(Exception):
    """A publisher confirm came back as ``basic.nack``."""


@dataclass
class Delivery:
    body: bytes
    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    props: dict
    consumer_tag: str | None = None
    raw: Any = field(default=None, repr=False)


def _norm_table(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _norm_table(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_norm_table(v) for v in value]
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def _norm_props(p: dict) -> dict:
    out = {k: v for k, v in p.items() if k in PROP_NAMES and v is not None}
    if "headers" in out:
        out["headers"] = _norm_table(out["headers"])
        if not out["headers"]:
            del out["headers"]
    ts = out.get("timestamp")
    if isinstance(ts, datetime.datetime):
        if ts.tzinfo is None:
            ts = ts.replace(tzinfo=datetime.timezone.utc)
        out["timestamp"] = int(ts.timestamp())
    if "delivery_mode" in out:
        out["delivery_mode"] = int(out["delivery_mode"])
    if "priority" in out:
        out["priority"] = int(out["priority"])
    return out


class Client:
    """Interface. ``props`` dicts use pika's property names (see ``PROP_NAMES``)."""

    name = "?"

    def __init__(self, url: str, confirms: bool = False) -> None:
        self.url, self.confirms = url, confirms
        self.deliveries: list[Delivery] = []
        self.cancelled: list[str] = []

    # -- topology
    def declare_queue(self, name: str = "", *, durable=False, exclusive=False,
                      auto_delete=False, passive=False, arguments=None) -> tuple[str, int, int]:
        raise NotImplementedError

    def declare_exchange(self, name: str, type: str = "direct", *, durable=False,
                         auto_delete=False, passive=False, arguments=None) -> None:
        raise NotImplementedError

    def bind_queue(self, queue: str, exchange: str, routing_key: str = "",
                   arguments=None) -> None:
        raise NotImplementedError

    def bind_exchange(self, destination: str, source: str, routing_key: str = "",
                      arguments=None) -> None:
        raise NotImplementedError

    def delete_queue(self, name: str, *, if_unused=False, if_empty=False) -> None:
        raise NotImplementedError

    def delete_exchange(self, name: str, *, if_unused=False) -> None:
        raise NotImplementedError

    def purge(self, name: str) -> int:
        raise NotImplementedError

    # -- messages
    def publish(self, exchange: str, routing_key: str, body: bytes, props: dict | None = None,
                mandatory: bool = False) -> None:
        """Publish; in confirm mode wait for the confirm (raise Nacked / Returned)."""
        raise NotImplementedError

    def get(self, queue: str, no_ack: bool = False) -> Delivery | None:
        raise NotImplementedError

    def consume(self, queue: str, no_ack: bool = False) -> str:
        raise NotImplementedError

    def cancel(self, consumer_tag: str) -> None:
        raise NotImplementedError

    def qos(self, prefetch_count: int, global_: bool = False) -> None:
        raise NotImplementedError

    def ack(self, d: Delivery, multiple: bool = False) -> None:
        raise NotImplementedError

    def ack_tag(self, delivery_tag: int) -> None:
        """basic.ack for an arbitrary delivery tag (to provoke 406)."""
        raise NotImplementedError

    def nack(self, d: Delivery, requeue: bool = True, multiple: bool = False) -> None:
        raise NotImplementedError

    def reject(self, d: Delivery, requeue: bool = True) -> None:
        raise NotImplementedError

    def recover(self) -> None:
        raise NotImplementedError

    def pump(self, seconds: float) -> None:
        """Let the client process incoming frames for ``seconds``."""
        raise NotImplementedError

    def reopen(self) -> None:
        """Open a new channel after the broker closed the current one."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # -- helpers shared by all adapters
    def wait_for(self, count: int, timeout: float = 10.0) -> list[Delivery]:
        """Pump until at least ``count`` deliveries arrived in total; return them all."""
        deadline = time.monotonic() + timeout
        while len(self.deliveries) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: expected {count} deliveries within "
                                     f"{timeout} s, got {len(self.deliveries)}")
            self.pump(0.05)
        return list(self.deliveries)

    def settle_quietly(self, seconds: float = 0.5) -> list[Delivery]:
        """Pump for a fixed while (to see that nothing more arrives); return all deliveries."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.pump(0.05)
        return list(self.deliveries)

    def take(self) -> list[Delivery]:
        out, self.deliveries = self.deliveries, []
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        with contextlib.suppress(Exception):
            self.close()


