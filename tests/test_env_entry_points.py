"""Any env (``env.id``, ``env.kwargs``, ``env.wrappers``): a registered gymnasium id or a user's
``module:function`` / ``module:Class`` entry point, wrapped in gymnasium wrappers named in the
config; whatever cannot be made is one error line that names it, in ``apexrl.envs``, at the
launcher's preflight and in a role (exit 2); and a PPO run on CartPole made by a user's function
and limited by a wrapper from the config learns through the launcher.

The entry points live in ``tests/envs_for_tests.py``, imported as ``tests.envs_for_tests`` with
the repository on the path, as the launcher's roles have it (``PYTHONPATH``)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import builders
import gymnasium as gym
import numpy as np
import pytest
from conftest import REPO, free_addr, run_launcher
from gymnasium.vector import AutoresetMode
from test_launch_local import Launch, launch  # noqa: F401 - the fixture

from apexrl.config import Config, ConfigError, EnvConfig, WrapperConfig, load_config
from apexrl.envs import (
    EnvError,
    check_env,
    env_modules,
    make_env,
    make_vector_env,
    resolve_env_id,
    step_vector,
)

ENVS = "tests.envs_for_tests"
PPO_CONFIG = REPO / "configs" / "ppo_cartpole.yaml"


@pytest.fixture(autouse=True)
def repo_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tests.envs_for_tests`` importable here as in the roles (the repository on the path)."""
    monkeypatch.syspath_prepend(str(REPO))


# --- the config ----------------------------------------------------------------------------------


def test_the_env_section_reads_an_entry_point_its_kwargs_and_wrappers(tmp_path: Path) -> None:
    path = builders.write_config(
        tmp_path,
        "env:\n"
        f"  id: {ENVS}:Corridor\n"
        "  kwargs: {length: 5}\n"
        "  wrappers:\n"
        "    - {name: TimeLimit, kwargs: {max_episode_steps: 200}}\n"
        f"    - {{name: '{ENVS}:AddToReward', kwargs: {{bonus: 0.5}}}}\n",
    )
    cfg = load_config(path)
    assert cfg.env.id == f"{ENVS}:Corridor"
    assert cfg.env.kwargs == {"length": 5}
    assert cfg.env.wrappers == (
        WrapperConfig("TimeLimit", {"max_episode_steps": 200}),
        WrapperConfig(f"{ENVS}:AddToReward", {"bonus": 0.5}),
    )
    # The run's config.yaml (written by the learner) reads back to the same config.
    again = builders.write_config(tmp_path, cfg, "again.yaml")
    assert load_config(again) == cfg
    # Overrides reach into kwargs and replace the wrapper list.
    cfg = load_config(path, ["env.kwargs.length=9", "env.wrappers=[{name: FlattenObservation}]"])
    assert cfg.env.kwargs == {"length": 9}
    assert cfg.env.wrappers == (WrapperConfig("FlattenObservation", {}),)


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "env.wrappers=[{nam: TimeLimit}]",
            "unknown config key 'env.wrappers[0].nam'; did you mean 'env.wrappers[0].name'?",
        ),
        ("env.wrappers=[TimeLimit]", "env.wrappers[0] must be a mapping, got 'TimeLimit' (str)"),
        (
            "env.wrappers=[{name: not a class}]",
            "env.wrappers[0].name must be module:Class or a class name of gymnasium.wrappers, "
            "got 'not a class'",
        ),
        ("env.id=", "env.id must not be empty"),
        ("env.id=my-pkg:make", "env.id must look like package.module:Name, got 'my-pkg:make'"),
        ("env.kwargs=[1, 2]", "env.kwargs must be dict, got [1, 2] (list)"),
        ("env.kwargs={size: {1: 2}}", "env.kwargs.size: keys must be strings, got 1"),
        (
            "env.kwargs={day: 2026-01-01}",
            "env.kwargs.day must be plain YAML data (numbers, strings, lists, mappings), got "
            "datetime.date(2026, 1, 1) (date)",
        ),
        (
            "env.max_episode_steps=-1",
            "env.max_episode_steps must be >= 0 (0: the env's own), got -1",
        ),
    ],
)
def test_a_malformed_env_section_is_a_config_error(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, [override])
    assert str(caught.value) == expected


# --- resolution -----------------------------------------------------------------------------------


def test_an_env_id_resolves_to_a_registered_id_or_the_entry_point() -> None:
    from tests import envs_for_tests

    assert resolve_env_id("CartPole-v1") == "CartPole-v1"
    assert resolve_env_id(f"{ENVS}:make_corridor") is envs_for_tests.make_corridor
    assert resolve_env_id(f"{ENVS}:Corridor") is envs_for_tests.Corridor
    # gymnasium's own form: import the module that registers the id, then make the id.
    assert resolve_env_id("gymnasium.envs.classic_control:CartPole-v1") == "CartPole-v1"


def test_the_modules_that_making_the_envs_imports_are_named_for_the_fork_server() -> None:
    assert env_modules(EnvConfig(id="CartPole-v1")) == ["gymnasium.envs.classic_control.cartpole"]
    assert env_modules(EnvConfig(id="CartPol-v1")) == []
    wrappers = (WrapperConfig("TimeLimit"), WrapperConfig(f"{ENVS}:AddToReward"))
    assert env_modules(EnvConfig(id=f"{ENVS}:make_cartpole", wrappers=wrappers)) == [ENVS]


def walk_right(env: gym.Env, steps: int) -> list[tuple]:
    env.reset(seed=0)
    return [env.step(1)[1:4] for _ in range(steps)]  # (reward, terminated, truncated)


def test_a_function_entry_point_gets_its_kwargs() -> None:
    env = make_env(EnvConfig(id=f"{ENVS}:make_corridor", kwargs={"length": 4}))
    # From cell 0, the last cell (3) is 3 steps to the right.
    assert walk_right(env, 3) == [(0.0, False, False), (0.0, False, False), (1.0, True, False)]


def test_a_class_entry_point_gets_the_step_limit_and_wrappers_first_innermost() -> None:
    cfg = EnvConfig(
        id=f"{ENVS}:Corridor",
        kwargs={"length": 10},
        max_episode_steps=5,
        wrappers=(
            WrapperConfig(f"{ENVS}:AddToReward", {"bonus": 0.5}),
            WrapperConfig("TimeLimit", {"max_episode_steps": 3}),
        ),
    )
    env = make_env(cfg)
    # TimeLimit(3) outside AddToReward outside TimeLimit(5) (env.max_episode_steps) outside
    # the corridor: the third step truncates, every reward is 0 + 0.5.
    assert walk_right(env, 3) == [(0.5, False, False), (0.5, False, False), (0.5, False, True)]
    assert isinstance(env, gym.wrappers.TimeLimit) and env._max_episode_steps == 3
    assert env.env.bonus == 0.5
    assert env.env.env._max_episode_steps == 5


def test_wrappers_apply_to_each_env_of_a_same_step_sync_vector_env() -> None:
    cfg = EnvConfig(
        id=f"{ENVS}:make_cartpole",
        wrappers=(
            WrapperConfig("TimeLimit", {"max_episode_steps": 4}),
            WrapperConfig(f"{ENVS}:AddToReward", {"bonus": 1.0}),
        ),
    )
    envs = make_vector_env(cfg, 8)  # 8 CartPoles would get the numpy vector env as an id
    assert isinstance(envs, gym.vector.SyncVectorEnv)
    assert envs.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    envs.reset(seed=0)
    steps = [step_vector(envs, np.zeros(8, dtype=np.int64)) for _ in range(4)]
    # Pushing left 4 times keeps the pole up; the 4th step truncates every env, which resets in
    # the same step (a fresh observation near 0, the final one further left).
    assert all((s.reward == 1.0 + 1.0).all() for s in steps)
    assert not any(s.terminated.any() for s in steps)
    assert [bool(s.truncated.all()) for s in steps] == [False, False, False, True]
    assert (np.abs(steps[-1].obs) <= 0.05).all()
    assert (steps[-1].next_obs != steps[-1].obs).all()
    envs.close()


def test_the_preflight_check_makes_and_resets_an_entry_point_env() -> None:
    check_env(Config(env=EnvConfig(id=f"{ENVS}:make_corridor", kwargs={"length": 2})))


# --- one clear line for what cannot be made ------------------------------------------------------


def error_line(cfg: EnvConfig) -> str:
    with pytest.raises(EnvError) as caught:
        make_vector_env(cfg, 2)
    line = str(caught.value)
    assert "\n" not in line
    return line


BROKEN = str(REPO / "tests" / "envs_for_tests.py")


@pytest.mark.parametrize(
    "cfg, expected",
    [
        (
            EnvConfig(id="CartPol-v1"),
            "cannot make environment 'CartPol-v1': no gymnasium id of that name is registered; "
            "did you mean CartPole-v1?",
        ),
        (
            EnvConfig(id="NoSuchEnv-v0"),
            "cannot make environment 'NoSuchEnv-v0': no gymnasium id of that name is registered "
            "(an entry point is written module:function or module:Class)",
        ),
        (
            EnvConfig(id="no_such_pkg.envs:make"),
            "env.id 'no_such_pkg.envs:make': no module named 'no_such_pkg' (is its package "
            "installed, or its directory on PYTHONPATH?)",
        ),
        (
            EnvConfig(id=f"{ENVS}:make_corrido"),
            f"env.id '{ENVS}:make_corrido': module '{ENVS}' has no 'make_corrido'; did you mean "
            f"{ENVS}:make_corridor?",
        ),
        (
            EnvConfig(id=f"{ENVS}:NOT_CALLABLE"),
            f"env.id '{ENVS}:NOT_CALLABLE' is not callable (type int); name a gymnasium.Env "
            "class or a function that returns one",
        ),
        (
            EnvConfig(id=f"{ENVS}:not_an_env"),
            f"env.id '{ENVS}:not_an_env' returned an object of type list, not a gymnasium.Env",
        ),
        (
            EnvConfig(id=f"{ENVS}:broken_env", kwargs={"size": 0}),
            f"env.id '{ENVS}:broken_env' with kwargs {{'size': 0}} failed: ValueError: size 0 is "
            f"too small ({BROKEN}:",  # and the line of the user's code
        ),
        (
            EnvConfig(id=f"{ENVS}:make_corridor", kwargs={"size": 3}),
            f"env.id '{ENVS}:make_corridor' with kwargs {{'size': 3}} failed: TypeError: "
            "make_corridor() got an unexpected keyword argument 'size'",
        ),
        (
            EnvConfig(id="CartPole-v1", kwargs={"size": 3}),
            "cannot make environment 'CartPole-v1' with kwargs {'size': 3}: TypeError: "
            "CartPoleEnv.__init__() got an unexpected keyword argument 'size'",
        ),
        (
            EnvConfig(wrappers=(WrapperConfig("TimeLimt"),)),
            "env.wrappers[0] 'gymnasium.wrappers:TimeLimt': module 'gymnasium.wrappers' has no "
            "'TimeLimt'; did you mean gymnasium.wrappers:TimeLimit?",
        ),
        (
            EnvConfig(wrappers=(WrapperConfig(f"{ENVS}:make_cartpole"),)),
            f"env.wrappers[0] '{ENVS}:make_cartpole' is not a gymnasium.Wrapper subclass",
        ),
        (
            EnvConfig(wrappers=(WrapperConfig("TimeLimit", {"max_steps": 3}),)),
            "env.wrappers[0] 'TimeLimit' with kwargs {'max_steps': 3} failed: TypeError: "
            "TimeLimit.__init__() got an unexpected keyword argument 'max_steps'",
        ),
        (
            EnvConfig(wrappers=(WrapperConfig("no_such_pkg:Wrapper"),)),
            "env.wrappers[0] 'no_such_pkg:Wrapper': no module named 'no_such_pkg' (is its "
            "package installed, or its directory on PYTHONPATH?)",
        ),
    ],
    ids=lambda value: value.id if isinstance(value, EnvConfig) else "",
)
def test_what_cannot_be_made_is_one_line_naming_it(cfg: EnvConfig, expected: str) -> None:
    assert error_line(cfg).startswith(expected)


# --- exit 2 before anything starts, and in a role ------------------------------------------------


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (("env.id=CartPol-v1",), "did you mean CartPole-v1?"),
        ((f"env.id={ENVS}:no_such_env",), f"module '{ENVS}' has no 'no_such_env'"),
        (
            (f"env.wrappers=[{{name: '{ENVS}:make_corridor'}}]",),
            f"env.wrappers[0] '{ENVS}:make_corridor' is not a gymnasium.Wrapper subclass",
        ),
    ],
    ids=["unknown_id", "missing_attribute", "not_a_wrapper"],
)
def test_the_launcher_fails_with_one_line_before_anything_starts(
    launch: Callable[..., Launch],  # noqa: F811
    overrides: tuple[str, ...],
    expected: str,
) -> None:
    launched = launch("--actors", "1", "--learners", "1", overrides=overrides)
    code = launched.wait(60.0)
    assert code == 2, f"exit code {code}\n{launched.log()}"
    lines = launched.log().strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], lines
    assert not launched.logdir.exists(), "a failed launch left a run directory"


@pytest.mark.parametrize("role", ["actor", "learner"])
def test_a_role_given_an_env_it_cannot_make_exits_2_with_the_line(
    role: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl",
            role,
            "--config",
            str(PPO_CONFIG),
            "--run-dir",
            str(tmp_path / "run"),
            "--replay",
            free_addr(),
            "--params",
            free_addr(),
            "--set",
            f"env.id={ENVS}:not_an_env",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert (
        f"apexrl {role}: error: env.id '{ENVS}:not_an_env' returned an object of type list, "
        "not a gymnasium.Env"
    ) in done.stderr
    assert "Traceback" not in done.stderr


# --- a real run ---------------------------------------------------------------------------------

STEP_LIMIT = 200  # the wrapper's (CartPole-v1's own is 500)
STOP_ENV_STEPS = 20_000  # PPO solves CartPole-v1 (475 over 100 episodes) in about 15k


@pytest.mark.slow  # a learning run
def test_ppo_learns_cartpole_made_by_an_entry_point_and_limited_by_a_wrapper(
    tmp_path: Path,
) -> None:
    """CartPole-v1 made by the user's ``make_cartpole`` and cut to 200 steps by a ``TimeLimit``
    from the config, in every actor and the evaluation actor: the return of the sampled policy
    rises from a random policy's ~22 to more than 100 in 20k env steps, and no return of
    training or evaluation exceeds the wrapper's 200."""
    code, output = run_launcher(
        [
            "--actors",
            "2",
            "--learners",
            "1",
            "--config",
            str(PPO_CONFIG),
            "--logdir",
            str(tmp_path),
            "--set",
            f"env.id={ENVS}:make_cartpole",
            "--set",
            f"env.wrappers=[{{name: TimeLimit, kwargs: {{max_episode_steps: {STEP_LIMIT}}}}}]",
            "--set",
            f"run.stop_env_steps={STOP_ENV_STEPS}",
            "--set",
            "run.stop_eval_return=null",
            "--set",
            "run.stop_wall_s=600",
            "--set",
            "actor.report_interval_s=0.5",
            "--set",
            "learner.report_interval_s=1",
        ],
        720,
    )
    assert code == 0, output[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert load_config(run_dir / "config.yaml").env.wrappers == (
        WrapperConfig("TimeLimit", {"max_episode_steps": STEP_LIMIT}),
    )
    results = [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]
    training = [r["episode_return_mean"] for r in results if r["episode_return_mean"]]
    evaluation = [r["eval_return_mean"] for r in results if r["eval_return_mean"]]
    last = results[-1]
    print(
        f"\n{run_dir.name}: env steps {last['env_steps']}, updates {last['learner_updates']}, "
        f"training returns {training}, evaluation returns {evaluation}"
    )
    assert last["done"] is True and last["env_steps"] >= STOP_ENV_STEPS, last
    assert last["learner_updates"] >= 10, last
    assert training[0] < 50 < 100 < training[-1], training
    assert evaluation, "the evaluation actor played no round"
    assert max(training + evaluation) <= STEP_LIMIT, (training, evaluation)
