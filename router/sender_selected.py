"""Sender-selected distribution: a publish's ``CC`` and ``BCC`` headers name more routing keys
(RabbitMQ's extension, "Sender-selected Distribution" in its docs; ``rabbit_basic``
``header_routes`` and ``strip_bcc_header`` in 3.10).

Each header, when present, must be an array; its long-string items are routing keys the
exchange routes by as well as the publish's own (a queue that several keys reach gets one
copy), other items are ignored. ``BCC`` is taken out of the message before it is stored;
``CC`` stays. The delivery's routing key stays the publish's. Only AMQP 0-9-1 publishes (and
the management API's publish) are read for them, as in RabbitMQ 3.10.

The headers are read from the raw content header, and only when its octets hold ``CC`` at
all: the common publish pays one substring search.
"""
from __future__ import annotations

import struct

from shoal.shared.errors import PRECONDITION_FAILED, soft_error
from shoal.shared.header_table import raw_headers, split_array, without_headers

_U32 = struct.Struct(">I")
_BCC = frozenset(("BCC",))
#: field type octet -> the type's name in RabbitMQ's error text (rabbit_binary_parser)
_TYPE_NAMES = {b"S": "longstr", b"I": "signedint", b"i": "unsignedint", b"l": "long",
               b"L": "unsignedlong", b"b": "byte", b"B": "unsignedbyte", b"s": "short",
               b"u": "unsignedshort", b"f": "float", b"d": "double", b"D": "decimal",
               b"T": "timestamp", b"F": "table", b"V": "void", b"t": "bool", b"x": "binary"}


def header_routes(header: bytes) -> tuple[tuple[str, ...], bytes]:
    """``(more routing keys, header)`` for a content-header payload: the keys of its ``CC``
    and ``BCC`` arrays (``()`` for none), and the header without ``BCC`` (the same object
    when it has none). A header whose table does not parse has none (routed as it is).

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
        kind = value[:1]
        if kind != b"A":
            raise soft_error(PRECONDITION_FAILED, "invalid message: {unacceptable_type_in_"
                             f'header,"{name}",{_TYPE_NAMES.get(kind, "unknown")}}}')
        bcc = bcc or name == "BCC"
        try:
            items = split_array(value[5:5 + _U32.unpack_from(value, 1)[0]])
        except (IndexError, ValueError):
            continue
        keys += [item[5:].decode("utf-8", "replace") for item in items if item[:1] == b"S"]
    return tuple(keys), (without_headers(header, _BCC) if bcc else header)
