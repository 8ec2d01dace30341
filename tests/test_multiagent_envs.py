"""A multi-agent run's envs, config and bookkeeping, on real PettingZoo envs and tiny scripted ones
whose every number is worked out by hand (``multiagent_envs_for_tests``):

- ``AgentEnv``: AEC turns (rewards given while an agent waits add up to its next outcome, each
  agent flushed once at the end with its own flag), agents that come and go with different
  spaces, Parallel episodes cut by the env (simple_spread) or by ``env.max_episode_steps``, and
  tictactoe's masks, board, wins and illegal moves;
- the ``multiagent`` config section's errors;
- ``policy_spaces`` and ``policy_config`` (speaker_listener, simple_spread, tictactoe);
- ``group_returns`` / ``judged_return``;
- the fixed policies: ``random_actions`` and a scripted policy's checks.
"""

from __future__ import annotations

import copy
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from apexrl.algos import load_algorithm
from apexrl.config import ConfigError, config_from_dict, load_config
from apexrl.config.env import EnvConfig
from apexrl.envs import EnvError
from apexrl.multiagent.envs import AgentEnv, Episode, agent_views, make_pettingzoo_env
from apexrl.multiagent.fixed import ScriptedPolicy, random_actions
from apexrl.multiagent.policies import PolicyMap, policy_config, policy_spaces
from apexrl.multiagent.returns import group_returns, judged_return
from apexrl.multiagent.stepping import SeatedEpisode

REPO = Path(__file__).resolve().parents[1]
HELPERS = "multiagent_envs_for_tests"
SPREAD = "mpe2.simple_spread_v3:parallel_env"
SPEAKER_LISTENER = "mpe2.simple_speaker_listener_v4:parallel_env"
TICTACTOE = "pettingzoo.classic.tictactoe_v3:env"
OBS_SPACE = gym.spaces.Box(0.0, 1.0, (18,), np.float32)  # tictactoe's board, as a network sees it
NINE = gym.spaces.Discrete(9)  # tictactoe's squares


def agent_env(env_id: str, max_episode_steps: int = 0, **kwargs) -> AgentEnv:
    env = make_pettingzoo_env(
        EnvConfig(id=env_id, kwargs=kwargs, max_episode_steps=max_episode_steps)
    )
    return AgentEnv(env, agent_views(env), max_episode_steps)


def play_turns(env: AgentEnv, moves: list[int]) -> tuple[list, list, Episode | None]:
    """Play an AEC env's moves in turn from a reset; every outcome and decision, and the
    episode when it ended."""
    decisions = env.reset(seed=0, episode=0)
    outcomes, seen, episode = [], list(decisions), None
    for move in moves:
        (decision,) = decisions
        new, decisions, episode = env.step({decision.agent: move})
        outcomes += new
        seen += decisions
    return outcomes, seen, episode


def by_agent(events: list) -> dict[str, list]:
    found: dict[str, list] = {}
    for event in events:
        found.setdefault(event.agent, []).append(event)
    return found


# --- AEC: turns, rewards while waiting, the final flush ----------------------------------------


def test_aec_outcome_sums_the_rewards_since_the_agents_own_action() -> None:
    # TakeTurns: a acts at turns 1 and 3, b at 2 and 4; the mover of turn k gets k, the other
    # 10 * k; after turn 4 a is terminated and b truncated.
    env = agent_env(f"{HELPERS}:take_turns")
    outcomes, decisions, episode = play_turns(env, [0, 1, 0, 1])
    assert [d.agent for d in decisions] == ["a", "b", "a", "b"]
    got = by_agent(outcomes)
    # a: its turn 1 (1) and b's turn 2 (20); then its turn 3 (3) and b's turn 4 (40)
    assert [o.reward for o in got["a"]] == [1 + 20, 3 + 40]
    # b: its turn 2 (2) and a's turn 3 (30); then its turn 4 (4), nothing after it
    assert [o.reward for o in got["b"]] == [2 + 30, 4]
    # next_obs is the agent's own next turn: [turns taken, index]
    assert [o.next_obs.tolist() for o in got["a"]] == [[2, 0], [4, 0]]
    assert [o.next_obs.tolist() for o in got["b"]] == [[3, 1], [4, 1]]
    assert [d.obs.tolist() for d in decisions] == [[0, 0], [1, 1], [2, 0], [3, 1]]
    # each flushed once at the end, with the flag the env gave it
    assert [(o.terminated, o.truncated) for o in got["a"]] == [(False, False), (True, False)]
    assert [(o.terminated, o.truncated) for o in got["b"]] == [(False, False), (False, True)]
    # b's 10 of turn 1 came before it ever acted: in its return, in no outcome
    assert episode == Episode(
        number=0,
        returns={"a": 1 + 20 + 3 + 40, "b": 10 + 2 + 30 + 4},
        decisions={"a": 2, "b": 2},
        env_steps=4,
    )


def test_aec_agents_that_come_and_go_each_get_their_own_decisions_and_outcomes() -> None:
    # ComeAndGo's script (its docstring): early [2], stay [2], late [3] and ghost [3] observe
    # [turns taken, index, 1 ...]; the mover of turn k gets k.
    env = agent_env(f"{HELPERS}:come_and_go")
    assert {agent: view.space.shape for agent, view in env.views.items()} == {
        "early": (2,),
        "stay": (2,),
        "late": (3,),
        "ghost": (3,),
    }
    outcomes, decisions, episode = play_turns(env, [0] * 5)
    assert [(d.agent, d.obs.tolist()) for d in decisions] == [
        ("early", [0, 0]),
        ("stay", [1, 1]),
        ("late", [2, 2, 1]),  # joined after turn 2
        ("stay", [3, 1]),
        ("late", [4, 2, 1]),
    ]
    got = by_agent(outcomes)
    flags = {agent: [(o.reward, o.terminated, o.truncated) for o in got[agent]] for agent in got}
    assert flags == {
        "early": [(1 + 30, True, False)],  # left after turn 3 while the others went on
        "stay": [(2, False, False), (4 + 50, False, True)],
        "late": [(3, False, False), (5, True, False)],
    }
    assert "ghost" not in got  # it never acted: no outcome, though it got 7
    assert [o.next_obs.tolist() for o in got["late"]] == [[4, 2, 1], [5, 2, 1]]
    assert episode.returns == {"early": 1 + 30, "stay": 2 + 4 + 50, "late": 3 + 5, "ghost": 7}
    assert episode.decisions == {"early": 1, "stay": 2, "late": 2}
    assert episode.env_steps == 5


def test_aec_env_takes_no_max_episode_steps() -> None:
    with pytest.raises(EnvError, match="cuts Parallel envs only"):
        agent_env(f"{HELPERS}:take_turns", max_episode_steps=3)


# --- Parallel: simple_spread --------------------------------------------------------------------


def play_parallel(env: AgentEnv, seed: int = 0) -> tuple[list[list], Episode]:
    """Every step's outcomes of one episode in which each agent plays action 0."""
    decisions = env.reset(seed=seed, episode=0)
    steps = []
    while True:
        outcomes, decisions, episode = env.step({d.agent: 0 for d in decisions})
        steps.append(outcomes)
        if episode is not None:
            return steps, episode


def test_simple_spread_is_truncated_for_every_agent_after_its_25_cycles() -> None:
    env = agent_env(SPREAD, N=3, max_cycles=25, continuous_actions=False)
    steps, episode = play_parallel(env)
    agents = ["agent_0", "agent_1", "agent_2"]
    assert len(steps) == 25 and episode.env_steps == 25
    assert all([o.agent for o in outcomes] == agents for outcomes in steps)
    assert not any(o.terminated or o.truncated for outcomes in steps[:-1] for o in outcomes)
    assert [(o.terminated, o.truncated) for o in steps[-1]] == [(False, True)] * 3
    assert episode.decisions == dict.fromkeys(agents, 25)
    for agent in agents:  # the return is the sum of the agent's outcomes' rewards
        rewards = [o.reward for outcomes in steps for o in outcomes if o.agent == agent]
        assert episode.returns[agent] == pytest.approx(sum(rewards))


def test_max_episode_steps_cuts_a_parallel_episode_with_truncated_outcomes() -> None:
    env = agent_env(SPREAD, max_episode_steps=10, N=3, max_cycles=25, continuous_actions=False)
    steps, episode = play_parallel(env)
    assert len(steps) == 10 and episode.env_steps == 10
    assert [(o.terminated, o.truncated) for o in steps[-1]] == [(False, True)] * 3
    assert not any(o.truncated for outcomes in steps[:-1] for o in outcomes)
    # the next episode starts from a reset, with every agent again
    assert [d.agent for d in env.reset(seed=1, episode=1)] == ["agent_0", "agent_1", "agent_2"]


def test_parallel_outcomes_of_a_scripted_env_carry_each_step_reward() -> None:
    # Twins: at step t, left gets t and right 10 + t; both truncated after 3 steps.
    env = agent_env(f"{HELPERS}:twins", length=3)
    steps, episode = play_parallel(env)
    assert [[o.reward for o in outcomes] for outcomes in steps] == [[1, 11], [2, 12], [3, 13]]
    assert [o.next_obs.tolist() for o in steps[0]] == [[1, 0, 0, 0], [1, 1, 0, 0]]
    assert episode.returns == {"left": 1 + 2 + 3, "right": 11 + 12 + 13}


# --- tictactoe: masks, board, wins, illegal moves ------------------------------------------------


def test_tictactoe_masks_come_from_the_observation_and_the_board_is_18_floats() -> None:
    env = agent_env(TICTACTOE)
    assert env.views["player_1"].space == gym.spaces.Box(0.0, 1.0, (18,), np.float32)
    first = env.reset(seed=0, episode=0)
    assert [d.agent for d in first] == ["player_1"]
    assert first[0].obs.tolist() == [0.0] * 18 and first[0].mask.tolist() == [True] * 9
    _, (decision,), _ = env.step({"player_1": 4})  # the centre
    raw = env.env.observe("player_2")
    np.testing.assert_array_equal(decision.mask, raw["action_mask"].astype(bool))
    np.testing.assert_array_equal(decision.obs, raw["observation"].reshape(-1))
    assert decision.obs.dtype == np.float32
    # square s is board[s // 3, s % 3] with [own, opponent's] channels: flat 2 * s + channel.
    # player_2 sees player_1's centre stone at 2 * 4 + 1 = 9, and square 4 is no longer legal.
    assert np.flatnonzero(decision.obs).tolist() == [9]
    assert np.flatnonzero(~decision.mask).tolist() == [4]


def test_tictactoe_win_gives_the_winner_plus_one_and_the_loser_minus_one() -> None:
    # player_1 completes the line of squares 0, 1 and 2 while player_2 plays 3 and 4
    outcomes, _, episode = play_turns(agent_env(TICTACTOE), [0, 3, 1, 4, 2])
    final = {o.agent: (o.reward, o.terminated, o.truncated) for o in outcomes[-2:]}
    assert final == {"player_1": (1.0, True, False), "player_2": (-1.0, True, False)}
    assert all(o.reward == 0 for o in outcomes[:-2])
    assert episode.returns == {"player_1": 1.0, "player_2": -1.0}
    assert episode.decisions == {"player_1": 3, "player_2": 2}


def test_tictactoe_random_legal_moves_always_end_in_a_win_loss_or_draw() -> None:
    env = agent_env(TICTACTOE)
    rng = np.random.default_rng(0)
    results = set()
    for number in range(40):
        decisions = env.reset(seed=number, episode=number)
        outcomes, episode = [], None
        while episode is None:
            (decision,) = decisions
            (action,) = random_actions(NINE, 1, decision.mask[None], rng)
            assert decision.mask[action]
            new, decisions, episode = env.step({decision.agent: int(action)})
            outcomes += new
        returns = (episode.returns["player_1"], episode.returns["player_2"])
        assert returns in {(1.0, -1.0), (-1.0, 1.0), (0.0, 0.0)}
        results.add(returns)
        for agent, events in by_agent(outcomes).items():  # no reward comes before a move
            assert sum(o.reward for o in events) == episode.returns[agent]
            assert [o.terminated for o in events] == [False] * (len(events) - 1) + [True]
        p1, p2 = episode.decisions["player_1"], episode.decisions["player_2"]
        assert p1 in (p2, p2 + 1) and p1 + p2 == episode.env_steps
    assert results == {(1.0, -1.0), (-1.0, 1.0), (0.0, 0.0)}  # 40 games see all three


def test_tictactoe_illegal_move_ends_the_game_and_the_mover_loses() -> None:
    # PettingZoo's TerminateIllegalWrapper (tictactoe_v3.env): a move outside the mask ends the
    # game at once, the mover gets -1 and the other player 0 (not +1), both terminated.
    outcomes, _, episode = play_turns(agent_env(TICTACTOE), [0, 0])  # player_2 plays on 0
    final = {o.agent: (o.reward, o.terminated, o.truncated) for o in outcomes}
    assert final == {"player_1": (0.0, True, False), "player_2": (-1.0, True, False)}
    assert episode.returns == {"player_1": 0.0, "player_2": -1.0}
    assert episode.env_steps == 2


# --- the multiagent config section ------------------------------------------------------------


def speaker_listener(algorithm: str = "impala", **multiagent) -> dict:
    """A two-policy IMPALA config of simple_speaker_listener (one policy per agent)."""
    return {
        "algorithm": algorithm,
        "env": {"id": SPEAKER_LISTENER, "kwargs": {"continuous_actions": False}, "num_envs": 2},
        "algo": {"unroll_length": 4, "hidden_sizes": [8], "lr": 0.001},
        "replay": {"kind": "fifo", "capacity": 64, "min_size_to_sample": 4},
        "learner": {"batch_size": 4},
        "multiagent": {
            "policies": [{"name": "speaker"}, {"name": "listener"}],
            "mapping": [
                {"agents": "speaker_*", "policy": "speaker"},
                {"agents": "listener_*", "policy": "listener"},
            ],
            **multiagent,
        },
    }


def with_section(data: dict, **multiagent) -> dict:
    data = copy.deepcopy(data)
    data["multiagent"].update(multiagent)
    return data


CONFIG_ERRORS = {
    "unknown policy in mapping": (
        {"mapping": [{"agents": "*", "policy": "narrator"}]},
        r"multiagent.mapping\[0\] maps '\*' to 'narrator', which is not a policy "
        r"\(policies: speaker, listener\)",
    ),
    "duplicate names": (
        {"policies": [{"name": "speaker"}, {"name": "speaker"}]},
        "multiagent.policies names 'speaker' twice",
    ),
    "fixed with algo": (
        {"policies": [{"name": "speaker", "fixed": "random", "algo": {"lr": 0.1}}, {"name": "l"}]},
        r"multiagent.policies\[0\] \(speaker\) is fixed \(random\): it has no algo to set",
    ),
    "mapping_fn without agents": (
        {"mapping": [], "mapping_fn": f"{HELPERS}:seat_by_episode"},
        r"multiagent.policies\[0\] \(speaker\) needs agents",
    ),
    "mapping and mapping_fn": (
        {"mapping_fn": f"{HELPERS}:seat_by_episode"},
        "multiagent.mapping \\(a table\\) or multiagent.mapping_fn \\(module:function\\), one",
    ),
    "policies_to_train names a fixed policy": (
        {
            "policies": [{"name": "speaker", "fixed": "random"}, {"name": "listener"}],
            "policies_to_train": ["speaker"],
        },
        "policies_to_train names 'speaker', a fixed policy, which has nothing to train",
    ),
    "policies_to_train names a missing policy": (
        {"policies_to_train": ["narrator"]},
        "policies_to_train names 'narrator', not a policy",
    ),
    "judge names a missing policy": (
        {"judge": "policy:narrator"},
        "multiagent.judge names policy 'narrator', not a policy",
    ),
    "judge of no kind": (
        {"judge": "best"},
        "multiagent.judge must be team, policy:<name> or agent:<name>, got 'best'",
    ),
    "no trained policy": (
        {
            "policies": [
                {"name": "speaker", "fixed": "random"},
                {"name": "listener", "fixed": "random"},
            ]
        },
        "a multi-agent run needs at least one policy to train",
    ),
    "episodes of no kind": (
        {"mapping": [{"agents": "*", "policy": "speaker", "episodes": "third"}]},
        r"multiagent.mapping\[0\].episodes must be all, even or odd, got 'third'",
    ),
}


@pytest.mark.parametrize("case", CONFIG_ERRORS)
def test_multiagent_config_errors_name_what_is_wrong(case: str) -> None:
    section, message = CONFIG_ERRORS[case]
    with pytest.raises(ConfigError, match=message):
        config_from_dict(with_section(speaker_listener(), **section))


def test_multiagent_keys_without_policies_are_an_error() -> None:
    data = speaker_listener()
    data["multiagent"] = {"judge": "policy:speaker"}
    with pytest.raises(ConfigError, match="need multiagent.policies"):
        config_from_dict(data)


# --- policy_spaces and policy_config -------------------------------------------------------


def test_speaker_listener_policies_take_their_agents_spaces() -> None:
    spaces = policy_spaces(config_from_dict(speaker_listener()))
    inf = np.inf
    assert spaces["speaker"] == (
        gym.spaces.Box(-inf, inf, (3,), np.float32),
        gym.spaces.Discrete(3),
        False,
        ["speaker_0"],
        0,
    )
    assert spaces["listener"] == (
        gym.spaces.Box(-inf, inf, (11,), np.float32),
        gym.spaces.Discrete(5),
        False,
        ["listener_0"],
        0,
    )


def test_one_policy_for_agents_of_different_spaces_is_an_error_naming_both() -> None:
    cfg = config_from_dict(with_section(speaker_listener(), mapping=[{"policy": "speaker"}]))
    with pytest.raises(
        ConfigError,
        match=r"policy 'speaker' plays agents with different observation spaces: speaker_0 "
        r"Box\(.*\(3,\).*\), listener_0 Box\(.*\(11,\).*\); give them different policies",
    ):
        policy_spaces(cfg)


def test_an_agent_no_rule_maps_is_an_error() -> None:
    section = {"mapping": [{"agents": "speaker_*", "policy": "speaker"}]}
    cfg = config_from_dict(with_section(speaker_listener(), **section))
    with pytest.raises(ConfigError, match="no rule for agent 'listener_0'"):
        policy_spaces(cfg)


def test_a_policy_whose_rule_an_earlier_rule_shadows_plays_no_agent() -> None:
    # The first rule that matches wins: '*' -> a, in every episode, so b never plays.
    cfg = config_from_dict(
        {
            "algorithm": "impala",
            "env": {"id": SPREAD, "kwargs": {"N": 3, "continuous_actions": False}},
            "replay": {"kind": "fifo"},
            "multiagent": {
                "policies": [{"name": "a"}, {"name": "b"}],
                "mapping": [{"agents": "*", "policy": "a"}, {"agents": "agent_2", "policy": "b"}],
            },
        }
    )
    assert [cfg.multiagent.table_policy("agent_2", episode) for episode in (0, 1)] == ["a", "a"]
    with pytest.raises(ConfigError, match="policy 'b' plays none of the env's agents"):
        policy_spaces(cfg)


def test_policy_config_sets_the_policys_algo_table_and_lanes() -> None:
    section = {"policies": [{"name": "speaker"}, {"name": "listener", "algo": {"lr": 0.01}}]}
    cfg = config_from_dict(with_section(speaker_listener(), **section))
    spaces = policy_spaces(cfg)
    speaker = policy_config(cfg, "speaker", spaces["speaker"])
    listener = policy_config(cfg, "listener", spaces["listener"])
    assert (speaker.algo.lr, listener.algo.lr, cfg.algo.lr) == (0.001, 0.01, 0.001)
    assert (speaker.replay.table, listener.replay.table) == ("speaker", "listener")
    assert speaker.env.num_envs == listener.env.num_envs == 2 * 1  # 2 envs x 1 agent each
    assert not speaker.algo.action_mask
    assert speaker.algo.unroll_length == listener.algo.unroll_length == 4  # the rest: the run's


def test_policy_config_of_a_shared_policy_has_a_lane_per_agent_of_each_env() -> None:
    cfg = config_from_dict(
        {
            "algorithm": "ppo",
            "env": {"id": SPREAD, "kwargs": {"N": 3, "continuous_actions": False}, "num_envs": 2},
            "multiagent": {"policies": [{"name": "shared"}], "mapping": [{"policy": "shared"}]},
            "replay": {"kind": "fifo", "samples_per_insert": 0.0},
            "learner": {"publish_period": 1},
        }
    )
    spaces = policy_spaces(cfg)["shared"]
    assert spaces.agents == ["agent_0", "agent_1", "agent_2"]
    assert policy_config(cfg, "shared", spaces).env.num_envs == 2 * 3


def test_policy_config_sets_action_mask_for_tictactoe() -> None:
    cfg = load_config(REPO / "configs" / "apex_dqn_tictactoe.yaml")
    spaces = policy_spaces(cfg)
    obs_space, action_space, masked, agents, _ = spaces["learner"]
    assert masked and agents == ["player_1", "player_2"]  # seats swapped by episode
    learner = policy_config(cfg, "learner", spaces["learner"])
    assert learner.algo.action_mask and not cfg.algo.action_mask
    assert learner.env.num_envs == 16 * 2
    spec = learner.algo.item_spec(obs_space, action_space)
    assert spec["obs"] == (np.dtype(np.float32), (18,))
    assert spec["next_action_mask"] == (np.dtype(np.bool_), (9,))


def test_a_team_critic_policy_sees_its_agents_observation_then_every_agents() -> None:
    section = {"policies": [{"name": "speaker", "critic": "team"}, {"name": "listener"}]}
    cfg = config_from_dict(with_section(speaker_listener(), **section))
    spaces = policy_spaces(cfg)
    # the speaker's 3 numbers, then the team's: the speaker's 3 and the listener's 11
    assert spaces["speaker"].obs_space.shape == (3 + 3 + 11,)
    assert spaces["speaker"].policy_obs_dim == 3
    assert spaces["listener"].obs_space.shape == (11,) and spaces["listener"].policy_obs_dim == 0
    speaker = policy_config(cfg, "speaker", spaces["speaker"])
    listener = policy_config(cfg, "listener", spaces["listener"])
    assert (speaker.algo.policy_obs_dim, listener.algo.policy_obs_dim) == (3, 0)
    net = load_algorithm("impala").make_network(
        spaces["speaker"].obs_space, spaces["speaker"].action_space, speaker
    )
    assert net.policy_torso[0].in_features == 3 and net.value_torso[0].in_features == 17


def test_team_state_is_every_agents_latest_observation_zeros_before_one_is_seen() -> None:
    env = agent_env(SPEAKER_LISTENER, max_cycles=25, continuous_actions=False)
    decisions = env.reset(seed=0, episode=0)
    own = {d.agent: d.obs for d in decisions}
    np.testing.assert_array_equal(
        env.team_state(), np.concatenate([own["speaker_0"], own["listener_0"]])
    )
    outcomes, decisions, _ = env.step({"speaker_0": 1, "listener_0": 2})
    after = {o.agent: o.next_obs for o in outcomes}
    np.testing.assert_array_equal(
        env.team_state(), np.concatenate([after["speaker_0"], after["listener_0"]])
    )
    env.close()
    # ComeAndGo (AEC): only early has observed at the start; the others are zeros of their size
    env = agent_env(f"{HELPERS}:come_and_go")
    (first,) = env.reset(seed=0, episode=0)
    assert first.agent == "early"
    np.testing.assert_array_equal(env.team_state(), [0, 0] + [0, 0] + [0, 0, 0] + [0, 0, 0])
    env.step({"early": 0})
    assert env.team_state()[2:4].tolist() == env.obs["stay"][0].tolist() != [0, 0]
    env.close()


@pytest.mark.parametrize(
    ("algorithm", "policy", "error", "message"),
    [
        ("apex_dqn", {"name": "speaker", "critic": "team"}, ConfigError,
         "policy 'speaker': critic team is an actor-critic's option .*not apex_dqn's"),
        ("impala", {"name": "speaker", "critic": "all"}, ConfigError, "critic must be own or team"),
        ("impala", {"name": "speaker", "fixed": "random", "critic": "team"}, ConfigError,
         "is fixed .* no critic"),
    ],
)  # fmt: skip
def test_team_critic_mistakes_are_errors(algorithm, policy, error, message) -> None:
    data = with_section(speaker_listener(algorithm), policies=[policy, {"name": "listener"}])
    if algorithm == "apex_dqn":  # no unrolls, a prioritized table
        del data["algo"]["unroll_length"], data["replay"]["kind"]
    with pytest.raises(error, match=message):
        cfg = config_from_dict(data)
        policy_config(cfg, "speaker", policy_spaces(cfg)["speaker"])


def test_mapping_rules_for_even_and_odd_episodes_swap_the_seats() -> None:
    mapping = PolicyMap(load_config(REPO / "configs" / "apex_dqn_tictactoe.yaml"))
    seats = [(mapping("player_1", episode), mapping("player_2", episode)) for episode in range(3)]
    assert seats == [("learner", "opponent"), ("opponent", "learner"), ("learner", "opponent")]


def test_mapping_fn_seats_and_its_mistakes() -> None:
    section = {
        "policies": [{"name": "blue", "agents": "*"}, {"name": "red", "agents": "speaker_*"}],
        "mapping": [],
        "mapping_fn": f"{HELPERS}:seat_by_episode",
    }
    mapping = PolicyMap(config_from_dict(with_section(speaker_listener(), **section)))
    assert [mapping("speaker_0", episode) for episode in (0, 1, 2)] == ["blue", "red", "blue"]
    assert mapping("listener_0", 0) == "blue"
    with pytest.raises(EnvError, match="seats policy 'red' at agent 'listener_0', outside"):
        mapping("listener_0", 1)


# --- group returns -------------------------------------------------------------------------


def test_group_returns_sum_each_groups_agents() -> None:
    # red plays p1 and p2, blue plays p3; p4 got a reward but never acted (no seat)
    episode = Episode(
        number=0,
        returns={"p1": 1.5, "p2": -0.5, "p3": 2.0, "p4": 0.25},
        decisions={"p1": 3, "p2": 3, "p3": 2},
        env_steps=8,
    )
    seated = SeatedEpisode(episode, {"p1": "red", "p2": "red", "p3": "blue"}, env=0)
    groups = group_returns(seated)
    assert groups == {
        "team": 1.5 - 0.5 + 2.0 + 0.25,
        "policy/red": 1.5 - 0.5,
        "policy/blue": 2.0,
        "agent/p1": 1.5,
        "agent/p2": -0.5,
        "agent/p3": 2.0,
        "agent/p4": 0.25,
        "policy/red/p1": 1.5,
        "policy/red/p2": -0.5,
        "policy/blue/p3": 2.0,
    }
    assert judged_return("team", groups) == 3.25
    assert judged_return("policy:red", groups) == 1.0
    assert judged_return("agent:p3", groups) == 2.0
    assert judged_return("policy:green", groups) is None  # green did not play this episode
    assert judged_return("agent:p9", groups) is None


# --- fixed policies ------------------------------------------------------------------------


def test_random_actions_keep_to_the_legal_ones_and_reach_each_of_them() -> None:
    rng = np.random.default_rng(0)
    space = gym.spaces.Discrete(5)
    masks = np.array([[False, True, False, True, True], [True, False, False, False, False]] * 1000)
    actions = random_actions(space, len(masks), masks, rng)
    assert actions.dtype == np.int64
    assert masks[np.arange(len(masks)), actions].all()
    assert set(actions[0::2].tolist()) == {1, 3, 4}
    assert set(actions[1::2].tolist()) == {0}
    # uniform: each of 3 legal actions about 1000 / 3 times (std sqrt(1000 * 2 / 9) ~ 15)
    counts = np.bincount(actions[0::2], minlength=5)
    assert all(abs(counts[a] - 1000 / 3) < 5 * 15 for a in (1, 3, 4))
    unmasked = random_actions(space, 1000, None, rng)
    assert set(unmasked.tolist()) == {0, 1, 2, 3, 4}


def test_random_box_actions_stay_within_the_bounds() -> None:
    low, high = np.array([-1.0, 0.0], np.float32), np.array([1.0, 5.0], np.float32)
    space = gym.spaces.Box(low, high, dtype=np.float32)
    actions = random_actions(space, 500, None, np.random.default_rng(0))
    assert actions.shape == (500, 2) and actions.dtype == np.float32
    assert (actions >= space.low).all() and (actions <= space.high).all()


def test_scripted_policy_acts_within_the_mask() -> None:
    policy = ScriptedPolicy(f"{HELPERS}:FirstLegal", OBS_SPACE, NINE)
    mask = np.ones((2, 9), bool)
    mask[0, :4] = False
    np.testing.assert_array_equal(policy.compute_actions(np.zeros((2, 18)), mask), [4, 0])


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("AlwaysZero", "scripted policy '{name}' chose an illegal action"),
        ("OutOfRange", r"scripted policy '{name}' gave an action outside 0..n-1"),
    ],
)
def test_scripted_policy_refuses_a_wrong_action_naming_the_class(name: str, message: str) -> None:
    full = f"{HELPERS}:{name}"
    policy = ScriptedPolicy(full, OBS_SPACE, NINE)
    mask = np.ones((2, 9), bool)
    mask[1, 0] = False  # the second agent may not play 0
    with pytest.raises(RuntimeError, match=message.format(name=full)):
        policy.compute_actions(np.zeros((2, 18)), mask)


def test_scripted_policy_that_cannot_be_loaded_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cannot be loaded"):
        ScriptedPolicy(f"{HELPERS}:NoSuchPlayer", OBS_SPACE, NINE)


@pytest.mark.parametrize(("game", "shape"), [("connect_four", (2, 6, 7)), ("tictactoe", (2, 3, 3))])
def test_board_planes_is_the_games_board_channel_first_for_a_cnn(game: str, shape: tuple) -> None:
    from importlib import import_module

    from apexrl.multiagent.tasks import board_planes

    raw = import_module(f"pettingzoo.classic.{game}_v3").env()
    planes = board_planes(game)
    assert planes.observation_space("player_1" if game == "tictactoe" else "player_0")[
        "observation"
    ] == gym.spaces.Box(0, 1, shape, np.uint8)
    rng = np.random.default_rng(0)
    for env in (raw, planes):
        env.reset(seed=3)
    moves = 0
    for agent in raw.agent_iter():
        obs, _, terminated, truncated, _ = raw.last()
        mine, _, _, _, _ = planes.last()
        assert planes.agent_selection == agent
        assert (mine["observation"] == np.moveaxis(obs["observation"], -1, 0)).all()
        assert (mine["action_mask"] == obs["action_mask"]).all()
        move = (
            None if terminated or truncated else int(rng.choice(np.flatnonzero(obs["action_mask"])))
        )
        raw.step(move)
        planes.step(move)
        moves += 1
    assert moves > 5
    cfg = load_config(
        None,
        [
            "env.id=apexrl.multiagent.tasks:board_planes",
            "multiagent={policies: [{name: main}], mapping: [{policy: main}]}",
        ],
    )
    assert policy_spaces(cfg)["main"].obs_space.shape == (2, 6, 7)  # an image: a CNN reads it


def test_the_win_block_player_takes_a_win_then_blocks_on_either_board_layout() -> None:
    from multiagent_envs_for_tests import ConnectFourWinBlock

    player = ConnectFourWinBlock(None, None)
    board = np.zeros((6, 7, 2), np.float32)
    board[5, 0:3, 1] = 1  # the other player threatens the bottom row's 4th square (column 3)
    legal = np.ones(7, bool)
    for layout in (board.ravel(), np.moveaxis(board, -1, 0)):
        assert player.move(layout, legal) == 3  # block
    board[3:6, 6, 0] = 1  # the mover has three up column 6: winning comes first
    for layout in (board.ravel(), np.moveaxis(board, -1, 0)):
        assert player.move(layout, legal) == 6
