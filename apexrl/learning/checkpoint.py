"""The learner's checkpoints: writing them, reading them back and resuming from them.

``checkpoint.pt`` (``rundir``) holds ``{"algo": the core's state_dict, "counters": {...}}``:
tensors and numbers only, loaded with ``torch.load(weights_only=True)``. Every counter of the run
that is not the algorithm's own continues on resume: ``num_samples``, ``elapsed_ms``,
``env_steps``, and ``weights_version`` (the version of the weights it holds). The checkpoint
before it is kept as ``checkpoint.prev.pt``, and a resumed learner that cannot read the latest
loads the previous one. Weights that are not finite are never written (``finite``).

``save_judged_checkpoint`` writes the weights of a version that evaluation judged (``judged``):
``checkpoint_best.pt``, and ``checkpoint.pt`` when the run stops on its evaluation condition.
``weights_digest`` is the hash the learner logs when it stops (equal on ranks of one group).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import torch

from apexrl.algos import LearnerCore
from apexrl.learning.finite import non_finite_tensors
from apexrl.learning.judged import JudgedWeights
from apexrl.runtime import rundir

log = logging.getLogger("apexrl.learner")  # the learner's log lines, whichever part writes them


def save_checkpoint(
    path: Path, algo: LearnerCore, counters: dict[str, int], keep_previous: bool = True
) -> bool:
    """Write the checkpoint atomically and, with ``keep_previous``, keep the one it replaces as
    ``checkpoint.prev.pt``.
    Weights (or optimizer state) that are not finite are not written: the error is logged, the
    checkpoints on disk stay as they are, and the result is False."""
    state = algo.state_dict()
    bad = non_finite_tensors(state)
    if bad:
        log.error(
            "checkpoint not written: %s hold NaN or infinite values (%d tensors); %s is kept",
            ", ".join(bad[:3]),
            len(bad),
            path.name,
        )
        return False
    tmp = path.with_suffix(".tmp")
    torch.save({"algo": state, "counters": counters}, tmp)
    if keep_previous and path.exists():
        os.replace(path, path.with_name(rundir.PREVIOUS_CHECKPOINT))
    os.replace(tmp, path)
    return True


def load_checkpoint(path: Path, algo: LearnerCore, device: torch.device) -> dict[str, int]:
    """Load a checkpoint written by ``save_checkpoint``; ``weights_only`` refuses anything but
    tensors and plain containers, so a tampered file cannot run code. A checkpoint with
    non-finite tensors raises ``ValueError`` before anything is loaded."""
    state = torch.load(path, map_location=device, weights_only=True)
    bad = non_finite_tensors(state)
    if bad:
        raise ValueError(f"{', '.join(bad[:3])} hold NaN or infinite values")
    algo.load_state_dict(state["algo"])
    return {k: int(v) for k, v in state["counters"].items()}


def resume_checkpoint(run_dir: Path, algo: LearnerCore, device: torch.device) -> dict[str, int]:
    """Load the run's latest checkpoint, or the previous one when the latest cannot be read
    (missing, truncated, tampered, not finite); raises ``FileNotFoundError`` when neither can."""
    latest, previous = rundir.checkpoint_path(run_dir), rundir.previous_checkpoint_path(run_dir)
    if not latest.is_file() and not previous.is_file():
        raise FileNotFoundError(f"run.resume is set but {latest} does not exist")
    try:
        return load_checkpoint(latest, algo, device)
    except Exception as exc:  # torch.load raises many types for a bad file; all mean unreadable
        reason = _brief(exc)
        if not previous.is_file():
            raise FileNotFoundError(
                f"cannot read {latest} ({reason}) and there is no {previous.name} to fall back on"
            ) from exc
        log.error(
            "cannot read %s (%s); loading the previous checkpoint %s", latest, reason, previous
        )
    try:
        return load_checkpoint(previous, algo, device)
    except Exception as exc:
        raise FileNotFoundError(f"cannot read {latest} nor {previous} ({_brief(exc)})") from exc


def _brief(exc: Exception) -> str:
    """An exception's type and the first line of its message, bounded."""
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0][:200] if lines else ''}"


def save_judged_checkpoint(
    path: Path, algo: LearnerCore, counters: dict[str, int], judged: JudgedWeights, version: int
) -> None:
    """A checkpoint whose network holds the weights of published ``version`` (the learner's
    other state is its current one); the current weights when that version is no longer kept."""
    with judged.loaded(algo.network, version) as kept:
        counters["weights_version"] = version if kept else algo.num_updates
        written = save_checkpoint(
            path, algo, counters, keep_previous=path.name == rundir.CHECKPOINT
        )
    if written:
        log.info(
            "%s: weights version %d%s",
            path.name,
            counters["weights_version"],
            "" if kept else f" (version {version} was no longer kept)",
        )


def weights_digest(network: torch.nn.Module) -> str:
    """SHA-256 of the weights' bytes: equal on learners that hold equal weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(network.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
