"""Gymnasium vector environments for actors, and the project's own partially observable CartPole
(``apexrl/CartPoleNoVelocity-v1``).

Vector envs autoreset in ``SAME_STEP`` mode: when an episode ends, ``step`` returns the reset
observation and puts the episode's final observation in ``info["final_obs"]``. ``step_vector``
returns that final observation as ``next_obs`` of the ending step, so a transition never spans two
episodes (the default ``NEXT_STEP`` mode would produce one garbage step after every episode end).

An env id whose gymnasium spec has a vector entry point (CartPole: ``CartPoleVectorEnv``, all envs
in one set of numpy operations, several times faster than a ``SyncVectorEnv`` of single envs from
8 envs on) is made with it when that class autoresets in ``SAME_STEP`` mode or apexrl adapts it
(``CartPoleSameStep``) and there are at least ``MIN_ENVS_FOR_VECTOR_ENTRY_POINT`` envs; any other
env is a ``SyncVectorEnv``.

``env.id`` is a registered gymnasium id, or an entry point ``module:function`` /
``module:Class`` that returns a ``gym.Env`` (the user's code, named in the user's own config);
``env.kwargs`` are its arguments and ``env.wrappers`` wrap each single env before vectorisation
(such an env is always a ``SyncVectorEnv``). Whatever cannot be made is one ``EnvError`` line
that names it: an unknown id (with the registered ids closest to it), a module that cannot be
imported, a missing attribute, something that is not a ``gym.Env``, a wrapper that is not a
``gymnasium.Wrapper`` or fails with its arguments.
"""

from __future__ import annotations

import difflib
import importlib
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector import AutoresetMode

from apexrl.config import Config, EnvConfig
from apexrl.envs import atari, minatar, nested_tasks  # noqa: F401 (registers its ids)
from apexrl.envs.nested import HybridActions, flatten_spaces


class MaskObservation(gym.ObservationWrapper):
    """Keeps only the entries ``keep`` of a flat ``Box`` observation: a partially observable
    version of an env (e.g. CartPole without its velocities, which then have to be inferred from
    the history, as a recurrent agent can and a feed-forward one cannot)."""

    def __init__(self, env: gym.Env, keep: tuple[int, ...]) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ValueError(f"MaskObservation needs a flat Box observation, got {space}")
        self.keep = np.asarray(keep, dtype=np.int64)
        self.observation_space = gym.spaces.Box(
            space.low[self.keep], space.high[self.keep], dtype=space.dtype
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self.keep]


def cartpole_without_velocity(**kwargs) -> gym.Env:
    """CartPole-v1 observing only the cart position and the pole angle (no velocities)."""
    from gymnasium.envs.classic_control import CartPoleEnv

    return MaskObservation(CartPoleEnv(**kwargs), keep=(0, 2))


# Configs name it as ``env.id``; registered when any role imports this module (they all make
# their envs through it).
CARTPOLE_NO_VELOCITY_ID = "apexrl/CartPoleNoVelocity-v1"
if CARTPOLE_NO_VELOCITY_ID not in gym.registry:
    gym.register(
        id=CARTPOLE_NO_VELOCITY_ID,
        entry_point="apexrl.envs:cartpole_without_velocity",
        max_episode_steps=500,
        reward_threshold=475.0,
    )


class EnvError(RuntimeError):
    """The configured environment cannot be made (unknown id, missing package, bad spaces)."""


class VectorStep(NamedTuple):
    obs: np.ndarray  # [B, *obs] observation to act on next (reset obs where an episode ended)
    next_obs: np.ndarray  # [B, *obs] the observation the step led to (final obs at episode ends)
    reward: np.ndarray  # [B] float32
    terminated: np.ndarray  # [B] bool
    truncated: np.ndarray  # [B] bool
    lives: np.ndarray | None = None  # [B] int lives left after the step, for games that have them


_GYMNASIUM_DIR = str(Path(gym.__file__).parent)


def _env_kwargs(cfg: EnvConfig) -> dict:
    return {"max_episode_steps": cfg.max_episode_steps} if cfg.max_episode_steps > 0 else {}


def one_line(exc: BaseException) -> str:
    """``Type: message (file:line)`` of an exception raised while making an env, on one line;
    the place is the innermost frame outside gymnasium (the user's code), none when the
    exception came from the call itself (wrong arguments)."""
    text = " ".join(str(exc).split())
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith((_GYMNASIUM_DIR, "<"))
    ]
    where = ""
    if frames and frames[-1].filename != __file__:
        where = f" ({frames[-1].filename}:{frames[-1].lineno})"
    return f"{type(exc).__name__}{': ' if text else ''}{text}{where}"


def _with_kwargs(kwargs: dict) -> str:
    return f" with kwargs {kwargs}" if kwargs else ""


def _import_module(key: str, name: str) -> Any:
    """The module of ``name`` (``module:attr``), imported; ``key`` is the config field."""
    module_name = name.partition(":")[0]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name + ".").startswith(exc.name + "."):
            raise EnvError(
                f"{key} {name!r}: no module named {exc.name!r} (is its package installed, or its "
                "directory on PYTHONPATH?)"
            ) from exc
        raise EnvError(
            f"{key} {name!r}: importing {module_name!r} failed: {one_line(exc)}"
        ) from exc
    except Exception as exc:  # the user's module raised while it was imported
        raise EnvError(
            f"{key} {name!r}: importing {module_name!r} failed: {one_line(exc)}"
        ) from exc


def _attribute(key: str, name: str, module: Any) -> Any:
    """The object ``attr`` (dotted: ``Outer.make``) of ``name`` = ``module:attr``."""
    module_name, _, attr = name.partition(":")
    found = module
    for part in attr.split("."):
        if not hasattr(found, part):
            public = [n for n in dir(found) if not n.startswith("_")]
            close = difflib.get_close_matches(part, public, n=1)
            hint = f"; did you mean {module_name}:{close[0]}?" if close else ""
            raise EnvError(f"{key} {name!r}: module {module_name!r} has no {attr!r}{hint}")
        found = getattr(found, part)
    return found


def register_pixel_envs(env_id: str) -> None:
    """Registers ale-py's ``ALE/...`` or MinAtar's ``MinAtar/...`` ids when ``env_id`` is one;
    ``EnvError`` naming the missing package."""
    for family, package in ((atari, "ale-py"), (minatar, "minatar")):
        if env_id.startswith(family.PREFIX):
            try:
                family.register()
            except ImportError as exc:
                raise EnvError(
                    f"environment {env_id!r} needs the {package} package, which is missing "
                    f"({exc}); scripts/install.sh installs it"
                ) from exc


def registered_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """The gymnasium spec of a registered id; ``EnvError`` naming the closest registered ids."""
    register_pixel_envs(env_id)
    try:
        return gym.spec(env_id)
    except gym.error.Error as exc:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=1, cutoff=0.6)
        hint = (
            f"; did you mean {close[0]}?"
            if close
            else " (an entry point is written module:function or module:Class)"
        )
        raise EnvError(
            f"cannot make environment {env_id!r}: no gymnasium id of that name is registered{hint}"
        ) from exc


def resolve_env_id(env_id: str) -> str | Callable[..., Any]:
    """What ``env.id`` names: a registered id (``"CartPole-v1"``; ``"package:Id-v0"`` imports
    ``package``, which registers ``Id-v0``, and gives ``"Id-v0"``), or the callable of an entry
    point ``module:function`` / ``module:Class``. Raises ``EnvError`` with one line."""
    if ":" not in env_id:
        registered_spec(env_id)
        return env_id
    module = _import_module("env.id", env_id)
    attr = env_id.partition(":")[2]
    if attr in gym.registry and not hasattr(module, attr.split(".")[0]):
        return attr
    entry = _attribute("env.id", env_id, module)
    if not callable(entry):
        raise EnvError(
            f"env.id {env_id!r} is not callable (type {type(entry).__name__}); name a "
            "gymnasium.Env class or a function that returns one"
        )
    return entry


def _wrapper_class(index: int, name: str) -> type[gym.Wrapper]:
    key = f"env.wrappers[{index}]"
    if ":" in name:
        wrapper = _attribute(key, name, _import_module(key, name))
    else:  # a class of gymnasium.wrappers
        wrapper = _attribute(key, f"gymnasium.wrappers:{name}", gym.wrappers)
    if not (isinstance(wrapper, type) and issubclass(wrapper, gym.Wrapper)):
        raise EnvError(f"{key} {name!r} is not a gymnasium.Wrapper subclass")
    return wrapper


def make_env(cfg: EnvConfig, render_mode: str | None = None) -> gym.Env:
    """One env of ``cfg``: made from its id or entry point with ``cfg.kwargs`` (and
    ``render_mode`` when given), limited to ``cfg.max_episode_steps`` when set, then wrapped in
    ``cfg.wrappers``, the first innermost. Raises ``EnvError`` with one line."""
    kwargs = dict(cfg.kwargs)
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    source = resolve_env_id(cfg.id)
    if isinstance(source, str) and atari.is_atari(source):
        try:
            env = atari.make_env(cfg, render_mode)
        except Exception as exc:
            raise EnvError(
                f"cannot make environment {cfg.id!r}{_with_kwargs(kwargs)}: {one_line(exc)}"
            ) from exc
    elif isinstance(source, str):
        try:
            env = gym.make(source, **_env_kwargs(cfg), **kwargs)
        except ImportError as exc:
            raise EnvError(
                f"environment {cfg.id!r} needs a package that is missing: {exc}"
            ) from exc
        except Exception as exc:
            raise EnvError(
                f"cannot make environment {cfg.id!r}{_with_kwargs(kwargs)}: {one_line(exc)}"
            ) from exc
        if minatar.is_minatar(source):
            env = minatar.MinAtarChannelsFirst(env)
    else:
        try:
            env = source(**kwargs)
        except Exception as exc:
            raise EnvError(
                f"env.id {cfg.id!r}{_with_kwargs(kwargs)} failed: {one_line(exc)}"
            ) from exc
        if not isinstance(env, gym.Env):
            raise EnvError(
                f"env.id {cfg.id!r} returned an object of type {type(env).__name__}, not a "
                "gymnasium.Env"
            )
        if cfg.max_episode_steps > 0:
            env = gym.wrappers.TimeLimit(env, cfg.max_episode_steps)
    try:
        for i, wrapper_cfg in enumerate(cfg.wrappers):
            env = _wrap(env, i, wrapper_cfg.name, wrapper_cfg.kwargs)
    except EnvError:
        env.close()
        raise
    return env


def _wrap(env: gym.Env, index: int, name: str, kwargs: dict) -> gym.Env:
    """``env`` in the wrapper ``env.wrappers[index]`` names, made with ``kwargs``."""
    wrapper = _wrapper_class(index, name)
    try:
        return wrapper(env, **kwargs)
    except Exception as exc:
        raise EnvError(
            f"env.wrappers[{index}] {name!r}{_with_kwargs(kwargs)} failed: {one_line(exc)}"
        ) from exc


def env_modules(cfg: EnvConfig) -> list[str]:
    """The modules that making ``cfg``'s envs imports, for a process that imports them ahead
    (the fork server): an entry point's or a wrapper's, or the one a registered id's own entry
    point names; none for an id that is not registered (making the env says why)."""
    names = [wrapper.name for wrapper in cfg.wrappers if ":" in wrapper.name]
    if atari.is_atari(cfg.id):
        names.append("ale_py")
    elif minatar.is_minatar(cfg.id):
        names.append("minatar.gym")
    elif ":" in cfg.id:
        names.append(cfg.id)
    elif cfg.id in gym.registry and isinstance(gym.registry[cfg.id].entry_point, str):
        names.append(gym.registry[cfg.id].entry_point)
    return list(dict.fromkeys(name.partition(":")[0] for name in names))


def check_action_space(cfg: Config, action_space: gym.Space) -> None:
    """Raise ``EnvError`` unless the algorithm can act in ``action_space`` (the kinds its
    hyperparameter class lists in ``ACTION_SPACES``)."""
    kinds = cfg.algo.ACTION_SPACES
    if type(action_space).__name__ not in kinds:
        raise EnvError(
            f"environment {cfg.env.id!r} has action space {action_space}; {cfg.algorithm} "
            f"needs a {' or '.join(kinds)} action space"
        )


def mirror_board_refusal(obs_space: gym.Space, action_space: gym.Space) -> str | None:
    """Why ``algo.mirror_board`` cannot mirror these spaces (None: it can): it takes a board's
    channel-first planes ``[C, H, W]`` and ``Discrete(W)`` actions, its columns."""
    shape = getattr(obs_space, "shape", None) or ()
    columns = shape[-1] if len(shape) == 3 else None
    if isinstance(action_space, gym.spaces.Discrete) and int(action_space.n) == columns:
        return None
    return (
        "algo.mirror_board takes a board's channel-first planes [C, H, W] and Discrete(W) "
        f"actions (its columns), not observations {obs_space} and actions {action_space}"
    )


def check_spaces(cfg: Config, obs_space: gym.Space, action_space: gym.Space) -> None:
    """``check_action_space``, and with ``algo.mirror_board`` the board it mirrors: raises
    ``EnvError`` with one line."""
    check_action_space(cfg, action_space)
    if getattr(cfg.algo, "mirror_board", False):
        refusal = mirror_board_refusal(obs_space, action_space)
        if refusal:
            raise EnvError(f"environment {cfg.env.id!r}: {refusal}")


def flat_env(cfg: EnvConfig, unit_actions: bool, product_discrete: bool) -> gym.Env:
    """``make_env``'s env with its nested spaces made flat (``envs.nested.flatten_spaces``);
    raises ``EnvError`` for a nested space apexrl cannot flatten."""
    env = make_env(cfg)
    try:
        return flatten_spaces(env, unit_actions, product_discrete)
    except ValueError as exc:
        env.close()
        raise EnvError(f"environment {cfg.id!r}: {one_line(exc)}") from exc


def check_env(cfg: Config) -> None:
    """Make and reset one env of ``cfg`` and check its action space against the algorithm, as
    every actor and learner will: raises ``EnvError`` with one line (the launcher calls it before
    it starts any role; a multi-agent run's: ``multiagent.policies.check_policies``)."""
    env = flat_env(cfg.env, cfg.unit_actions, cfg.product_discrete)
    try:
        try:
            env.reset(seed=cfg.env.seed)
        except Exception as exc:
            raise EnvError(f"resetting environment {cfg.env.id!r} failed: {one_line(exc)}") from exc
        check_spaces(cfg, env.observation_space, env.action_space)
    finally:
        env.close()


class CartPoleSameStep(gym.vector.VectorWrapper):
    """Gymnasium's ``CartPoleVectorEnv`` autoresetting in ``SAME_STEP`` mode.

    ``CartPoleVectorEnv`` only autoresets in ``NEXT_STEP`` mode: an env whose episode ended is
    reset by its next ``step``, which ignores that env's action and returns reward 0. This wrapper
    resets the ended envs within the step that ended them instead, drawing their new state as
    ``CartPoleVectorEnv`` does (uniform in ``[low, high)`` from its generator, step count 0), so
    the env's own reset never runs. The step returns the reset observations and puts the final
    ones in ``info["final_obs"]`` (``[B, 4]``, rows of the envs flagged in ``info["_final_obs"]``).
    """

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        if not isinstance(env.unwrapped, CartPoleVectorEnv):
            raise TypeError(f"CartPoleSameStep wraps a CartPoleVectorEnv, got {env.unwrapped}")
        super().__init__(env)
        self.metadata = {**env.metadata, "autoreset_mode": AutoresetMode.SAME_STEP}

    def step(self, actions: np.ndarray) -> tuple:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        ended = terminated | truncated
        if not ended.any():
            return obs, reward, terminated, truncated, info
        cartpole = self.env.unwrapped
        state = cartpole.np_random.uniform(
            low=cartpole.low, high=cartpole.high, size=(4, int(ended.sum()))
        )
        cartpole.state[:, ended] = state
        cartpole.steps[ended] = 0
        cartpole.prev_done[:] = False  # reset here: the next step moves every env
        reset_obs = obs.copy()
        reset_obs[ended] = state.T
        info = {**info, "final_obs": obs, "_final_obs": ended}
        return reset_obs, reward, terminated, truncated, info


# NEXT_STEP vector envs of gymnasium that apexrl resets in the same step.
SAME_STEP_ADAPTERS = {CartPoleVectorEnv: CartPoleSameStep}
# Fewer envs than this step faster as a SyncVectorEnv of single envs: a numpy vector env's step
# costs about the same for 1 env as for 16 (CartPole at 1 env: a third of the sync rate; the two
# are even at 2 to 4 envs).
MIN_ENVS_FOR_VECTOR_ENTRY_POINT = 4


def _vector_entry_point_env(cfg: EnvConfig, num_envs: int) -> gym.vector.VectorEnv | None:
    """The id's own vector env when it autoresets in ``SAME_STEP`` mode or has an adapter; None
    when the env is an entry point or has kwargs or wrappers, when the id has no vector entry
    point, one that apexrl cannot use, or too few envs."""
    if ":" in cfg.id or cfg.kwargs or cfg.wrappers:
        return None
    spec = registered_spec(cfg.id)
    if spec.vector_entry_point is None or num_envs < MIN_ENVS_FOR_VECTOR_ENTRY_POINT:
        return None
    try:
        vector_class = load_env_creator(spec.vector_entry_point)
    except ImportError:  # e.g. an accelerated version whose package is missing
        return None
    mode = getattr(vector_class, "metadata", {}).get("autoreset_mode")
    adapter = SAME_STEP_ADAPTERS.get(vector_class)
    if mode != AutoresetMode.SAME_STEP and adapter is None:
        return None
    try:
        envs = gym.make_vec(
            cfg.id, num_envs=num_envs, vectorization_mode="vector_entry_point", **_env_kwargs(cfg)
        )
    except Exception as exc:
        raise EnvError(f"cannot make environment {cfg.id!r}: {one_line(exc)}") from exc
    return envs if adapter is None else adapter(envs)


def make_vector_env(
    cfg: EnvConfig, num_envs: int, unit_actions: bool = False, product_discrete: bool = False
) -> gym.vector.VectorEnv:
    """``num_envs`` envs of ``cfg``, autoresetting in ``SAME_STEP`` mode: the id's own vector env
    where apexrl can use it (see the module docstring), otherwise a ``SyncVectorEnv`` of
    ``make_env``'s envs. A ``Box`` action space takes actions as they are and clips them to its
    bounds, or, with ``unit_actions``, takes actions in [-1, 1] and maps them affinely onto its
    bounds (a tanh-squashed policy's range). Nested spaces are made flat (``envs.nested``):
    ``Dict`` and ``Tuple`` observations packed into byte rows, Tuple and Dict actions of Discrete
    and Box parts into float32 rows, and with ``product_discrete`` (``Config.product_discrete``)
    a MultiDiscrete action into the index of its product. Raises ``EnvError`` with one line."""
    envs = None
    if atari.is_atari(cfg.id) and not cfg.wrappers and not cfg.kwargs:
        register_pixel_envs(cfg.id)
        envs = atari.make_vector_env(cfg, num_envs)
    else:
        envs = _vector_entry_point_env(cfg, num_envs)
    if envs is None:
        envs = gym.vector.SyncVectorEnv(
            [lambda: flat_env(cfg, unit_actions, product_discrete)] * num_envs,
            autoreset_mode=AutoresetMode.SAME_STEP,
        )
    action_space = envs.single_action_space
    if isinstance(action_space, gym.spaces.Box) and not isinstance(action_space, HybridActions):
        if unit_actions:
            envs = rescale_to_unit(envs)
        else:
            # A Gaussian policy samples unbounded actions and trains on what it sampled; the
            # env gets them clipped to its bounds.
            envs = gym.wrappers.vector.ClipAction(envs)
    return envs


def rescale_to_unit(envs: gym.vector.VectorEnv) -> gym.vector.VectorEnv:
    """The env's Box actions taken in [-1, 1] (bounds in the space's own dtype, so gymnasium
    keeps the action precision it had)."""
    space = envs.single_action_space
    low = np.full(space.shape, -1.0, space.dtype)
    return gym.wrappers.vector.RescaleAction(envs, min_action=low, max_action=-low)


def step_vector(envs: gym.vector.VectorEnv, actions: np.ndarray) -> VectorStep:
    obs, reward, terminated, truncated, info = envs.step(actions)
    next_obs = obs
    ended = terminated | truncated
    if ended.any():
        next_obs = obs.copy()
        final = info["final_obs"]
        if final.dtype == object:  # SyncVectorEnv: one entry per env, None where none ended
            for i in np.flatnonzero(ended):
                next_obs[i] = final[i]
        else:  # a numpy vector env: one [B, *obs] array
            next_obs[ended] = final[ended]
    lives = info.get("lives")
    return VectorStep(
        obs=obs,
        next_obs=next_obs,
        reward=np.asarray(reward, dtype=np.float32),
        terminated=np.asarray(terminated, dtype=bool),
        truncated=np.asarray(truncated, dtype=bool),
        lives=None if lives is None else np.asarray(lives),
    )
