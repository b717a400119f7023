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
