"""``SHOAL_*`` variables that name no setting (shared/settings.py ``unknown_env``): one warning
line each, with the closest setting; variables that other parts of Shoal, its tests and
Kubernetes set are not warned about; a ``shoal serve`` child does not repeat the warning."""
from __future__ import annotations

import io

import pytest

from shoal.shared.settings import ENV_CHECKED, load_settings, unknown_env, warn_unknown_env


def test_a_misspelt_setting_is_named_with_the_closest_one():
    assert unknown_env({"SHOAL_PROT": "5673", "SHOAL_PORT": "5674"}) == [
        "environment variable SHOAL_PROT is not a setting and is ignored; did you mean "
        "SHOAL_PORT?"]
    assert unknown_env({"SHOAL_MANAGMENT_PORT": "1"})[0].endswith(
        "did you mean SHOAL_MANAGEMENT_PORT?")


def test_nothing_close_gets_no_suggestion():
    assert unknown_env({"SHOAL_XYZZY": "1"}) == [
        "environment variable SHOAL_XYZZY is not a setting and is ignored"]


@pytest.mark.parametrize("key, value", [
    ("SHOAL_WIRE_CHECK", "1"), ("SHOAL_INJECT_FAULTS", "node:x"),
    ("SHOAL_NODE_STATS_FILE", "/tmp/s"), ("SHOAL_MANAGEMENT_URL", "http://h:15672"),
    ("SHOAL_USER", "guest"), ("SHOAL_PASSWORD", "guest"), ("SHOAL_E2E_EMBED", "1"),
    ("SHOAL_E2E_URL", "amqp://"), ("SHOAL_FUZZ_SEED", "1"), ("SHOAL_CRASH_SEED", "1"),
    ("SHOAL_PARITY_RABBITMQ_URL", "amqp://"), (ENV_CHECKED, "1"),
    # Kubernetes' service links for a Service named shoal or shoal-router
    ("SHOAL_SERVICE_HOST", "10.0.0.1"), ("SHOAL_SERVICE_PORT_AMQP", "5672"),
    ("SHOAL_PORT_5672_TCP_ADDR", "10.0.0.1"), ("SHOAL_ROUTER_PORT", "tcp://10.0.0.1:5672"),
    # settings
    ("SHOAL_LOCAL_LINK", "unix"), ("SHOAL_LOAD_DEFINITIONS", "/d.json"), ("SHOAL_PORT", "1"),
])
def test_variables_read_elsewhere_are_not_warned_about(key, value):
    assert unknown_env({key: value}) == []


def test_an_unknown_variable_changes_no_setting():
    assert load_settings(env={"SHOAL_PROT": "5673"}).port == 5672


def test_the_warning_is_printed_once_and_not_by_a_child_of_serve():
    out = io.StringIO()
    warn_unknown_env("shoal serve", {"SHOAL_PROT": "1", "SHOAL_NODES": "2"}, out)
    assert out.getvalue() == ("shoal serve: warning: environment variable SHOAL_PROT is not a "
                              "setting and is ignored; did you mean SHOAL_PORT?\n")
    child = io.StringIO()
    warn_unknown_env("shoal node", {"SHOAL_PROT": "1", ENV_CHECKED: "1"}, child)
    assert child.getvalue() == ""
