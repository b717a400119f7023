"""router/access/users.py: RabbitMQ's permission rules, without sockets (issue 22, point 1)."""
from __future__ import annotations

import logging

import pytest

from shoal.router.access.users import CONFIGURE, READ, WRITE, UserStore, VhostAccess
from shoal.shared.definitions import Permission, from_settings, parse_definitions
from shoal.shared.errors import AMQPError


def access(configure=".*", write=".*", read=".*", topics=None, user="u", vhost="/"):
    return VhostAccess(user, vhost, Permission(user, vhost, configure, write, read),
                       topics or {})


def refusal(fn, *args) -> str:
    with pytest.raises(AMQPError) as e:
        fn(*args)
    assert e.value.reply_code == 403 and e.value.soft
    return e.value.reply_text


def test_all_dot_star_is_unrestricted_and_checks_nothing():
    a = access()
    assert a.unrestricted
    a.check(CONFIGURE, "queue", "anything")
    assert not access(topics={"amq.topic": (".*", ".*")}).unrestricted


def test_expressions_are_searched_not_anchored_as_rabbitmq():
    a = access(configure="c-", write="^w", read="")
    a.check(CONFIGURE, "queue", "x-c-y")          # unanchored: a match anywhere
    assert refusal(a.check, WRITE, "queue", "xw") == \
        "ACCESS_REFUSED - access to queue 'xw' in vhost '/' refused for user 'u'"
    assert "queue 'q'" in refusal(a.check, READ, "queue", "q")   # "" grants nothing


def test_the_default_exchange_is_checked_as_amq_default():
    a = access(write=r"^amq\.default$")
    a.check(WRITE, "exchange", "")
    assert "exchange 'amq.direct'" in refusal(a.check, WRITE, "exchange", "amq.direct")


def test_topic_permissions_with_variables():
    a = access(topics={"amq.topic": (r"^{username}\.", r"^{vhost}\.")}, user="ann",
               vhost="v")
    a.check_topic(WRITE, "amq.topic", "ann.x")
    a.check_topic(READ, "amq.topic", "v.#")
    a.check_topic(WRITE, "other.topic", "anything")    # no topic permission: open
    assert refusal(a.check_topic, WRITE, "amq.topic", "bob.x") == (
        "ACCESS_REFUSED - access to topic 'bob.x' in exchange 'amq.topic' in vhost 'v' refused for user 'ann'")


def test_user_store_logins_vhosts_and_loopback(caplog):
    store = UserStore(from_settings({"guest": "guest", "dev": "pw"}, ["/"]), ("guest",))
    caplog.set_level(logging.WARNING, "shoal.router.access.users")
    assert store.authenticate("dev", "pw", "10.0.0.9:5000", loopback=False)
    assert not store.authenticate("dev", "wrong-pw-123", "10.0.0.9:5000", loopback=False)
    assert not store.authenticate("guest", "guest", "10.0.0.9:5001", loopback=False)
    assert store.authenticate("guest", "guest", "127.0.0.1:5002", loopback=True)
    assert not store.authenticate("nobody", "x", "127.0.0.1:5003", loopback=True)
    text = caplog.text
    assert "from 10.0.0.9:5000: user 'dev' - invalid credentials" in text
    assert "user 'guest' can only connect via localhost" in text
    assert "wrong-pw-123" not in text
    assert store.vhost_access("dev", "/").unrestricted
    assert store.vhost_access("dev", "other") is None


def test_topic_permissions_reach_the_users_vhost_access():
    defs = parse_definitions({
        "users": [{"name": "u", "password_hash": ""}], "vhosts": [{"name": "/"}],
        "permissions": [{"user": "u", "vhost": "/", "configure": ".*", "write": ".*",
                         "read": ".*"}],
        "topic_permissions": [{"user": "u", "vhost": "/", "exchange": "t", "write": "^a",
                               "read": "^b"}]})
    a = UserStore(defs).vhost_access("u", "/")
    assert not a.unrestricted and a.topics == {"t": ("^a", "^b")}
    assert not UserStore(defs).authenticate("u", "", "127.0.0.1:1", True)  # passwordless
