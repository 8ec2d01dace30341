"""A league's state on disk, beside the run's checkpoints, so that a resumed run has its pool,
payoffs and ratings (``<run dir>/league/``):

- ``snapshots/<policy>_<version>.params``: a pinned version's ``Params`` frames as the parameter
  server encoded them at publish (a count, each frame's length, the frames), written once when it
  is pinned and removed when it is evicted;
- ``state.json``: each main policy's ``League.to_dict`` and every policy's pinned versions, oldest
  first, written atomically.

Reading back trusts nothing: a snapshot is decoded by the wire codec within the actors' limits and
must be that version of the policy's network, with finite weights (what a publish must be);
anything else is left out with a warning, and the league forgets that snapshot.
"""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path

from apexrl.runtime import lifecycle
from apexrl.transport.codec import DEFAULT_LIMITS, DecodeError, Limits, decode
from apexrl.transport.messages import Params
from apexrl.transport.weights import ArraySpec, layout_mismatch, non_finite_arrays

log = logging.getLogger(__name__)

STATE = "state.json"
SNAPSHOTS = "snapshots"
MAX_FRAMES = 64


def snapshot_path(league_dir: Path, policy: str, version: int) -> Path:
    return league_dir / SNAPSHOTS / f"{policy}_{version}.params"


def write_snapshot(league_dir: Path, policy: str, version: int, frames: tuple[bytes, ...]) -> None:
    path = snapshot_path(league_dir, policy, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(f"<{1 + len(frames)}Q", len(frames), *(len(f) for f in frames))
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as out:
        out.write(header)
        for frame in frames:
            out.write(frame)
    tmp.replace(path)


def remove_snapshot(league_dir: Path, policy: str, version: int) -> None:
    snapshot_path(league_dir, policy, version).unlink(missing_ok=True)


def write_state(league_dir: Path, state: dict) -> None:
    league_dir.mkdir(parents=True, exist_ok=True)
    lifecycle.write_atomic(league_dir / STATE, json.dumps(state, indent=1, sort_keys=True))


def read_state(league_dir: Path) -> dict | None:
    """``state.json`` as written; None when there is none; ``ValueError`` when it is not a
    league's state."""
    path = league_dir / STATE
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(state, dict) or not isinstance(state.get("pools"), dict):
        raise ValueError(f"{path} is not a league's state (no pools)")
    return state


def read_snapshot(
    league_dir: Path,
    policy: str,
    version: int,
    layout: dict[str, ArraySpec] | None,
    limits: Limits = DEFAULT_LIMITS,
) -> tuple[bytes, ...] | None:
    """A pinned version's frames as written, checked (module docstring); None, with a warning,
    when it is missing or not that version of the policy's network."""
    path = snapshot_path(league_dir, policy, version)
    try:
        data = path.read_bytes()
        frames = split_frames(data)
        params = decode(list(frames), limits)
    except (OSError, ValueError, DecodeError) as exc:
        log.warning("snapshot %s version %d is left out: %s", policy, version, exc)
        return None
    problem = None
    if not isinstance(params, Params) or params.shm_file:
        problem = f"it holds a {type(params).__name__}, not weights"
    elif params.version != version:
        problem = f"it holds version {params.version}"
    elif layout is not None and layout_mismatch(params.arrays, layout) is not None:
        problem = layout_mismatch(params.arrays, layout)
    elif non_finite_arrays(params.arrays):
        problem = "it holds NaN or infinite weights"
    if problem is not None:
        log.warning("snapshot %s version %d is left out: %s", policy, version, problem)
        return None
    return frames


def split_frames(data: bytes) -> tuple[bytes, ...]:
    """``write_snapshot``'s file back into its frames; ``ValueError`` when it is not one."""
    if len(data) < 8:
        raise ValueError("too short for a snapshot")
    (count,) = struct.unpack_from("<Q", data)
    if not 1 <= count <= MAX_FRAMES or len(data) < 8 * (1 + count):
        raise ValueError(f"a snapshot of {count} frames")
    lengths = struct.unpack_from(f"<{count}Q", data, 8)
    start = 8 * (1 + count)
    if start + sum(lengths) != len(data):
        raise ValueError("the frames' lengths do not add up to the file's")
    frames = []
    for length in lengths:
        frames.append(data[start : start + length])
        start += length
    return tuple(frames)
