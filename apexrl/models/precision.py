"""Numeric precision of a role's networks: ``learner.precision`` and ``actor.precision``.

- ``fp32``: float32 throughout (on CUDA with TF32 matrix multiplies and convolutions);
- ``bf16``: the networks' forward passes run under ``torch.autocast`` in bfloat16 (their backward
  passes follow), and every floating output leaves the network as float32, so that what reads
  it — targets (n-step returns, V-trace, GAE, TD errors), log-probabilities and their ratios,
  softmax and entropy, the losses — computes in float32, and the optimizer keeps float32 master
  weights (the parameters never change dtype);
- ``auto``: bf16 where the hardware has it (a CPU with AMX-BF16 or AVX512-BF16, any CUDA device)
  and a short measurement at start-up (``probe``) found it at least ``BF16_MARGIN`` faster than
  the best float32 variant, float32 elsewhere. The role logs what it chose and why.

Convolutional torsos also run ``channels_last`` (NHWC) where the measurement found that faster:
``fp32`` and ``bf16`` probe it too (for image torsos only; nothing to choose for an MLP).

``apply`` installs the choice on a network: a forward pre-hook enters autocast and a forward hook
(always called, also when the forward raises) leaves it and casts the outputs to float32. The
network's parameters, names and state dict stay as they are, so published weights, checkpoints
and the wire do not change with the precision.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from apexrl.config import PRECISIONS
from apexrl.models.torsos import set_channels_last

log = logging.getLogger(__name__)

BF16_MARGIN = 1.15  # auto takes bf16 only when it measures at least this much faster
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of fast bf16 on a CPU
PROBE_MIN_S = 0.15  # each variant is timed for at least this long (after one untimed step),
PROBE_STEPS = (2, 50)  # over at least 2 and at most 50 steps


@dataclass(frozen=True)
class Precision:
    """What a network computes in: ``dtype`` (None: float32) on ``device_type``, NHWC images
    or not, and why (the log line)."""

    dtype: torch.dtype | None = None
    device_type: str = "cpu"
    channels_last: bool = False
    reason: str = "fp32"

    @property
    def name(self) -> str:
        base = "fp32" if self.dtype is None else "bf16"
        return base + (" channels_last" if self.channels_last else "")


def cpu_bf16_flags(cpuinfo: str | None = None) -> list[str]:
    """The fast-bf16 flags this CPU reports (``/proc/cpuinfo``); none where it cannot be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    words = set(cpuinfo.split())
    return [flag for flag in CPU_BF16_FLAGS if flag in words]


def float32_outputs(output: object) -> object:
    """``output`` with every floating tensor in it (nested tuples, NamedTuples) as float32."""
    if isinstance(output, Tensor):
        return output.float() if output.is_floating_point() else output
    if isinstance(output, tuple):
        converted = [float32_outputs(x) for x in output]
        return type(output)(*converted) if hasattr(output, "_fields") else tuple(converted)
    return output


def apply(network: nn.Module, precision: Precision) -> None:
    """Run ``network``'s forward passes in ``precision`` (hooks on it, see the module
    docstring) and its image torsos NHWC where chosen. Float32 without NHWC changes nothing."""
    set_channels_last(network, precision.channels_last)
    if precision.dtype is None:
        return
    contexts: list[torch.autocast] = []

    def enter(module: nn.Module, args: object) -> None:
        context = _autocast(precision)
        context.__enter__()
        contexts.append(context)

    def leave(module: nn.Module, args: object, output: object) -> object:
        contexts.pop().__exit__(None, None, None)
        return float32_outputs(output)

    network.register_forward_pre_hook(enter)
    network.register_forward_hook(leave, always_call=True)


def use_tf32(device: torch.device) -> None:
    """Float32 on CUDA: TF32 matrix multiplies and convolutions (Ampere and newer)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def bf16_available(device: torch.device) -> tuple[bool, str]:
    """Whether ``device`` has fast bf16, and what says so."""
    if device.type == "cuda":
        return True, f"CUDA device {torch.cuda.get_device_name(device)}"
    flags = cpu_bf16_flags()
    if flags:
        return True, "the CPU has " + ", ".join(f.upper().replace("_", "-") for f in flags)
    return False, "the CPU has neither AMX-BF16 nor AVX512-BF16"


def choose(
    setting: str,
    device: torch.device,
    torso: nn.Module | None,
    obs_shape: Sequence[int],
    obs_dtype: np.dtype,
    rows: int,
    train: bool,
) -> Precision:
    """The precision for a role's networks from its ``setting`` (``PRECISIONS``): the variants
    the setting allows, measured on ``torso`` (a batch of ``rows`` observations; forward and
    backward when ``train``), the fastest taken (bf16 under ``auto`` only by ``BF16_MARGIN``).
    Nothing is measured where there is one variant."""
    if setting not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {setting!r}")
    if setting == "fp32":
        use_tf32(device)
    has_bf16, why = bf16_available(device)
    if setting == "auto" and not has_bf16:
        setting, reason = "fp32", f"auto: {why}"
        use_tf32(device)
    else:
        reason = setting if setting != "auto" else f"auto: {why}"
    dtypes = {"fp32": [None], "bf16": [torch.bfloat16], "auto": [None, torch.bfloat16]}[setting]
    images = torso is not None and len(obs_shape) == 3
    layouts = [False, True] if images else [False]
    variants = [Precision(d, device.type, cl) for d in dtypes for cl in layouts]
    if len(variants) == 1 or torso is None:
        v = variants[0]
        return Precision(v.dtype, v.device_type, v.channels_last, reason)
    obs = torch.zeros((rows, *obs_shape), dtype=torch.from_numpy(np.zeros(0, obs_dtype)).dtype)
    speeds = {v: probe(torso, obs.to(device), v, train) for v in variants}
    best_fp32 = max((s for v, s in speeds.items() if v.dtype is None), default=0.0)
    allowed = {
        v: s
        for v, s in speeds.items()
        if setting != "auto" or v.dtype is None or s >= BF16_MARGIN * best_fp32
    }
    chosen = max(allowed, key=allowed.get)
    shown = ", ".join(f"{v.name} {s:,.0f}/s" for v, s in speeds.items())
    kind = "training steps" if train else "forward passes"
    reason = f"{reason}; {kind} of the torso on {rows} observations: {shown}"
    return Precision(chosen.dtype, chosen.device_type, chosen.channels_last, reason)


def probe(torso: nn.Module, obs: Tensor, variant: Precision, train: bool) -> float:
    """Observations a second through ``torso`` in ``variant`` (its own state restored after):
    one untimed step, then timed steps for ``PROBE_MIN_S`` (within ``PROBE_STEPS``)."""
    was_training = torso.training
    torso.train(train)
    grads = [p.grad for p in torso.parameters()]
    set_channels_last(torso, variant.channels_last)
    step = _training_step if train else _forward
    try:
        step(torso, obs, variant)
        _sync(obs.device)
        started, steps, elapsed = time.perf_counter(), 0, 0.0
        while steps < PROBE_STEPS[1] and (steps < PROBE_STEPS[0] or elapsed < PROBE_MIN_S):
            step(torso, obs, variant)
            _sync(obs.device)
            steps, elapsed = steps + 1, time.perf_counter() - started
        return steps * len(obs) / elapsed
    finally:
        set_channels_last(torso, False)
        for p, g in zip(torso.parameters(), grads, strict=True):
            p.grad = g
        torso.train(was_training)


def _training_step(torso: nn.Module, obs: Tensor, variant: Precision) -> None:
    with _autocast(variant):
        out = torso(obs)
    out.float().square().mean().backward()


def _forward(torso: nn.Module, obs: Tensor, variant: Precision) -> None:
    with torch.inference_mode(), _autocast(variant):
        torso(obs)


def _autocast(variant: Precision) -> torch.autocast:
    enabled = variant.dtype is not None
    return torch.autocast(variant.device_type, dtype=variant.dtype, enabled=enabled)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def torso_of(network: nn.Module) -> nn.Module | None:
    """The module that turns observations into features (``torso``, or an MLP actor-critic's
    ``value_torso``, which reads the whole observation where the policy reads a part of it; the
    network behind an observation normaliser), None when there is none."""
    for candidate in (network, getattr(network, "net", None)):
        for name in ("torso", "value_torso"):
            module = getattr(candidate, name, None) if candidate is not None else None
            if isinstance(module, nn.Module):
                return module
    return None


def networks_of(core: object) -> list[nn.Module]:
    """Every network a learner core holds as an attribute (its ``network``, a target network)."""
    return [value for value in vars(core).values() if isinstance(value, nn.Module)]


def choose_and_apply(
    setting: str,
    device: torch.device,
    networks: Sequence[nn.Module],
    obs_space: object,
    rows: int,
    train: bool,
    role: str,
    on_choice: Callable[[Precision], None] | None = None,
) -> Precision:
    """``choose`` on the first network's torso, ``apply`` to every one of ``networks``, and
    the log line that says what ``role`` computes in and why."""
    precision = choose(
        setting,
        device,
        torso_of(networks[0]),
        tuple(obs_space.shape),
        np.dtype(obs_space.dtype),
        rows,
        train,
    )
    for network in networks:
        apply(network, precision)
    log.info("%s precision: %s (%s)", role, precision.name, precision.reason)
    if on_choice is not None:
        on_choice(precision)
    return precision
