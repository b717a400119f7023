"""Sender-selected distribution: a publish's ``CC`` and ``BCC`` headers name more routing keys
(RabbitMQ's extension, "Sender-selected Distribution" in its docs; ``rabbit_basic``
``header_routes`` and ``strip_bcc_header`` in 3.10).

Each header, when present, must be an array; its long-string items are routing keys the
exchange routes by as well as the publish's own (a queue that several keys reach gets one
copy), other items are ignored. ``BCC`` is taken out of the message before it is stored;
``CC`` stays. The delivery's routing key stays the publish's. Read on AMQP 0-9-1 publishes and the
management API's publish, as in RabbitMQ 3.10, and for AMQP 1.0 in its ``x-cc`` message
annotation (RabbitMQ 4, router/amqp10/convert.py); a dead letter is routed by its ``CC``
keys too (:func:`stored_routes`).

The headers are read from the raw content header, and only when its octets hold ``CC`` at
all: the common publish pays one substring search.
"""
from __future__ import annotations

from shoal.shared.errors import PRECONDITION_FAILED, soft_error
from shoal.shared.header_table import array_strings, raw_headers, without_headers

_BCC = frozenset(("BCC",))
#: field type octet -> the type's name in RabbitMQ's error text (rabbit_binary_parser)
_TYPE_NAMES = {b"S": "longstr", b"I": "signedint", b"i": "unsignedint", b"l": "long",
               b"L": "unsignedlong", b"b": "byte", b"B": "unsignedbyte", b"s": "short",
               b"u": "unsignedshort", b"f": "float", b"d": "double", b"D": "decimal",
               b"T": "timestamp", b"F": "table", b"V": "void", b"t": "bool", b"x": "binary"}


def header_routes(header: bytes) -> tuple[tuple[str, ...], bytes]:
    """``(more routing keys, header)`` for a publish's content-header payload: the keys of
    its ``CC`` and ``BCC`` arrays (``()`` for none), and the header without ``BCC`` (the same
    object when it has none). A header whose table does not parse has none (routed as it is).

    Raises AMQPError 406 PRECONDITION_FAILED (channel) when ``CC`` or ``BCC`` is not an
    array, with RabbitMQ's text ("invalid message: {unacceptable_type_in_header,"CC",longstr}").
    """
    if b"CC" not in header:
        return (), header
    entries = raw_headers(header)
    if not entries:
        return (), header
    keys: list[str] = []
    bcc = False
    for name, value in entries:
        if name != "CC" and name != "BCC":
            continue
        if value[:1] != b"A":
            raise soft_error(PRECONDITION_FAILED, "invalid message: {unacceptable_type_in_"
                             f'header,"{name}",{_TYPE_NAMES.get(value[:1], "unknown")}}}')
        bcc = bcc or name == "BCC"
        keys += array_strings(value)
    return tuple(keys), (without_headers(header, _BCC) if bcc else header)


def stored_routes(header: bytes) -> tuple[str, ...]:
    """The ``CC`` keys (and ``BCC``'s, which only an AMQP 1.0 message's application
    properties can still carry) of a stored message's header, for routing its dead letter
    (RabbitMQ's ``rabbit_dead_letter``: routed by the message's keys unless the queue has an
    ``x-dead-letter-routing-key``, when the node has taken ``CC`` out). Never raises: what is
    not an array of strings is no key."""
    if b"CC" not in header:
        return ()
    return tuple(key for name, value in raw_headers(header) or ()
                 if name in ("CC", "BCC") for key in array_strings(value))
