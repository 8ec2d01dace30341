"""A network as named numpy arrays, the form the weights take on the wire.

The learner publishes its weights as ``params_to_arrays(net)`` (the codec sends them as raw frames,
never pickle) and actors load them with ``arrays_to_params``, which refuses anything that does not
match the network exactly.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


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
