"""The evaluation actor's games against fixed players (``league.eval_opponents``): each round,
the main policy's latest greedy version plays ``run.stop_eval_episodes`` games against each named
fixed player, in both seats (``opponents.opponent_config``: the seats swapped every other game),
never read from training games: a round of ``run.stop_eval_episodes`` games, shared out evenly
between the opponents, so that the run's judged return is the mean over all of them.

``OpponentRounds`` holds one vector of envs per opponent, all sharing the main policy's player
(its weights as the evaluation actor loads them). A round's judged returns are the main policy's
in every game of the round; its groups add ``opponent/<name>`` (the main policy's returns against
that player), ``opponent/<name>/wins`` (1 for each game it won, else 0: its mean is the win rate)
and ``opponent/<name>/<agent>`` (in that seat), names as a metric holds them.
"""

from __future__ import annotations

import re
from pathlib import PurePath

import numpy as np

from apexrl.acting.rounds import round_quotas
from apexrl.config import Config, ConfigError
from apexrl.config.rules import FIXED_CHECKPOINT
from apexrl.league.config import main_policy
from apexrl.league.opponents import opponent_config
from apexrl.multiagent.checkpoint_player import fixed_player_policy
from apexrl.multiagent.players import ActionView, FixedPlayer, Player
from apexrl.multiagent.policies import policy_spaces
from apexrl.multiagent.rounds import MultiAgentRound, play_multiagent_round
from apexrl.multiagent.stepping import AgentEnvs
from apexrl.transport.messages import MAX_METRIC_NAME_CHARS


def opponent_group(name: str) -> str:
    """A fixed player's name as a return group: ``opponent/random``, ``opponent/module.Class``,
    ``opponent/checkpoint.<run>[.<policy>]`` (``<run>``: the run directory's name, or
    ``<directory>.<file>`` for a ``.pt`` file; characters a metric name cannot hold become
    ``_``)."""
    if name.startswith(FIXED_CHECKPOINT):
        path, _, policy = name.removeprefix(FIXED_CHECKPOINT).partition("#")
        found = PurePath(path)
        run = f"{found.parent.name}.{found.stem}" if found.suffix == ".pt" else found.name
        name = ".".join(part for part in ("checkpoint", run, policy) if part)
        name = re.sub(r"[^A-Za-z0-9_.\-]", "_", name)
    return ("opponent/" + name.replace(":", "."))[:MAX_METRIC_NAME_CHARS]


class OpponentRounds:
    """Rounds of the main policy against each of ``league.eval_opponents`` (module docstring)."""

    def __init__(
        self, cfg: Config, players: dict[str, Player], num_envs: int, rng: np.random.Generator
    ) -> None:
        self.main = main_policy(cfg.league, cfg.multiagent.trained)
        games = max(cfg.run.stop_eval_episodes // len(cfg.league.eval_opponents), 2)
        self.quotas = round_quotas(games, min(num_envs, games))  # each opponent's, per env
        self.tables: list[tuple[str, Config, AgentEnvs]] = []
        groups = [opponent_group(name) for name in cfg.league.eval_opponents]
        if len(set(groups)) < len(groups):
            raise ConfigError(
                f"league.eval_opponents: two opponents share a metric name ({', '.join(groups)})"
            )
        try:
            for name in cfg.league.eval_opponents:
                table_cfg = opponent_config(cfg, self.main, name)
                rival = next(spec for spec in table_cfg.multiagent.policies if spec.fixed)
                found = policy_spaces(table_cfg)[rival.name]
                try:
                    policy = fixed_player_policy(name, found.obs_space, found.action_space, rng)
                except ConfigError as exc:
                    raise ConfigError(f"league.eval_opponents: {exc}") from exc
                seated = {
                    self.main: players[self.main],
                    rival.name: FixedPlayer(
                        rival.name, policy, ActionView(found.action_space, False)
                    ),
                }
                self.tables.append((name, table_cfg, AgentEnvs(table_cfg, num_envs, seated)))
        except BaseException:
            self.close()
            raise

    def play(self, seed: int, between_steps=None) -> MultiAgentRound | None:
        """A round against every opponent, as one ``MultiAgentRound``; None when stopped."""
        rounds = []
        quotas = self.quotas
        for name, table_cfg, envs in self.tables:
            try:
                played = play_multiagent_round(table_cfg, envs, quotas, seed, between_steps)
            finally:
                envs.release_seats()  # the main policy's rows, for the next opponent
            if played is None:
                return None
            rounds.append((name, played))
        return self.merged(rounds)

    def merged(self, rounds: list[tuple[str, MultiAgentRound]]) -> MultiAgentRound:
        groups: dict[str, np.ndarray] = {}
        prefix = f"policy/{self.main}/"
        for name, played in rounds:
            group = opponent_group(name)
            groups[group] = played.returns
            groups[f"{group[: MAX_METRIC_NAME_CHARS - 5]}/wins"] = (played.returns > 0).astype(
                float
            )
            for key, values in played.groups.items():
                if key.startswith(prefix):
                    groups[f"{group}/{key[len(prefix) :]}"[:MAX_METRIC_NAME_CHARS]] = values
        return MultiAgentRound(
            np.concatenate([played.returns for _, played in rounds]),
            np.concatenate([played.lengths for _, played in rounds]),
            groups,
            sum(played.env_steps for _, played in rounds),
            sum(played.agent_steps for _, played in rounds),
            sum(played.illegal_actions for _, played in rounds),
            sum(played.seconds for _, played in rounds),
        )

    def close(self) -> None:
        for _, _, envs in self.tables:
            envs.close()
