"""``apexrl evaluate`` for real: a short PPO CartPole run is trained once by
``scripts/launch_local.sh`` (which also writes the run's plots at its end), and its checkpoints are
played by the command a user types. Bad inputs (a missing run or checkpoint, a tampered or
mismatched checkpoint, ``--record`` without moviepy) are one line on stderr and exit status 2."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import builders
import numpy as np
import pytest
import torch
from conftest import REPO, log_tail, run_apexrl, set_args

SCRIPT = REPO / "scripts" / "launch_local.sh"
RUN_TIMEOUT_S = 240.0
# One actor of 4 envs, a rollout of 4 unrolls (one actor's share), evaluation rounds of 8
# episodes: PPO's CartPole run of 6000 env steps takes well under a minute on two cores.
PPO_OVERRIDES = (
    "env.num_envs=4",
    "actor.eval_num_envs=4",
    "actor.report_interval_s=0.5",
    "replay.min_size_to_sample=4",
    "replay.report_interval_s=0.5",
    "learner.batch_size=4",
    "learner.report_interval_s=1",
    "run.stop_eval_episodes=8",
    "run.stop_env_steps=6000",
    "run.stop_eval_return=null",
    "run.stop_wall_s=0",
)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The run directory of a finished PPO CartPole run (checkpoints, config.yaml, result.json)."""
    base = tmp_path_factory.mktemp("trained")
    logdir, log_path = base / "runs", base / "launcher.log"
    with open(log_path, "wb") as log_file:
        popen = subprocess.Popen(
            [
                str(SCRIPT),
                "--actors",
                "1",
                "--learners",
                "1",
                "--config",
                str(REPO / "configs" / "ppo_cartpole.yaml"),
                "--logdir",
                str(logdir),
                *set_args(PPO_OVERRIDES),
            ],
            cwd=base,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        code = popen.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        if popen.poll() is None:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()
    assert code == 0, f"launcher exit code {code}\n{log_tail(log_path)}"
    (path,) = [p for p in logdir.iterdir() if p.is_dir()]
    yield path


def evaluate(*args: str) -> subprocess.CompletedProcess:
    return run_apexrl("evaluate", *args, timeout_s=180)


def stat_line(stdout: str, name: str) -> dict[str, float]:
    """``return  mean 1.00  std 0.00  min 1.00  max 1.00`` -> {"mean": 1.0, ...}."""
    (line,) = [line for line in stdout.splitlines() if line.split()[:1] == [name]]
    words = line.split()[1:]
    return {k: float(v) for k, v in zip(words[::2], words[1::2], strict=True)}


def one_error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("apexrl evaluate: error: "), lines
    assert "Traceback" not in done.stderr
    return lines[0]


def test_evaluate_plays_the_trained_checkpoint(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "episodes.json"
    done = evaluate(str(run_dir), "--episodes", "7", "--envs", "3", "--out", str(out))
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    returns, lengths = np.array(record["returns"]), np.array(record["lengths"])
    assert record["episodes"] == len(returns) == len(lengths) == 7
    assert record["envs"] == 3
    assert record["algorithm"] == "ppo" and record["env"] == "CartPole-v1"
    # CartPole pays 1 per step: every return is its episode's length.
    np.testing.assert_array_equal(returns, lengths)
    assert ((lengths >= 1) & (lengths <= 500)).all()
    # The weights played are the checkpoint's, and the output says which version they are.
    counters = torch.load(run_dir / "checkpoint.pt", weights_only=True)["counters"]
    assert record["weights_version"] == counters["weights_version"]
    assert record["checkpoint"] == str(run_dir / "checkpoint.pt")
    assert f"(weights version {counters['weights_version']})" in done.stdout
    assert "7 episodes on 3 envs" in done.stdout
    printed = stat_line(done.stdout, "return")
    expected = {
        "mean": returns.mean(),
        "std": returns.std(),
        "min": returns.min(),
        "max": returns.max(),
    }
    for key, value in expected.items():
        assert printed[key] == pytest.approx(value, abs=0.005), (key, done.stdout)
        assert record["return"][key] == pytest.approx(value)
    assert stat_line(done.stdout, "length")["max"] == lengths.max()
    assert f"written to {out}" in done.stdout


def test_evaluate_best_checkpoint_writes_next_to_it_by_default(run_dir: Path) -> None:
    before = set(run_dir.glob("evaluate-*.json"))
    done = evaluate(str(run_dir), "--best", "--episodes", "2")
    assert done.returncode == 0, done.stderr
    (written,) = set(run_dir.glob("evaluate-*.json")) - before
    record = json.loads(written.read_text())
    assert record["checkpoint"] == str(run_dir / "checkpoint_best.pt")
    assert record["episodes"] == 2
    best = torch.load(run_dir / "checkpoint_best.pt", weights_only=True)["counters"]
    assert record["weights_version"] == best["weights_version"]


def test_evaluate_a_checkpoint_file_with_overrides(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "short.json"
    done = evaluate(
        str(run_dir / "checkpoint.pt"),
        "--episodes",
        "5",
        "--envs",
        "2",
        "--set",
        "env.max_episode_steps=20",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert record["episodes"] == 5
    assert max(record["lengths"]) <= 20  # the override reached the envs


def test_record_writes_mp4s_that_decoders_read_with_the_games_frames(
    run_dir: Path, tmp_path: Path
) -> None:
    """On this install (imageio, imageio-ffmpeg and pygame from pyproject.toml): one mp4 per
    episode, one frame per step and the reset's, which both ffmpeg (through imageio) and
    OpenCV's decoder read back as CartPole's 600x400 frames, and which differ along the game."""
    import cv2
    import imageio.v2 as imageio

    videos, out = tmp_path / "videos", tmp_path / "recorded.json"
    args = ("--episodes", "2", "--set", "env.max_episode_steps=30", "--out", str(out))
    done = evaluate(str(run_dir), "--record", str(videos), *args)
    assert done.returncode == 0, done.stderr
    mp4s = sorted(videos.glob("*.mp4"))
    assert [p.name for p in mp4s] == ["env0-episode-0.mp4", "env0-episode-1.mp4"]
    assert "2 videos in" in done.stdout
    lengths = json.loads(out.read_text())["lengths"]
    for mp4, length in zip(mp4s, lengths, strict=True):
        with imageio.get_reader(mp4, "ffmpeg") as reader:
            frames = np.stack(list(reader.iter_data()))
        assert frames.shape == (length + 1, 400, 600, 3), (mp4.name, frames.shape)
        assert np.abs(frames[0].astype(int) - frames[-1].astype(int)).max() > 50  # it moved
        capture = cv2.VideoCapture(str(mp4))
        read = 0
        while True:
            ok, frame = capture.read()
            if not ok:
                break
            assert frame.shape == (400, 600, 3)
            read += 1
        capture.release()
        assert read == length + 1


def test_record_without_its_packages_says_what_to_install(monkeypatch) -> None:
    from apexrl.envs import video

    real = importlib.util.find_spec
    monkeypatch.setattr(
        video.importlib.util,
        "find_spec",
        lambda name: None if name == "imageio_ffmpeg" else real(name),
    )
    with pytest.raises(video.VideoError, match="pip install imageio-ffmpeg"):
        video.check_video_packages()


def test_missing_run_or_checkpoint_is_one_line(run_dir: Path, tmp_path: Path) -> None:
    assert "no run directory or checkpoint" in one_error_line(evaluate(str(tmp_path / "nope")))
    no_checkpoint = tmp_path / "run"
    no_checkpoint.mkdir()
    shutil.copy(run_dir / "config.yaml", no_checkpoint)
    assert "has no checkpoint.pt" in one_error_line(evaluate(str(no_checkpoint)))
    assert "has no checkpoint_best.pt" in one_error_line(evaluate(str(no_checkpoint), "--best"))
    lonely = tmp_path / "lonely" / "checkpoint.pt"
    lonely.parent.mkdir()
    shutil.copy(run_dir / "checkpoint.pt", lonely)
    assert "give --config" in one_error_line(evaluate(str(lonely)))


class _RunsCode:
    """Unpickling this object would create ``path``: what a tampered checkpoint could do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_tampered_truncated_or_mismatched_checkpoints_are_refused(
    run_dir: Path, tmp_path: Path
) -> None:
    config = ("--config", str(run_dir / "config.yaml"))
    witness = tmp_path / "code_ran"
    tampered = tmp_path / "tampered.pt"
    with open(tampered, "wb") as f:
        pickle.dump({"algo": _RunsCode(witness), "counters": {}}, f)
    assert "cannot load" in one_error_line(evaluate(str(tampered), *config))
    assert not witness.exists(), "evaluate unpickled an object from the checkpoint"
    torch.save({"algo": {"network": _RunsCode(witness)}, "counters": {}}, tampered)
    assert "not unpickled" in one_error_line(evaluate(str(tampered), *config))
    assert not witness.exists(), "evaluate unpickled an object from the checkpoint"

    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes((run_dir / "checkpoint.pt").read_bytes()[:200])
    assert "cannot load" in one_error_line(evaluate(str(truncated), *config))
    # A config whose network does not match the weights.
    line = one_error_line(evaluate(str(run_dir), "--set", "algo.hidden_sizes=[32]"))
    assert "cannot load" in line and "state_dict" in line


def test_the_launcher_plotted_the_run_at_its_end(run_dir: Path) -> None:
    from apexrl.tools.plot import RETURN_FIGURES, THROUGHPUT_NAME

    for name in [name for name, _, _ in RETURN_FIGURES] + [THROUGHPUT_NAME]:
        data = (run_dir / "plots" / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 5000, name


@pytest.mark.parametrize("config", ["apex_dqn_cartpole", "r2d2_cartpole", "impala_pendulum"])
def test_every_algorithm_plays_its_learners_checkpoint(
    config: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint as the learner writes it (its core, ``save_checkpoint``) of each other
    algorithm family, played through the command line in this process."""
    from apexrl.cli import main
    from apexrl.learning.checkpoint import save_checkpoint
    from apexrl.learning.update import build_algo

    cfg = builders.config(f"run.dir={tmp_path}", path=builders.config_file(config))
    algo, counters = build_algo(cfg, torch.device("cpu"), resume=False)
    builders.write_config(tmp_path, cfg)
    assert save_checkpoint(tmp_path / "checkpoint.pt", algo, {**counters, "weights_version": 3})
    out = tmp_path / "episodes.json"
    args = ["evaluate", str(tmp_path), "--episodes", "3", "--envs", "2", "--out", str(out)]
    code = main([*args, "--set", "env.max_episode_steps=50"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    record = json.loads(out.read_text())
    assert record["algorithm"] == cfg.algorithm and record["weights_version"] == 3
    assert record["episodes"] == len(record["returns"]) == len(record["lengths"]) == 3
    assert max(record["lengths"]) <= 50
    assert stat_line(printed.out, "return")["mean"] == pytest.approx(
        np.mean(record["returns"]), abs=0.005
    )
