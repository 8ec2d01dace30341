"""apexrl: a distributed actor-learner reinforcement-learning system over ZeroMQ.

From Python (docs/python-api.md):

- ``Trainer`` (``apexrl.api``): a run of the roles' processes on this machine, driven from Python:
  ``train()`` returns each ``result.json`` record, ``save()`` / ``restore(path)``,
  ``get_weights()`` / ``set_weights(weights)``, ``evaluate(episodes)``, ``stop()``;
- ``Policy`` (``apexrl.policy``): a checkpoint's policy in the user's own loop,
  ``compute_actions(obs_batch, state=None, explore=False)``, numpy in and out, with
  ``RecurrentState`` for R2D2;
- ``RunEnded``: what ``Trainer.train()`` raises once the run is over;
- ``PolicyClient`` (``apexrl.external.client``): an environment apexrl does not step, acting
  through a run's policy server (``apexrl external``, ``apexrl local --external N``).

They are imported on first use, so ``import apexrl`` (and the ``apexrl`` command) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["Policy", "PolicyClient", "RecurrentState", "RunEnded", "Trainer", "__version__"]

_LAZY = {
    "Trainer": "apexrl.api",
    "RunEnded": "apexrl.api",
    "Policy": "apexrl.policy",
    "RecurrentState": "apexrl.policy",
    "PolicyClient": "apexrl.external.client",
}

if TYPE_CHECKING:
    from apexrl.api import RunEnded, Trainer
    from apexrl.external.client import PolicyClient
    from apexrl.policy import Policy, RecurrentState


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'apexrl' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
