"""AMQP 1.0 property filter expressions (router/amqp10/filters.py), as RabbitMQ 4.1's
``rabbit_amqp_filter_prop``: parsing the source filter, and matching encoded messages."""
from __future__ import annotations

from shoal.router.amqp10 import filters
from shoal.router.amqp10.codec import Described, Symbol, Timestamp, Typed, encode


def message(props: list | None = None, app: dict | None = None) -> bytes:
    out = b""
    if props is not None:
        out += encode(Described(0x73, props))
    if app is not None:
        out += encode(Described(0x74, app))
    return out + encode(Described(0x75, b"body"))


def props_filter(**fields) -> Described:
    return Described(Symbol("amqp:properties-filter"),
                     {Symbol(k.replace("_", "-")): v for k, v in fields.items()})


def app_filter(fields: dict) -> Described:
    return Described(Symbol("amqp:application-properties-filter"), fields)


def test_properties_exact_prefix_suffix_and_escape() -> None:
    subj = filters.parse(props_filter(subject="yellow"))
    msg = message(["id-1", None, None, "yellow"])
    assert filters.matches([subj], msg)
    assert not filters.matches([subj], message(["id-1", None, None, "green"]))
    assert not filters.matches([subj], message(None))
    assert filters.matches([filters.parse(props_filter(subject="&p:yel"))], msg)
    assert filters.matches([filters.parse(props_filter(subject="&s:low"))], msg)
    assert not filters.matches([filters.parse(props_filter(subject="&s:yel"))], msg)
    amp = message([None, None, None, "&x"])
    assert filters.matches([filters.parse(props_filter(subject="&&x"))], amp)
    assert filters.parse(props_filter(subject="&x")) is None          # RabbitMQ: invalid
    both = [filters.parse(props_filter(subject="yellow", message_id="id-1"))]
    assert filters.matches(both, msg)
    assert not filters.matches(both, message(["id-2", None, None, "yellow"]))


def test_typed_properties() -> None:
    msg = message([Typed("ulong", 7), b"user", None, None, None, None, Symbol("text/plain"),
                   None, None, Timestamp(1000), None, Typed("uint", 3)])
    assert filters.matches([filters.parse(props_filter(message_id=Typed("ulong", 7)))], msg)
    assert filters.matches([filters.parse(props_filter(user_id=b"user"))], msg)
    assert filters.matches([filters.parse(props_filter(content_type=Symbol("text/plain")))],
                           msg)
    assert filters.matches([filters.parse(props_filter(creation_time=Timestamp(1000)))], msg)
    assert filters.matches([filters.parse(props_filter(group_sequence=Typed("uint", 3)))], msg)
    # a string where RabbitMQ wants a symbol is not a filter it parses
    assert filters.parse(props_filter(content_type="text/plain")) is None
    assert filters.parse(props_filter(unknown_field="x")) is None


def test_application_properties() -> None:
    f = filters.parse(app_filter({"from": "italy", "n": 2}))
    assert f[0] == "application-properties"
    assert filters.matches([f], message(None, {"from": "italy", "n": Typed("long", 2)}))
    assert filters.matches([f], message(None, {"from": "italy", "n": 2.0}))   # by value
    assert not filters.matches([f], message(None, {"from": "spain", "n": 2}))
    assert not filters.matches([f], message(None, {"from": "italy"}))         # missing key
    assert filters.matches([filters.parse(app_filter({"from": None}))],
                           message(None, {"from": "anywhere"}))               # null: any
    assert filters.parse(app_filter({})) is None
    assert filters.parse(app_filter({f"k{i}": i for i in range(17)})) is None  # > 16 fields
    assert filters.parse(app_filter({Symbol("k"): 1})) is None                # keys: strings


def test_a_filter_set_needs_every_filter() -> None:
    fs = [filters.parse(props_filter(subject="yellow")),
          filters.parse(app_filter({"from": "italy"}))]
    assert filters.matches(fs, message([None, None, None, "yellow"], {"from": "italy"}))
    assert not filters.matches(fs, message([None, None, None, "yellow"], {"from": "spain"}))
    assert not filters.matches(fs, b"\x00garbage")


def sql(text: str):
    return filters.parse(Described(Symbol("amqp:sql-filter"), text))


def test_sql_filters_through_the_selector_grammar() -> None:
    """RabbitMQ 4.2's SQL filter expressions, where they agree with the JMS selector's
    grammar: section identifiers, application properties by bare name, LIKE, IN, IS NULL,
    arithmetic, three-valued logic; header.priority is 4 when absent."""
    msg = message(["id-1", None, None, "is_in_the_filter"], {"k": "v", "n": 5})
    for text, want in [
        ("properties.subject LIKE '%in_the_filter%' AND k = 'v'", True),
        ("p.subject = 'is_in_the_filter' AND a.n > 4", True),
        ("application_properties.n * 2 = 10", True),
        ("k IN ('x', 'v')", True),
        ("missing IS NULL AND p.message_id = 'id-1'", True),
        ("header.priority = 4", True),
        ("missing = 1", False),                 # unknown: not selected
        ("NOT (missing = 1)", False),
        ("k = 5", False),                       # unlike types
    ]:
        f = sql(text)
        assert f is not None and f[0] == "sql", text
        assert filters.matches([f], msg) is want, text
    prio = encode(Described(0x70, [True, Typed("ubyte", 9)])) + msg
    assert filters.matches([sql("h.priority = 9")], prio)


def test_sql_only_syntax_as_rabbitmq_reads_it() -> None:
    """What SQL filters have and JMS selectors do not (rabbit_amqp_sql_lexer.xrl): ``!=``,
    ``%`` (integers, the dividend's sign), ``/`` always a true division, double-quoted
    strings, ``0x`` binaries, ``[delimited identifiers]``, ``UTC()``."""
    msg = message(["id-1", None, None, "s"], {"k": "v", "n": 5, "neg": -7, "odd key": 1,
                                               "b": b"\x0a\x1b"})
    for text, want in [
        ("k != 'w'", True), ("k != 'v'", False),
        ("n % 2 = 1", True), ("neg % 3 = -1", True), ("n % 0 = 1", False),
        ("n / 2 = 2.5", True),
        ('k = "v"', True), ('k = "say ""hi"""', False),
        ("[odd key] = 1", True), ("b = 0x0A1B", True),
        ("UTC() > 1700000000000", True),
    ]:
        f = sql(text)
        assert f is not None and f[0] == "sql", text
        assert filters.matches([f], msg) is want, text


def test_sql_that_does_not_parse_is_not_applied() -> None:
    for text in ("k ==", "0x1 = 1", "utc = 1", "[unclosed = 1", ""):
        assert sql(text) is None, text
    assert sql("x" * 5000) is None                           # over RabbitMQ's 4096
