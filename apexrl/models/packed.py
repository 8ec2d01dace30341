"""Networks for nested spaces: a torso per part of a packed observation, and an actor-critic whose
policy is a product distribution over MultiDiscrete or Tuple/Dict (Discrete and Box) actions.

``PackedTorso`` reads the uint8 rows of ``apexrl.envs.packing``: each image part (uint8, two or
three dims; channel-last ones are turned channel-first) goes through the convolutional torso that
``algo.torso`` names (``auto``: by its size, as for a whole image observation), every other part
is flattened, and all of those are concatenated into one MLP of ``hidden_sizes``; the features
are the image features and the MLP's, side by side.

``ProductActorCritic`` puts a value head and these policy heads on any torso:

- ``Discrete(A)``: ``CategoricalOutput(logits [..., A])``, as the other actor-critics;
- ``MultiDiscrete(nvec)``: ``CategoricalOutput(logits [..., K, max(nvec)])``, part ``k``'s logits
  beyond ``nvec[k]`` at ``-inf`` (``algos.actor_critic`` sums log-probabilities and entropies
  over ``K``);
- a Box: ``GaussianOutput``;
- Discrete and Box parts together (``envs.nested.HybridActions``): ``HybridOutput``, the
  MultiDiscrete logits of the Discrete parts and one diagonal Gaussian over the Box parts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from apexrl.envs.packing import PackedLayout, Part
from apexrl.models.actor_critic import CategoricalOutput, GaussianOutput
from apexrl.models.q import QOutput, add_q_heads, q_from_heads
from apexrl.models.torsos import build_torso, choose_torso, mlp_torso


def parts_mask(nvec: Sequence[int]) -> Tensor:
    """``[K, max(nvec)]``: True where column ``j`` is one of Discrete part ``k``'s actions
    (``j < nvec[k]``)."""
    return torch.arange(max(nvec)).unsqueeze(0) < torch.tensor(list(nvec)).unsqueeze(1)


def mask_past_parts(logits: Tensor, mask: Tensor) -> Tensor:
    """Logits ``[..., K, max(nvec)]`` with ``-inf`` past each part's size (``mask`` of
    ``parts_mask``), so those actions get probability 0."""
    return logits.masked_fill(~mask, float("-inf"))


class HybridOutput(NamedTuple):
    """Output of an actor-critic over Discrete and Box parts at once.

    Fields:
        logits: ``[..., K, max(nvec)]``, one row per Discrete part (``-inf`` past its size).
        mean, log_std: ``[..., D]``: the Gaussian over the Box parts' values.
        value: ``[...]``.
    """

    logits: Tensor
    mean: Tensor
    log_std: Tensor
    value: Tensor


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype


def image_shape(part: Part) -> tuple[int, int, int]:
    """A uint8 image part's channel-first shape: ``(H, W)`` gets one channel, ``(H, W, C)`` with
    ``C <= 4 < H`` is channel-last."""
    shape = part.shape
    if len(shape) == 2:
        return (1, *shape)
    if shape[-1] <= 4 < shape[0]:
        return (shape[2], shape[0], shape[1])
    return shape  # type: ignore[return-value]


class PackedTorso(nn.Module):
    """A torso per part of a packed observation, concatenated (module docstring)."""

    def __init__(
        self,
        layout: PackedLayout,
        hidden_sizes: Sequence[int],
        activation: str = "relu",
        image_torso: str = "auto",
    ) -> None:
        super().__init__()
        self.layout = layout
        self.images = [p for p in layout.parts if p.is_image]
        self.vectors = [p for p in layout.parts if not p.is_image]
        self.image_torsos = nn.ModuleList()
        for part in self.images:
            shape = image_shape(part)
            name = choose_torso(shape, image_torso if image_torso != "mlp" else "auto")
            scale = 1.0 / part.high if 0 < part.high < float("inf") else 1.0
            self.image_torsos.append(build_torso(shape, name, pixel_scale=scale))
        width = sum(int(np.prod(p.shape, dtype=np.int64)) for p in self.vectors)
        self.mlp = mlp_torso(width, hidden_sizes, activation) if self.vectors else None
        self.out_features = sum(t.out_features for t in self.image_torsos) + (
            self.mlp.out_features if self.mlp is not None else 0
        )

    def part(self, rows: Tensor, part: Part) -> Tensor:
        """Part ``part`` of uint8 rows ``[B, nbytes]`` as ``[B, *shape]`` in its dtype."""
        data = rows[:, part.offset : part.end].contiguous().view(_torch_dtype(part.dtype))
        return data.reshape(len(rows), *part.shape)

    def forward(self, rows: Tensor) -> Tensor:
        features = []
        for part, torso in zip(self.images, self.image_torsos, strict=True):
            image = self.part(rows, part)
            if image.dim() == 3:
                image = image.unsqueeze(1)
            elif image.shape[1:] != image_shape(part):
                image = image.permute(0, 3, 1, 2)
            features.append(torso(image))
        if self.mlp is not None:
            flat = [self.part(rows, p).flatten(1).float() for p in self.vectors]
            features.append(self.mlp(torch.cat(flat, dim=1)))
        return torch.cat(features, dim=1)


class ProductActorCritic(nn.Module):
    """A value head and product-distribution policy heads on a torso (module docstring).

    Args:
        obs_shape: the observation's shape (``(nbytes,)`` for packed rows).
        torso: maps ``[B, *obs_shape]`` to ``[B, F]`` features (``out_features``).
        nvec: the sizes of the Discrete parts (empty: none).
        box_dim: the size of the Box parts together (0: none).
        single_discrete: one Discrete part given as ``Discrete``: logits ``[..., A]``.
        value_torso: a second torso for the value head (flat observations: as ``MLPActorCritic``
            keeps policy and value apart); None: the value reads the policy's features.
        init_log_std: the Gaussian's initial log-std (a parameter, state-independent).
    """

    def __init__(
        self,
        obs_shape: Sequence[int],
        torso: nn.Module,
        nvec: Sequence[int] = (),
        box_dim: int = 0,
        single_discrete: bool = False,
        value_torso: nn.Module | None = None,
        init_log_std: float = 0.0,
    ) -> None:
        super().__init__()
        if not nvec and box_dim < 1:
            raise ValueError("a policy needs Discrete parts (nvec) or Box ones (box_dim)")
        if any(n < 1 for n in nvec):
            raise ValueError(f"every Discrete part needs >= 1 action, got {tuple(nvec)}")
        self.obs_shape = tuple(obs_shape)
        self.nvec, self.box_dim = tuple(int(n) for n in nvec), int(box_dim)
        self.single_discrete = single_discrete and len(self.nvec) == 1 and box_dim == 0
        self.torso, self.value_torso = torso, value_torso
        features = torso.out_features
        width = max(self.nvec, default=0)
        if self.nvec:
            self.logits_head = nn.Linear(features, len(self.nvec) * width)
            self.register_buffer("logits_mask", parts_mask(self.nvec), persistent=False)
        if box_dim:
            self.mean_head = nn.Linear(features, box_dim)
            self.log_std = nn.Parameter(torch.full((box_dim,), float(init_log_std)))
        value_features = (value_torso or torso).out_features
        self.value_head = nn.Linear(value_features, 1)
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Conv2d):
                nn.init.orthogonal_(module.weight, gain=2.0**0.5)
                nn.init.zeros_(module.bias)
        for head in ("logits_head", "mean_head"):
            if hasattr(self, head):
                nn.init.orthogonal_(getattr(self, head).weight, gain=0.01)
        nn.init.orthogonal_(self.value_head.weight, gain=1.0)

    @property
    def discrete(self) -> bool:
        return bool(self.nvec) and not self.box_dim

    def forward(self, obs: Tensor) -> CategoricalOutput | GaussianOutput | HybridOutput:
        lead = obs.shape[: obs.dim() - len(self.obs_shape)]
        flat = obs.reshape(-1, *self.obs_shape)
        features = self.torso(flat)
        value_features = features if self.value_torso is None else self.value_torso(flat)
        value = self.value_head(value_features).view(*lead)
        logits = mean = None
        if self.nvec:
            logits = self.logits_head(features).view(len(flat), len(self.nvec), -1)
            logits = mask_past_parts(logits, self.logits_mask)
            if self.single_discrete:
                return CategoricalOutput(logits.view(*lead, -1), value)
            logits = logits.view(*lead, *logits.shape[1:])
        if self.box_dim:
            mean = self.mean_head(features).view(*lead, self.box_dim)
            log_std = self.log_std.expand_as(mean)
            if logits is None:
                return GaussianOutput(mean, log_std, value)
            return HybridOutput(logits, mean, log_std, value)
        return CategoricalOutput(logits, value)


class TorsoQNetwork(nn.Module):
    """Q-values on any torso (Ape-X on packed observations), with the dueling or plain head of
    ``models.q``."""

    def __init__(
        self,
        obs_shape: Sequence[int],
        torso: nn.Module,
        num_actions: int,
        dueling: bool,
        atoms: Tensor | None = None,
        noisy: bool = False,
    ):
        super().__init__()
        if num_actions < 1:
            raise ValueError(f"num_actions must be >= 1, got {num_actions}")
        self.obs_shape, self.num_actions, self.dueling = tuple(obs_shape), num_actions, dueling
        self.torso = torso
        add_q_heads(self, torso.out_features, num_actions, dueling, atoms, noisy)

    def forward(self, obs: Tensor) -> QOutput:
        return q_from_heads(self, self.torso(obs), self.dueling)
