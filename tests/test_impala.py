"""IMPALA through the launcher a user runs: a short run ends by itself with the policy lag in
``result.json``, and two learners keep identical weights. APPO (``algo.clip_ratio``,
``algo.passes``): its loss and gradients against numbers worked by hand, the passes over a batch,
IMPALA's gradients unchanged by the defaults, and a short run."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from conftest import REPO
from test_algos import as_batch, collect, turn
from test_launch_local import Launch, launch  # noqa: F401 - the launcher fixture
from test_learner_group import launched_digests
from torch import Tensor, nn

from apexrl.algos import SampledBatch
from apexrl.algos.actor_critic import log_prob_and_entropy, next_values, time_major
from apexrl.algos.impala import ImpalaLearner
from apexrl.config import ConfigError, load_config
from apexrl.config.algos import ImpalaConfig
from apexrl.math import targets
from apexrl.models import CategoricalOutput

CONFIG = REPO / "configs" / "impala_cartpole.yaml"
# A run small enough for two cores; the SMALL_OVERRIDES of the fixture are Ape-X-shaped (batch 32
# items, min size 200), which the IMPALA config reads as unrolls.
IMPALA_SMALL = (
    "algo.hidden_sizes=[32]",
    "algo.unroll_length=8",
    "replay.capacity=256",
    "replay.min_size_to_sample=8",
    "learner.batch_size=8",
    "learner.publish_period=1",
)


def test_impala_short_run_ends_by_itself_with_its_policy_lag(
    launch: Callable[..., Launch],  # noqa: F811
) -> None:
    launched = launch(
        "--actors",
        "2",
        "--learners",
        "1",
        "--config",
        str(CONFIG),
        overrides=(*IMPALA_SMALL, "run.stop_env_steps=6000"),
    )
    code = launched.wait(120.0)
    assert code == 0, f"launcher exit code {code}\n{launched.tails()}"
    results = launched.results()
    last = results[-1]
    assert last["done"] is True and last["env_steps"] >= 6000, last
    assert last["learner_updates"] > 0 and "policy_lag" in last, last
    # Actors poll for weights every few steps and the queue holds at most a few unrolls: the
    # data the learner trains on is a few versions old, never hundreds.
    assert 0 <= last["policy_lag"] < 50, last
    assert launched.run_dir().name.startswith("impala-CartPole-v1-")


def test_impala_with_two_learners_keeps_identical_weights(
    launch: Callable[..., Launch],  # noqa: F811
) -> None:
    launched = launch(
        "--actors",
        "2",
        "--learners",
        "2",
        "--no-eval",
        "--config",
        str(CONFIG),
        overrides=(*IMPALA_SMALL, "run.stop_env_steps=6000"),
    )
    code = launched.wait(180.0)
    assert code == 0, f"launcher exit code {code}\n{launched.tails()}"
    digests = launched_digests(launched.run_dir() / "logs", 2)
    assert int(digests[0][0]) > 0
    assert digests[0] == digests[1], digests  # same number of updates, same weights


def test_appo_short_run_makes_updates(launch: Callable[..., Launch]) -> None:  # noqa: F811
    launched = launch(
        "--actors",
        "2",
        "--learners",
        "1",
        "--no-eval",
        "--config",
        str(CONFIG),
        overrides=(
            *IMPALA_SMALL,
            "algo.clip_ratio=0.3",
            "algo.passes=2",
            "run.stop_env_steps=3000",
        ),
    )
    code = launched.wait(120.0)
    assert code == 0, f"launcher exit code {code}\n{launched.tails()}"
    last = launched.results()[-1]
    assert last["done"] is True and last["learner_updates"] > 0, last


@pytest.mark.parametrize(
    "override, message",
    [
        ("algo.clip_ratio=-0.1", "algo.clip_ratio must be >= 0"),
        ("algo.passes=0", "algo.passes must be >= 1"),
    ],
)
def test_appo_keys_are_validated(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(CONFIG, [override])


class ConstantPolicy(nn.Module):
    """pi = softmax(logits) and V = value whatever the observation: a learner worked by hand."""

    def __init__(self, logits: list[float], value: float) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.tensor(logits))
        self.value = nn.Parameter(torch.tensor(value))

    def forward(self, obs: Tensor) -> CategoricalOutput:
        lead = obs.shape[:-1]
        return CategoricalOutput(self.logits.expand(*lead, -1), self.value.expand(lead))


def two_step_batch() -> SampledBatch:
    """One unroll of T = 2 steps, actions 0 then 1, rewards 1 and 1, no episode end, acted by mu
    with mu(0 | s_0) = 0.25 and mu(1 | s_1) = 0.625."""
    fields = {
        "obs": torch.zeros(1, 2, 1),
        "action": torch.tensor([[0, 1]]),
        "reward": torch.tensor([[1.0, 1.0]]),
        "terminated": torch.tensor([[False, False]]),
        "truncated": torch.tensor([[False, False]]),
        "next_obs": torch.zeros(1, 2, 1),
        "behaviour_logp": torch.log(torch.tensor([[0.25, 0.625]])),
        "value": torch.ones(1, 2),
        "weights_version": torch.zeros(1, 2, dtype=torch.int64),
    }
    return SampledBatch(np.arange(1), fields, np.ones(1), 1)


@pytest.mark.parametrize("clip_ratio", [0.25, 0.0])
def test_appo_loss_and_gradient_hand_worked(clip_ratio: float) -> None:
    # pi = (0.5, 0.5) (zero logits), V = 1 everywhere, gamma = 0.5, rho-bar = c-bar = 1:
    #   rho = pi / mu = 0.5 / 0.25 = 2 at step 0, 0.5 / 0.625 = 0.8 at step 1
    #   delta_1 = 0.8 * (1 + 0.5 * 1 - 1) = 0.4           v_1 = 1 + 0.4 = 1.4
    #   delta_0 = 1 * (1 + 0.5 * 1 - 1) = 0.5             v_0 = 1 + 0.5 + 0.5 * 1 * 0.4 = 1.7
    #   A_0 = min(1, 2) * (1 + 0.5 * 1.4 - 1) = 0.7        A_1 = 0.8 * (1 + 0.5 * 1 - 1) = 0.4
    # APPO, clip 0.25: the ratio 2 is clipped to 1.25 (A_0 > 0), 0.8 is inside [0.75, 1.25]:
    #   pg_loss = -(1.25 * 0.7 + 0.8 * 0.4) / 2 = -0.5975
    #   d pg_loss / d logits: only step 1 (step 0 is clipped); d pi(1) / d logits = 0.5 *
    #   ((0, 1) - (0.5, 0.5)) = (-0.25, 0.25), so -1/2 * 0.4 / 0.625 * (-0.25, 0.25) = (0.08, -0.08)
    # IMPALA: pg_loss = -(0.7 * ln 0.5 + 0.4 * ln 0.5) / 2 = 0.55 ln 2, and with
    #   d ln pi(a) / d logits = e_a - pi: -1/2 * (0.7 * (0.5, -0.5) + 0.4 * (-0.5, 0.5))
    #   = (-0.075, 0.075)
    # Both: baseline 0.5 * (0.7 ** 2 + 0.4 ** 2) / 2 = 0.1625, entropy ln 2 (gradient 0 at the
    # uniform policy); d/dV of 0.5 * baseline = 0.5 * 0.5 * 2 * (-(0.7 + 0.4)) / 2 = -0.275.
    cfg = ImpalaConfig(gamma=0.5, clip_ratio=clip_ratio, baseline_cost=0.5, entropy_cost=0.01)
    network = ConstantPolicy([0.0, 0.0], 1.0)
    learner = ImpalaLearner(network, cfg, torch.device("cpu"))
    result = learner.compute_gradients(two_step_batch())
    assert result is not None
    pg_loss, logits_grad = (
        (-0.5975, [0.08, -0.08]) if clip_ratio else (0.55 * math.log(2), [-0.075, 0.075])
    )
    m = result.metrics
    assert m["learner/pg_loss"] == pytest.approx(pg_loss, rel=1e-6)
    assert m["learner/baseline_loss"] == pytest.approx(0.1625, rel=1e-6)
    assert m["learner/loss"] == pytest.approx(pg_loss + 0.5 * 0.1625 - 0.01 * math.log(2), rel=1e-6)
    assert network.logits.grad.tolist() == pytest.approx(logits_grad, abs=1e-6)
    assert float(network.value.grad) == pytest.approx(-0.275, rel=1e-6)
    if clip_ratio:
        assert m["learner/clip_fraction"] == 0.5  # step 0 of the two


def impala_learner(*overrides: str) -> tuple[ImpalaLearner, list]:
    """A learner of the CartPole config (small) and two chunks of real unrolls."""
    cfg = load_config(CONFIG, ["algo.hidden_sizes=[16]", "env.num_envs=4", *overrides])
    algorithm, spaces, chunks = collect(cfg, num_blocks=2, version=0)
    return algorithm.learner_core(*spaces, cfg, torch.device("cpu")), chunks


def test_appo_passes_take_that_many_steps_on_one_batch() -> None:
    learner, chunks = impala_learner("algo.clip_ratio=0.3", "algo.passes=3")
    batch = as_batch(chunks)
    for k in range(3):
        if k == 1:  # every pass is computed afresh with the current network, V-trace included
            fresh = copy.deepcopy(learner)
            fresh.passes_left, fresh.fields, fresh.waiting = 0, {}, None
            expected = turn(fresh, batch).metrics
        result = turn(learner, batch if k == 0 else None)
        assert result is not None
        if k == 1:
            assert result.metrics == expected
        learner.apply_gradients()
        assert learner.num_updates == k + 1 and learner.has_work == (k < 2)
    assert turn(learner, None) is None and learner.num_updates == 3


def test_appo_holds_one_batch_while_another_trains_and_leaves_the_rest_in_replay() -> None:
    learner, chunks = impala_learner("algo.passes=3")
    a = as_batch(chunks)
    versions = {}
    for v in (1, 2):
        fields = {**a.fields, "weights_version": torch.full_like(a.fields["weights_version"], v)}
        versions[v] = a._replace(fields=fields)
    arriving = [a, versions[1], versions[2]]
    trained, asked = [], []  # each step's batch version (from its policy lag); wants_batch
    for _ in range(10):
        asked.append(learner.wants_batch)
        # The learner loop takes a batch from replay only while the core wants one.
        result = turn(learner, arriving.pop(0) if learner.wants_batch and arriving else None)
        if result is None:
            break
        trained.append(learner.num_updates - result.metrics["learner/policy_lag"])
        learner.apply_gradients()
    # Every batch three times, in order: none dropped; after the first two arrived, the third
    # waited in replay until the first was done.
    assert trained == [0, 0, 0, 1, 1, 1, 2, 2, 2] and not learner.has_work
    assert asked[:4] == [True, True, False, False], asked
    with pytest.raises(RuntimeError, match="while another was waiting"):
        turn(learner, a)
        turn(learner, a)
        turn(learner, a)


def todays_impala_gradients(network: nn.Module, fields: dict[str, Tensor], cfg: ImpalaConfig):
    """IMPALA's loss as apexrl computed it before APPO: the reference for the defaults."""
    f = time_major(fields)
    out = network(f["obs"])
    with torch.no_grad():
        v_t = network(f["next_obs"]).value
    logp, entropy = log_prob_and_entropy(out, f["action"], cfg.squash_actions)
    terminated = f["terminated"].bool()
    vt = targets.vtrace(
        f["reward"].float(),
        out.value.detach(),
        v_t,
        cfg.gamma * (~terminated).float(),
        terminated | f["truncated"].bool(),
        logp.detach() - f["behaviour_logp"],
        clip_rho=cfg.clip_rho,
        clip_c=cfg.clip_c,
        clip_pg_rho=cfg.clip_pg_rho,
    )
    pg_loss = -(vt.pg_advantage * logp).mean()
    baseline_loss = 0.5 * (vt.vs - out.value).pow(2).mean()
    loss = pg_loss + cfg.baseline_cost * baseline_loss - cfg.entropy_cost * entropy.mean()
    network.zero_grad(set_to_none=True)
    loss.backward()
    return {name: p.grad for name, p in network.named_parameters()}


def test_impala_defaults_give_todays_gradients_exactly() -> None:
    learner, chunks = impala_learner()
    assert learner.cfg.clip_ratio == 0 and learner.cfg.passes == 1
    batch = as_batch(chunks)
    reference = todays_impala_gradients(copy.deepcopy(learner.network), batch.fields, learner.cfg)
    assert turn(learner, batch) is not None
    for name, p in learner.network.named_parameters():
        assert torch.equal(p.grad, reference[name]), name
    assert not learner.has_work
    learner.apply_gradients()
    assert turn(learner, None) is None and learner.num_updates == 1


class _Values(nn.Module):
    """V(x) = the sum of x's entries; records how many observations each call evaluated."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[int] = []

    def forward(self, obs: Tensor) -> CategoricalOutput:
        self.rows.append(int(obs.shape[0]))
        return CategoricalOutput(logits=torch.zeros(*obs.shape[:-1], 2), value=obs.sum(-1))


def test_next_values_reuse_the_next_steps_values_within_an_episode() -> None:
    # One env, T = 4, observations are 1-vectors: the episode ends after step 1 (the env reset
    # to [10.0]), so next_obs[1] = [7.0] (the final one) differs from obs[2] = [10.0].
    obs = torch.tensor([[[1.0]], [[2.0]], [[10.0]], [[11.0]]])
    next_obs = torch.tensor([[[2.0]], [[7.0]], [[11.0]], [[12.0]]])
    values = torch.tensor([[100.0], [200.0], [300.0], [400.0]])  # the network's V(obs), given
    net = _Values()
    got = next_values(values, obs, next_obs, net)
    # t=0: V(obs[1]) = 200 from values; t=1: V([7]) = 7 by the network; t=2: values[3] = 400;
    # t=3 (the unroll's last step): V([12]) = 12 by the network.
    assert got.tolist() == [[200.0], [7.0], [400.0], [12.0]]
    assert net.rows == [2]  # only the two observations nobody had evaluated


def test_next_values_equal_a_forward_pass_over_next_obs() -> None:
    torch.manual_seed(0)
    from apexrl.models.actor_critic import ImageActorCritic

    net = ImageActorCritic((4, 42, 42), 6, torso="small_cnn")
    frames = torch.randint(0, 256, (12, 3, 42, 42), dtype=torch.uint8)  # [T + 4, N, H, W]
    obs = torch.stack([frames[t : t + 4].transpose(0, 1) for t in range(8)])  # [T, N, 4, H, W]
    next_obs = torch.stack([frames[t + 1 : t + 5].transpose(0, 1) for t in range(8)])
    assert torch.equal(next_obs[:-1], obs[1:])  # stacks sharing 3 frames, as actors make them
    next_obs[3, 1] = torch.randint(0, 256, (4, 42, 42), dtype=torch.uint8)  # an episode's end
    with torch.no_grad():
        values = net(obs).value
        got = next_values(values, obs, next_obs, net)
        want = net(next_obs).value
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
