"""Config loading: the shipped file, round trips, unknown keys, wrong types, overrides, rules."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from apexrl.algos.apex_dqn import ApexDQNConfig
from apexrl.config import (
    IDLE_EVAL_NICE,
    Config,
    ConfigError,
    EnvConfig,
    config_from_dict,
    dump_config,
    load_config,
    parse_override,
)
from apexrl.replay.rate_limiter import RateLimiter, check_no_deadlock

CARTPOLE = Path(__file__).resolve().parents[1] / "configs" / "apex_dqn_cartpole.yaml"


# --- the shipped config ---------------------------------------------------------------------------


def test_shipped_cartpole_config_loads_with_its_values() -> None:
    cfg = load_config(CARTPOLE)
    assert cfg.algorithm == "apex_dqn"
    assert isinstance(cfg.algo, ApexDQNConfig)
    assert cfg.algo.hidden_sizes == (128, 128)  # a YAML list becomes the tuple field
    assert cfg.algo.lr == 0.0005
    assert cfg.algo.adam_eps == 1e-8
    assert cfg.env == EnvConfig(id="CartPole-v1", num_envs=32, max_episode_steps=0, seed=0)
    assert cfg.actor.chunk_steps == 16
    assert (cfg.replay.capacity, cfg.replay.min_size_to_sample) == (100_000, 2000)
    assert cfg.replay.samples_per_insert == 4.0
    assert cfg.learner.batch_size == 128
    assert cfg.run.stop_eval_return == 475.0
    assert cfg.run_dir == Path("runs") / "apex_dqn-CartPole-v1"
    cfg.validate()


def test_the_resolved_config_is_complete_where_the_file_is_not() -> None:
    """A shipped config writes what matters; its resolved whole (what ``apexrl config show``
    prints) has every field of every section, the file's own values among them."""
    on_disk = yaml.safe_load(CARTPOLE.read_text())
    resolved = yaml.safe_load(dump_config(load_config(CARTPOLE)))
    everything = yaml.safe_load(dump_config(Config()))
    assert set(resolved) == set(everything)
    for section, values in everything.items():
        if isinstance(values, dict):
            assert set(resolved[section]) == set(values), section
            assert set(on_disk.get(section) or {}) < set(values), section  # the file: a part
    assert resolved["algo"]["lr"] == on_disk["algo"]["lr"]


def test_no_path_gives_the_defaults() -> None:
    assert load_config(None) == Config()


# --- round trip -----------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["defaults", "cartpole"])
def test_round_trip_through_yaml_text_gives_an_equal_config(source: str, tmp_path: Path) -> None:
    cfg = Config() if source == "defaults" else load_config(CARTPOLE, ["algo.hidden_sizes=[7, 5]"])
    text = dump_config(cfg)
    assert config_from_dict(yaml.safe_load(text)) == cfg
    path = tmp_path / "config.yaml"
    path.write_text(text)
    again = load_config(path)
    assert again == cfg
    assert again.algo.hidden_sizes == cfg.algo.hidden_sizes  # a tuple again, not a list


# --- unknown keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "named", "suggested"),
    [
        ({"replay": {"capasity": 10}}, "'replay.capasity'", "'replay.capacity'"),
        ({"algo": {"lrr": 0.1}}, "'algo.lrr'", "'algo.lr'"),
        ({"learnr": {}}, "'learnr'", "'learner'"),
        ({"env": {"num_env": 2}}, "'env.num_env'", "'env.num_envs'"),
    ],
)
def test_unknown_key_is_named_with_the_nearest_valid_key(
    data: dict, named: str, suggested: str
) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    message = str(info.value)
    assert named in message
    assert f"did you mean {suggested}" in message


def test_unknown_key_without_a_near_match_lists_the_valid_keys() -> None:
    with pytest.raises(ConfigError, match="'replay.zzzz'.*valid keys: .*capacity"):
        config_from_dict({"replay": {"zzzz": 1}})


def test_unknown_algorithm_is_named_and_the_known_ones_listed() -> None:
    with pytest.raises(ConfigError, match="unknown algorithm 'dqn'; known: apex_dqn"):
        config_from_dict({"algorithm": "dqn"})


def test_algorithm_of_the_wrong_type_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="algorithm"):
        config_from_dict({"algorithm": ["apex_dqn"]})


# --- types ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"env": {"num_envs": "8"}}, r"env.num_envs must be int, got '8' \(str\)"),
        ({"env": {"num_envs": True}}, r"env.num_envs must be int, got True \(bool\)"),
        ({"env": {"num_envs": 8.0}}, r"env.num_envs must be int, got 8.0 \(float\)"),
        ({"env": {"id": ["CartPole-v1"]}}, r"env.id must be str, got \['CartPole-v1'\] \(list\)"),
        ({"actor": {"epsilon": "0.4"}}, r"actor.epsilon must be float, got '0.4' \(str\)"),
        ({"actor": {"epsilon": False}}, r"actor.epsilon must be float, got False \(bool\)"),
        ({"run": {"resume": 1}}, r"run.resume must be bool, got 1 \(int\)"),
        ({"run": {"resume": "yes please"}}, r"run.resume must be bool"),
        ({"algo": {"n_step": 3.5}}, r"algo.n_step must be int, got 3.5 \(float\)"),
        ({"algo": {"hidden_sizes": 64}}, r"algo.hidden_sizes must be tuple, got 64 \(int\)"),
        ({"algo": {"hidden_sizes": [64, "x"]}}, r"algo.hidden_sizes\[1\] must be int, got 'x'"),
    ],
)
def test_a_value_of_the_wrong_type_names_the_key(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict(data)


@pytest.mark.parametrize("section", ["env", "replay", "algo"])
def test_a_section_that_is_not_a_mapping_is_an_error(section: str) -> None:
    with pytest.raises(ConfigError, match=f"{section}. must be a mapping, got int"):
        config_from_dict({section: 5})


def test_ints_are_accepted_for_float_fields_and_become_floats() -> None:
    cfg = config_from_dict({"actor": {"epsilon": 1}, "algo": {"gamma": 1, "lr": 1}})
    assert cfg.actor.epsilon == 1.0 and isinstance(cfg.actor.epsilon, float)
    assert cfg.algo.gamma == 1.0 and isinstance(cfg.algo.gamma, float)
    assert isinstance(cfg.algo.lr, float)


def test_a_list_is_accepted_for_the_hidden_sizes_tuple() -> None:
    cfg = config_from_dict({"algo": {"hidden_sizes": [64, 32]}})
    assert cfg.algo.hidden_sizes == (64, 32)
    assert isinstance(cfg.algo.hidden_sizes, tuple)


# --- overrides ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("algo.lr=0.0003", ("algo.lr", 0.0003)),
        ("algo.lr=3.0e-4", ("algo.lr", 0.0003)),
        ("env.id=Acrobot-v1", ("env.id", "Acrobot-v1")),
        ("env.num_envs=2", ("env.num_envs", 2)),
        ("run.resume=true", ("run.resume", True)),
        ("algo.hidden_sizes=[64, 64]", ("algo.hidden_sizes", [64, 64])),
        (" run.dir = ", ("run.dir", "")),
        ("net.replay_addr=tcp://127.0.0.1:7000", ("net.replay_addr", "tcp://127.0.0.1:7000")),
    ],
)
def test_parse_override_reads_the_value_as_yaml(text: str, expected: tuple) -> None:
    assert parse_override(text) == expected


def test_parse_override_reads_exponent_floats_without_a_dot() -> None:
    # PyYAML (YAML 1.1) reads "3e-4" as text; a float field accepts that form of number.
    assert load_config(CARTPOLE, ["algo.lr=3e-4"]).algo.lr == 0.0003
    assert load_config(CARTPOLE, ["replay.samples_per_insert=1e1"]).replay.samples_per_insert == 10
    with pytest.raises(ConfigError, match="algo.lr must be float"):
        load_config(CARTPOLE, ["algo.lr='0.5'"])


def test_overrides_replace_file_values() -> None:
    cfg = load_config(
        CARTPOLE,
        ["algo.lr=0.0003", "env.id=Acrobot-v1", "env.num_envs=2", "algo.hidden_sizes=[16]"],
    )
    assert cfg.algo.lr == 0.0003
    assert cfg.env.id == "Acrobot-v1"
    assert cfg.env.num_envs == 2
    assert cfg.algo.hidden_sizes == (16,)
    assert cfg.algo.gamma == 0.99  # untouched fields keep the file's values
    assert cfg.replay.capacity == 100_000


def test_overrides_apply_in_order_and_without_a_file() -> None:
    cfg = load_config(None, ["env.num_envs=2", "env.num_envs=3"])
    assert cfg.env.num_envs == 3
    assert cfg.env.id == Config().env.id


def test_override_of_an_unknown_key_suggests_the_nearest() -> None:
    with pytest.raises(ConfigError, match="'replay.capasity'; did you mean 'replay.capacity'"):
        load_config(CARTPOLE, ["replay.capasity=10"])


def test_override_with_a_wrong_type_names_the_key() -> None:
    with pytest.raises(ConfigError, match="env.num_envs must be int, got 'many'"):
        load_config(CARTPOLE, ["env.num_envs=many"])


def test_override_that_goes_into_a_value_is_an_error() -> None:
    # env.id is a string in the file, so "env.id.x" walks into a value, not a section.
    with pytest.raises(ConfigError, match="'id' is not a section"):
        load_config(CARTPOLE, ["env.id.x=1"])


@pytest.mark.parametrize("text", ["noequals", "=5", "  =5"])
def test_override_without_key_and_equals_is_an_error(text: str) -> None:
    with pytest.raises(ConfigError, match="must look like section.key=value"):
        parse_override(text)


def test_override_value_that_is_not_yaml_is_an_error() -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_override("algo.hidden_sizes=[1, 2")


# --- cross-field validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["replay.capacity=100", "replay.min_size_to_sample=101", "learner.batch_size=8"],
            r"replay.min_size_to_sample \(101\) exceeds replay.capacity \(100\)",
        ),
        (["learner.batch_size=0"], "learner.batch_size must be positive, got 0"),
        (["learner.batch_size=-4"], "learner.batch_size must be positive, got -4"),
        (
            ["replay.capacity=2000", "learner.batch_size=2001"],
            r"learner.batch_size \(2001\) exceeds replay.capacity \(2000\)",
        ),
        (["actor.epsilon=1.5"], r"actor.epsilon must be in \[0, 1\], got 1.5"),
        (["actor.epsilon=-0.1"], r"actor.epsilon must be in \[0, 1\], got -0.1"),
        (["actor.eval_epsilon=2"], r"actor.eval_epsilon must be in \[0, 1\], got 2.0"),
        (["replay.kind=lifo"], "replay.kind must be 'prioritized' or 'fifo', got 'lifo'"),
        (["learner.device=tpu"], "learner.device must be 'cpu', 'cuda\\[:N\\]' or 'auto'"),
        (["actor.device=tpu"], "actor.device must be 'cpu', 'cuda\\[:N\\]' or 'auto'"),
        (["env.num_envs=0"], "env.num_envs must be positive, got 0"),
        (["actor.chunk_steps=0"], "actor.chunk_steps must be positive, got 0"),
        (["algo.gamma=1.5"], r"algo.gamma must be in \[0, 1\], got 1.5"),
        (["algo.n_step=0"], "algo.n_step must be >= 1, got 0"),
        (["algo.lr=0"], "algo.lr must be positive, got 0.0"),
        (["algo.hidden_sizes=[]"], "algo.hidden_sizes must be positive widths"),
        (["algo.hidden_sizes=[64, 0]"], "algo.hidden_sizes must be positive widths"),
    ],
)
def test_cross_field_rules_raise_config_error(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(CARTPOLE, overrides)


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1", "auto"])
def test_valid_devices_are_accepted(device: str) -> None:
    assert load_config(CARTPOLE, [f"learner.device={device}"]).learner.device == device


def test_min_size_equal_to_capacity_is_allowed() -> None:
    cfg = load_config(CARTPOLE, ["replay.capacity=128", "replay.min_size_to_sample=128"])
    assert cfg.replay.min_size_to_sample == cfg.replay.capacity == 128


# --- files ----------------------------------------------------------------------------------------


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_file_whose_top_level_is_a_list_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- algorithm\n- apex_dqn\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(path)


def test_file_that_is_not_yaml_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("env: {id: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_empty_file_gives_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing\n")
    assert load_config(path) == Config()


# --- derived values -------------------------------------------------------------------------------


def test_default_rate_error_buffer_is_one_chunk_of_samples_plus_one_batch() -> None:
    cfg = load_config(CARTPOLE)
    # chunk_items = chunk_steps * num_envs = 16 * 32 = 512
    assert cfg.chunk_items == 512
    # rate_error_buffer = chunk_items * samples_per_insert + batch_size = 512 * 4 + 128 = 2176
    assert cfg.rate_error_buffer == 512 * 4.0 + 128 == 2176.0
    # ...which is the deadlock-free bound max(512 * 4, 128) = 2048, with room to spare.
    limiter = RateLimiter(4.0, 2000, cfg.rate_error_buffer)
    check_no_deadlock(limiter, max_insert_items=512, max_sample_items=128)


def test_rate_error_buffer_with_the_ratio_disabled_is_one_batch() -> None:
    cfg = load_config(CARTPOLE, ["replay.samples_per_insert=0"])
    assert cfg.rate_error_buffer == 0 * 512 + 128 == 128.0


def test_configured_rate_error_buffer_is_used_as_given() -> None:
    cfg = load_config(CARTPOLE, ["replay.rate_error_buffer=3000"])
    assert cfg.rate_error_buffer == 3000.0


def test_run_dir_uses_the_configured_directory() -> None:
    assert load_config(CARTPOLE, ["run.dir=/tmp/x"]).run_dir == Path("/tmp/x")


def test_the_evaluation_actor_idles_only_where_no_evaluation_stops_the_run() -> None:
    """``actor.eval_nice`` null (the default): 0 where ``run.stop_eval_return`` ends the run (the
    evaluation is then on the run's critical path), the idle niceness where nothing it measures
    stops the run; a value set is taken as it is."""
    judged = load_config(CARTPOLE.with_name("impala_cartpole.yaml"))
    assert judged.actor.eval_nice is None and judged.run.stop_eval_return == 475.0
    assert judged.eval_niceness == 0
    assert load_config(CARTPOLE.with_name("impala_pong.yaml")).eval_niceness == IDLE_EVAL_NICE == 10
    assert load_config(None, ["actor.eval_nice=5"]).eval_niceness == 5
    with pytest.raises(ConfigError, match="actor.eval_nice must be in 0..19 or null"):
        load_config(None, ["actor.eval_nice=20"])
