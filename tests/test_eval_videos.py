"""``actor.eval_video_interval_s``: the evaluation actor of a launched run writes mp4s of greedy
games into the run directory, which a decoder reads back with the game's frames."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_launcher

from apexrl.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]


def test_the_evaluation_actor_records_games_into_the_run_directory(tmp_path: Path) -> None:
    import imageio.v2 as imageio

    code, output = run_launcher(
        ["--actors", "1", "--learners", "1",
         "--config", str(REPO / "configs" / "ppo_cartpole.yaml"),
         "--logdir", str(tmp_path), "--set", "actor.eval_video_interval_s=0.01",
         "--set", "run.stop_eval_episodes=10", "--set", "actor.eval_num_envs=10",
         "--set", "env.max_episode_steps=60", "--set", "run.stop_wall_s=12"],
        180,
    )  # fmt: skip
    assert code == 0, output[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    videos = sorted((run_dir / "videos").glob("eval-v*-episode-0.mp4"))
    assert len(videos) >= 2, output[-3000:]  # games of several weights versions
    assert not list((run_dir / "videos").glob("*.partial*"))
    eval_log = (run_dir / "logs" / "eval.log").read_text()
    steps_of_version = {}  # "eval: recorded a game of weights version 3 (return 60.0, 60 steps)"
    for line in eval_log.splitlines():
        if "recorded a game of weights version" in line:
            version = int(line.split("weights version ")[1].split()[0])
            steps_of_version[version] = int(line.split(" steps)")[0].split(", ")[-1])
    assert sorted(steps_of_version) == sorted(int(v.name.split("-")[1][1:]) for v in videos)
    for video in videos:
        steps = steps_of_version[int(video.name.split("-")[1][1:])]
        with imageio.get_reader(video, "ffmpeg") as reader:
            frames = np.stack(list(reader.iter_data()))
        assert frames.shape == (steps + 1, 400, 600, 3)
    rounds = [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]
    assert rounds[-1]["eval_episodes_in_window"] == 10  # the recorded games are not counted


def test_a_negative_interval_is_refused() -> None:
    with pytest.raises(ConfigError, match="eval_video_interval_s must be >= 0"):
        load_config(REPO / "configs" / "ppo_cartpole.yaml", ["actor.eval_video_interval_s=-1"])
