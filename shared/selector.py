"""JMS message selectors (``x-filter-jms-selector``), shared by router (bindings) and node
(consumers).

The language is the SQL-92 subset of the JMS 1.1 specification, section 3.8.1.1 ("Message
Selector Syntax"), as the Qpid broker accepts it (seed 003, "bindings with selectors"):
literals (strings in single quotes with ``''`` escapes, exact and approximate numbers, hex,
``TRUE``/``FALSE``), identifiers (message headers, and the JMS header fields ``JMSPriority``,
``JMSDeliveryMode``, ``JMSMessageID``, ``JMSCorrelationID``, ``JMSTimestamp``, ``JMSType``),
``= <> < <= > >=``, ``+ - * /``, ``[NOT] BETWEEN``, ``[NOT] LIKE ... [ESCAPE]``, ``[NOT] IN``,
``IS [NOT] NULL``, ``AND OR NOT`` and parentheses. Keywords are case-insensitive.

Evaluation uses SQL three-valued logic: a missing identifier is NULL (unknown), and a message
is selected only when the whole expression is TRUE. Comparing values of unlike types is FALSE
(JMS 3.8.1.2).

Public API: :func:`compile_selector` (text -> :class:`Selector`, cached; raises
:class:`~shoal.shared.errors.AMQPError` 406 PRECONDITION_FAILED naming the position of the
error) and :func:`selector_fields` (decoded ``basic`` properties -> the identifier dict a
selector reads).

:func:`compile_sql` is the same language as the AMQP Filter Expressions' SQL filter as
RabbitMQ 4.2 reads it (OASIS filtex 1.0 section 6; rabbit_amqp_sql_lexer.xrl and
rabbit_amqp_filter_sql.erl): besides the above, ``!=`` (as ``<>``), ``%`` (integers, the
remainder with the dividend's sign), ``/`` always a true division, strings in double quotes
too (``""`` escapes), binaries ``0x0A1B`` (hex pairs), ``[delimited identifiers]``
(``]]`` and ``[[`` escapes) and ``UTC()`` (the time now, epoch ms); ``0x`` is never a hex
number there.

The grammars, their parsers and the closures' logic live in
:mod:`shoal.shared.selector_compiler`, imported at the first selector a process compiles.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from .errors import PRECONDITION_FAILED, AMQPError, soft_error

ARGUMENT = "x-filter-jms-selector"

Fn = Callable[[dict], Any]


class Selector:
    """A compiled selector. ``text``: its source; :meth:`matches` (fields dict -> bool)."""

    __slots__ = ("text", "_fn")

    def __init__(self, text: str, fn: Fn) -> None:
        self.text = text
        self._fn = fn

    def matches(self, fields: dict) -> bool:
        """True when the selector evaluates to TRUE for ``fields`` (see
        :func:`selector_fields`); FALSE and unknown (NULL) both reject."""
        try:
            return self._fn(fields) is True
        except (TypeError, ValueError, OverflowError):   # odd header types: not selected
            return False

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def _error(text: str, pos: int, why: str) -> AMQPError:
    return soft_error(PRECONDITION_FAILED,
                      f"invalid {ARGUMENT} '{text}': {why} at position {pos}")


@functools.lru_cache(maxsize=1024)
def compile_selector(text: str) -> Selector:
    """Parse ``text`` (JMS 1.1 section 3.8.1.1). Raises AMQPError 406 PRECONDITION_FAILED
    "invalid x-filter-jms-selector '<text>': <reason> at position <n>" (n counted from 1)."""
    return _compile(text, False)


@functools.lru_cache(maxsize=1024)
def compile_sql(text: str) -> Selector:
    """Parse an AMQP SQL filter expression (``amqp:sql-filter``, OASIS filtex 1.0 section 6,
    as RabbitMQ 4.2; module docstring). Raises AMQPError 406 as :func:`compile_selector`."""
    return _compile(text, True)


def _compile(text: str, sql: bool) -> Selector:
    if not isinstance(text, str) or not text.strip():
        raise _error(str(text), 1, "empty selector")
    # imported at the first selector, not at start-up (selector_compiler's docstring)
    from .selector_compiler import SelectorSyntaxError, build
    try:
        fn = build(text, sql)
    except SelectorSyntaxError as e:
        raise _error(text, e.pos, e.why) from None
    return Selector(text, fn)


def check_arguments(arguments: dict | None) -> Selector | None:
    """The compiled ``x-filter-jms-selector`` of a consume or bind arguments table, or None.
    Raises AMQPError 406 when the value is not a string or does not parse."""
    if not arguments or ARGUMENT not in arguments:
        return None
    value = arguments[ARGUMENT]
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        raise soft_error(PRECONDITION_FAILED, f"{ARGUMENT} must be a string, not "
                                              f"{type(value).__name__}")
    return compile_selector(value)


def _plain(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "replace")
    if hasattr(v, "timestamp") and callable(v.timestamp):      # datetime
        return int(v.timestamp() * 1000)
    if isinstance(v, (dict, list, tuple)):
        return None                                           # not selectable
    try:
        import decimal
        if isinstance(v, decimal.Decimal):
            return float(v)
    except ImportError:  # pragma: no cover
        pass
    return v


def selector_fields(props: Any) -> dict:
    """The identifiers a selector can read, from decoded ``basic`` properties (a pamqp
    ``Basic.Properties`` or anything with the same attribute names): every header by name,
    plus JMSPriority (default 4), JMSDeliveryMode ('PERSISTENT' when delivery_mode is 2,
    else 'NON_PERSISTENT'), JMSMessageID, JMSCorrelationID, JMSTimestamp (ms), JMSType."""
    if props is None:
        return {"JMSPriority": 4, "JMSDeliveryMode": "NON_PERSISTENT"}
    out = {k: _plain(v) for k, v in (getattr(props, "headers", None) or {}).items()}
    prio = getattr(props, "priority", None)
    out["JMSPriority"] = 4 if prio is None else prio
    out["JMSDeliveryMode"] = ("PERSISTENT" if getattr(props, "delivery_mode", None) == 2
                              else "NON_PERSISTENT")
    for name, attr in (("JMSMessageID", "message_id"), ("JMSCorrelationID", "correlation_id"),
                       ("JMSType", "message_type"), ("JMSTimestamp", "timestamp")):
        v = getattr(props, attr, None)
        if v is not None:
            out[name] = _plain(v)
    return out
