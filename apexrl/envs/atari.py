"""Atari 2600 games through ale-py (which ships the ROMs: nothing is downloaded at run time).

``env.id: ALE/Pong-v5`` (any game of ale-py's ``ALE/<Game>-v5`` ids) is preprocessed as the
papers and the ecosystem do, with the settings of the config's ``env.atari`` section:

| ``env.atari``          | default | meaning                                               |
|------------------------|---------|-------------------------------------------------------|
| ``frame_skip``         | 4       | emulator frames per env step, the action repeated;    |
|                        |         | the last two frames max-pooled (sprites flicker)      |
| ``screen_size``        | 84      | frames resized (area interpolation) to 84x84, grey;   |
|                        |         | any size works (42: RLlib's 42x42 frames, a quarter   |
|                        |         | of the pixels, with the ``small_cnn`` torso)          |
| ``frame_stack``        | 4       | an observation is the last 4 frames: (4, 84, 84) uint8 |
| ``noop_max``           | 30      | a reset plays 1..30 no-op steps (random starts)       |
| ``sticky_actions``     | 0.25    | a frame repeats the previous action with this         |
|                        |         | probability (ale-py v5, Machado et al. 2018); 0.0 is  |
|                        |         | the deterministic protocol of the DQN-era papers      |
| ``max_episode_frames`` | 108000  | a game is truncated after 30 minutes of play          |
| ``fire_reset``         | true    | press FIRE after a reset in games that need it        |
| ``full_action_space``  | false   | the game's minimal action set                         |
| ``terminal_on_life_loss`` | false | training sees a lost life as an episode's end      |

Units: one env step is ``frame_skip`` frames; apexrl counts env steps (``env_steps``) and reports
frames beside them (``frames = env_steps * frame_skip``). Rewards here are the raw game score;
whether training clips them is the algorithm's choice (``env.clip_rewards``), and evaluation always
reports raw scores of whole games. ``terminal_on_life_loss`` is applied by
``apexrl.envs.training``: the env itself always plays whole games.

Two implementations of the same preprocessing:

- ``make_vector_env``: ale-py's ``AtariVectorEnv``, every game of an actor stepped by C++ threads
  with the preprocessing done in C++, autoresetting in ``SAME_STEP`` mode (the final observation
  of a game in ``info["final_obs"]``). Actors use it.
- ``make_env``: one game as gymnasium's ``AtariPreprocessing`` and ``FrameStackObservation``
  wrappers around ``gym.make(id, frameskip=1)``: the reference stack, also what ``apexrl evaluate
  --record`` renders. ``tests/test_pixels.py`` shows the two equal step for step on the same seeds
  with ``noop_max`` 0, ``sticky_actions`` 0 and ``fire_reset`` off. With them on, the two draw the
  random parts from their own generators, and ``FireReset`` here presses FIRE as a whole env step
  where ale-py presses it inside its own frames: the same protocol, not the same frames.
"""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from apexrl.config import EnvConfig
from apexrl.runtime.cores import usable_cores

PREFIX = "ALE/"


def is_atari(env_id: str) -> bool:
    return env_id.startswith(PREFIX)


def register() -> None:
    """Registers ale-py's ``ALE/...`` ids with gymnasium, once; ImportError when it is missing."""
    if f"{PREFIX}Pong-v5" in gym.registry:
        return
    import ale_py

    gym.register_envs(ale_py)


def rom_name(env_id: str) -> str:
    """ale-py's ROM name of an id: ``ALE/MsPacman-v5`` -> ``ms_pacman``."""
    game = env_id[len(PREFIX) :].rsplit("-v", 1)[0]
    return re.sub(r"(?<!^)(?=[A-Z])", "_", game).lower()


def frames_per_step(cfg: EnvConfig) -> int:
    """Emulator frames in one env step: ``frame_skip`` for Atari, 1 for anything else."""
    return cfg.atari.frame_skip if is_atari(cfg.id) else 1


def make_env(cfg: EnvConfig, render_mode: str | None = None) -> gym.Env:
    """One preprocessed game: ``gym.make(id, frameskip=1, ...)`` in ``AtariPreprocessing`` (no-op
    starts, frame skip with max-pooling, resize, grey) and ``FrameStackObservation``."""
    atari = cfg.atari
    kwargs = dict(cfg.kwargs)
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    env = gym.make(
        cfg.id,
        frameskip=1,
        repeat_action_probability=atari.sticky_actions,
        full_action_space=atari.full_action_space,
        max_num_frames_per_episode=atari.max_episode_frames,
        **kwargs,
    )
    env = gym.wrappers.AtariPreprocessing(
        env,
        noop_max=atari.noop_max,
        frame_skip=atari.frame_skip,
        screen_size=atari.screen_size,
        grayscale_obs=atari.grayscale,
        grayscale_newaxis=False,
        scale_obs=False,
    )
    if atari.fire_reset and "FIRE" in env.unwrapped.get_action_meanings():
        env = FireReset(env)
    return gym.wrappers.FrameStackObservation(env, atari.frame_stack, padding_type="zero")


class FireReset(gym.Wrapper):
    """Presses FIRE and then action 2 (one env step each) after every reset, for games that wait
    for FIRE to start (the baselines' ``FireResetEnv`` convention)."""

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        meanings = self.env.unwrapped.get_action_meanings()
        for action in (meanings.index("FIRE"), 2 if len(meanings) > 2 else 0):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                return self.env.reset(**kwargs)
        return obs, info


def make_vector_env(cfg: EnvConfig, num_envs: int, num_threads: int = 0) -> gym.vector.VectorEnv:
    """``num_envs`` games in ale-py's ``AtariVectorEnv`` (``num_threads`` C++ threads; 0: as many as
    envs, up to the cores this process may run on), autoresetting in ``SAME_STEP`` mode, rewards
    unclipped."""
    import ale_py

    atari = cfg.atari
    return ale_py.AtariVectorEnv(
        rom_name(cfg.id),
        num_envs,
        num_threads=num_threads or min(num_envs, usable_cores()),
        autoreset_mode=AutoresetMode.SAME_STEP,
        frameskip=atari.frame_skip,
        stack_num=atari.frame_stack,
        img_height=atari.screen_size,
        img_width=atari.screen_size,
        grayscale=atari.grayscale,
        maxpool=True,
        noop_max=atari.noop_max,
        repeat_action_probability=atari.sticky_actions,
        max_num_frames_per_episode=atari.max_episode_frames,
        full_action_space=atari.full_action_space,
        use_fire_reset=atari.fire_reset,
        episodic_life=False,
        life_loss_info=False,
        reward_clipping=False,
    )


def lives_lost(previous_lives: np.ndarray, lives: np.ndarray, ended: np.ndarray) -> np.ndarray:
    """Where a step cost a life without ending the game: fewer lives than before the step. A
    step that ended the game is its episode's end already (and ``lives`` there is the next
    game's count, reset by the autoreset)."""
    return (np.asarray(lives) < np.asarray(previous_lives)) & ~np.asarray(ended, dtype=bool)


def clip_reward(reward: np.ndarray) -> np.ndarray:
    """The training reward of the papers that clip (DQN, Ape-X, IMPALA, PPO): sign(r) in
    {-1, 0, 1} for Atari's integer scores, i.e. ``r`` clipped to [-1, 1]."""
    return np.clip(reward, -1.0, 1.0)
