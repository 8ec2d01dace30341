"""Typed configuration: frozen dataclasses filled from YAML plus ``--set key=value`` overrides.

Every role reads the same ``Config``. Loading is strict: an unknown key is an error that names it
and suggests the closest valid key, a value of the wrong type is an error that names the key, and
``Config.validate`` checks the rules between fields: each section's ``validate``, then the rules
between sections. The rules themselves, each a small function in the config's key names, live in
``config_rules.py`` (the replay's that keep inserts and samples from waiting for each other
forever among them). The resolved config is written to ``<run dir>/config.yaml`` by the learner,
so a run can be repeated from its own directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from apexrl.config.algos import ALGORITHM_CONFIGS, ApexDQNConfig
from apexrl.config.env import AtariConfig, EnvConfig, WrapperConfig
from apexrl.config.rules import (
    ConfigError,
    check_in_unit_interval,
    check_positive,
    check_replay_config,
    check_seconds,
)
from apexrl.external.config import ExternalConfig
from apexrl.league.config import LeagueConfig
from apexrl.multiagent.config import MultiAgentConfig

__all__ = ["AtariConfig", "Config", "ConfigError", "EnvConfig", "WrapperConfig", "load_config"]


# learner.precision, actor.precision (apexrl.models.precision)
PRECISIONS = ("fp32", "bf16", "auto")


def check_precision(key: str, value: str) -> None:
    if value not in PRECISIONS:
        raise ConfigError(f"{key} must be one of {', '.join(PRECISIONS)}, got {value!r}")


# YAML 1.1 (PyYAML) reads "3e-4" and "1e5" as strings; a float field accepts exactly that form.
_FLOAT_TEXT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def check_callbacks_name(name: str) -> None:
    """``callbacks`` is empty or ``package.module:Class`` (importing it is the launcher's
    preflight: ``apexrl.callbacks``)."""
    if not name:
        return
    module, colon, attr = name.partition(":")
    names = [*module.split("."), *attr.split(".")]
    if not colon or not all(part.isidentifier() for part in names):
        raise ConfigError(f"callbacks must be package.module:Class or empty, got {name!r}")


def _check_device(key: str, device: str) -> None:
    if device not in ("cpu", "auto") and not device.startswith("cuda"):
        raise ConfigError(f"{key} must be 'cpu', 'cuda[:N]' or 'auto', got {device!r}")


IDLE_EVAL_NICE = 10  # the evaluation actor's niceness where no evaluation stops the run


@dataclass(frozen=True)
class ActorConfig:
    num_actors: int = 4  # N of the per-actor epsilon schedule (the launcher sets it to --actors)
    epsilon: float = 0.4  # Ape-X epsilon base: actor i explores with epsilon^(1 + alpha*i/(N-1))
    epsilon_alpha: float = 7.0  # Ape-X alpha of the epsilon schedule
    chunk_steps: int = 16  # vector steps per chunk sent to replay (items = chunk_steps * num_envs)
    params_poll_steps: int = 400  # env steps between checks for newer weights
    report_interval_s: float = 2.0  # seconds between reports to replay and metric writes
    device: str = "cpu"  # inference device: "cpu", "cuda" or "auto" (cuda when present)
    torch_threads: int = 1  # intra-op threads for inference
    # Training actors' inference: "fp32", "bf16" (autocast) or "auto" (bf16 where the CPU has
    # AMX/AVX512-BF16 or on CUDA and measured faster at start-up); apexrl.models.precision. The
    # evaluation actor always plays in fp32.
    precision: str = "auto"
    # The evaluation actor plays rounds of run.stop_eval_episodes episodes, one weights version
    # each, on this many envs at once (at most one env per episode of the round).
    eval_num_envs: int = 100
    eval_epsilon: float = 0.0  # exploration of the evaluation actor (0: greedy)
    # The evaluation actor's niceness. null (auto): 0 where an evaluation return stops the run
    # (run.stop_eval_return: the evaluation decides when it ends, as fast as the training roles
    # run), else 10: it plays in the time the training roles leave idle.
    eval_nice: int | None = None
    # > 0: after a round, at most every this many seconds, the evaluation actor plays one more
    # greedy game and writes it to <run dir>/videos/eval-v<version>-episode-0.mp4; 0: no videos.
    eval_video_interval_s: float = 0.0
    # > 0: the evaluation actor starts a round at most every this many seconds, resting between
    # rounds (its CPU left to the training roles; a stop condition on the evaluation return is
    # judged that much later); 0: the next round as soon as newer weights are there.
    eval_interval_s: float = 0.0
    peer_timeout_s: float = 30.0  # warn when a server has not answered for this long
    # A request to a server (a chunk, a weights request) unanswered this long, while the server
    # answers nothing else either, is sent again; a dropped connection re-sends it at once.
    resend_timeout_s: float = 10.0  # seconds
    # Step half of the envs while the network infers for the other half (apexrl.acting.stepping):
    # where the env has an asynchronous vector env (ale-py's Atari games) and the algorithm is
    # asynchronous; elsewhere the actor steps all envs, then infers, as with false.
    overlap: bool = True

    def validate(self) -> None:
        for key in ("num_actors", "chunk_steps", "params_poll_steps", "eval_num_envs"):
            check_positive(f"actor.{key}", getattr(self, key))
        if self.eval_nice is not None and not 0 <= self.eval_nice <= 19:
            raise ConfigError(f"actor.eval_nice must be in 0..19 or null, got {self.eval_nice}")
        check_positive("actor.resend_timeout_s", self.resend_timeout_s)
        if not self.eval_video_interval_s >= 0:
            interval = self.eval_video_interval_s
            raise ConfigError(f"actor.eval_video_interval_s must be >= 0 (0: none), got {interval}")
        check_seconds("actor.eval_interval_s", self.eval_interval_s, "0: no rest")
        check_precision("actor.precision", self.precision)
        check_in_unit_interval("actor.epsilon", self.epsilon)
        check_in_unit_interval("actor.eval_epsilon", self.eval_epsilon)
        _check_device("actor.device", self.device)


@dataclass(frozen=True)
class ReplayConfig:
    table: str = "apex_dqn"  # table name on the wire
    kind: str = "prioritized"  # "prioritized" or "fifo"
    capacity: int = 2_000_000  # items; the oldest are evicted first
    priority_exponent: float = 0.6  # alpha of prioritized sampling
    min_size_to_sample: int = 50_000  # items stored before the first sample
    samples_per_insert: float = 1.0  # sampled items per inserted item; <= 0 disables the ratio
    rate_error_buffer: float = 0.0  # slack of the ratio in items; 0 picks the smallest safe value
    max_pending_inserts: int = 256  # chunks held back by the rate limiter before refusing more
    max_pending_insert_bytes: int = 256 * 2**20  # bytes of those held chunks, all together
    max_pending_samples: int = 64  # sample requests held back before refusing more
    max_times_sampled: int = 1  # FIFO: deliveries of each item before it leaves the queue
    evict_unread: bool = False  # FIFO: when full, drop the oldest unread items (counted) instead
    # of holding the actors back
    report_interval_s: float = 2.0  # seconds between metric writes
    # Seconds between snapshots of the table and the run's counters to <run dir>/replay_snapshot/
    # (one is also written at a clean stop and loaded at start); 0 disables them.
    snapshot_interval_s: float = 60.0
    # Every stored chunk goes to a log in the run dir before its ack (snapshot + log = all that
    # was acknowledged, after a kill too); the snapshots then leave the items in the log, whose
    # segments go once their items have left the table; needs snapshot_interval_s > 0
    durable: bool = True
    log_fsync: bool = False  # also flush the log to the disk before each ack (machine crashes)
    # Seconds between writes of the learners' priority updates to the chunk log (the last one of
    # each key; durable and prioritized): a killed server comes back with the priorities of at
    # most this long ago; 0: at every pass of the server loop
    priority_log_period_s: float = 1.0
    # Stacked Atari frames are sent and stored once (items hold references to them; about 7 KB
    # per 84x84 frame, 1.8 KB per 42x42, instead of a stack of 4 per observation); false: whole
    # stacks
    store_frames_once: bool = True

    def validate(self) -> None:
        """What the table, the rate limiter and the learners' batches must agree on is
        ``Config.check_links``'s (``replay.kind``, ``capacity``, ``min_size_to_sample``, ...)."""
        check_positive("replay.max_pending_inserts", self.max_pending_inserts)
        check_positive("replay.max_pending_insert_bytes", self.max_pending_insert_bytes)
        if self.priority_exponent < 0:
            raise ConfigError(
                f"replay.priority_exponent must be >= 0, got {self.priority_exponent}"
            )
        check_seconds("replay.snapshot_interval_s", self.snapshot_interval_s, "0: no snapshots")
        if self.rate_error_buffer < 0:
            raise ConfigError(
                f"replay.rate_error_buffer must be >= 0 (0: automatic), "
                f"got {self.rate_error_buffer}"
            )
        if self.durable and self.snapshot_interval_s == 0:
            raise ConfigError(
                "replay.durable needs replay snapshots: the chunk log holds the chunks stored "
                "since the last snapshot and is cut at each one; set replay.snapshot_interval_s "
                "> 0 or replay.durable: false"
            )
        check_seconds("replay.priority_log_period_s", self.priority_log_period_s)
        if self.log_fsync and not self.durable:
            raise ConfigError("replay.log_fsync needs replay.durable: true (there is no log)")


@dataclass(frozen=True)
class LearnerConfig:
    batch_size: int = 512  # items per update
    device: str = "cpu"  # "cpu", "cuda" or "auto" (cuda when present)
    torch_threads: int = 1  # intra-op threads
    # "fp32", "bf16" (autocast forward passes; targets, ratios, softmax, losses, the optimizer
    # and the weights stay fp32) or "auto" (bf16 where the hardware has it and a start-up
    # measurement found it faster); apexrl.models.precision
    precision: str = "auto"
    publish_period: int = 10  # updates between weight publishes
    checkpoint_period: int = 5000  # updates between checkpoints (and one at shutdown)
    prefetch_batches: int = 4  # sample requests kept in flight
    report_interval_s: float = (
        5.0  # seconds between metric writes, result.json lines, console lines
    )
    seed: int = 0  # seed of network initialisation
    # Several learners (torch.distributed): each rank samples its own batch_size items and the
    # gradients are averaged every update, so one update sees batch_size * world_size items and
    # lr applies to that averaged gradient (scale lr yourself if you scale the learners).
    world_size: int = 1  # learner processes that train one model
    rendezvous: str = ""  # tcp://HOST:PORT where rank 0 hosts the group's store (world_size > 1)
    join_timeout_s: float = 120.0  # seconds to wait for every rank to join
    collective_timeout_s: float = 60.0  # seconds a rank waits in an all-reduce for the others
    # A server that answers nothing this long (replay: sample requests; params: a publish's
    # ack) is taken as gone: the requests are sent again; a dropped connection does it at once.
    resend_timeout_s: float = 10.0  # seconds

    def validate(self) -> None:
        """``learner.batch_size`` is checked with the replay (``Config.check_links``)."""
        for key in (
            "publish_period",
            "checkpoint_period",
            "prefetch_batches",
            "world_size",
            "join_timeout_s",
            "collective_timeout_s",
            "resend_timeout_s",
        ):
            check_positive(f"learner.{key}", getattr(self, key))
        if self.world_size > 1 and not self.rendezvous.startswith("tcp://"):
            raise ConfigError(
                "learner.rendezvous must be tcp://HOST:PORT when learner.world_size > 1, "
                f"got {self.rendezvous!r}"
            )
        _check_device("learner.device", self.device)
        check_precision("learner.precision", self.precision)


@dataclass(frozen=True)
class NetConfig:
    replay_addr: str = (
        "tcp://127.0.0.1:6000"  # replay server: bind address there, connect elsewhere
    )
    params_addr: str = "tcp://127.0.0.1:6001"  # parameter server: bind there, connect elsewhere
    # Directory of the run's CURVE keys (`apexrl keys DIR`): servers admit only the roles in its
    # allow-list, every link is encrypted. Empty: no authentication (servers bind loopback only).
    keys_dir: str = ""
    insecure: bool = False  # let a server without keys bind a non-loopback address


TRACKER_NAMES = ("tensorboard", "wandb", "mlflow")  # run.trackers (apexrl.tracking)


@dataclass(frozen=True)
class RunConfig:
    dir: str = ""  # run directory; empty: runs/<algorithm>-<env id>
    # The limits below count across the sessions of a resumed run (the checkpoint keeps the run's
    # env steps and learner time); the evaluation window counts the current session only.
    stop_env_steps: int = 0  # stop after this many training env steps of the run; 0: no limit
    # Multi-agent runs: stop after this many agent steps (every agent's decisions); 0: no limit
    stop_agent_steps: int = 0
    stop_wall_s: float = 0.0  # stop after this many seconds of learner time; 0: no limit
    # Stop when the mean evaluation return reaches this (any number, negative included: Acrobot
    # is solved at -100); null: no return threshold.
    stop_eval_return: float | None = None
    stop_eval_episodes: int = 100  # evaluation episodes the mean is taken over
    resume: bool = False  # continue from <run dir>/checkpoint.pt
    restart_learner: bool = True  # the launcher restarts a dead learner with --resume; false: stop
    # A Minari dataset id: replay serves its episodes (apexrl dataset, which the launcher starts
    # as one more actor) to an offline learner (bc, apex_dqn, sac, td3, ddpg); "": none
    input_dataset: str = ""
    # A Minari dataset id the training actors' whole episodes are written to when the run ends
    # (apexrl.offline.training_episodes); "": none
    output_dataset: str = ""
    # Where the learner's records go besides result.json and every role's TensorBoard events
    # (apexrl.tracking): any of wandb, mlflow (tensorboard: the events, always written); the
    # launchers' --track adds one
    trackers: tuple[str, ...] = ("tensorboard",)
    tracker_project: str = "apexrl"  # the W&B project, the MLflow experiment
    # The W&B group, the MLflow parent run, of a sweep's trials (apexrl sweep sets it); "": none
    tracker_group: str = ""
    mlflow_tracking_uri: str = ""  # "": MLflow's own (MLFLOW_TRACKING_URI, else its default)

    def validate(self) -> None:
        check_positive("run.stop_eval_episodes", self.stop_eval_episodes)
        unknown = [t for t in self.trackers if t not in TRACKER_NAMES]
        if unknown or len(set(self.trackers)) != len(self.trackers):
            raise ConfigError(
                f"run.trackers takes each of {', '.join(TRACKER_NAMES)} at most once, got "
                f"{list(self.trackers)}"
            )
        for key in ("stop_env_steps", "stop_agent_steps", "stop_wall_s"):
            if getattr(self, key) < 0:
                raise ConfigError(f"run.{key} must be >= 0 (0: no limit)")
        if self.stop_eval_return is not None and not math.isfinite(self.stop_eval_return):
            raise ConfigError(
                f"run.stop_eval_return must be a finite number or null, got {self.stop_eval_return}"
            )


OFFLINE_FAMILIES = ("bc", "apex_dqn", "sac", "td3", "ddpg")  # they learn from transitions


@dataclass(frozen=True)
class Config:
    algorithm: str = "apex_dqn"  # key of ALGORITHM_CONFIGS; decides the type of `algo`
    algo: Any = field(default_factory=ApexDQNConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    net: NetConfig = field(default_factory=NetConfig)
    run: RunConfig = field(default_factory=RunConfig)
    external: ExternalConfig = field(default_factory=ExternalConfig)
    # Several agents and policies (a PettingZoo env): apexrl.multiagent; empty: one agent
    multiagent: MultiAgentConfig = field(default_factory=MultiAgentConfig)
    # Snapshots of a multi-agent run's trained policies (frozen past versions): apexrl.league
    league: LeagueConfig = field(default_factory=LeagueConfig)
    # "package.module:Class" of the run's callbacks and custom metrics (apexrl.callbacks), made by
    # every training actor and the learner; "": none. The module must be importable by the roles.
    callbacks: str = ""

    @property
    def run_dir(self) -> Path:
        if self.run.dir:
            return Path(self.run.dir)
        return Path("runs") / self.run_name

    @property
    def run_name(self) -> str:
        """``<algorithm>-<env id>`` with the env id's ``/`` (``ALE/Pong-v5``) made a ``-`` and an
        entry point's ``:`` (``mypkg.envs:make``) a ``.``."""
        name = f"{self.algorithm}-{self.env.id}"
        return name.replace("/", "-").replace(":", ".").replace(" ", "_")

    @property
    def dataset_actor_id(self) -> int:
        """The actor id the dataset feeder sends as: the last before the policy servers'."""
        return self.actor.num_actors - self.external.num_servers - 1

    @property
    def eval_niceness(self) -> int:
        """The evaluation actor's niceness: ``actor.eval_nice``, or where that is null (auto) 0
        when an evaluation return stops the run and 10 when none does."""
        if self.actor.eval_nice is not None:
            return self.actor.eval_nice
        return 0 if self.run.stop_eval_return is not None else IDLE_EVAL_NICE

    @property
    def unit_actions(self) -> bool:
        """Whether the policy acts in [-1, 1] (a tanh-squashed Gaussian, ``algo.squash_actions``
        of the actor-critics; always for DDPG, TD3 and SAC), which the envs map onto their Box
        bounds."""
        return bool(getattr(self.algo, "UNIT_ACTIONS", False)) or bool(
            getattr(self.algo, "squash_actions", False)
        )

    @property
    def product_discrete(self) -> bool:
        """Whether a MultiDiscrete action is taken as one index of its product (the Q-learners,
        ``algo.PRODUCT_DISCRETE``: their heads score single actions)."""
        return bool(getattr(self.algo, "PRODUCT_DISCRETE", False))

    @property
    def chunk_items(self) -> int:
        """Replay items in one actor's chunk: the algorithm says what a chunk of
        ``actor.chunk_steps`` vector steps of ``env.num_envs`` envs makes."""
        return self.algo.items_per_chunk(self.actor.chunk_steps, self.env.num_envs)

    @property
    def rate_error_buffer(self) -> float:
        """The rate limiter's slack in items: the configured one, or the smallest that cannot
        deadlock (a blocked insert must leave room for a sample and the other way round)."""
        if self.replay.rate_error_buffer > 0:
            return self.replay.rate_error_buffer
        return float(
            self.chunk_items * max(self.replay.samples_per_insert, 0.0) + self.learner.batch_size
        )

    def validate(self) -> None:
        """Each section's rules, then those between sections (the replay's among them); raises
        ``ConfigError`` naming the key of the first rule broken."""
        try:
            self.env.validate()
            check_callbacks_name(self.callbacks)
            self.actor.validate()
            self.learner.validate()
            self.run.validate()
            self.replay.validate()
            self.algo.validate()
            self.external.validate()
            self.multiagent.validate()
            self.league.validate()
            self.check_links()
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc

    def check_offline(self) -> None:
        """What training from ``run.input_dataset`` needs: a family that learns from
        transitions and no replay ratio (nothing is inserted after the dataset)."""
        if self.algorithm not in OFFLINE_FAMILIES:
            raise ConfigError(
                f"run.input_dataset trains {', '.join(OFFLINE_FAMILIES)}; {self.algorithm} "
                "learns from its own actions"
            )
        if self.replay.samples_per_insert > 0:
            raise ConfigError(
                "run.input_dataset needs replay.samples_per_insert 0 (no ratio: nothing is "
                f"inserted after the dataset), got {self.replay.samples_per_insert}"
            )

    def check_league(self) -> None:
        """A league is a multi-agent run's, its main policy one it trains."""
        league = self.league
        if not (league.enabled or league.eval_opponents or league.main):
            return
        if not self.multiagent.enabled:
            raise ConfigError(
                "the league (snapshots, matches, eval_opponents) plays a multi-agent run's "
                "policies; set multiagent.policies"
            )
        if league.main and league.main not in self.multiagent.trained:
            raise ConfigError(
                f"league.main {league.main!r} is not a policy the run trains "
                f"({', '.join(self.multiagent.trained)})"
            )

    def check_annealing(self) -> None:
        """Annealing runs over a number of env steps of a single-agent run."""
        names = ("anneal_lr", "anneal_clip")
        annealed = [f"algo.{name}" for name in names if getattr(self.algo, name, False)]
        if not annealed:
            return
        if self.multiagent.enabled:
            raise ConfigError(f"{annealed[0]} anneals over a single-agent run's env steps")
        horizon, stop = self.algo.anneal_env_steps, self.run.stop_env_steps
        if horizon < 0:
            raise ConfigError(
                f"algo.anneal_env_steps must be positive, or 0 for run.stop_env_steps; got "
                f"{horizon}"
            )
        if stop <= 0 or stop > (horizon or stop):
            raise ConfigError(
                f"{annealed[0]} anneals towards 0 over algo.anneal_env_steps (0: "
                f"run.stop_env_steps), and a run must stop by then: set run.stop_env_steps, at "
                f"most the annealing's length (got run.stop_env_steps {stop}, "
                f"algo.anneal_env_steps {horizon})"
            )

    def check_multiagent(self) -> None:
        """What a multi-agent run cannot be combined with (yet)."""
        if self.algorithm == "bc":
            raise ConfigError("multiagent: bc learns from a dataset of one agent")
        for key, value in (
            ("run.input_dataset", self.run.input_dataset),
            ("run.output_dataset", self.run.output_dataset),
            ("external.num_servers", self.external.num_servers),
            ("env.wrappers", self.env.wrappers),
        ):
            if value:
                raise ConfigError(f"{key} is for single-agent runs; a multi-agent run has none")

    def check_links(self) -> None:
        """The rules between sections: the learners' publishes and sample requests, and the
        replay setup that must not deadlock (``config_rules.check_replay_config``, which also
        checks ``replay.capacity``, ``replay.min_size_to_sample`` and ``learner.batch_size``)."""
        if self.algo.SYNCHRONOUS and self.learner.publish_period != 1:
            raise ConfigError(
                f"{self.algorithm}'s actors wait for every new weights version; set "
                f"learner.publish_period to 1, got {self.learner.publish_period}"
            )
        if not getattr(self.algo, "AUTOCAST", True):
            for key in ("learner.precision", "actor.precision"):
                section, name = key.split(".")
                if getattr(getattr(self, section), name) == "bf16":
                    raise ConfigError(
                        f"{self.algorithm}'s MLP networks compute in fp32; set {key} to fp32 "
                        f"or auto, got bf16"
                    )
        if self.run.input_dataset:
            self.check_offline()
        self.check_annealing()
        if self.multiagent.enabled:
            self.check_multiagent()
        self.check_league()
        if self.external.num_servers > self.actor.num_actors:
            raise ConfigError(
                f"external.num_servers {self.external.num_servers} > actor.num_actors "
                f"{self.actor.num_actors}: the policy servers take the last actor ids"
            )
        in_flight = self.learner.world_size * self.learner.prefetch_batches
        if self.replay.max_pending_samples < in_flight:
            raise ConfigError(
                f"replay.max_pending_samples {self.replay.max_pending_samples} < the sample "
                f"requests the learners keep in flight (learner.world_size "
                f"{self.learner.world_size} * learner.prefetch_batches "
                f"{self.learner.prefetch_batches} = {in_flight}); raise it"
            )
        check_replay_config(
            self.replay.kind,
            self.replay.capacity,
            self.replay.samples_per_insert,
            self.rate_error_buffer,
            self.replay.min_size_to_sample,
            max_insert_items=self.chunk_items,
            max_sample_items=self.learner.batch_size,
            max_times_sampled=self.replay.max_times_sampled,
            evict_unread=self.replay.evict_unread,
        )


# ---------------------------------------------------------------------------------------------
# Loading: YAML mapping -> dataclasses, strictly.


def config_keys(algo_type: type = ApexDQNConfig) -> list[str]:
    """Every dotted key of a ``Config`` whose ``algo`` section is ``algo_type``."""

    def keys(cls: type, where: str) -> list[str]:
        hints = typing.get_type_hints(cls)
        found = []
        for f in dataclasses.fields(cls):
            kind = algo_type if (cls is Config and f.name == "algo") else hints[f.name]
            if dataclasses.is_dataclass(kind):
                found += keys(kind, f"{where}{f.name}.")
            else:
                found.append(f"{where}{f.name}")
        return found

    return keys(Config, "")


def _fail_unknown(key: str, valid: list[str], where: str, all_keys: list[str]) -> typing.NoReturn:
    """Name the unknown key and suggest, in order: the same name in another section
    (``learner.lr`` -> ``algo.lr``), the nearest key of its own section, the nearest full key."""
    full = f"{where}{key}"
    by_name = {}  # the last part of every key in another section -> that full key
    for k in all_keys:
        if k.startswith(where) and where:
            continue
        by_name.setdefault(k.rsplit(".", 1)[-1], k)
    close = (
        [by_name[key]]
        if key in by_name
        else [f"{where}{k}" for k in difflib.get_close_matches(key, valid, n=1)]
        or [by_name[k] for k in difflib.get_close_matches(key, list(by_name), n=1)]
    )
    hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(valid)}"
    raise ConfigError(f"unknown config key '{full}'{hint}")


def _coerce(value: Any, annotation: Any, path: str) -> Any:
    """Check ``value`` against a field's type; ints are accepted for floats, lists for tuples."""
    origin = typing.get_origin(annotation)
    if annotation is type(None):
        if value is None or value == "":  # `key:` in YAML, or `--set key=`
            return None
    elif annotation is bool:
        if isinstance(value, bool):
            return value
    elif annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and _FLOAT_TEXT.match(value.strip()):
            return float(value)
    elif annotation is str:
        if isinstance(value, str):
            return value
    elif origin is tuple:
        (item_type, _ellipsis) = typing.get_args(annotation)
        if isinstance(value, (list, tuple)):
            return tuple(_coerce(v, item_type, f"{path}[{i}]") for i, v in enumerate(value))
    elif dataclasses.is_dataclass(annotation):  # an item of a tuple of sections (env.wrappers)
        if not isinstance(value, dict):
            raise ConfigError(f"{path} must be a mapping, got {value!r} ({type(value).__name__})")
        return _build(annotation, value, f"{path}.", [])
    elif origin is dict:  # arguments for user code (env.kwargs): plain YAML data, str keys
        if isinstance(value, dict):
            _check_plain_data(value, path)
            return dict(value)
    elif origin in (typing.Union, types.UnionType):
        for option in typing.get_args(annotation):
            try:
                return _coerce(value, option, path)
            except ConfigError:
                continue
    else:
        raise ConfigError(f"{path}: unsupported field type {annotation!r}")
    name = getattr(annotation, "__name__", str(annotation))
    raise ConfigError(f"{path} must be {name}, got {value!r} ({type(value).__name__})")


def _check_plain_data(value: Any, path: str) -> None:
    """``value`` is made of None, bool, int, float, str, lists and str-keyed mappings only."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(f"{path}: keys must be strings, got {key!r}")
            _check_plain_data(item, f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_plain_data(item, f"{path}[{i}]")
    elif value is not None and not isinstance(value, (bool, int, float, str)):
        raise ConfigError(
            f"{path} must be plain YAML data (numbers, strings, lists, mappings), "
            f"got {value!r} ({type(value).__name__})"
        )


def _build(cls: type, data: Any, where: str, all_keys: list[str]) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if not isinstance(key, str) or key not in fields:
            _fail_unknown(str(key), sorted(fields), where, all_keys)
        path = f"{where}{key}"
        annotation = hints[key]
        if dataclasses.is_dataclass(annotation):
            kwargs[key] = _build(annotation, value, f"{path}.", all_keys)
        else:
            kwargs[key] = _coerce(value, annotation, path)
    return cls(**kwargs)


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted!r}: {key!r} is not a section")
        node = child
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``"learner.lr=3e-4"`` -> ``("learner.lr", 0.0003)``; the value is parsed as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} must look like section.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML: {exc}") from exc
    return key.strip(), value


def config_from_dict(data: dict[str, Any]) -> Config:
    """Build and validate a ``Config`` from a plain mapping (YAML already parsed)."""
    data = dict(data)
    algorithm = data.get("algorithm", Config.algorithm)
    if not isinstance(algorithm, str) or algorithm not in ALGORITHM_CONFIGS:
        raise ConfigError(
            f"unknown algorithm {algorithm!r}; known: {', '.join(sorted(ALGORITHM_CONFIGS))}"
        )
    algo_type = ALGORITHM_CONFIGS[algorithm]
    all_keys = config_keys(algo_type)
    algo = _build(algo_type, data.pop("algo", {}) or {}, "algo.", all_keys)
    cfg = dataclasses.replace(_build(Config, data, "", all_keys), algo=algo)
    cfg.validate()
    return cfg


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config (``None``: all defaults), apply ``key=value`` overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
        data = loaded or {}
    for text in overrides:
        key, value = parse_override(text)
        _set_path(data, key, value)
    return config_from_dict(data)


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain mapping (tuples as lists) that ``config_from_dict`` reads back to an equal config."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        return value

    return plain(cfg)


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


def add_overrides_argument(parser: argparse.ArgumentParser, example: str = "algo.lr=1e-4") -> None:
    """The ``--set KEY=VALUE`` flag of every command that reads a config (``args.overrides``)."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a config value, e.g. {example} (repeatable)",
    )
