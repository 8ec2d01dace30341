"""Torsos: what turns an observation into a feature vector, for every family's network.

A torso maps ``[N, *obs_shape]`` to float32 features ``[N, F]`` and says its width
``out_features``. The heads (Q values, LSTM, policy and value) read those features and never look at
the observation themselves, so any family runs on any torso.

- ``mlp``, flat ``(obs_dim,)``: Linear + activation layers of widths ``hidden_sizes``;
- ``nature_cnn``, images ``(C, H, W)`` of 36 pixels a side or more: Mnih et al. 2015, Conv
  32x8x8/4, 64x4x4/2, 64x3x3/1, Linear 512;
- ``small_cnn``, images (42x42 Atari frames): RLlib's default vision network for 42x42, Conv
  16x4x4/2 and 32x4x4/2 ("same" padding), Conv 256 over the whole remaining map; on 4x42x42
  about a quarter of the Nature CNN's multiply-adds on 4x84x84 (``SmallCNN``);
- ``impala_resnet``, images: Espeholt et al. 2018, three sections (16, 32, 32 channels) of Conv
  3x3, MaxPool 3x3/2 and two residual blocks, then Linear 256;
- ``minatar_cnn``, MinAtar's 10x10 images: Young & Tian 2019, Conv 16x3x3/1, Linear 128;
- ``board_cnn``, board games' planes (connect four's 2x6x7): three Conv 32x3x3/1 ("same"
  padding, so every cell keeps its place and the third layer sees 7x7 around it: any line of
  four), Linear 128.

``auto`` (every config's default) is ``mlp`` for a flat observation, ``minatar_cnn`` for an image
smaller than 36 pixels a side, ``small_cnn`` for one of 36 to 63 (Atari at ``screen_size`` 42)
and ``nature_cnn`` for any larger image (Atari's 4x84x84).

Images are channel-first and stay in their env dtype (uint8 for Atari and MinAtar: a quarter of
float32 in replay and on the wire) until they reach the device that computes on them; the torso
casts them to float32 there (bf16 inside a bf16 autocast region) and scales them by
``pixel_scale`` (1/255 for Atari frames, 1 for MinAtar's 0/1 channels), so the scaling travels
with the network and not with the data.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from apexrl.config.algos import TORSOS

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}
SMALL_IMAGE = 36  # pixels a side below which ``auto`` picks the MinAtar torso (Nature needs 36)
NATURE_IMAGE = 64  # pixels a side from which ``auto`` picks the Nature CNN (below: small_cnn)


def choose_torso(obs_shape: Sequence[int], torso: str = "auto") -> str:
    """The torso's name for an observation shape: ``torso`` itself, or what ``auto`` means:
    ``mlp`` for ``(obs_dim,)``, ``minatar_cnn`` for an image under 36 pixels both ways (MinAtar's
    10x10), ``small_cnn`` for one of 36 to 63 pixels both ways (Atari at 42x42) and
    ``nature_cnn`` for one of 36 or more both ways and 64 or more one way (Atari's 84x84).

    ``small_cnn`` takes the 36..63 band because there the Nature CNN's strides leave it little
    map to read (a 1x1 map from 36 to 43 pixels, 42 included; 2x2 from 44; 3x3 from 52; 4x4 from
    60), where the small CNN's "same" padding keeps a quarter of each side (11x11 at 42) for its
    last layer. MinAtar's 10x10 and Atari's 84x84 lie outside the band.

    Raises:
        ValueError: an unknown name, or a torso that cannot read this shape (an image 36 pixels or
            more one way and less the other is most likely channel-last, and is refused).
    """
    obs_shape = tuple(obs_shape)
    if torso not in TORSOS:
        raise ValueError(f"torso must be one of {', '.join(TORSOS)}, got {torso!r}")
    if len(obs_shape) == 1 and torso in ("auto", "mlp"):
        return "mlp"
    if len(obs_shape) != 3 or torso == "mlp":
        raise ValueError(
            f"torso {torso!r} reads flat observations (obs_dim,) (mlp) or channel-first images "
            f"(C, H, W) (a convolutional torso), got obs_shape {obs_shape} (flatten anything "
            f"else with a wrapper)"
        )
    if torso == "auto" and max(obs_shape[1:]) < SMALL_IMAGE:
        return "minatar_cnn"
    if torso in ("auto", "nature_cnn") and min(obs_shape[1:]) < SMALL_IMAGE:
        raise ValueError(
            f"obs_shape {obs_shape} is too small for the Nature CNN: it needs channel-first "
            f"(C, H, W) images with H, W >= {SMALL_IMAGE} (Atari: (4, 84, 84)); name torso "
            f"minatar_cnn, small_cnn or impala_resnet for small images"
        )
    if torso == "auto":
        return "small_cnn" if max(obs_shape[1:]) < NATURE_IMAGE else "nature_cnn"
    return torso


def pixel_scale(high: object) -> float:
    """What an image torso multiplies pixel values by: 1 / the largest value of the observation
    space's ``high`` (1/255 for Atari frames, 1 for MinAtar's 0/1 channels); 1 when that is not a
    positive finite number."""
    top = float(np.max(np.asarray(high, dtype=np.float64)))
    return 1.0 / top if 0.0 < top < float("inf") else 1.0


def build_torso(
    obs_shape: Sequence[int],
    torso: str = "auto",
    hidden_sizes: Sequence[int] = (64, 64),
    activation: str = "relu",
    pixel_scale: float = 1.0 / 255.0,
) -> nn.Module:
    """The torso named ``torso`` (``choose_torso``) for ``obs_shape``; ``hidden_sizes`` and
    ``activation`` are the MLP's, ``pixel_scale`` the images'."""
    name = choose_torso(obs_shape, torso)
    obs_shape = tuple(obs_shape)
    if name == "mlp":
        return mlp_torso(obs_shape[0], hidden_sizes, activation)
    return {
        "nature_cnn": NatureCNN,
        "small_cnn": SmallCNN,
        "impala_resnet": ImpalaResNet,
        "minatar_cnn": MinAtarCNN,
        "board_cnn": BoardCNN,
    }[name](obs_shape, pixel_scale)


def mlp_torso(obs_dim: int, hidden_sizes: Sequence[int], activation: str = "relu") -> nn.Sequential:
    """Linear + activation layers of widths ``hidden_sizes`` (none: the features are ``obs``), as
    one ``nn.Sequential`` whose ``out_features`` is the last width. Its parameters are named
    ``0.weight``, ``0.bias``, ``2.weight``, ... in every network that holds one, the names the
    published weights and checkpoints carry. It reads float32."""
    if obs_dim < 1 or any(size < 1 for size in hidden_sizes):
        raise ValueError(
            f"obs_dim and hidden_sizes must be >= 1, got {obs_dim} and {tuple(hidden_sizes)}"
        )
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    layers: list[nn.Module] = []
    width = obs_dim
    for size in hidden_sizes:
        layers += [nn.Linear(width, size), ACTIVATIONS[activation]()]
        width = size
    torso = nn.Sequential(*layers)
    torso.out_features = width
    return torso


class _ImageTorso(nn.Module):
    """What the image torsos share: the shape check and the uint8 -> float32 scaling."""

    def __init__(self, obs_shape: Sequence[int], pixel_scale: float) -> None:
        super().__init__()
        obs_shape = tuple(obs_shape)
        if len(obs_shape) != 3 or min(obs_shape) < 1:
            raise ValueError(f"obs_shape must be channel-first (C, H, W), got {obs_shape}")
        self.obs_shape = obs_shape
        self.pixel_scale = float(pixel_scale)
        self.channels_last = False  # NHWC pixels (``set_channels_last``), where that is faster

    def pixels(self, obs: Tensor) -> Tensor:
        if obs.dim() != 4 or tuple(obs.shape[1:]) != self.obs_shape:
            raise ValueError(
                f"obs must be [B, {', '.join(map(str, self.obs_shape))}], got shape "
                f"{tuple(obs.shape)}"
            )
        # One float copy scaled in place: the cast of a batch of frames is a large share of a CPU
        # update, and ``x * c`` would make a second copy. Under bf16 autocast the copy is bf16
        # (0..255 are exact in it), which the first convolution would otherwise make again.
        layout = torch.channels_last if self.channels_last else torch.contiguous_format
        pixels = obs.to(compute_dtype(obs.device), copy=True, memory_format=layout)
        return pixels if self.pixel_scale == 1.0 else pixels.mul_(self.pixel_scale)


def compute_dtype(device: torch.device) -> torch.dtype:
    """bf16 inside a bf16 autocast region on ``device``'s type, float32 otherwise."""
    kind = device.type
    if torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) == torch.bfloat16:
        return torch.bfloat16
    return torch.float32


def set_channels_last(network: nn.Module, on: bool) -> None:
    """Every image torso in ``network`` computes on NHWC (``torch.channels_last``) pixels, or on
    NCHW ones; the parameters and the outputs' values stay the same."""
    for module in network.modules():
        if isinstance(module, _ImageTorso):
            module.channels_last = on


def conv_out(size: int, layers: Sequence[tuple[int, int]]) -> int:
    """Spatial size after unpadded convolutions of (kernel, stride)."""
    for kernel, stride in layers:
        size = (size - kernel) // stride + 1
    return size


NATURE_LAYERS = ((8, 4), (4, 2), (3, 1))


class NatureCNN(_ImageTorso):
    """Mnih et al. 2015: Conv 32x8x8 stride 4, Conv 64x4x4 stride 2, Conv 64x3x3 stride 1, Linear
    to 512, ReLU after each. On 4x84x84 frames: 7x7x64 = 3136 features into the Linear layer."""

    def __init__(self, obs_shape: Sequence[int], pixel_scale: float = 1.0 / 255.0) -> None:
        super().__init__(obs_shape, pixel_scale)
        channels, height, width = self.obs_shape
        out_h, out_w = conv_out(height, NATURE_LAYERS), conv_out(width, NATURE_LAYERS)
        if out_h < 1 or out_w < 1:
            raise ValueError(
                f"obs_shape {self.obs_shape} is too small for the Nature CNN: it needs "
                f"channel-first (C, H, W) images with H, W >= 36 (Atari: (4, 84, 84))"
            )
        self.layers = nn.Sequential(
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
        self.out_features = 512

    def forward(self, obs: Tensor) -> Tensor:
        return self.layers(self.pixels(obs))


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int, int]:
    """TensorFlow's "same" padding of one side: (output size ``ceil(size / stride)``, zeros
    before, zeros after), the odd zero after."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return out, total // 2, total - total // 2


SMALL_LAYERS = ((16, 4, 2), (32, 4, 2))  # (filters, kernel, stride), each with "same" padding


class SmallCNN(_ImageTorso):
    """RLlib's default vision network for 42x42 frames, a torso sized for CPUs: Conv 16x4x4
    stride 2 and Conv 32x4x4 stride 2, both "same" padded (each side halves, rounded up), then
    Conv 256 over the whole remaining map (a Linear layer to 256), ReLU after each. On 4x42x42
    frames the maps are 21x21x16 and 11x11x32, and the last Conv is 256x11x11.

    Multiply-adds per sample, forward (padding included):

    - ``small_cnn`` on 4x42x42: 21*21*16*(4*4*4) + 11*11*32*(4*4*16) + 256*(11*11*32)
      = 451,584 + 991,232 + 991,232 = 2,434,048 (2.4 M; 4.9 MFLOPs);
    - ``nature_cnn`` on 4x84x84: 20*20*32*(8*8*4) + 9*9*64*(4*4*32) + 7*7*64*(3*3*64)
      + 3136*512 = 3,276,800 + 2,654,208 + 1,806,336 + 1,605,632 = 9,342,976 (9.3 M; 18.7
      MFLOPs), 3.8 times as many.
    """

    def __init__(self, obs_shape: Sequence[int], pixel_scale: float = 1.0 / 255.0) -> None:
        super().__init__(obs_shape, pixel_scale)
        channels, height, width = self.obs_shape
        layers: list[nn.Module] = []
        for filters, kernel, stride in SMALL_LAYERS:
            height, top, bottom = same_padding(height, kernel, stride)
            width, left, right = same_padding(width, kernel, stride)
            layers += [
                nn.ZeroPad2d((left, right, top, bottom)),
                nn.Conv2d(channels, filters, kernel_size=kernel, stride=stride),
                nn.ReLU(),
            ]
            channels = filters
        self.layers = nn.Sequential(
            *layers,
            nn.Conv2d(channels, 256, kernel_size=(height, width)),
            nn.ReLU(),
            nn.Flatten(),
        )
        self.out_features = 256

    def forward(self, obs: Tensor) -> Tensor:
        return self.layers(self.pixels(obs))


class MinAtarCNN(_ImageTorso):
    """Young & Tian 2019 (MinAtar's DQN): Conv 16x3x3 stride 1, Linear to 128, ReLU after each.
    On 10x10 images: 8x8x16 = 1024 features into the Linear layer."""

    def __init__(self, obs_shape: Sequence[int], pixel_scale: float = 1.0) -> None:
        super().__init__(obs_shape, pixel_scale)
        channels, height, width = self.obs_shape
        out_h, out_w = height - 2, width - 2
        if out_h < 1 or out_w < 1:
            raise ValueError(f"obs_shape {self.obs_shape} is too small for a 3x3 convolution")
        self.layers = nn.Sequential(
            nn.Conv2d(channels, 16, kernel_size=3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(16 * out_h * out_w, 128),
            nn.ReLU(),
        )
        self.out_features = 128

    def forward(self, obs: Tensor) -> Tensor:
        return self.layers(self.pixels(obs))


BOARD_CHANNELS = (32, 32, 32)


class BoardCNN(_ImageTorso):
    """A torso for board games' planes: three Conv 32x3x3 stride 1 with one zero of padding a
    side (the map keeps the board's size), then Linear to 128, ReLU after each. Three layers see
    7x7 cells around each cell, so a line of four through it in any direction is in view, where
    ``minatar_cnn``'s one layer sees 3x3 and leaves the lines to its Linear layer.

    Multiply-adds per sample, forward, on connect four's 2x6x7: 42*32*(2*9) + 2 * 42*32*(32*9)
    + 128*(42*32) = 24,192 + 774,144 + 172,032 = 970,368 (1.0 M), where ``minatar_cnn`` has
    20*16*(2*9) + 128*(20*16) = 46,720.
    """

    def __init__(self, obs_shape: Sequence[int], pixel_scale: float = 1.0) -> None:
        super().__init__(obs_shape, pixel_scale)
        channels, height, width = self.obs_shape
        layers: list[nn.Module] = []
        for filters in BOARD_CHANNELS:
            layers += [nn.Conv2d(channels, filters, kernel_size=3, padding=1), nn.ReLU()]
            channels = filters
        self.layers = nn.Sequential(
            *layers, nn.Flatten(), nn.Linear(channels * height * width, 128), nn.ReLU()
        )
        self.out_features = 128

    def forward(self, obs: Tensor) -> Tensor:
        return self.layers(self.pixels(obs))


class _ResidualBlock(nn.Module):
    """ReLU, Conv 3x3, ReLU, Conv 3x3, plus the input (channels and size kept)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


IMPALA_CHANNELS = (16, 32, 32)


class ImpalaResNet(_ImageTorso):
    """Espeholt et al. 2018, the "deep" IMPALA network: per section a Conv 3x3 (same padding),
    MaxPool 3x3 stride 2 (padding 1, so each side halves, rounded up) and two residual blocks;
    three sections of 16, 32 and 32 channels; then ReLU, Linear to 256, ReLU. On 84x84 frames the
    sections give 42, 21 and 11 pixels a side: 11x11x32 = 3872 features into the Linear layer."""

    def __init__(self, obs_shape: Sequence[int], pixel_scale: float = 1.0 / 255.0) -> None:
        super().__init__(obs_shape, pixel_scale)
        channels, height, width = self.obs_shape
        sections: list[nn.Module] = []
        for out_channels in IMPALA_CHANNELS:
            sections += [
                nn.Conv2d(channels, out_channels, kernel_size=3, padding=1),
                nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
                _ResidualBlock(out_channels),
                _ResidualBlock(out_channels),
            ]
            channels = out_channels
            height, width = (height + 1) // 2, (width + 1) // 2
        self.sections = nn.Sequential(*sections)
        self.head = nn.Sequential(
            nn.ReLU(), nn.Flatten(), nn.Linear(channels * height * width, 256), nn.ReLU()
        )
        self.out_features = 256

    def forward(self, obs: Tensor) -> Tensor:
        return self.head(self.sections(self.pixels(obs)))
