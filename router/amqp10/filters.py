"""AMQP 1.0 property filter expressions on a stream consumer's link (OASIS AMQP Filter
Expressions v1.0, sections 4.2.4 and 4.2.5, as RabbitMQ 4.1 applies them:
``rabbit_amqp_filter_prop.erl``; docs/streams.md).

- ``amqp:properties-filter`` (code 0x173): a map of properties-section field names
  (``message-id``, ``user-id``, ``to``, ``subject``, ``reply-to``, ``correlation-id``,
  ``content-type``, ``content-encoding``, ``absolute-expiry-time``, ``creation-time``,
  ``group-id``, ``group-sequence``, ``reply-to-group-id``) to reference values;
- ``amqp:application-properties-filter`` (code 0x174): a map of application property keys to
  reference values; a message without the key does not match.

A message passes when every field matches: a null reference matches anything; a string
reference ``&p:X`` matches values starting with X, ``&s:X`` values ending with it, ``&&X``
the value ``&X``; numbers compare by value whatever their types; anything else by equality.
At most 16 fields per filter, as RabbitMQ; a filter RabbitMQ would not parse is not applied
(and so not named in the attach's answer).

RabbitMQ 4.2's SQL filter expressions (``amqp:sql-filter``, code 0x120, under the filter
name ``sql-filter``; ``rabbit_amqp_filter_sql.erl``) are the JMS selector's grammar with
SQL's additions (shared/selector.py ``compile_sql``: comparisons with ``!=``, ``AND``/``OR``/
``NOT``, arithmetic with ``%``, ``LIKE`` with ``ESCAPE``, ``IN``, ``IS [NOT] NULL``, strings
in single or double quotes, ``0x`` binaries, ``[delimited]`` identifiers, ``UTC()``,
three-valued logic), and read the message's fields by the filter expressions' names:
``header.priority`` (4 when absent), ``properties.subject`` and the other properties fields
(``p.`` for short), ``application_properties.key`` (``a.``) or the bare key. An expression
that does not parse is not applied, and so not named in the attach's answer.

Sans-IO: :func:`parse` reads a source filter's value, :func:`matches` a transfer's payload.
"""
from __future__ import annotations

from typing import Any

from shoal.shared.errors import AMQPError
from shoal.shared.selector import compile_sql

from shoal.router.amqp10.codec import DecodeError, Described, Symbol, Timestamp, Typed, decode
from shoal.router.amqp10.convert import sections

PROPERTIES = (Symbol("amqp:properties-filter"), 0x173)
APPLICATION_PROPERTIES = (Symbol("amqp:application-properties-filter"), 0x174)
SQL = (Symbol("amqp:sql-filter"), 0x120)
MAX_FIELDS = 16
MAX_SQL = 4096          #: characters, as RabbitMQ's MAX_EXPRESSION_LENGTH
_HEADER_SECTION = 0x70
_PROPERTIES_SECTION = 0x73
_APP_PROPERTIES_SECTION = 0x74
#: properties-section fields: name -> (position in the list, the reference's check)
_FIELDS = {
    "message-id": 0, "user-id": 1, "to": 2, "subject": 3, "reply-to": 4,
    "correlation-id": 5, "content-type": 6, "content-encoding": 7,
    "absolute-expiry-time": 8, "creation-time": 9, "group-id": 10, "group-sequence": 11,
    "reply-to-group-id": 12}
_STRING_FIELDS = frozenset({"to", "subject", "reply-to", "group-id", "reply-to-group-id"})
_SYMBOL_FIELDS = frozenset({"content-type", "content-encoding"})
_TIME_FIELDS = frozenset({"absolute-expiry-time", "creation-time"})


class Affix:
    """A ``&p:`` (prefix) or ``&s:`` (suffix) string reference."""

    __slots__ = ("prefix", "text")

    def __init__(self, prefix: bool, text: str) -> None:
        self.prefix, self.text = prefix, text

    def matches(self, value: Any) -> bool:
        if not isinstance(value, str):
            return False
        return value.startswith(self.text) if self.prefix else value.endswith(self.text)


class Invalid(ValueError):
    """A filter RabbitMQ would not parse."""


def _string(ref: str) -> Any:
    if ref.startswith("&s:"):
        return Affix(False, ref[3:])
    if ref.startswith("&p:"):
        return Affix(True, ref[3:])
    if ref.startswith("&&"):
        return ref[1:]
    if ref.startswith("&"):
        raise Invalid(f"invalid reference field value {ref!r}")
    return ref


def _plain(v: Any) -> Any:
    return v.value if isinstance(v, Typed) else v


def _message_id(v: Any) -> Any:
    if isinstance(v, str) and not isinstance(v, Symbol):
        return _string(v)
    if isinstance(v, (bytes, int)) or type(v).__name__ == "UUID" or \
            (isinstance(v, Typed) and v.type == "ulong"):
        return _plain(v)
    raise Invalid("message-id or correlation-id of another type")


def parse(value: Any) -> tuple[str, list[tuple[Any, Any]]] | None:
    """A source filter's value as ``("properties" | "application-properties", [(field,
    reference), ...])``, or None when it is neither filter or one RabbitMQ would not parse."""
    if isinstance(value, Described) and value.descriptor in SQL:
        text = value.value
        if not isinstance(text, str) or isinstance(text, Symbol) or len(text) > MAX_SQL:
            return None
        try:
            return "sql", [compile_sql(text)]
        except AMQPError:           # does not parse: not applied
            return None
    if not isinstance(value, Described) or not isinstance(value.value, dict):
        return None
    items = list(value.value.items())
    if not items or len(items) > MAX_FIELDS:
        return None
    try:
        if value.descriptor in PROPERTIES:
            return "properties", [_property(k, v) for k, v in items]
        if value.descriptor in APPLICATION_PROPERTIES:
            out = []
            for k, v in items:
                if not isinstance(k, str) or isinstance(k, Symbol):
                    raise Invalid("application property keys are strings")
                ref = _string(v) if isinstance(v, str) and not isinstance(v, Symbol) \
                    else _plain(v)
                out.append((k, ref))
            return "application-properties", out
    except Invalid:
        return None
    return None


def _property(key: Any, v: Any) -> tuple[int, Any]:
    name = str(key) if isinstance(key, Symbol) else None
    if name not in _FIELDS:
        raise Invalid(f"unknown properties field {key!r}")
    if name in ("message-id", "correlation-id"):
        return _FIELDS[name], _message_id(v)
    if name == "user-id" and isinstance(v, bytes):
        return _FIELDS[name], v
    if name in _STRING_FIELDS and isinstance(v, str) and not isinstance(v, Symbol):
        return _FIELDS[name], _string(v)
    if name in _SYMBOL_FIELDS and isinstance(v, Symbol):
        return _FIELDS[name], str(v)
    if name in _TIME_FIELDS and isinstance(v, Timestamp):
        return _FIELDS[name], int(v)
    if name == "group-sequence" and isinstance(_plain(v), int):
        return _FIELDS[name], _plain(v)
    raise Invalid(f"a {name} filter of the wrong type")


def _match(ref: Any, value: Any) -> bool:
    if ref is None:
        return True
    if isinstance(ref, Affix):
        return ref.matches(value)
    value = _plain(value)
    if isinstance(ref, (int, float)) and not isinstance(ref, bool):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and \
            float(ref) == float(value)
    return ref == value


def matches(filters: list[tuple[str, list]], payload: bytes) -> bool:
    """Whether an encoded message (a transfer's payload) passes every filter (section 3.5.8:
    a message passes a filter set when it passes each filter). A payload that does not
    decode passes none."""
    try:
        found = {code: (vstart, end) for code, _, vstart, end in sections(payload)}
        props = app = None
        for kind, fields in filters:
            if kind == "sql":
                if not fields[0].matches(_sql_fields(payload, found)):
                    return False
            elif kind == "properties":
                if props is None:
                    at = found.get(_PROPERTIES_SECTION)
                    props = decode(payload, at[0], at[1])[0] if at else []
                for pos, ref in fields:
                    value = props[pos] if pos < len(props) else None
                    if not _match(ref, value):
                        return False
            else:
                if app is None:
                    at = found.get(_APP_PROPERTIES_SECTION)
                    app = decode(payload, at[0], at[1])[0] if at else {}
                for key, ref in fields:
                    if key not in app or not _match(ref, app[key]):
                        return False
    except (DecodeError, IndexError, TypeError):
        return False
    return True


def _sql_fields(payload: bytes, found: dict) -> dict:
    """The identifiers an SQL filter reads (module docstring), from the message's header,
    properties and application-properties sections."""
    fields: dict = {}
    at = found.get(_APP_PROPERTIES_SECTION)
    if at:
        for k, v in (decode(payload, at[0], at[1])[0] or {}).items():
            v = _sql_value(v)
            fields[k] = fields[f"application_properties.{k}"] = fields[f"a.{k}"] = v
    at = found.get(_PROPERTIES_SECTION)
    props = decode(payload, at[0], at[1])[0] if at else []
    for name, pos in _FIELDS.items():
        if pos < len(props) and props[pos] is not None:
            key = name.replace("-", "_")
            fields[f"properties.{key}"] = fields[f"p.{key}"] = _sql_value(props[pos])
    at = found.get(_HEADER_SECTION)
    header = decode(payload, at[0], at[1])[0] if at else []
    priority = _plain(header[1]) if len(header) > 1 and header[1] is not None else 4
    fields["header.priority"] = fields["h.priority"] = priority
    return fields


def _sql_value(v: Any) -> Any:
    v = _plain(v)
    if isinstance(v, Symbol):
        return str(v)
    if isinstance(v, Timestamp):
        return int(v)
    return v
