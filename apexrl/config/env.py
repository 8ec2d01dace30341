"""The ``env`` section of a run's config: the environment, its wrappers and its Atari
preprocessing (``apexrl.config`` re-exports these classes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from apexrl.config.rules import ConfigError, check_at_least_one, check_positive


@dataclass(frozen=True)
class WrapperConfig:
    """A gymnasium wrapper around each single env: ``name(env, **kwargs)``."""

    # "module:Class" of a gymnasium.Wrapper subclass, or the name of one in gymnasium.wrappers
    # ("TimeLimit", "NormalizeObservation")
    name: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)  # its arguments after the env


@dataclass(frozen=True)
class AtariConfig:
    """Atari preprocessing (``apexrl.envs.atari``), used when ``env.id`` is an ``ALE/`` id."""

    frame_skip: int = 4  # emulator frames per env step (max-pooled over the last two)
    screen_size: int = 84  # pixels a side of the resized frame (42: with algo.torso small_cnn)
    grayscale: bool = True  # one grey channel per frame (else RGB: not supported by the torsos)
    frame_stack: int = 4  # frames in an observation
    noop_max: int = 30  # at most this many no-op steps after a reset (random starts); 0: none
    # probability that a frame repeats the previous action (ale-py v5: 0.25); 0.0 is the
    # deterministic protocol of the DQN, Ape-X and R2D2 papers
    sticky_actions: float = 0.25
    max_episode_frames: int = 108_000  # frames before a game is truncated (30 minutes of play)
    fire_reset: bool = True  # press FIRE after a reset in games that wait for it
    full_action_space: bool = False  # all 18 actions instead of the game's minimal set
    # training sees a lost life as the end of an episode (no bootstrapping past it; the DQN and
    # PPO papers' EpisodicLife); the game goes on, and returns and evaluation stay whole games
    terminal_on_life_loss: bool = False

    def validate(self) -> None:
        for name in ("frame_skip", "screen_size", "frame_stack", "max_episode_frames"):
            check_at_least_one(f"env.atari.{name}", getattr(self, name))
        if self.noop_max < 0:
            raise ConfigError(f"env.atari.noop_max must be >= 0, got {self.noop_max}")
        if not 0.0 <= self.sticky_actions < 1.0:
            raise ConfigError(
                f"env.atari.sticky_actions must be in [0, 1), got {self.sticky_actions}"
            )
        if not self.grayscale:
            raise ConfigError("env.atari.grayscale must be true: the image torsos read grey frames")


@dataclass(frozen=True)
class EnvConfig:
    # A registered gymnasium id ("CartPole-v1"; "package:Id-v0" imports the package that registers
    # it first), or an entry point "module:function" / "module:Class" that returns a gymnasium.Env.
    id: str = "CartPole-v1"
    kwargs: dict[str, Any] = field(default_factory=dict)  # arguments of gym.make or the entry point
    # Wrappers of each env before vectorisation, the first innermost (after the step limit).
    wrappers: tuple[WrapperConfig, ...] = ()
    num_envs: int = 8  # envs stepped together by one actor process
    max_episode_steps: int = 0  # episode step limit; 0 keeps the environment's own
    seed: int = 0  # base seed; actor i uses seed + 10_000 * i
    # Train on rewards clipped to [-1, 1] (DQN, Ape-X, IMPALA and PPO on Atari); returns and
    # evaluation scores are always the raw rewards.
    clip_rewards: bool = False
    atari: AtariConfig = field(default_factory=AtariConfig)  # for ALE/ ids

    def validate(self) -> None:
        """The form of the names (importing them is the envs' job: ``apexrl.envs``)."""
        self.atari.validate()
        check_positive("env.num_envs", self.num_envs)
        _check_import_name("env.id", self.id)
        for i, wrapper in enumerate(self.wrappers):
            _check_import_name(f"env.wrappers[{i}].name", wrapper.name)
            if ":" not in wrapper.name and not wrapper.name.isidentifier():
                raise ConfigError(
                    f"env.wrappers[{i}].name must be module:Class or a class name of "
                    f"gymnasium.wrappers, got {wrapper.name!r}"
                )
        if self.max_episode_steps < 0:
            raise ConfigError(
                f"env.max_episode_steps must be >= 0 (0: the env's own), "
                f"got {self.max_episode_steps}"
            )


def _check_import_name(key: str, name: str) -> None:
    """``name`` is non-empty and, when it has a ``:``, a dotted module path before it."""
    if not name.strip():
        raise ConfigError(f"{key} must not be empty")
    module, colon, attr = name.partition(":")
    if colon and not (all(part.isidentifier() for part in module.split(".")) and attr):
        raise ConfigError(f"{key} must look like package.module:Name, got {name!r}")
