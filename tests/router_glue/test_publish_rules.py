"""A channel's checks of a publish's properties (router/frontend/publish_rules.py): RabbitMQ's
validated user ID (the ``impersonator`` tag lifts it) and the expiration's form. The same
against RabbitMQ 3.10.8, side by side: scenario ``publish_property_checks``."""
import pytest
from pamqp import commands as C
from pamqp.header import ContentHeader

from shoal.router.access.users import VhostAccess
from shoal.router.frontend import publish_rules
from shoal.shared.definitions import Permission
from shoal.shared.errors import AMQPError


def header(**props) -> bytes:
    return ContentHeader(0, 1, C.Basic.Properties(
        content_type="text/plain", headers={"k": "v"}, correlation_id="c", **props)).marshal()


def access(impersonator: bool = False) -> VhostAccess:
    return VhostAccess("alice", "/", Permission("alice", "/", ".*", ".*", ".*"), {}, impersonator)


def test_plain_publishes_are_not_looked_at():
    assert not publish_rules.announced(header(message_id="m"))
    assert publish_rules.announced(header(user_id="alice"))
    assert publish_rules.announced(header(expiration="5"))


def test_the_connections_own_user_id_passes_another_is_refused_unless_impersonator():
    publish_rules.check(header(user_id="alice"), access(), 406)
    with pytest.raises(AMQPError) as e:
        publish_rules.check(header(user_id="mallory"), access(), 406)
    assert (e.value.reply_code, e.value.reply_text) == (
        406, "PRECONDITION_FAILED - user_id property set to 'mallory' but authenticated "
             "user was 'alice'")
    with pytest.raises(AMQPError) as e:
        publish_rules.check(header(user_id="mallory"), access(), 403)      # over AMQP 1.0
    assert e.value.reply_code == 403
    publish_rules.check(header(user_id="mallory"), access(impersonator=True), 406)


@pytest.mark.parametrize("value,why", [
    ("-1", "{value_negative,-1}"), ("foo", "no_integer"),     # "": pamqp omits it (parity)
    (" 5", "no_integer"), ("1000foo", '{leftover_string,"foo"}'),
    ("1.5", '{leftover_string,".5"}'), ("+5", None), ("0", None), ("86400000", None)])
def test_an_expiration_is_a_decimal_integer_of_ms_at_least_0(value, why):
    h = header(expiration=value, user_id="alice")
    if why is None:
        publish_rules.check(h, access(), 406)
        return
    with pytest.raises(AMQPError) as e:
        publish_rules.check(h, access(), 406)
    assert (e.value.reply_code, e.value.reply_text) == (
        406, f"PRECONDITION_FAILED - invalid expiration '{value}': {why}")
