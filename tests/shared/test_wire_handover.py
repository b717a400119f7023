"""shared/wire.handover and received: batches handed over in memory to a peer in the same
process (``--embed-node``) carry what the ZeroMQ link would, without sharing what may change."""
from __future__ import annotations

import datetime
import decimal

import pytest

from shoal.shared import wire
from shoal.shared.wire import T, TAG_CREDIT, TAG_DELIVER, TAG_PUBLISH, TAG_SETTLE

PUBLISH = [TAG_PUBLISH, 0, "/", ["q1"], "", "q1", b"\x00\x3c", b"body", "r/1"]
DELIVER = [TAG_DELIVER, 3, 17, False, "", "q1", b"\x00\x3c", b"body"]


@pytest.fixture
def check(monkeypatch):
    monkeypatch.setattr(wire, "CHECK", True)


def _round_trip(batch):
    return wire.decode_batch(wire.encode_batch(batch))


def test_hot_messages_are_handed_over_as_they_are():
    batch = [PUBLISH, [TAG_SETTLE, wire.OUTCOME_ACK, [1, 2]], [TAG_CREDIT, 3, 5, False], DELIVER]
    out = wire.handover(batch)
    assert out == _round_trip(batch)
    assert all(a is b for a, b in zip(out, batch))


def test_other_messages_arrive_as_a_msgpack_copy_in_order():
    args = {"x-max-length": 10, "x-tags": ("a", "b"), "x-when": datetime.datetime(
        2026, 1, 2, tzinfo=datetime.timezone.utc), "x-rate": decimal.Decimal("1.5")}
    declare = [int(T.QUEUE_DECLARE), 7, "/", "q1", False, True, False, False, args, None]
    batch = [PUBLISH, declare, [int(T.REPLY), 7, 0, "", {"q": [1, 2]}]]
    out = wire.handover(batch)
    assert out == _round_trip(batch)               # what a ZeroMQ peer would decode
    assert out[0] is PUBLISH
    assert out[1] is not declare and out[1][8] is not args
    assert out[1][8]["x-tags"] == ["a", "b"]       # a tuple arrives as a list, as on the wire
    assert out[1][8]["x-rate"] == "1.5"
    out[2][4]["q"].append(3)                       # the receiver's copy is its own
    assert batch[2][4] == {"q": [1, 2]}


def test_a_value_the_wire_cannot_carry_is_a_type_error_as_over_zeromq():
    with pytest.raises(TypeError):
        wire.handover([[int(T.REPLY), 1, 0, "", object()]])


@pytest.mark.parametrize("bad", [
    [T.SETTLE, wire.OUTCOME_ACK, [1]],                          # IntEnum tag, not int
    [TAG_SETTLE, wire.OUTCOME_ACK, (1, 2)],                     # tuple arrives as a list
    [TAG_PUBLISH, 0, "/", ["q1"], "", "q1", b"h", memoryview(b"body"), None],
    [TAG_PUBLISH, 0, "/", ["q1"], "", "q1", b"h", bytearray(b"body"), None],
])
def test_check_refuses_a_hot_message_the_wire_would_change(check, bad):
    with pytest.raises(wire.WireCheckError, match="would arrive as"):
        wire.handover([bad])


def test_check_sees_a_hot_message_changed_after_the_handover(check):
    settle = [TAG_SETTLE, wire.OUTCOME_ACK, [1, 2]]
    out = wire.handover([settle, list(DELIVER)])
    wire.received(out)                              # unchanged: fine
    settle[2].append(3)                             # the sender merges into a sent message
    with pytest.raises(wire.WireCheckError, match="changed after it was handed over"):
        wire.received(out)


def test_received_does_nothing_without_the_check():
    settle = [TAG_SETTLE, wire.OUTCOME_ACK, [1, 2]]
    out = wire.handover([settle])
    settle[2].append(3)
    wire.received(out)
