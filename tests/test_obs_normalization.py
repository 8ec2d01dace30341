"""``algo.normalize_obs`` for Ape-X DQN, R2D2 and IMPALA, verified by learning: each family's
CartPole config on CartPole whose observations are ``obs * 1000 + 10000`` (a sensor's raw counts:
``tests.envs_for_tests:make_scaled_cartpole``), started with the launcher, solves it (a greedy mean
of 475 over 100 episodes) with the running statistics; the statistics are in the checkpoint (their
count and spread those of the scaled observations) and a resumed Ape-X run goes on from them.
Without the statistics the Ape-X and IMPALA configs do not learn it in four times the time that
they took with them (here: Ape-X solved it in 14 s with them, and its evaluation rounds reached
at most 151 in 120 s without; IMPALA 12 s, and at most 136 in 120 s, 9 at the end; R2D2 39 s with
them; one run each). (``slow``: CI runs it with the
learning runs.) The fast tests: the learner's merge of each batch's moments into its networks'
statistics, summed over ranks (R2D2's from its sequences' real steps only), and R2D2's network
standardising what its torso reads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, run_launcher

BUDGET_S = 120  # a run's stop_wall_s: CartPole unscaled takes Ape-X about 14 s, IMPALA 6 s
WITHOUT_S = 40  # the runs without statistics: about three times what the runs with them took
SCALED = [
    "env.id=tests.envs_for_tests:make_scaled_cartpole",
    "env.kwargs={scale: 1000.0, offset: 10000.0}",
]


def launch(
    config: str, run_dir: Path, *overrides: str, resume: bool = False, budget_s: float = BUDGET_S
) -> dict:
    args = ["--actors", "2", "--learners", "1", "--config", str(REPO / "configs" / config)]
    args += ["--run-dir", str(run_dir), *(["--resume"] if resume else [])]
    for override in (*SCALED, f"run.stop_wall_s={budget_s}", *overrides):
        args += ["--set", override]
    code, output = run_launcher(args, budget_s + 240)
    assert code == 0, output[-3000:]
    return json.loads((run_dir / "result.json").read_text().splitlines()[-1])


def statistics(run_dir: Path) -> dict[str, torch.Tensor]:
    """The learner's observation statistics in the run's checkpoint (Ape-X: the online
    network's)."""
    flat = _flat(torch.load(run_dir / "checkpoint.pt", weights_only=True)["algo"])
    counts = sorted(key for key in flat if key.endswith("normalizer.count"))
    assert counts, f"no normalizer in the checkpoint: {sorted(flat)[:10]}"
    prefix = counts[0].removesuffix("count")
    return {k.removeprefix(prefix): v for k, v in flat.items() if k.startswith(prefix)}


def _flat(state: object, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    if isinstance(state, dict):
        out = {}
        for key, value in state.items():
            out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {}


@pytest.mark.slow
@pytest.mark.parametrize(
    "config", ["apex_dqn_cartpole.yaml", "impala_cartpole.yaml", "r2d2_cartpole.yaml"]
)
def test_normalized_observations_learn_scaled_cartpole_and_survive_resume(
    tmp_path: Path, config: str
) -> None:
    with_stats = launch(config, tmp_path / "normalized", "algo.normalize_obs=true")
    print(
        f"\n{config} on CartPole in raw counts with normalize_obs: eval return "
        f"{with_stats['eval_return_mean']} (solved {with_stats['done']}, "
        f"{with_stats['time_s']:.0f} s, {with_stats['env_steps']} env steps)"
    )
    assert with_stats["done"] and with_stats["eval_return_mean"] >= 475.0, with_stats

    stats = statistics(tmp_path / "normalized")
    count = float(stats["count"][0])
    assert count > 1000, stats
    # CartPole's position and angle stay near 0; scaled by 1000 their spread is far above 1
    assert float(stats["var"].sqrt().max()) > 10.0, stats
    if config != "apex_dqn_cartpole.yaml":
        return
    # Resumed for 10 s more: Ape-X merges each batch's observations (one row per sampled item)
    # into the statistics, so the count grows by the samples trained on since, from where the
    # checkpoint left it (statistics that started over would lack the first run's count).
    resumed = launch(
        config, tmp_path / "normalized", "algo.normalize_obs=true", "run.stop_eval_return=null",
        f"run.stop_wall_s={with_stats['time_s'] + 10}", resume=True,
    )  # fmt: skip
    after = float(statistics(tmp_path / "normalized")["count"][0])
    trained = resumed["learner_samples"] - with_stats["learner_samples"]
    print(f"statistics' count {count:.0f}, then {after:.0f} after {trained} more samples")
    assert trained > 0 and abs(after - count - trained) < 0.05 * count, (count, after, trained)


@pytest.mark.slow
@pytest.mark.parametrize("config", ["apex_dqn_cartpole.yaml", "impala_cartpole.yaml"])
def test_without_statistics_the_scaled_cartpole_is_not_learned(tmp_path: Path, config: str) -> None:
    without = launch(
        config, tmp_path / "raw", "algo.normalize_obs=false", budget_s=WITHOUT_S
    )  # fmt: skip
    rounds = [
        json.loads(line).get("eval_return_mean")
        for line in (tmp_path / "raw" / "result.json").read_text().splitlines()
    ]
    best = max((r for r in rounds if r is not None), default=None)
    print(
        f"\n{config} on the scaled CartPole without normalize_obs: best evaluation round {best} "
        f"in {without['time_s']:.0f} s ({without['env_steps']} env steps)"
    )
    assert best is not None and best < 475.0, rounds  # evaluated, and never solved
    assert without["time_s"] >= WITHOUT_S - 1, without  # it ran its whole budget


def test_ape_x_merges_each_batchs_observation_statistics_into_both_networks() -> None:
    from apexrl.algos import SampledBatch
    from apexrl.algos.apex_dqn import ALGORITHM
    from apexrl.config import load_config
    from apexrl.models import NormalizedObsNetwork
    from apexrl.policy import env_spaces

    cfg = load_config(
        "configs/apex_dqn_cartpole.yaml", ["algo.normalize_obs=true", "algo.num_atoms=11"]
    )
    obs_space, action_space = env_spaces(cfg)
    core = ALGORITHM.learner_core(obs_space, action_space, cfg, torch.device("cpu"))
    assert isinstance(core.online, NormalizedObsNetwork) and core.online.num_atoms == 11
    n = 8
    obs = torch.arange(n * 4, dtype=torch.float32).view(n, 4) * 1000
    fields = {
        "obs": obs, "action": torch.zeros(n, dtype=torch.int64), "reward": torch.ones(n),
        "num_steps": torch.full((n,), 3), "next_obs": obs + 1,
        "terminated": torch.zeros(n, dtype=torch.bool),
        "truncated": torch.zeros(n, dtype=torch.bool),
    }  # fmt: skip
    core.agree(lambda values: values)
    assert core.online.normalizer.count.item() == 0  # nothing before a batch
    core.update(SampledBatch(np.arange(n), fields, np.full(n, 0.1), 100))
    core.agree(lambda values: values)  # the learner loop's next turn
    for net in (core.online, core.target):
        assert net.normalizer.count.item() == n
        assert torch.allclose(net.normalizer.mean, obs.mean(0))
        assert torch.allclose(net.normalizer.var, obs.var(0, unbiased=False))
    # a group of two: the ranks' moments are summed, every rank keeps the same
    core.update(SampledBatch(np.arange(n), fields, np.full(n, 0.1), 100))
    core.agree(lambda values: [2 * v for v in values])
    assert core.online.normalizer.count.item() == 3 * n


def test_impala_normalizes_flat_observations_and_refuses_images() -> None:
    from apexrl.algos.apex_dqn import ALGORITHM as APEX
    from apexrl.algos.impala import ALGORITHM as IMPALA
    from apexrl.config import load_config
    from apexrl.models import NormalizedObsNetwork
    from apexrl.policy import env_spaces

    cfg = load_config("configs/impala_cartpole.yaml", ["algo.normalize_obs=true"])
    net = IMPALA.make_network(*env_spaces(cfg), cfg)
    assert isinstance(net, NormalizedObsNetwork)
    minatar = load_config("configs/apex_dqn_minatar_breakout.yaml", ["algo.normalize_obs=true"])
    with pytest.raises(ValueError, match="algo.normalize_obs takes flat observations"):
        APEX.make_network(*env_spaces(minatar), minatar)


def test_r2d2_takes_statistics_from_real_steps_and_standardises_before_its_torso() -> None:
    from apexrl.algos.r2d2 import ALGORITHM
    from apexrl.config import load_config
    from apexrl.policy import env_spaces

    cfg = load_config("configs/r2d2_cartpole.yaml", ["algo.normalize_obs=true"])
    obs_space, action_space = env_spaces(cfg)
    core = ALGORITHM.learner_core(obs_space, action_space, cfg, torch.device("cpu"))
    assert core.online.normalizer is not None and core.target.normalizer is not None
    # Two sequences of L = 3 steps (obs [B, L + 1, 4]): the first has 3 real steps, the second 1
    # (its episode ended; the rest is padding, zeros). Only the 4 real steps' observations count.
    obs = torch.zeros(2, 4, 4)
    obs[0, :3] = torch.tensor([[1.0, 2, 3, 4], [3, 2, 1, 0], [5, 5, 5, 5]]) * 1000
    obs[0, 3] = 7777.0  # the step the last one led to: not a step of this sequence
    obs[1, 0] = torch.tensor([7.0, 0, 0, 1]) * 1000
    real = torch.tensor([[True, True, True], [True, False, False]])
    core.moments.add(obs, real)
    core.agree(lambda values: values)
    counted = torch.cat([obs[0, :3], obs[1, :1]])
    for net in (core.online, core.target):
        assert net.normalizer.count.item() == 4
        assert torch.allclose(net.normalizer.mean, counted.mean(0))
        assert torch.allclose(net.normalizer.var, counted.var(0, unbiased=False))
    # The network reads standardised observations: the same as a network without statistics
    # (the same weights) given them standardised by hand.
    unnormalized = load_config("configs/r2d2_cartpole.yaml")
    plain = ALGORITHM.make_network(obs_space, action_space, unnormalized)
    weights = {k: v for k, v in core.online.state_dict().items() if not k.startswith("normalizer")}
    plain.load_state_dict(weights)
    steps = obs[:, :3].transpose(0, 1)  # time-major [T, B, 4]
    prev_action, prev_reward = torch.zeros(3, 2, dtype=torch.int64), torch.zeros(3, 2)
    state = core.online.initial_state(2)
    standardised = (steps - counted.mean(0)) / torch.sqrt(counted.var(0, unbiased=False) + 1e-8)
    expected = plain(standardised.clamp(-10, 10), prev_action, prev_reward, state).q
    got = core.online(steps, prev_action, prev_reward, state).q
    assert torch.allclose(got, expected, atol=1e-5)
    assert "normalizer.mean" in core.online.state_dict(), "published with the weights"
    minatar = load_config("configs/r2d2_minatar_breakout.yaml", ["algo.normalize_obs=true"])
    with pytest.raises(ValueError, match="algo.normalize_obs takes flat observations"):
        ALGORITHM.make_network(*env_spaces(minatar), minatar)
