"""The shipped config files (``configs/*.yaml``) and sweep specs (``configs/sweeps/*.yaml``).

A config file holds the settings a reader of its run should see, the paper's or recipe's values
and the departures from them, and none that its algorithm ignores; the rest are the code's
documented defaults (``apexrl/config/``, ``apexrl/config/algos.py``) and the run directory
holds the resolved whole. So every file loads, names only keys its family's code reads, and fits
on a screen.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from apexrl.config import Config, ConfigError, load_config
from apexrl.config.algos import ALGORITHM_CONFIGS, ImpalaConfig, PPOConfig
from apexrl.sweep.runner import check_spec
from apexrl.sweep.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
SWEEPS = sorted((REPO / "configs" / "sweeps").glob("*.yaml"))
MAX_SETTING_LINES = 60  # lines that are neither blank nor a comment

# Keys outside algo.* that only some families read, and where the code says so:
# - actor.epsilon, actor.epsilon_alpha, actor.eval_epsilon: apex_dqn.actor_epsilon, which R2D2's
#   actor imports; the actor-critics sample their policy and the Q-function policy gradients add
#   their own noise;
# - actor.chunk_steps: an IMPALA or PPO chunk is one unroll per env (UnrollItems.items_per_chunk);
# - actor.params_poll_steps: a synchronous family's actors wait for each weights version instead
#   of polling (apexrl/actor.py).
FAMILY_KEYS: dict[str, set[str]] = {
    "actor.epsilon": {"apex_dqn", "r2d2"},
    "actor.epsilon_alpha": {"apex_dqn", "r2d2"},
    "actor.eval_epsilon": {"apex_dqn", "r2d2"},
    "actor.chunk_steps": {"apex_dqn", "r2d2", "sac", "td3", "ddpg", "bc"},
    "actor.params_poll_steps": {
        name for name, cls in ALGORITHM_CONFIGS.items() if not cls.SYNCHRONOUS
    },
}


def raw(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def dotted_keys(tree: dict[str, Any], where: str = "") -> set[str]:
    """``{"replay": {"kind": "fifo"}}`` -> ``{"replay.kind"}``; ``env.kwargs`` and the items of
    ``env.wrappers`` are values, not keys."""
    keys = set()
    for key, value in tree.items():
        path = f"{where}{key}"
        if isinstance(value, dict) and path != "env.kwargs" and value:
            keys |= dotted_keys(value, f"{path}.")
        else:
            keys.add(path)
    return keys


def name(path: Path) -> str:
    return path.name


def test_every_family_has_a_shipped_config() -> None:
    families = {raw(path).get("algorithm", Config.algorithm) for path in CONFIGS}
    assert families == set(ALGORITHM_CONFIGS)


@pytest.mark.parametrize("path", CONFIGS, ids=name)
def test_config_loads_and_validates(path: Path) -> None:
    cfg = load_config(path)
    assert isinstance(cfg.algo, ALGORITHM_CONFIGS[cfg.algorithm])
    assert cfg.run.stop_env_steps or cfg.run.stop_wall_s, "a shipped run stops by itself"


@pytest.mark.parametrize("path", CONFIGS, ids=name)
def test_config_names_its_algorithm_and_env(path: Path) -> None:
    """A reader sees what runs on what without knowing the defaults."""
    data = raw(path)
    assert data.get("algorithm") in ALGORITHM_CONFIGS
    assert "id" in data.get("env", {})
    assert path.read_text().startswith("# "), "a header says what the run is"


@pytest.mark.parametrize("path", CONFIGS, ids=name)
def test_config_is_short(path: Path) -> None:
    lines = path.read_text().splitlines()
    settings = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    assert len(settings) <= MAX_SETTING_LINES, f"{len(settings)} lines of settings"
    assert max(len(line) for line in lines) <= 100


@pytest.mark.parametrize("path", CONFIGS, ids=name)
def test_algo_keys_belong_to_the_family(path: Path) -> None:
    data = raw(path)
    cls = ALGORITHM_CONFIGS[data["algorithm"]]
    fields = {f.name for f in dataclasses.fields(cls)}
    assert set(data.get("algo") or {}) <= fields


def test_a_key_of_another_family_is_refused() -> None:
    """load_config itself refuses an algo key the family's class lacks, naming it."""
    with pytest.raises(ConfigError, match="algo.n_step"):
        load_config(REPO / "configs" / "ppo_cartpole.yaml", ["algo.n_step=3"])


@pytest.mark.parametrize("path", CONFIGS, ids=name)
def test_config_sets_no_key_its_run_ignores(path: Path) -> None:
    """Keys outside what the family reads (FAMILY_KEYS), or what the run's other settings make
    unread: priorities of a FIFO table, the FIFO's delivery count of a prioritized one, Atari
    preprocessing outside ALE ids, an LSTM's inputs without an LSTM."""
    cfg = load_config(path)
    keys = dotted_keys(raw(path))
    ignored = {key for key, families in FAMILY_KEYS.items() if cfg.algorithm not in families}
    if cfg.replay.kind == "fifo":
        ignored.add("replay.priority_exponent")
    else:
        ignored |= {"replay.max_times_sampled", "replay.evict_unread"}
    if not cfg.env.id.startswith("ALE/"):
        ignored |= {"replay.store_frames_once", "env.atari"}
        ignored |= {key for key in keys if key.startswith("env.atari.")}
    if getattr(cfg.algo, "lstm_size", None) == 0:
        ignored |= {"algo.prev_action_reward", "algo.shared_lstm"}
    assert not keys & ignored


def test_unroll_families_ignore_chunk_steps() -> None:
    """What FAMILY_KEYS says of actor.chunk_steps and actor.params_poll_steps, from the code."""
    for algo in (ImpalaConfig(), PPOConfig()):
        for method in ("items_per_chunk", "max_env_steps_per_chunk"):
            assert getattr(algo, method)(1, 8) == getattr(algo, method)(64, 8)
        assert algo.frames_per_item(4, 1) == algo.frames_per_item(4, 64)
    assert PPOConfig.SYNCHRONOUS and not ImpalaConfig.SYNCHRONOUS


def test_only_the_q_learners_read_the_epsilons() -> None:
    """The epsilon keys are read in one place, apex_dqn.actor_epsilon, which R2D2 imports."""
    reads = re.compile(r"\w\.actor\.(epsilon|epsilon_alpha|eval_epsilon)\b")
    readers = {
        str(path.relative_to(REPO))
        for path in (REPO / "apexrl").rglob("*.py")
        if path != REPO / "apexrl" / "config" / "__init__.py" and reads.search(path.read_text())
    }
    assert readers == {"apexrl/algos/apex_dqn.py"}
    assert "actor_epsilon" in (REPO / "apexrl" / "algos" / "r2d2.py").read_text()


@pytest.mark.parametrize("path", SWEEPS, ids=name)
def test_sweep_spec_resolves_its_base_config(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # a spec names its base config from the current directory
    spec = load_spec(path)
    assert (REPO / spec.config).is_file()
    base = check_spec(spec)  # every grid point and an example of each drawn key load
    assert base.algorithm == raw(REPO / spec.config)["algorithm"]
