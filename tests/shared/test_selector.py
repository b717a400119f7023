"""JMS selectors (shoal.shared.selector): the JMS 1.1 3.8.1.1 language, three-valued logic,
and 406 errors naming the position."""
from __future__ import annotations

import pytest
from pamqp.commands import Basic

from shoal.shared.errors import PRECONDITION_FAILED, AMQPError
from shoal.shared.selector import check_arguments, compile_selector, selector_fields

FIELDS = {"color": "red", "n": 5, "price": 2.5, "flag": True, "name": "it's"}


@pytest.mark.parametrize("text,expected", [
    ("color = 'red'", True), ("color <> 'red'", False), ("n > 3 AND price < 3", True),
    ("n >= 5 and n <= 5", True), ("n BETWEEN 1 AND 4", False), ("n NOT BETWEEN 1 AND 4", True),
    ("color LIKE 'r%'", True), ("color LIKE 'r_d'", True), ("color NOT LIKE 'b%'", True),
    ("name LIKE 'it''s'", True), ("color IN ('red', 'blue')", True),
    ("color NOT IN ('red')", False), ("missing IS NULL", True), ("color IS NOT NULL", True),
    ("NOT (n = 5)", False), ("missing = 1 OR n = 5", True), ("NOT missing = 1", False),
    ("missing = 1 AND n = 5", False), ("n * 2 + 1 = 11", True), ("-n < 0", True),
    ("n / 2 = 2.5", True), ("n = 5.0", True), ("color = 5", False), ("flag = TRUE", True),
    ("n = 0x5", True), ("n = 5L", True), ("1.5e1 > n", True), ("(n > 1) = TRUE", True),
    ("COLOR = 'red'", False),                      # identifiers are case-sensitive
    ("color like 'R%'", False),                    # keywords are not
    ("x LIKE '50\\%' ESCAPE '\\'", False),
])
def test_selector_semantics(text, expected):
    assert compile_selector(text).matches(FIELDS) is expected


def test_like_escape():
    assert compile_selector("p LIKE '50!%' ESCAPE '!'").matches({"p": "50%"})
    assert not compile_selector("p LIKE '50!%' ESCAPE '!'").matches({"p": "500"})


@pytest.mark.parametrize("text,pos", [("color = ", 9), ("color == 'red'", 8), ("(a = 1", 7),
                                      ("a = 1 AND", 10), ("'abc", 1), ("a # b", 3)])
def test_invalid_selector_names_the_position(text, pos):
    with pytest.raises(AMQPError) as e:
        compile_selector(text)
    assert e.value.reply_code == PRECONDITION_FAILED and e.value.soft
    assert f"at position {pos}" in e.value.text and "x-filter-jms-selector" in e.value.text


def test_check_arguments():
    assert check_arguments({}) is None and check_arguments(None) is None
    assert check_arguments({"x-filter-jms-selector": b"a = 1"}).matches({"a": 1})
    with pytest.raises(AMQPError):
        check_arguments({"x-filter-jms-selector": 5})
    with pytest.raises(AMQPError):
        check_arguments({"x-filter-jms-selector": "  "})


def test_fields_from_properties():
    p = Basic.Properties(headers={"h": b"v"}, priority=7, delivery_mode=2, message_id="m1",
                         correlation_id="c1", message_type="t")
    f = selector_fields(p)
    assert f["h"] == "v" and f["JMSPriority"] == 7 and f["JMSDeliveryMode"] == "PERSISTENT"
    assert f["JMSMessageID"] == "m1" and f["JMSCorrelationID"] == "c1" and f["JMSType"] == "t"
    assert selector_fields(None)["JMSPriority"] == 4
