"""A multi-agent run's learner side: one learner core per network policy, each built from its own
config (``policies.policy_config``) and spaces, and checkpointed together.

``checkpoint.pt`` of a multi-agent run holds ``{"algo": {"policies": {name: core state}}, ...}``:
every policy's weights and optimizer at the same moment, resumed together. A policy that is not
trained (``multiagent.policies_to_train`` leaves it out) is built, published once and kept in the
checkpoint like the others; it never samples or updates.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch

from apexrl.algos import LearnerCore, load_algorithm
from apexrl.config import Config
from apexrl.envs.spaces import network_spaces
from apexrl.learning.checkpoint import resume_checkpoint
from apexrl.learning.update import probe_rows
from apexrl.models import precision
from apexrl.multiagent.policies import policy_config, policy_spaces

log = logging.getLogger("apexrl.learner")


class PolicyCore(NamedTuple):
    name: str
    cfg: Config  # the policy's own config
    core: LearnerCore
    trained: bool


class PolicyCores:
    """Every network policy's learner core, as one ``state_dict`` for checkpoints."""

    def __init__(self, cores: list[PolicyCore]) -> None:
        self.cores = cores

    def state_dict(self) -> dict[str, object]:
        return {"policies": {p.name: p.core.state_dict() for p in self.cores}}

    def load_state_dict(self, state: dict[str, object]) -> None:
        policies = state["policies"]
        missing = [p.name for p in self.cores if p.name not in policies]
        if missing:
            raise ValueError(f"the checkpoint holds no policy {missing[0]!r}")
        for p in self.cores:
            p.core.load_state_dict(policies[p.name])

    @property
    def num_updates(self) -> int:
        return sum(p.core.num_updates for p in self.cores)

    @property
    def has_work(self) -> bool:
        return any(p.core.has_work for p in self.cores)


def build_policy_cores(
    cfg: Config, device: torch.device, resume: bool
) -> tuple[PolicyCores, dict[str, int]]:
    """Each network policy's learner core with fresh weights, or all of them restored from the
    run's checkpoint; the run's counters."""
    spaces = policy_spaces(cfg)
    trained = set(cfg.multiagent.trained)
    cores = []
    for name in cfg.multiagent.networks:
        policy_cfg = policy_config(cfg, name, spaces[name])
        obs_space, action_space = network_spaces(policy_cfg)
        core = load_algorithm(policy_cfg.algorithm).learner_core(
            obs_space, action_space, policy_cfg, device
        )
        networks = precision.networks_of(core)
        precision.choose_and_apply(
            cfg.learner.precision,
            device,
            networks,
            obs_space,
            probe_rows(policy_cfg),
            True,
            f"learner ({name})",
        )
        cores.append(PolicyCore(name, policy_cfg, core, name in trained))
    policies = PolicyCores(cores)
    counters = {"num_samples": 0, "elapsed_ms": 0, "env_steps": 0}
    if resume:
        counters.update(resume_checkpoint(cfg.run_dir, policies, device))
        log.info(
            "resumed policies %s from %s at %d env steps",
            ", ".join(f"{p.name} (update {p.core.num_updates})" for p in cores),
            cfg.run_dir,
            counters["env_steps"],
        )
    return policies, counters
