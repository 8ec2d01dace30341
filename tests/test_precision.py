"""``apexrl.models.precision``: bf16 autocast against fp32 for one update of every family, from
the same weights and batch on MinAtar frames (a convolutional torso) and CartPole (an MLP); the
hooks' float32 outputs, their behaviour when a forward raises, NHWC pixels, the CPU flags and what
each setting chooses."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from test_algos import REPO, as_batch, collect

from apexrl.config import load_config
from apexrl.models import precision
from apexrl.models.actor_critic import build_policy_network
from apexrl.models.precision import Precision
from apexrl.models.q import QOutput
from apexrl.models.recurrent import LSTMState, RecurrentQOutput
from apexrl.models.torsos import set_channels_last

BF16 = Precision(torch.bfloat16, "cpu", channels_last=True, reason="test")
# One update in bf16 against fp32, from the same weights and batch: bf16 keeps 8 bits of
# mantissa (a relative step of 2^-8 = 0.4 %), and the loss and gradient sum over many of them.
LOSS_RTOL = 0.03  # |loss_bf16 - loss_fp32| <= 3 % of |loss_fp32| (+ 1e-3 absolute)
GRAD_COSINE = 0.99  # the whole gradient vectors point the same way
GRAD_NORM_RTOL = 0.05  # and their lengths agree within 5 %


def first_gradient(cfg, spaces, batch, numerics: Precision | None):
    """The learner core's first gradient and loss on ``batch``, with fresh seeded weights."""
    torch.manual_seed(0)
    core = load_algorithm_core(cfg, spaces)
    if numerics is not None:
        for network in precision.networks_of(core):
            precision.apply(network, numerics)
    for _ in range(3):  # PPO takes in the rollout on the first turn and steps from the next
        core.agree(lambda values: values)
        result = core.compute_gradients(batch)
        if result is not None:
            break
    grads = torch.cat([p.grad.flatten() for p in core.network.parameters() if p.grad is not None])
    return result.metrics["learner/loss"], grads


def load_algorithm_core(cfg, spaces):
    from apexrl.algos import load_algorithm

    return load_algorithm(cfg.algorithm).learner_core(*spaces, cfg, torch.device("cpu"))


@pytest.mark.parametrize(
    "config",
    [
        "apex_dqn_minatar_breakout",
        "r2d2_minatar_breakout",
        "impala_minatar_breakout",
        "ppo_minatar_breakout",
        "apex_dqn_cartpole",
        "ppo_cartpole",
    ],
)
def test_one_update_in_bf16_is_the_fp32_update_within_tolerance(config: str) -> None:
    overrides = ["env.num_envs=4", "actor.num_actors=1"]
    if config.startswith("r2d2"):
        overrides += ["algo.sequence_length=20", "algo.sequence_overlap=10", "algo.burn_in=5"]
    cfg = load_config(REPO / "configs" / f"{config}.yaml", overrides)
    blocks = 2 if not config.startswith("r2d2") else 8
    algorithm, spaces, chunks = collect(cfg, num_blocks=blocks, version=0)
    chunks = [c for c in chunks if len(next(iter(c[0].values())))]
    batch = as_batch(chunks)
    loss32, grad32 = first_gradient(cfg, spaces, batch, None)
    loss16, grad16 = first_gradient(cfg, spaces, batch, BF16)
    assert np.isfinite(loss16) and torch.isfinite(grad16).all()
    assert abs(loss16 - loss32) <= LOSS_RTOL * abs(loss32) + 1e-3, (loss16, loss32)
    cosine = float(torch.nn.functional.cosine_similarity(grad16, grad32, dim=0))
    norm_ratio = float(grad16.norm() / grad32.norm())
    assert cosine >= GRAD_COSINE, cosine
    assert abs(norm_ratio - 1.0) <= GRAD_NORM_RTOL, norm_ratio
    print(
        f"{config}: loss {loss32:.5f} -> {loss16:.5f}, cosine {cosine:.5f}, norm {norm_ratio:.4f}"
    )


def test_outputs_leave_the_network_in_float32_and_the_weights_stay_as_they_are() -> None:
    torch.manual_seed(0)
    net = build_policy_network((4, 84, 84), num_actions=6, torso="nature_cnn")
    names = {name: p.dtype for name, p in net.named_parameters()}
    obs = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        expected = net(obs)
        precision.apply(net, BF16)
        out = net(obs)
    assert out.logits.dtype == out.value.dtype == torch.float32
    assert {name: p.dtype for name, p in net.named_parameters()} == names
    torch.testing.assert_close(out.logits, expected.logits, rtol=0.05, atol=0.02)
    assert not torch.is_autocast_enabled("cpu"), "autocast left on after the forward"


def test_a_forward_that_raises_leaves_autocast_off() -> None:
    net = build_policy_network((4, 84, 84), num_actions=6, torso="nature_cnn")
    precision.apply(net, BF16)
    with pytest.raises(RuntimeError, match="invalid for input"):
        net(torch.zeros(2, 3, 84, 84, dtype=torch.uint8))  # a wrong shape
    assert not torch.is_autocast_enabled("cpu")


def test_nested_outputs_are_cast_and_keep_their_types() -> None:
    out = RecurrentQOutput(
        q=torch.ones(2, 3, dtype=torch.bfloat16),
        state=LSTMState(torch.ones(1, 4, dtype=torch.bfloat16), torch.ones(1, 4)),
    )
    cast = precision.float32_outputs(out)
    assert type(cast) is RecurrentQOutput and type(cast.state) is LSTMState
    assert cast.q.dtype == cast.state.h.dtype == cast.state.c.dtype == torch.float32
    ints = precision.float32_outputs(QOutput(q=torch.ones(2, dtype=torch.int64)))
    assert ints.q.dtype == torch.int64  # integers stay integers


def test_nhwc_pixels_give_the_same_features() -> None:
    torch.manual_seed(0)
    net = build_policy_network((4, 84, 84), num_actions=6, torso="nature_cnn")
    obs = torch.randint(0, 256, (4, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        nchw = net(obs).logits
        set_channels_last(net, True)
        nhwc = net(obs).logits
    torch.testing.assert_close(nhwc, nchw, rtol=1e-5, atol=1e-6)


def test_cpu_flags_are_read_from_cpuinfo() -> None:
    assert precision.cpu_bf16_flags("flags : fpu avx512f amx_bf16 amx_tile") == ["amx_bf16"]
    assert precision.cpu_bf16_flags("flags : fpu avx2") == []


def test_each_setting_chooses_within_what_it_allows(caplog: pytest.LogCaptureFixture) -> None:
    cpu = torch.device("cpu")
    net = build_policy_network((4, 42, 42), num_actions=6, torso="nature_cnn")
    torso, shape, dtype = net.torso, (4, 42, 42), np.dtype(np.uint8)
    fp32 = precision.choose("fp32", cpu, torso, shape, dtype, 32, True)
    assert fp32.dtype is None and "fp32" in fp32.reason
    bf16 = precision.choose("bf16", cpu, torso, shape, dtype, 32, True)
    assert bf16.dtype is torch.bfloat16 and "channels_last" in bf16.reason  # both layouts timed
    mlp = precision.choose("bf16", cpu, None, (4,), np.dtype(np.float32), 32, True)
    assert mlp.dtype is torch.bfloat16 and not mlp.channels_last  # nothing to time
    auto = precision.choose("auto", cpu, torso, shape, dtype, 32, True)
    if precision.cpu_bf16_flags():
        assert "fp32 " in auto.reason and "bf16 " in auto.reason  # every variant timed
    else:
        assert auto.dtype is None and "neither" in auto.reason
    with pytest.raises(ValueError, match="precision must be one of"):
        precision.choose("fp16", cpu, torso, shape, dtype, 32, True)
    with caplog.at_level(logging.INFO, logger="apexrl.models.precision"):
        precision.choose_and_apply("fp32", cpu, [net], _Space(shape, dtype), 32, True, "learner")
    assert "learner precision: fp32" in caplog.text


class _Space:
    def __init__(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.shape, self.dtype = shape, dtype
