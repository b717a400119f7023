"""RabbitMQ definitions and password hashes (shared/definitions.py; issue 22, point 1)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from shoal.shared.definitions import (access_document, check_password, definitions_for,
                                      from_settings,
                                      hash_password, load_definitions, parse_definitions)
from shoal.shared.errors import ConfigError
from shoal.shared.settings import load_settings

#: exported by RabbitMQ 3.10.8 (rabbitmqctl export_definitions) for the password "p"
RABBITMQ_SHA256 = "o90CI7XlbxwUGU0OMErYYKsyCO2TsfHF4kbi5zkqgJcxubLw"


def test_a_hash_exported_from_rabbitmq_checks():
    assert check_password("p", RABBITMQ_SHA256)
    assert not check_password("P", RABBITMQ_SHA256)
    assert not check_password("p", "")           # passwordless user: no password login
    assert not check_password("p", "not base64!")


@pytest.mark.parametrize("algorithm", ["rabbit_password_hashing_sha256",
                                       "rabbit_password_hashing_sha512",
                                       "rabbit_password_hashing_md5"])
def test_hash_round_trip_with_a_fresh_salt_each_time(algorithm):
    a, b = hash_password("s3cret-ü", algorithm), hash_password("s3cret-ü", algorithm)
    assert a != b          # salted
    assert check_password("s3cret-ü", a, algorithm) and check_password("s3cret-ü", b, algorithm)
    assert not check_password("s3cret", a, algorithm)


def test_hash_is_salt_then_digest_of_salt_and_password():
    assert hash_password("p", salt=bytes.fromhex("a3dd0223")) == RABBITMQ_SHA256


def test_a_full_export_parses_and_unused_sections_are_ignored():
    defs = parse_definitions({
        "rabbit_version": "3.10.8", "rabbitmq_version": "3.10.8",
        "users": [{"name": "u", "password_hash": RABBITMQ_SHA256,
                   "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": [],
                   "limits": {}},
                  {"name": "old", "password_hash": "", "tags": "administrator,management"}],
        "vhosts": [{"name": "/", "limits": [], "metadata": {}}, {"name": "v2"}],
        "permissions": [{"user": "u", "vhost": "v2", "configure": "^c", "write": "",
                         "read": ".*"}],
        "topic_permissions": [{"user": "u", "vhost": "/", "exchange": "amq.topic",
                               "write": "^a", "read": "^b"}],
        "queues": [{"name": "q", "vhost": "/", "durable": True, "auto_delete": False,
                    "arguments": {}}],
        "exchanges": [], "bindings": [], "policies": [], "parameters": [],
        "global_parameters": [{"name": "cluster_name", "value": "rabbit@x"}],
    })
    assert defs.users["u"].check_password("p")
    assert defs.users["old"].tags == ("administrator", "management")  # pre-3.10 tags
    assert defs.vhosts == ["/", "v2"]
    assert defs.permissions[("u", "v2")].configure == "^c"
    assert defs.topic_permissions[0].exchange == "amq.topic"
    assert defs.queues[0]["name"] == "q"


def test_only_users_vhosts_permissions_is_fine():
    defs = parse_definitions({"users": [{"name": "a", "password_hash": RABBITMQ_SHA256}],
                              "vhosts": [{"name": "/"}],
                              "permissions": [{"user": "a", "vhost": "/", "configure": ".*",
                                               "write": ".*", "read": ".*"}]})
    assert list(defs.users) == ["a"] and defs.queues == []


@pytest.mark.parametrize("data, words", [
    ([], "must hold a JSON object"),
    ({"users": {}}, "'users' must be a list"),
    ({"users": [{"password_hash": ""}]}, "users[0] needs a string 'name'"),
    ({"users": [{"name": "a", "password_hash": "", "hashing_algorithm": "bcrypt"}]},
     "unknown hashing_algorithm 'bcrypt'"),
    ({"users": [{"name": "a"}], "vhosts": [{"name": "/"}],
      "permissions": [{"user": "b", "vhost": "/", "configure": "", "write": "", "read": ""}]},
     "permissions[0]: no user 'b'"),
    ({"users": [{"name": "a"}], "vhosts": [{"name": "/"}],
      "permissions": [{"user": "a", "vhost": "x", "configure": "", "write": "", "read": ""}]},
     "permissions[0]: no vhost 'x'"),
    ({"users": [{"name": "a"}], "vhosts": [{"name": "/"}],
      "permissions": [{"user": "a", "vhost": "/", "configure": "(", "write": "", "read": ""}]},
     "'configure' is not a valid regular expression"),
])
def test_bad_definitions_name_the_entry(data, words):
    with pytest.raises(ConfigError) as e:
        parse_definitions(data, "defs.json")
    assert words in str(e.value) and str(e.value).startswith("defs.json")


def test_unreadable_or_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read definitions file"):
        load_definitions(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        load_definitions(bad)


def test_development_users_are_hashed_admins_everywhere():
    defs = from_settings({"dev": "pw"}, ["/", "v"])
    u = defs.users["dev"]
    assert u.password_hash != "pw" and u.check_password("pw")
    assert u.tags == ("administrator",)
    assert {k: (p.configure, p.write, p.read) for k, p in defs.permissions.items()} == {
        ("dev", "/"): (".*", ".*", ".*"), ("dev", "v"): (".*", ".*", ".*")}


def test_load_definitions_setting_from_env(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"users": [{"name": "a", "password_hash": RABBITMQ_SHA256}],
                                "vhosts": [{"name": "/"}]}))
    s = load_settings(env={"SHOAL_LOAD_DEFINITIONS": str(path)})
    assert list(definitions_for(s).users) == ["a"]
    assert list(definitions_for(load_settings(env={})).users) == ["guest"]


@pytest.mark.parametrize("command", ["serve", "router"])
def test_a_bad_definitions_file_stops_start_up_with_one_line(tmp_path, command):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"users": [{"name": "a", "hashing_algorithm": "x"}]}))
    extra = ["--node", "tcp://127.0.0.1:1"] if command == "router" else []
    r = subprocess.run([sys.executable, "-m", "shoal.cli", command, "--definitions", str(path),
                        "--port", "0", *extra], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"shoal {command}: {path}: user 'a': unknown hashing_algorithm 'x' (known: "
        "rabbit_password_hashing_sha256, rabbit_password_hashing_sha512, "
        "rabbit_password_hashing_md5)"]


def test_rabbitmqctl_export_definitions_output_loads_unchanged():
    """``rabbitmqctl export_definitions`` of RabbitMQ 3.10.8 (session 11): users with hashes
    and limits, vhosts, permissions, vhost limits, and topology."""
    from pathlib import Path
    defs = load_definitions(Path(__file__).parent / "data" / "rabbitmq-3.10.8-export.json")
    assert defs.users["u"].check_password("p") and defs.users["guest"].check_password("guest")
    assert defs.users["guest"].tags == ("administrator",)
    assert defs.users["acc-lim"].limits == {"max-channels": 3, "max-connections": 2}
    assert defs.vhost_limits["acc-limited-vh"] == {"max-connections": 1, "max-queues": 2}
    assert defs.permissions[("u", "/")].configure == "^c.*"
    assert any(q["name"] == "acc-def-q" for q in defs.queues)
    assert any(b["destination"] == "acc-def-q" for b in defs.bindings)


def test_a_vhosts_default_queue_type_is_read_kept_and_checked():
    """RabbitMQ 3.11+ exports it in the vhost's ``metadata`` (older exports at the top of
    the vhost); ``undefined`` means none; an unknown type is a clear error."""
    defs = parse_definitions({"vhosts": [
        {"name": "/", "metadata": {"default_queue_type": "quorum"}},
        {"name": "a", "default_queue_type": "classic"},
        {"name": "b", "metadata": {"default_queue_type": "undefined"}},
        {"name": "s", "metadata": {"default_queue_type": "stream"}}]})
    assert defs.default_queue_types == {"/": "quorum", "a": "classic", "s": "stream"}
    again = parse_definitions(access_document(defs))
    assert again.default_queue_types == defs.default_queue_types
    with pytest.raises(ConfigError, match="vhost 'c': default_queue_type must be one of "
                                          "classic, quorum, stream"):
        parse_definitions({"vhosts": [{"name": "c", "metadata": {"default_queue_type": "x"}}]})
