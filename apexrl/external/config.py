"""The ``external`` section of a run's config: its policy servers (``apexrl external``)."""

from __future__ import annotations

from dataclasses import dataclass

from apexrl.config.rules import check_positive


@dataclass(frozen=True)
class ExternalConfig:
    # Policy servers in the run (the local launcher's --external): server i acts as actor id
    # actor.num_actors - num_servers + i, so actor.num_actors counts them with the actors.
    num_servers: int = 0
    addr: str = "tcp://127.0.0.1:6100"  # where a policy server binds (apexrl external --bind)
    max_episodes: int = 1024  # open episodes per server; a StartEpisode past it gets an Error
    max_calls_per_turn: int = 256  # client calls read before the server acts for a batch

    def validate(self) -> None:
        if self.num_servers < 0:
            raise ValueError(f"external.num_servers must be >= 0, got {self.num_servers}")
        check_positive("external.max_episodes", self.max_episodes)
        check_positive("external.max_calls_per_turn", self.max_calls_per_turn)
