"""Videos of whole episodes, written as mp4 by imageio and imageio-ffmpeg (its own ffmpeg
binary): ``apexrl evaluate --record`` and the evaluation actor's ``actor.eval_video_interval_s``.

gymnasium's ``RecordVideo`` writes through moviepy, which pins Pillow below 12 and which nothing
else here needs; this wrapper keeps the same file names (``<prefix>-episode-<k>.mp4``) and
writes the frames ``env.render()`` gives (``render_mode="rgb_array"``) after the reset and after
every step, at the env's ``render_fps``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np

from apexrl.runtime import rundir

VIDEO_PACKAGES = ("imageio", "imageio_ffmpeg")


class VideoError(RuntimeError):
    """Videos cannot be written here (a package missing, an env that does not render)."""


def check_video_packages() -> None:
    """Raise ``VideoError`` naming the packages ``scripts/install.sh`` installs for videos."""
    missing = [name for name in VIDEO_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        names = " ".join(name.replace("_", "-") for name in missing)
        raise VideoError(f"videos need {names}: pip install {names} (scripts/install.sh does)")


def write_mp4(path: Path, frames: list[np.ndarray], fps: float) -> None:
    """``frames`` (``[H, W, 3]`` uint8 each) as an H.264 mp4 (yuv420p: every player reads it).
    Odd sizes are padded by one pixel (H.264 wants even ones); written to a temporary name and
    renamed, so a video on disk is whole."""
    import imageio.v2 as imageio

    height, width = frames[0].shape[:2]
    pad = ((0, height % 2), (0, width % 2), (0, 0))
    partial = path.with_name(path.name + rundir.PARTIAL_VIDEO_SUFFIX)
    writer = imageio.get_writer(
        partial, fps=fps, codec="libx264", pixelformat="yuv420p", macro_block_size=1
    )
    try:
        for frame in frames:
            writer.append_data(np.pad(np.asarray(frame, dtype=np.uint8), pad, mode="edge"))
    finally:
        writer.close()
    partial.replace(path)


class RecordEpisodes(gym.Wrapper):
    """Record the episodes ``episode_trigger(k)`` picks (k counts from 0) of an env made with
    ``render_mode="rgb_array"`` into ``video_dir/<name_prefix>-episode-<k>.mp4``; the video is
    written when the episode ends (terminated or truncated); an episode the env closes in is
    not written (no video of half a game)."""

    def __init__(
        self,
        env: gym.Env,
        video_dir: Path | str,
        episode_trigger: Callable[[int], bool],
        name_prefix: str = "rl-video",
    ) -> None:
        super().__init__(env)
        if env.render_mode != "rgb_array":
            raise VideoError(f"recording needs render_mode='rgb_array', got {env.render_mode!r}")
        check_video_packages()
        self.video_dir, self.name_prefix = Path(video_dir), name_prefix
        self.episode_trigger = episode_trigger
        self.fps = float(env.metadata.get("render_fps") or 30)
        self.episode = -1
        self.frames: list[np.ndarray] | None = None  # the recorded episode's, None: not recording

    def reset(self, **kwargs):
        self._finish()
        obs, info = self.env.reset(**kwargs)
        self.episode += 1
        if self.episode_trigger(self.episode):
            self.frames = []
            self._capture()
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.frames is not None:
            self._capture()
            if terminated or truncated:
                self._finish()
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        self.frames = None
        super().close()

    def _capture(self) -> None:
        frame = self.env.render()
        if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[2] != 3:
            shape = getattr(frame, "shape", None)
            raise VideoError(f"render() gave {type(frame).__name__} {shape}, not [H, W, 3]")
        self.frames.append(frame)

    def _finish(self) -> None:
        if self.frames:
            self.video_dir.mkdir(parents=True, exist_ok=True)
            path = self.video_dir / f"{self.name_prefix}-episode-{self.episode}.mp4"
            write_mp4(path, self.frames, self.fps)
        self.frames = None


def recorded_vector_env(cfg, quotas, video_dir: Path, name_prefix: str = "env{i}"):
    """A ``SyncVectorEnv`` of ``len(quotas)`` envs made as the config says, env ``i`` recording
    its first ``quotas[i]`` episodes into ``video_dir`` (``name_prefix`` formatted with ``i``),
    with the actors' space flattening and action wrappers."""

    def record(env: gym.Env, i: int, quota: int) -> gym.Env:
        return RecordEpisodes(env, video_dir, lambda k: k < quota, name_prefix.format(i=i))

    return wrapped_vector_env(cfg, quotas, [record], render_mode="rgb_array")


def wrapped_vector_env(cfg, quotas, wrappers, render_mode: str | None = None):
    """A ``SyncVectorEnv`` of ``len(quotas)`` envs made as the config says, each wrapped by
    every ``wrapper(env, i, quotas[i])`` in turn around the user's env itself (below the actors'
    space flattening and action wrappers, which come on top as for the actors' envs)."""
    from gymnasium.vector import AutoresetMode

    from apexrl.envs import make_env, rescale_to_unit
    from apexrl.envs.nested import HybridActions, flatten_spaces

    def make(i: int, quota: int):
        def thunk() -> gym.Env:
            env = make_env(cfg.env, render_mode=render_mode)  # its kwargs, limit and wrappers
            for wrapper in wrappers:
                env = wrapper(env, i, quota)
            return flatten_spaces(env, cfg.unit_actions, cfg.product_discrete)

        return thunk

    envs = gym.vector.SyncVectorEnv(
        [make(i, int(q)) for i, q in enumerate(quotas)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    space = envs.single_action_space
    if isinstance(space, gym.spaces.Box) and not isinstance(space, HybridActions):
        if cfg.unit_actions:
            envs = rescale_to_unit(envs)
        else:
            envs = gym.wrappers.vector.ClipAction(envs)
    return envs
