"""Settings precedence and errors; placement stability."""
import pytest

from shoal.shared.errors import ConfigError
from shoal.shared.placement import owner
from shoal.shared.settings import cpu_plan, default_layout, load_settings


def test_defaults_are_what_the_readme_promises():
    s = load_settings(env={})
    assert (s.host, s.port, s.frame_max, s.channel_max, s.heartbeat) == \
        ("127.0.0.1", 5672, 131072, 2047, 60)
    assert s.users == {"guest": "guest"} and s.max_message_size == 128 * 1024 * 1024


def test_file_then_env_then_flags(tmp_path):
    cfg = tmp_path / "shoal.yaml"
    cfg.write_text("port: 6000\nheartbeat: 10\nusers: {alice: secret}\n")
    s = load_settings(cfg, env={"SHOAL_PORT": "6001", "SHOAL_HEARTBEAT": "20"},
                      overrides={"port": 6002, "nodes": None})
    assert s.port == 6002 and s.heartbeat == 20 and s.users == {"alice": "secret"}


def test_env_lists_and_users():
    s = load_settings(env={"SHOAL_NODE_ENDPOINTS": "a=tcp://h:1, tcp://h:2",
                           "SHOAL_USERS": "a:1,b:2"})
    assert s.node_map() == [("a", "tcp://h:1"), ("node-1", "tcp://h:2")]
    assert s.users == {"a": "1", "b": "2"}


@pytest.mark.parametrize("env,needle", [
    ({"SHOAL_PORT": "abc"}, "'port'"),
    ({"SHOAL_PORT": "70000"}, "'port'"),
    ({"SHOAL_NODES": "0"}, "'nodes'"),
    ({"SHOAL_FRAME_MAX": "100"}, "'frame_max'"),
    ({"SHOAL_LOG_LEVEL": "loud"}, "'log_level'"),
    ({"SHOAL_NODE_ENDPOINTS": "nowhere"}, "'node_endpoints'"),
    ({"SHOAL_EMBED_NODE": "ture"}, "'embed_node'"),
    ({"SHOAL_ROUTERS": "-1"}, "'routers'"),
    ({"SHOAL_EMBED_BIND": "nowhere"}, "'embed_bind'"),
    ({"SHOAL_DIRECT_PORT": "-2"}, "'direct_port'"),
])
def test_invalid_setting_names_the_setting(env, needle):
    with pytest.raises(ConfigError) as exc:
        load_settings(env=env)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_embed_node_from_file_env_and_flag(tmp_path):
    assert load_settings(env={}).embed_node is False          # node-0 is a process
    cfg = tmp_path / "shoal.yaml"
    cfg.write_text("embed_node: true\n")
    assert load_settings(cfg, env={}).embed_node is True
    assert load_settings(cfg, env={"SHOAL_EMBED_NODE": "off"}).embed_node is False
    assert load_settings(cfg, env={"SHOAL_EMBED_NODE": "0"},
                         overrides={"embed_node": True}).embed_node is True


def test_routers_from_file_env_and_flag(tmp_path, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    s = load_settings(env={})              # by CPU count: half nodes, half + a quarter routers
    assert (s.serve_routers(), s.nodes) == (6, 4)
    s = load_settings(env={"SHOAL_EMBED_NODE": "1"})          # node-0 in the one router
    assert (s.serve_routers(), s.nodes) == (1, 4)
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert (load_settings(env={}).serve_routers(), load_settings(env={}).nodes) == (1, 1)
    cfg = tmp_path / "shoal.yaml"
    cfg.write_text("routers: 3\n")
    assert load_settings(cfg, env={}).routers == 3
    assert load_settings(cfg, env={"SHOAL_ROUTERS": "2"}).routers == 2
    assert load_settings(cfg, env={"SHOAL_ROUTERS": "2"}, overrides={"routers": 4}).routers == 4


def test_bad_config_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "missing.yaml", env={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("port: [1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(bad, env={})
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("colour: blue\n")
    with pytest.raises(ConfigError, match="unknown setting 'colour'"):
        load_settings(unknown, env={})


def test_placement_is_deterministic_and_spreads():
    nodes = ["node-0", "node-1", "node-2"]
    names = [f"q{i}" for i in range(300)]
    first = [owner("/", n, nodes) for n in names]
    assert first == [owner("/", n, list(reversed(nodes))) for n in names]
    counts = {n: first.count(n) for n in nodes}
    assert all(c > 50 for c in counts.values()), counts


def test_placement_adding_a_node_moves_only_its_share():
    names = [f"q{i}" for i in range(1000)]
    before = {n: owner("/", n, ["node-0", "node-1", "node-2"]) for n in names}
    after = {n: owner("/", n, ["node-0", "node-1", "node-2", "node-3"]) for n in names}
    moved = [n for n in names if before[n] != after[n]]
    assert all(after[n] == "node-3" for n in moved)
    assert len(moved) < 400


@pytest.mark.parametrize("cpus,routers,nodes,expect", [
    ([0], 1, 1, ([], [])),                          # one CPU: nothing to pin
    ([0, 1], 1, 1, ([0], [1])),
    ([0, 1], 1, 2, ([0], [1, 1])),                  # compare_rabbitmq's layout
    ([0, 1, 2, 3], 2, 2, ([0, 1], [2, 3])),         # the default layout
    ([4, 5, 6, 7], 1, 3, ([4], [5, 6, 7])),
    ([0, 1], 4, 4, ([0, 0, 0, 0], [1, 1, 1, 1])),   # more processes than CPUs
    ([0, 1, 2], 1, 1, ([0], [2])),                  # an odd count: routers get 2 CPUs
    ([0, 1, 2, 3], 3, 2, ([], [])),                 # 4 CPUs' default: the kernel spreads them
    ([0, 1, 2, 3, 4, 5, 6, 7], 6, 4, ([], [])),     # 8 CPUs' default
])
def test_cpu_plan_puts_routers_and_nodes_on_cpus_of_their_own(cpus, routers, nodes, expect):
    assert cpu_plan(cpus, routers, nodes) == expect


@pytest.mark.parametrize("cores,layout", [
    (1, (1, 1)), (2, (1, 1)), (3, (1, 2)), (4, (3, 2)), (8, (6, 4)), (16, (12, 8)),
])
def test_default_layout_gives_routers_a_quarter_more_from_4_cores(cores, layout):
    """shoal serve's routers and nodes for a machine of ``cores`` CPUs (a router costs about
    twice a node per message: docs/performance.md, "Scaling across cores")."""
    assert default_layout(cores) == layout


def test_pin_cpus_from_env_and_flag():
    assert load_settings(env={}).pin_cpus is True
    assert load_settings(env={"SHOAL_PIN_CPUS": "0"}).pin_cpus is False
    assert load_settings(env={}, overrides={"pin_cpus": False}).serve_cpus(1, 1) == ([], [])
