"""The learners' Adam (``apexrl.learning.optim``): the same steps as ``torch.optim.Adam``,
checkpoints that load in either, and a learner start that imports no compiler."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from apexrl.learning.optim import Adam


def two_nets() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    twin = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    twin.load_state_dict(net.state_dict())
    return net, twin


def backward(net: nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 3, generator=gen)
    net(x).pow(2).sum().backward()


def test_first_step_moves_each_weight_by_lr_against_its_gradient_sign():
    # Adam's first step: m = (1 - b1) g, v = (1 - b2) g^2, bias-corrected m/sqrt(v) = g/|g|.
    w = nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    opt = Adam([w], lr=0.1, eps=1e-12)
    w.grad = torch.tensor([0.5, -4.0, 0.0])
    opt.step()
    assert torch.allclose(w.detach(), torch.tensor([1.0 - 0.1, -2.0 + 0.1, 3.0]))


def test_steps_match_torch_adam_including_steps_without_some_gradients():
    net, twin = two_nets()
    ours = Adam(net.parameters(), lr=1e-2, eps=1e-6)
    torch_adam = torch.optim.Adam(twin.parameters(), lr=1e-2, eps=1e-6, fused=True)
    for step in range(6):
        for model, opt in ((net, ours), (twin, torch_adam)):
            opt.zero_grad(set_to_none=True)
            backward(model, seed=step)
            if step == 2:  # the last layer's bias gets no gradient this step
                model[2].bias.grad = None
            if step == 4:  # no gradient at all: nothing changes
                opt.zero_grad(set_to_none=True)
            opt.step()
    for ours_p, torch_p in zip(net.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(ours_p, torch_p, rtol=0, atol=1e-7)
    torch_state = torch_adam.state_dict()["state"]
    for i, state in ours.state_dict()["state"].items():
        assert float(state["step"]) == float(torch_state[i]["step"])


@pytest.mark.parametrize("direction", ["torch to ours", "ours to torch"])
def test_state_dicts_load_in_either_adam(direction):
    net, twin = two_nets()
    ours = Adam(net.parameters(), lr=1e-2)
    torch_adam = torch.optim.Adam(twin.parameters(), lr=1e-2, fused=True)
    for step in range(3):  # both trained alike, then one's state copied into the other
        for model, opt in ((net, ours), (twin, torch_adam)):
            opt.zero_grad()
            backward(model, seed=step)
            opt.step()
    if direction == "torch to ours":
        ours = Adam(net.parameters(), lr=1e-2)
        ours.load_state_dict(torch_adam.state_dict())
    else:
        torch_adam = torch.optim.Adam(twin.parameters(), lr=1e-2, fused=True)
        torch_adam.load_state_dict(ours.state_dict())
    for model, opt in ((net, ours), (twin, torch_adam)):
        opt.zero_grad()
        backward(model, seed=9)
        opt.step()
    for ours_p, torch_p in zip(net.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(ours_p, torch_p, rtol=0, atol=1e-7)


def test_state_of_another_network_is_refused():
    net, _ = two_nets()
    other = nn.Linear(3, 7)
    opt = Adam(other.parameters(), lr=1e-3)
    backward(net, seed=0)
    source = Adam(net.parameters(), lr=1e-3)
    source.step()
    with pytest.raises(ValueError, match="parameters"):
        opt.load_state_dict(source.state_dict())
    wrong_shape = Adam(nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 2)).parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="shape"):
        wrong_shape.load_state_dict(source.state_dict())


LEARNER_START = """
import sys
import numpy as np
import torch
from apexrl.algos import SampledBatch
from apexrl.algos.apex_dqn import apex_dqn_learner
from apexrl.config import load_config
cfg = load_config(sys.argv[1])
algo = apex_dqn_learner((4,), 2, cfg.algo, "cpu")
n = 8
fields = {
    "obs": torch.randn(n, 4), "action": torch.zeros(n, dtype=torch.int64),
    "reward": torch.ones(n), "num_steps": torch.full((n,), 3), "next_obs": torch.randn(n, 4),
    "terminated": torch.zeros(n, dtype=torch.bool), "truncated": torch.zeros(n, dtype=torch.bool),
}
algo.update(SampledBatch(np.arange(n), fields, np.full(n, 0.1), 100))
algo.load_state_dict(algo.state_dict())
print(sorted(m for m in ("torch._dynamo", "torch._inductor") if m in sys.modules))
"""


def test_a_learner_core_builds_and_updates_without_importing_a_compiler():
    from conftest import CONFIG

    out = subprocess.run(
        [sys.executable, "-c", LEARNER_START, str(CONFIG)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stderr
