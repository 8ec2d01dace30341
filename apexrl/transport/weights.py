"""The weights the learner publishes, as the parameter server and the actors check them.

- ``ArraySpec`` and ``network_layout``: the name, shape and dtype of every array of the run's
  network (built on torch's ``meta`` device, so no weights are allocated);
- ``layout_mismatch``: why a set of arrays is not exactly a layout;
- ``non_finite_arrays``: the float arrays that hold a NaN or an infinity.

The parameter server refuses a publish that fails them (``param_server.py``), and an actor's
params client weights it reads from shared memory (``clients/params.py``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from apexrl.config import Config


class ArraySpec(NamedTuple):
    """The shape and dtype one published array must have."""

    shape: tuple[int, ...]
    dtype: np.dtype


def network_layout(cfg: Config) -> dict[str, ArraySpec]:
    """The name, shape and dtype of every array the learner publishes for ``cfg``'s network.

    The network is built as actors build it (spaces from one env of the config) on torch's
    ``meta`` device, which allocates and initialises no weights, and only its layout is kept.
    Raises ``EnvError`` when the env cannot be made or does not suit the algorithm.
    """
    import torch  # only here: serving weights needs no torch, knowing their layout does

    from apexrl.algos import load_algorithm
    from apexrl.envs.spaces import network_spaces

    obs_space, action_space = network_spaces(cfg)
    with torch.device("meta"):
        network = load_algorithm(cfg.algorithm).make_network(obs_space, action_space, cfg)
    return {
        name: ArraySpec(tuple(tensor.shape), torch.empty(0, dtype=tensor.dtype).numpy().dtype)
        for name, tensor in network.state_dict().items()
    }


def layout_mismatch(arrays: dict[str, np.ndarray], layout: dict[str, ArraySpec]) -> str | None:
    """Why ``arrays`` are not exactly ``layout`` (names, shapes, dtypes), or None."""
    missing = [name for name in layout if name not in arrays]
    if missing:
        return f"missing array {missing[0]!r} ({len(missing)} of {len(layout)} missing)"
    unexpected = [name for name in arrays if name not in layout]
    if unexpected:
        return f"unexpected array {unexpected[0]!r} (not a weight of the run's network)"
    for name, (shape, dtype) in layout.items():
        array = arrays[name]
        if array.shape != shape:
            return f"array {name!r} has shape {array.shape}, expected {shape}"
        if array.dtype != dtype:
            return f"array {name!r} has dtype {array.dtype}, expected {dtype}"
    return None


def non_finite_arrays(arrays: dict[str, np.ndarray]) -> list[str]:
    """The names of the float arrays that hold a NaN or an infinity."""
    return [
        name
        for name, array in arrays.items()
        if array.dtype.kind == "f" and not np.isfinite(array).all()
    ]
