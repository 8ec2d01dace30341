"""Neural networks (``nn.Module`` only) and the weight format that carries them over the wire.

Actors and learners build the same network with ``build_q_network``. The learner publishes its
weights as ``params_to_arrays(net)`` (named numpy arrays, which the codec sends as raw frames, never
pickle) and actors load them with ``arrays_to_params``, which refuses anything that does not match
the network exactly.

``MLPQNetwork`` serves flat observations and ``NatureCNNQNetwork`` stacked image frames.
Models return ``NamedTuple`` outputs so that callers name what they use (``out.q``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor, nn


class QOutput(NamedTuple):
    """Output of a Q-network.

    Fields:
        q: float32 ``[B, A]`` action values.
    """

    q: Tensor


class MLPQNetwork(nn.Module):
    """A Q-network for flat observations: an MLP torso and a dueling or plain linear head.

    Dueling head (Wang et al. 2016, "Dueling Network Architectures for Deep RL", eq. 9)::

        Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a')

    Args:
        obs_dim: size of the flat observation.
        num_actions: A, the number of discrete actions.
        hidden_sizes: widths of the torso's Linear + ReLU layers (empty: the head reads ``obs``).
        dueling: use the dueling head; otherwise one Linear layer to A outputs.
    """

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        hidden_sizes: Sequence[int] = (256, 256),
        dueling: bool = True,
    ) -> None:
        super().__init__()
        if obs_dim < 1:
            raise ValueError(f"obs_dim must be >= 1, got {obs_dim}")
        if num_actions < 1:
            raise ValueError(f"num_actions must be >= 1, got {num_actions}")
        if any(size < 1 for size in hidden_sizes):
            raise ValueError(f"hidden_sizes must all be >= 1, got {tuple(hidden_sizes)}")
        self.obs_dim = obs_dim
        self.num_actions = num_actions
        self.dueling = dueling

        layers: list[nn.Module] = []
        in_features = obs_dim
        for size in hidden_sizes:
            layers += [nn.Linear(in_features, size), nn.ReLU()]
            in_features = size
        self.torso = nn.Sequential(*layers)
        if dueling:
            self.value_head = nn.Linear(in_features, 1)
            self.advantage_head = nn.Linear(in_features, num_actions)
        else:
            self.q_head = nn.Linear(in_features, num_actions)

    def forward(self, obs: Tensor) -> QOutput:
        """Q-values for a batch of observations.

        Args:
            obs: ``[B, obs_dim]`` (leading dims such as ``[T, B, obs_dim]`` also work); other dtypes
                are cast to float32.

        Returns:
            ``QOutput(q)`` with ``q`` of shape ``[B, A]`` (the input's leading dims, then A).
        """
        if obs.dim() < 1 or obs.shape[-1] != self.obs_dim:
            raise ValueError(f"obs must be [B, {self.obs_dim}], got shape {tuple(obs.shape)}")
        if obs.dtype != torch.float32:
            obs = obs.to(torch.float32)
        features = self.torso(obs)
        if not self.dueling:
            return QOutput(q=self.q_head(features))
        value = self.value_head(features)
        advantage = self.advantage_head(features)
        return QOutput(q=value + advantage - advantage.mean(dim=-1, keepdim=True))


class NatureCNNQNetwork(nn.Module):
    """The Nature DQN network (Mnih et al. 2015) for stacked image frames, with the same dueling
    or plain head as ``MLPQNetwork``.

    Torso: Conv 32x8x8 stride 4, Conv 64x4x4 stride 2, Conv 64x3x3 stride 1 (ReLU after each),
    then Linear to 512 + ReLU. The dueling head is two Linear layers (V and A) on those 512
    features, so with 4 frames of 84x84 and 6 actions the network has 1,687,719 parameters (plain
    head: 1,687,206). Wang et al.'s dueling network instead splits into two 512-unit streams
    (about 3.3 M parameters); the shared layer keeps the Nature size and the MLP's head shape.

    Observations are pixel values in [0, 255] (uint8 from the env and replay: 4x less memory and
    wire than float32), scaled by 1/255 inside ``forward``.

    Args:
        obs_shape: ``(C, H, W)``, channel-first (C stacked frames); H and W at least 36.
        num_actions: A, the number of discrete actions.
        dueling: use the dueling head; otherwise one Linear layer to A outputs.
    """

    def __init__(self, obs_shape: Sequence[int], num_actions: int, dueling: bool = True) -> None:
        super().__init__()
        obs_shape = tuple(obs_shape)
        if len(obs_shape) != 3 or min(obs_shape) < 1:
            raise ValueError(f"obs_shape must be (C, H, W), got {obs_shape}")
        channels, height, width = obs_shape
        out_h, out_w = _nature_conv_out(height), _nature_conv_out(width)
        if out_h < 1 or out_w < 1:
            raise ValueError(
                f"obs_shape {obs_shape} is too small for the Nature CNN: it needs channel-first "
                f"(C, H, W) images with H, W >= 36 (Atari: (4, 84, 84))"
            )
        if num_actions < 1:
            raise ValueError(f"num_actions must be >= 1, got {num_actions}")
        self.obs_shape = obs_shape
        self.num_actions = num_actions
        self.dueling = dueling
        self.torso = nn.Sequential(
            nn.Conv2d(channels, 32, kernel_size=8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, kernel_size=3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(64 * out_h * out_w, 512),
            nn.ReLU(),
        )
        if dueling:
            self.value_head = nn.Linear(512, 1)
            self.advantage_head = nn.Linear(512, num_actions)
        else:
            self.q_head = nn.Linear(512, num_actions)

    def forward(self, obs: Tensor) -> QOutput:
        """Q-values for a batch of image observations.

        Args:
            obs: ``[B, C, H, W]`` pixel values in [0, 255], uint8 (other dtypes are cast to
                float32 and scaled the same way).

        Returns:
            ``QOutput(q)`` with ``q`` of shape ``[B, A]``.
        """
        if obs.dim() != 4 or tuple(obs.shape[1:]) != self.obs_shape:
            raise ValueError(
                f"obs must be [B, {', '.join(map(str, self.obs_shape))}], got shape "
                f"{tuple(obs.shape)}"
            )
        # One float copy scaled in place: the uint8 -> float32 cast of a batch of frames is a large
        # share of a CPU update (three casts per update), and ``x * c`` would make a second copy.
        pixels = obs.to(torch.float32, copy=True).mul_(1.0 / 255.0)
        features = self.torso(pixels)
        if not self.dueling:
            return QOutput(q=self.q_head(features))
        value = self.value_head(features)
        advantage = self.advantage_head(features)
        return QOutput(q=value + advantage - advantage.mean(dim=-1, keepdim=True))


def _nature_conv_out(size: int) -> int:
    """Spatial size after the Nature CNN's three convolutions (no padding)."""
    for kernel, stride in ((8, 4), (4, 2), (3, 1)):
        size = (size - kernel) // stride + 1
    return size


def build_q_network(
    obs_shape: tuple[int, ...],
    num_actions: int,
    hidden_sizes: Sequence[int] = (256, 256),
    dueling: bool = True,
) -> nn.Module:
    """The Q-network for an observation shape: an MLP for flat ``(obs_dim,)`` observations, the
    Nature CNN for channel-first images ``(C, H, W)`` (``hidden_sizes`` is then unused).

    Raises:
        ValueError: for any other observation shape.
    """
    obs_shape = tuple(obs_shape)
    if len(obs_shape) == 3:
        return NatureCNNQNetwork(obs_shape, num_actions, dueling=dueling)
    if len(obs_shape) != 1:
        raise ValueError(
            f"build_q_network supports flat observations of shape (obs_dim,) and channel-first "
            f"images (C, H, W), got obs_shape {obs_shape} (flatten the observation with a "
            f"wrapper if it is not an image)"
        )
    return MLPQNetwork(obs_shape[0], num_actions, hidden_sizes=hidden_sizes, dueling=dueling)


def _numpy_dtype(name: str, dtype: torch.dtype) -> np.dtype:
    if dtype == torch.bfloat16:
        raise ValueError(f"parameter {name!r} is bfloat16, which numpy cannot represent")
    return torch.empty((), dtype=dtype).numpy().dtype


def params_to_arrays(module: nn.Module) -> dict[str, np.ndarray]:
    """The module's ``state_dict`` as contiguous numpy copies on the CPU, keyed by name.

    The arrays share no memory with the module, so the caller may send or keep them while training
    continues. Dtypes are kept (float32 for the networks here).
    """
    arrays: dict[str, np.ndarray] = {}
    for name, tensor in module.state_dict().items():
        _numpy_dtype(name, tensor.dtype)
        arrays[name] = np.ascontiguousarray(tensor.detach().cpu().numpy()).copy()
    return arrays


def arrays_to_params(module: nn.Module, arrays: dict[str, np.ndarray]) -> None:
    """Load named numpy arrays (from ``params_to_arrays``) into the module.

    Names, shapes and dtypes must match the module's ``state_dict`` exactly. Everything is checked
    before anything is written, so on ``ValueError`` (which names the first mismatch) the module is
    unchanged. The arrays may be read-only (decoded straight from message frames); they are copied.
    """
    state = module.state_dict()
    for name, tensor in state.items():
        if name not in arrays:
            raise ValueError(f"missing array for parameter {name!r}")
        array = arrays[name]
        if not isinstance(array, np.ndarray):
            raise ValueError(f"array {name!r} must be a numpy array, got {type(array).__name__}")
        expected_shape = tuple(tensor.shape)
        if array.shape != expected_shape:
            raise ValueError(f"array {name!r} has shape {array.shape}, expected {expected_shape}")
        expected_dtype = _numpy_dtype(name, tensor.dtype)
        if array.dtype != expected_dtype:
            raise ValueError(f"array {name!r} has dtype {array.dtype}, expected {expected_dtype}")
    unexpected = [name for name in arrays if name not in state]
    if unexpected:
        raise ValueError(f"unexpected array {unexpected[0]!r} (not a parameter of the module)")
    with torch.no_grad():
        for name, tensor in state.items():
            # state_dict() tensors share storage with the module's parameters and buffers.
            tensor.copy_(torch.from_numpy(np.array(arrays[name], copy=True)))
