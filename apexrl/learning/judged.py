"""The weights that evaluation judged, on the learner.

The evaluation actor (``apexrl.evaluation``) plays rounds of greedy episodes, each with one
frozen weights version. ``JudgedWeights`` keeps the weights of the versions the learner published
lately (the arrays the publishes were sent with, so keeping them costs no copy), so the learner can
write the weights that were judged: ``checkpoint_best.pt`` whenever a round beats the best mean so
far, and, when the run stops on its evaluation condition, ``checkpoint.pt`` with the judged
version's weights.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from apexrl.models import arrays_to_params, params_to_arrays


class JudgedWeights:
    """The weights of the versions the learner published lately, newest last, at most
    ``max_bytes`` of them (always the newest one), and the best evaluation round so far."""

    def __init__(self, max_bytes: int = 256 << 20) -> None:
        self.max_bytes = max_bytes
        self.versions: collections.OrderedDict[int, dict[str, np.ndarray]] = (
            collections.OrderedDict()
        )
        self.num_bytes = 0
        self.best_return = -np.inf
        self.best_version = -1
        self.judged_round = -1.0  # ``eval/rounds`` of the last round looked at

    def remember(self, version: int, arrays: dict[str, np.ndarray]) -> None:
        old = self.versions.pop(version, None)
        if old is not None:
            self.num_bytes -= _nbytes(old)
        self.versions[version] = arrays
        self.num_bytes += _nbytes(arrays)
        while len(self.versions) > 1 and self.num_bytes > self.max_bytes:
            _, dropped = self.versions.popitem(last=False)
            self.num_bytes -= _nbytes(dropped)

    def new_round(self, stats: dict[str, float], window: int) -> tuple[int, float] | None:
        """(version, mean return) of a full evaluation window of one version that ``stats``
        shows for the first time; None otherwise."""
        rounds = stats.get("eval/rounds", 0.0)
        version = int(stats.get("eval/version", -1))
        if rounds == self.judged_round:
            return None
        self.judged_round = rounds
        if version < 0 or stats.get("eval/episodes_in_window", 0) < window:
            return None
        mean = stats.get("eval/return_mean", float("nan"))
        return (version, mean) if np.isfinite(mean) else None

    def is_best(self, mean: float, version: int) -> bool:
        """True (and remembered) when ``mean`` beats every earlier round's."""
        if mean <= self.best_return:
            return False
        self.best_return, self.best_version = mean, version
        return True

    @contextlib.contextmanager
    def loaded(self, network: torch.nn.Module, version: int) -> Iterator[bool]:
        """Within the block ``network`` holds ``version``'s weights (yields True) or, when they
        are no longer kept, its own (yields False); afterwards its own again."""
        arrays = self.versions.get(version)
        if arrays is None:
            yield False
            return
        own = params_to_arrays(network)
        arrays_to_params(network, arrays)
        try:
            yield True
        finally:
            arrays_to_params(network, own)


def _nbytes(arrays: dict[str, np.ndarray]) -> int:
    return sum(a.nbytes for a in arrays.values())
