"""A dead letter's routing less the queues it would cycle back into (router/dead_letters.py
``without_cycles``, RabbitMQ's ``rabbit_dead_letter:detect_cycles``); end to end, side by
side with RabbitMQ 3.10.8: parity scenario ``dead_letter_cycles``."""
from pamqp import commands as C
from pamqp.header import ContentHeader

from shoal.router.dead_letters import without_cycles


def header(*deaths: tuple[str, str]) -> bytes:
    """A header whose x-death lists ``(queue, reason)``, newest first."""
    table = [{"queue": q, "reason": r, "count": 1} for q, r in deaths]
    return ContentHeader(0, 1, C.Basic.Properties(headers={"x-death": table})).marshal()


def test_a_queue_in_the_history_with_no_rejection_since_is_a_cycle():
    h = header(("q2", "expired"), ("q1", "expired"))
    assert without_cycles({"q1", "q3"}, h) == {"q3"}
    assert without_cycles({"q2"}, h) == set()          # into itself: dropped at once


def test_a_rejection_on_the_way_breaks_the_cycle():
    assert without_cycles({"q1"}, header(("q2", "rejected"), ("q1", "expired"))) == {"q1"}
    assert without_cycles({"q1"}, header(("q1", "rejected"))) == {"q1"}
    assert without_cycles({"q1"}, header(("q2", "expired"), ("q1", "rejected"))) == {"q1"}


def test_a_queue_not_in_the_history_and_a_message_with_none_are_routed():
    assert without_cycles({"dlq"}, header(("q", "maxlen"), ("q", "expired"))) == {"dlq"}
    plain = ContentHeader(0, 1, C.Basic.Properties(headers={"a": 1})).marshal()
    assert without_cycles({"q"}, plain) == {"q"}
