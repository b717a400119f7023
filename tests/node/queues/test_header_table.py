"""shared/header_table.py and the dead-letter header it writes: the publisher's header types
survive, the broker's fields have RabbitMQ's types (issue 21: x-death count is 'l')."""
from __future__ import annotations

import struct

from pamqp import decode
from pamqp.commands import Basic

from shoal.node.queues.deadletter import dead_letter_header, delivery_count_header
from shoal.shared.header_table import raw_headers, split_table, table
from shoal.node.queues.message import encode_header, parse_properties


def publisher_header() -> bytes:
    """A content header whose headers table holds a long 'l' 5, a short 's' 7 and a decimal,
    as a Java client writes them (pamqp would re-encode 5 as 'b')."""
    props = Basic.Properties(content_type="text/plain", expiration="60000",
                             headers={"placeholder": 1})
    enc = encode_header(props, 3)
    entries = table([("java-long", b"l" + struct.pack(">q", 5)),
                     ("short", b"s" + struct.pack(">h", 7)),
                     ("price", b"D" + bytes((2,)) + struct.pack(">i", 1999))])
    old = table([("placeholder", 1)])
    i = enc.index(struct.pack(">I", len(old)) + old)
    return enc[:i] + struct.pack(">I", len(entries)) + entries + enc[i + 4 + len(old):]


def test_split_table_round_trips_every_field_type():
    entries = [("a", b"t\x01"), ("b", b"b\xff"), ("c", b"S\x00\x00\x00\x02hi"),
               ("d", b"A\x00\x00\x00\x02b\x01"), ("e", b"V"), ("f", b"T" + bytes(8)),
               ("g", b"F\x00\x00\x00\x00"), ("h", b"x\x00\x00\x00\x01z")]
    assert split_table(table(entries)) == entries


def test_dead_lettering_keeps_the_publishers_types_and_writes_count_as_long():
    header = publisher_header()
    out = dead_letter_header(header, 3, "src", "rejected", "", "src", 1_700_000_000_000)
    entries = dict(raw_headers(out))
    assert entries["java-long"] == b"l" + struct.pack(">q", 5)     # not re-encoded as 'b'
    assert entries["short"] == b"s" + struct.pack(">h", 7)
    assert entries["price"][:1] == b"D"
    _, deaths = decode.field_array(entries["x-death"][1:])
    death = deaths[0]
    assert death["count"] == 1 and death["reason"] == "rejected"
    assert death["original-expiration"] == "60000" and death["routing-keys"] == ["src"]
    kinds = dict(split_table(entries["x-death"][5 + 5:]))  # the one table in the array
    assert kinds["count"][:1] == b"l" and kinds["time"][:1] == b"T"
    assert kinds["queue"][:1] == b"S" and kinds["routing-keys"][:1] == b"A"
    props = parse_properties(out)
    assert props.expiration is None and props.content_type == "text/plain"
    assert props.headers["x-first-death-queue"] == "src"


def test_a_second_death_counts_up_and_stays_long():
    h = dead_letter_header(publisher_header(), 3, "src", "rejected", "", "k", 1e12)
    h = dead_letter_header(h, 3, "src", "rejected", "", "k", 2e12)
    entries = dict(raw_headers(h))
    _, deaths = decode.field_array(entries["x-death"][1:])
    assert [d["count"] for d in deaths] == [2]
    assert dict(split_table(entries["x-death"][10:]))["count"][:1] == b"l"


def test_a_second_death_keeps_the_time_of_the_first():
    """RabbitMQ 3.10 counts an x-death entry up and leaves its ``time`` (the first death's)."""
    h = dead_letter_header(publisher_header(), 3, "src", "rejected", "", "k", 1e12)
    h = dead_letter_header(h, 3, "src", "rejected", "", "k", 2e12)
    (death,) = decode.field_array(dict(raw_headers(h))["x-death"][1:])[1]
    assert int(death["time"].timestamp()) == 1_000_000_000


def _death_item(queue: str, reason: str = "expired", count: bytes | None = None) -> bytes:
    fields = [("reason", b"S" + struct.pack(">I", len(reason)) + reason.encode()),
              ("queue", b"S" + struct.pack(">I", len(queue)) + queue.encode()),
              ("random", b"s" + struct.pack(">h", 7))]
    if count is not None:
        fields.append(("count", count))
    body = table(fields)
    return b"F" + struct.pack(">I", len(body)) + body


def test_an_x_death_array_from_before_3_5_is_grouped_by_queue_and_reason():
    """rabbitmq-server#152 (the Java client's XDeathHeaderGrowth): one entry per (queue,
    reason), the first of each, counted when it had no count (a publisher's count kept as
    sent), in reverse order of first appearance, the new death in front."""
    items = [_death_item("q97"), _death_item("q97"), _death_item("q98", count=b"I\0\0\0\x02"),
             _death_item("q98"), _death_item("q97"), _death_item("q97", "rejected")]
    data = b"".join(items)
    array = table([("x-death", b"A" + struct.pack(">I", len(data)) + data)])
    h = encode_header(Basic.Properties(headers={"placeholder": 1}), 3)
    old = table([("placeholder", 1)])
    i = h.index(struct.pack(">I", len(old)) + old)
    h = h[:i] + struct.pack(">I", len(array)) + array + h[i + 4 + len(old):]
    out = dead_letter_header(h, 3, "src", "expired", "", "k", 1e12)
    raw = dict(raw_headers(out))["x-death"]
    _, deaths = decode.field_array(raw[1:])
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [
        ("src", "expired", 1), ("q97", "rejected", 1), ("q98", "expired", 2),
        ("q97", "expired", 3)]
    assert all(d["random"] == 7 for d in deaths[1:])           # the rest as sent
    assert items[2] in raw                      # q98's own count (an 'I') kept, octet for octet
    again = dead_letter_header(out, 3, "q97", "expired", "", "k", 2e12)
    _, deaths = decode.field_array(dict(raw_headers(again))["x-death"][1:])
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [
        ("q97", "expired", 4), ("q98", "expired", 2), ("q97", "rejected", 1),
        ("src", "expired", 1)]


def test_a_dead_letters_routing_keys_list_its_cc_keys_and_a_dead_letter_key_drops_cc():
    """RabbitMQ 3.10's rabbit_dead_letter: x-death's routing-keys are the publish's key and
    its CC keys; with an x-dead-letter-routing-key the copy's CC header goes."""
    h = encode_header(Basic.Properties(headers={"CC": ["two", "three"], "n": 1}), 3)
    for drop, kept in ((False, {"CC", "n"}), (True, {"n"})):
        out = dead_letter_header(h, 3, "src", "rejected", "x", "one", 1e12, drop_cc=drop)
        entries = dict(raw_headers(out))
        _, deaths = decode.field_array(entries.pop("x-death")[1:])
        assert deaths[0]["routing-keys"] == ["one", "two", "three"]
        assert {k for k in entries if not k.startswith("x-first-death")} == kept


def test_delivery_count_is_long_and_a_header_without_headers_gets_one():
    h = delivery_count_header(encode_header(Basic.Properties(), 0), 0, 3)
    assert dict(raw_headers(h)) == {"x-delivery-count": b"l" + struct.pack(">q", 3)}
    assert parse_properties(h).headers == {"x-delivery-count": 3}


def test_inequivalent_x_argument_on_one_side_only_reads_as_rabbitmq():
    """RabbitMQ 3.10.8's text, checked against it with pika (session 11)."""
    import pytest
    from shoal.node.topology import check_equivalent
    from shoal.shared.errors import AMQPError
    cases = [((None, 10), "received none but current is the value '10' of type 'signedint'"),
             ((None, "lazy"), "received none but current is the value 'lazy' of type 'longstr'"),
             ((11, 10), "received '11' but current is '10'"),
             (("default", "lazy"), "received 'default' but current is 'lazy'")]
    for (received, current), words in cases:
        with pytest.raises(AMQPError) as e:
            check_equivalent("queue", "/", "q", [("x-a", received, current)])
        assert e.value.reply_text == \
            f"PRECONDITION_FAILED - inequivalent arg 'x-a' for queue 'q' in vhost '/': {words}"
