"""The ``league`` section of a run's config: a multi-agent run's snapshots of its trained
policies, frozen past versions that later matches can seat as opponents.

Torch-free and gymnasium-free, like every section: the servers and the launcher read it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LeagueConfig:
    # Pin every trained policy's published version on the parameter server as a snapshot every
    # this many versions (a frozen opponent, served like any weights); 0: no snapshots
    snapshot_every_versions: int = 0
    # Snapshots kept per policy; pinning one more evicts the oldest
    pool_size: int = 8

    @property
    def enabled(self) -> bool:
        return self.snapshot_every_versions > 0

    def validate(self) -> None:
        if self.snapshot_every_versions < 0:
            raise ValueError(
                "league.snapshot_every_versions must be >= 0 (0: no snapshots), got "
                f"{self.snapshot_every_versions}"
            )
        if self.pool_size < 1:
            raise ValueError(f"league.pool_size must be >= 1, got {self.pool_size}")
