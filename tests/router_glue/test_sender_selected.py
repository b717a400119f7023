"""Sender-selected distribution (router/sender_selected.py, RabbitMQ's CC and BCC headers) on
raw content headers, and routing by the keys it finds (router/routing.py ``also``). The same
behaviour against RabbitMQ 3.10, side by side: tests/e2e/side_by_side, scenario
``sender_selected_distribution``."""
import pytest
from pamqp import commands as C
from pamqp.header import ContentHeader

from shoal.router.routing import Topology
from shoal.router.sender_selected import header_routes, stored_routes
from shoal.shared import wire
from shoal.shared.errors import AMQPError
from shoal.shared.header_table import raw_headers


def header(**headers) -> bytes:
    props = C.Basic.Properties(content_type="text/plain", headers=headers or None,
                               message_id="m1")
    return ContentHeader(0, 5, props).marshal()     # the header frame's payload


def test_a_header_without_cc_is_passed_as_it_is():
    h = header(other="x")
    assert header_routes(h) == ((), h)
    assert header_routes(h)[1] is h


def test_cc_and_bcc_keys_are_found_and_bcc_is_taken_out_every_other_octet_kept():
    h = header(CC=["two", "three"], BCC=["four"], other=1)
    keys, out = header_routes(h)
    assert sorted(keys) == ["four", "three", "two"]
    assert sorted(k for k, _ in raw_headers(out)) == ["CC", "other"]
    assert dict(raw_headers(out))["other"] == dict(raw_headers(h))["other"]
    assert out[:14] == h[:14] and out.endswith(h[-3:])       # message id after the table


def test_items_of_other_types_are_ignored():
    assert header_routes(header(CC=["three", 5, True]))[0] == ("three",)


@pytest.mark.parametrize("name,value,kind", [("CC", "two", "longstr"),
                                             ("BCC", {"a": "b"}, "table"),
                                             ("CC", True, "bool")])
def test_a_cc_or_bcc_that_is_not_an_array_is_406_with_rabbitmqs_text(name, value, kind):
    with pytest.raises(AMQPError) as e:
        header_routes(header(**{name: value}))
    assert e.value.reply_code == 406
    assert e.value.text.endswith(
        f'invalid message: {{unacceptable_type_in_header,"{name}",{kind}}}')


def test_a_stored_messages_keys_never_raise():
    """A dead letter is routed by its CC keys (and a BCC an AMQP 1.0 message's application
    properties carried); what is not an array of strings is no key, not an error."""
    assert stored_routes(header(CC=["two"], other=1)) == ("two",)
    assert stored_routes(header(CC="two")) == ()
    assert stored_routes(header(other="x")) == ()


def _topology():
    t = Topology(["/"])
    t.apply(wire.EV_EXCHANGE_ADDED, ["/", "d", "direct", True, False, False, {}])
    t.apply(wire.EV_EXCHANGE_ADDED, ["/", "t", "topic", True, False, False, {}])
    t.apply(wire.EV_EXCHANGE_ADDED, ["/", "f", "fanout", True, False, False, {}])
    for key in ("one", "two", "three"):
        t.apply(wire.EV_BINDING_ADDED, ["/", "d", "q", f"q-{key}", key, {}])
    t.apply(wire.EV_BINDING_ADDED, ["/", "d", "e", "t", "to-topic", {}])
    t.apply(wire.EV_BINDING_ADDED, ["/", "t", "q", "q-a", "a.*", {}])
    t.apply(wire.EV_BINDING_ADDED, ["/", "f", "q", "q-f", "", {}])
    return t


def test_more_keys_route_on_direct_topic_and_bound_exchanges_and_the_default_exchange():
    t = _topology()
    assert t.route("/", "d", "one", None, None, ("two", "one")) == {"q-one", "q-two"}
    assert t.route("/", "d", "none", None, None, ("to-topic",)) == set()   # no key a.*
    assert t.route("/", "d", "a.x", None, None, ("to-topic",)) == {"q-a"}
    assert t.route("/", "t", "b.x", None, None, ("a.y",)) == {"q-a"}
    assert t.route("/", "f", "k", None, None, ("one",)) == {"q-f"}
    assert t.route("/", "", "qa", None, None, ("qb",)) == {"qa", "qb"}
