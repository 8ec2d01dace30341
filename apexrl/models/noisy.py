"""Noisy nets (Fortunato et al. 2018), factorised Gaussian: a Linear layer whose weights are
``mu + sigma * noise``, with ``mu`` and ``sigma`` learned, so that a Q-network explores by itself
(Rainbow's alternative to epsilon-greedy).

For a layer of ``p`` inputs and ``q`` outputs, each forward pass with noise on draws
``eps_in ~ N(0, 1)^p`` and ``eps_out ~ N(0, 1)^q`` and uses::

    f(x) = sgn(x) sqrt(|x|)
    w = mu_w + sigma_w * (f(eps_out) f(eps_in)^T),   b = mu_b + sigma_b * f(eps_out)

initialized as ``mu ~ U(-1/sqrt(p), 1/sqrt(p))`` and ``sigma = sigma0 / sqrt(p)`` (sigma0 = 0.5).
With noise off (``set_noise``: the evaluation actor, ``Policy``) the layer is ``mu`` alone.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SIGMA0 = 0.5  # Fortunato et al.'s factorised sigma_0


def scaled_noise(noise: Tensor) -> Tensor:
    """``f(x) = sgn(x) sqrt(|x|)``, the factorised noise's scaling."""
    return noise.sign() * noise.abs().sqrt()


class NoisyLinear(nn.Module):
    """``y = x w^T + b`` with factorised Gaussian noise on ``w`` and ``b`` while ``noise_on``."""

    def __init__(self, in_features: int, out_features: int, sigma0: float = SIGMA0) -> None:
        super().__init__()
        if in_features < 1 or out_features < 1:
            raise ValueError(f"NoisyLinear needs sizes >= 1, got {in_features}, {out_features}")
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features)
        sigma = sigma0 / math.sqrt(in_features)
        weight_mu = torch.empty(out_features, in_features).uniform_(-bound, bound)
        self.weight_mu = nn.Parameter(weight_mu)
        self.weight_sigma = nn.Parameter(torch.full((out_features, in_features), sigma))
        self.bias_mu = nn.Parameter(torch.empty(out_features).uniform_(-bound, bound))
        self.bias_sigma = nn.Parameter(torch.full((out_features,), sigma))
        self.noise_on = True

    def forward(self, x: Tensor) -> Tensor:
        if not self.noise_on:
            return F.linear(x, self.weight_mu, self.bias_mu)
        eps_in = scaled_noise(torch.randn(self.in_features, device=x.device))
        eps_out = scaled_noise(torch.randn(self.out_features, device=x.device))
        weight = self.weight_mu + self.weight_sigma * torch.outer(eps_out, eps_in)
        return F.linear(x, weight, self.bias_mu + self.bias_sigma * eps_out)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


def set_noise(network: nn.Module, on: bool) -> None:
    """Turn the noise of every ``NoisyLinear`` in ``network`` on (training actors, the learner)
    or off (greedy evaluation)."""
    for module in network.modules():
        if isinstance(module, NoisyLinear):
            module.noise_on = on


def has_noise(network: nn.Module) -> bool:
    return any(isinstance(module, NoisyLinear) for module in network.modules())
