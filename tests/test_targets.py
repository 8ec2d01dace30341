"""Tests for apexrl/math/targets.py: hand-worked arithmetic, slow oracles, and properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from apexrl.math import schedules, targets

GAMMA = 0.9


def _column(values: list[float] | list[bool], dtype: torch.dtype) -> torch.Tensor:
    """A [T, 1] tensor from one episode stream written as a list."""
    return torch.tensor(values, dtype=dtype).unsqueeze(1)


def _window(
    r: list[float], terminated: list[bool], truncated: list[bool], n: int, gamma: float = GAMMA
) -> targets.NStepWindow:
    """n_step_window on one column, squeezed back to [T - n + 1]."""
    window = targets.n_step_window(
        _column(r, torch.float32),
        _column(terminated, torch.bool),
        _column(truncated, torch.bool),
        gamma=gamma,
        n=n,
    )
    return targets.NStepWindow(*(field.squeeze(1) for field in window))


def _target(window: targets.NStepWindow, q_next: list[float], gamma: float = GAMMA) -> torch.Tensor:
    """n_step_target with q_bootstrap looked up at bootstrap_index in a per-step value array."""
    q_bootstrap = torch.tensor(q_next)[window.bootstrap_index]
    return targets.n_step_target(
        window.reward, window.num_steps, window.terminated, q_bootstrap, gamma
    )


def _assert_close(actual: torch.Tensor, expected: float | list) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype))


R = [1.0, 2.0, 3.0, 4.0]
Q_NEXT = [10.0, 20.0, 30.0, 40.0]  # value of next_obs[t], the state after step t
NO = [False, False, False, False]


def _vtrace(
    r: list[float],
    v_tm1: list[float],
    v_t: list[float],
    discount: list[float],
    done: list[bool],
    rho: list[float],
    **clips: float,
) -> targets.VTrace:
    """vtrace on one column (importance ratios given as pi / mu), squeezed back to [T]."""
    out = targets.vtrace(
        _column(r, torch.float64),
        _column(v_tm1, torch.float64),
        _column(v_t, torch.float64),
        _column(discount, torch.float64),
        _column(done, torch.bool),
        torch.log(_column(rho, torch.float64)),
        **clips,
    )
    return targets.VTrace(*(field.squeeze(1) for field in out))


def _gae(
    r: list[float],
    v_tm1: list[float],
    v_t: list[float],
    discount: list[float],
    done: list[bool],
    lambda_: float,
) -> torch.Tensor:
    """gae on one column, squeezed back to [T]."""
    return targets.gae(
        _column(r, torch.float64),
        _column(v_tm1, torch.float64),
        _column(v_t, torch.float64),
        _column(discount, torch.float64),
        _column(done, torch.bool),
        lambda_,
    ).squeeze(1)


def _rollout(rng: np.random.Generator, num_time_steps: int, batch: int) -> dict[str, np.ndarray]:
    """A random [T, B] rollout with episode ends, and values laid out as a learner would.

    ``v_t[t]`` is ``v_tm1[t + 1]`` inside an episode; at an episode end it is the value of the
    episode's final observation (a fresh number), and in the last row the bootstrap value.
    """
    terminated = rng.random((num_time_steps, batch)) < 0.2
    truncated = rng.random((num_time_steps, batch)) < 0.15
    done = terminated | truncated
    v_tm1 = rng.normal(size=(num_time_steps, batch))
    v_t = np.concatenate([v_tm1[1:], rng.normal(size=(1, batch))])
    v_t = np.where(done, rng.normal(size=(num_time_steps, batch)), v_t)
    return {
        "r": rng.normal(size=(num_time_steps, batch)),
        "v_tm1": v_tm1,
        "v_t": v_t,
        "terminated": terminated,
        "truncated": truncated,
        "done": done,
    }


# --------------------------------------------------------------------------------------------------
# Hand-worked
# --------------------------------------------------------------------------------------------------


def test_n_step_no_episode_end() -> None:
    w = _window(R, NO, NO, n=3)
    _assert_close(w.reward, [1 + 0.9 * 2 + 0.9**2 * 3, 2 + 0.9 * 3 + 0.9**2 * 4])
    assert w.num_steps.tolist() == [3, 3]
    assert w.bootstrap_index.tolist() == [2, 3]
    assert w.terminated.tolist() == [False, False]
    assert w.truncated.tolist() == [False, False]
    _assert_close(
        _target(w, Q_NEXT),
        [1 + 0.9 * 2 + 0.9**2 * 3 + 0.9**3 * 30, 2 + 0.9 * 3 + 0.9**2 * 4 + 0.9**3 * 40],
    )


def test_n_step_termination_inside_window() -> None:
    # Step 1 terminates: the window from t = 0 stops after 2 steps and has no bootstrap.
    w = _window(R, [False, True, False, False], NO, n=3)
    _assert_close(w.reward, [1 + 0.9 * 2, 2])
    assert w.num_steps.tolist() == [2, 1]
    assert w.terminated.tolist() == [True, True]
    assert w.truncated.tolist() == [False, False]
    assert w.bootstrap_index.tolist() == [1, 1]
    _assert_close(_target(w, Q_NEXT), [1 + 0.9 * 2, 2])


def test_n_step_truncation_inside_window() -> None:
    # Step 1 is truncated: the window stops after 2 steps but still bootstraps, with gamma ** 2,
    # from the final observation of the episode (next_obs[1], value 20).
    w = _window(R, NO, [False, True, False, False], n=3)
    _assert_close(w.reward, [1 + 0.9 * 2, 2])
    assert w.num_steps.tolist() == [2, 1]
    assert w.terminated.tolist() == [False, False]
    assert w.truncated.tolist() == [True, True]
    assert w.bootstrap_index.tolist() == [1, 1]
    _assert_close(_target(w, Q_NEXT), [1 + 0.9 * 2 + 0.9**2 * 20, 2 + 0.9 * 20])


def test_n_step_episode_end_at_first_step_of_window() -> None:
    # Step 0 terminates: its window has one step; the window from t = 1 is a fresh episode.
    w = _window(R, [True, False, False, False], NO, n=3)
    _assert_close(w.reward, [1, 2 + 0.9 * 3 + 0.9**2 * 4])
    assert w.num_steps.tolist() == [1, 3]
    assert w.terminated.tolist() == [True, False]
    assert w.bootstrap_index.tolist() == [0, 3]
    _assert_close(_target(w, Q_NEXT), [1, 2 + 0.9 * 3 + 0.9**2 * 4 + 0.9**3 * 40])


def test_n_step_termination_at_last_step_of_window() -> None:
    w = _window(R, [False, False, True, False], NO, n=3)
    _assert_close(w.reward, [1 + 0.9 * 2 + 0.9**2 * 3, 2 + 0.9 * 3])
    assert w.num_steps.tolist() == [3, 2]
    assert w.terminated.tolist() == [True, True]
    assert w.bootstrap_index.tolist() == [2, 2]
    _assert_close(_target(w, Q_NEXT), [1 + 0.9 * 2 + 0.9**2 * 3, 2 + 0.9 * 3])


def test_n_step_truncation_at_last_step_of_window() -> None:
    w = _window(R, NO, [False, False, True, False], n=3)
    assert w.num_steps.tolist() == [3, 2]
    assert w.truncated.tolist() == [True, True]
    assert w.terminated.tolist() == [False, False]
    _assert_close(
        _target(w, Q_NEXT),
        [1 + 0.9 * 2 + 0.9**2 * 3 + 0.9**3 * 30, 2 + 0.9 * 3 + 0.9**2 * 30],
    )


def test_n_step_terminated_and_truncated_same_step_counts_as_terminated() -> None:
    w = _window(R, [False, True, False, False], [False, True, False, False], n=3)
    assert w.terminated.tolist() == [True, True]
    assert w.truncated.tolist() == [False, False]
    _assert_close(_target(w, Q_NEXT), [1 + 0.9 * 2, 2])


def test_n_step_n_equals_one() -> None:
    w = _window(R, [False, True, False, False], [False, False, True, False], n=1)
    _assert_close(w.reward, R)
    assert w.num_steps.tolist() == [1, 1, 1, 1]
    assert w.bootstrap_index.tolist() == [0, 1, 2, 3]
    assert w.terminated.tolist() == [False, True, False, False]
    assert w.truncated.tolist() == [False, False, True, False]
    _assert_close(_target(w, Q_NEXT), [1 + 0.9 * 10, 2, 3 + 0.9 * 30, 4 + 0.9 * 40])


def test_n_step_ignores_rewards_after_episode_end() -> None:
    # Rewards after a terminal step belong to the next episode; even a NaN there must not leak in.
    w = _window([1.0, 2.0, math.nan], [False, True, False], NO[:3], n=3)
    _assert_close(w.reward, [1 + 0.9 * 2])


def test_n_step_columns_are_independent() -> None:
    r = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    terminated = torch.tensor([[False, False], [True, False], [False, False]])
    truncated = torch.zeros(3, 2, dtype=torch.bool)
    w = targets.n_step_window(r, terminated, truncated, gamma=GAMMA, n=3)
    _assert_close(w.reward, [[1 + 0.9 * 2, 1 + 0.9 * 2 + 0.9**2 * 3]])
    assert w.num_steps.tolist() == [[2, 3]]
    assert w.terminated.tolist() == [[True, False]]


def test_double_q_bootstrap_hand_worked() -> None:
    q_online = torch.tensor([[1.0, 3.0, 2.0], [5.0, 0.0, 4.0]])
    q_target = torch.tensor([[10.0, 20.0, 30.0], [-1.0, 7.0, 9.0]])
    _assert_close(targets.double_q_bootstrap(q_target, q_online), [20.0, -1.0])


def test_masked_double_q_bootstrap_hand_worked() -> None:
    # Row 0: the online argmax (action 1) is illegal; among legal {0, 2} it is 2, so Q_target's
    # action 2. Row 1: only action 1 is legal, however low its online Q. Row 2: no legal action
    # (a terminal state's mask): 0, not Q_target's value or NaN.
    q_online = torch.tensor([[1.0, 3.0, 2.0], [5.0, -9.0, 4.0], [1.0, 2.0, 3.0]])
    q_target = torch.tensor([[10.0, 20.0, 30.0], [-1.0, 7.0, 9.0], [4.0, 5.0, 6.0]])
    legal = torch.tensor([[True, False, True], [False, True, False], [False, False, False]])
    bootstrap = targets.double_q_bootstrap(q_target, q_online, legal)
    _assert_close(bootstrap, [30.0, 7.0, 0.0])
    # With every action legal it is the unmasked bootstrap.
    everything = torch.ones(3, 3, dtype=torch.bool)
    torch.testing.assert_close(
        targets.double_q_bootstrap(q_target, q_online, everything),
        targets.double_q_bootstrap(q_target, q_online),
    )
    # Into a one-step target: r + gamma * Q_target(s', argmax over legal a' of Q_online).
    y = targets.n_step_target(
        torch.tensor([1.0, 1.0, 1.0]),
        torch.tensor([1, 1, 1]),
        torch.tensor([False, False, True]),
        bootstrap,
        0.9,
    )
    _assert_close(y, [1 + 0.9 * 30, 1 + 0.9 * 7, 1.0])


def test_masked_double_q_bootstrap_rejects_a_bad_mask() -> None:
    q = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(2, 2\)"):
        targets.double_q_bootstrap(q, q, torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="legal_t must be a bool"):
        targets.double_q_bootstrap(q, q, torch.ones(2, 3))


def test_masked_epsilon_greedy_zero_picks_the_best_legal_action() -> None:
    rng = np.random.default_rng(0)
    q = np.array([[5.0, 1.0, 3.0], [0.0, 9.0, 8.0], [7.0, 7.0, -1.0]])
    legal = np.array([[False, True, True], [True, False, True], [False, False, True]])
    # Row 0: 5 at action 0 is illegal, best legal is 3 (action 2); row 1: 9 is illegal, 8 is
    # best; row 2: only action 2 is legal, however low.
    actions = targets.epsilon_greedy(q, 0.0, rng, legal)
    assert actions.dtype == np.int64
    assert actions.tolist() == [2, 2, 2]


def test_masked_epsilon_greedy_one_is_uniform_over_the_legal_actions() -> None:
    rng = np.random.default_rng(0)
    num_rows = 30_000
    q = np.zeros((num_rows, 5))
    q[:, 0] = 1.0  # greedy would pick 0, illegal
    legal = np.tile(np.array([False, True, False, True, True]), (num_rows, 1))
    actions = targets.epsilon_greedy(q, 1.0, rng, legal)
    counts = np.bincount(actions, minlength=5)
    assert counts[[0, 2]].tolist() == [0, 0]
    # Each legal count is Binomial(30000, 1/3): std ~82, so 5 % (500) is more than 6 sigma.
    np.testing.assert_allclose(counts[[1, 3, 4]], num_rows / 3, rtol=0.05)


def test_masked_epsilon_greedy_never_picks_an_illegal_action_and_covers_the_legal_ones() -> None:
    rng = np.random.default_rng(2)
    num_rows, num_actions = 2000, 9
    q = rng.normal(size=(num_rows, num_actions))
    legal = rng.random((num_rows, num_actions)) < 0.4
    legal[np.arange(num_rows), rng.integers(0, num_actions, num_rows)] = True  # one at least
    for epsilon in (0.0, 0.3, 1.0):
        actions = targets.epsilon_greedy(q, epsilon, rng, legal)
        assert legal[np.arange(num_rows), actions].all()
    # One row, drawn many times with epsilon 1: each of its 3 legal actions comes up.
    row = np.array([[True, False, False, True, False, False, False, False, True]])
    drawn = {int(targets.epsilon_greedy(q[:1], 1.0, rng, row)[0]) for _ in range(200)}
    assert drawn == {0, 3, 8}


def test_masked_epsilon_greedy_rejects_a_bad_mask() -> None:
    rng = np.random.default_rng(0)
    q = np.zeros((2, 3))
    with pytest.raises(ValueError, match=r"no action in rows \[1\]"):
        targets.epsilon_greedy(q, 0.5, rng, np.array([[True, False, False], [False] * 3]))
    with pytest.raises(ValueError, match="bool"):
        targets.epsilon_greedy(q, 0.5, rng, np.ones((2, 3), dtype=np.int64))
    with pytest.raises(ValueError, match=r"\[2, 3\]"):
        targets.epsilon_greedy(q, 0.5, rng, np.ones((2, 4), dtype=bool))


def test_importance_weights_hand_worked() -> None:
    # N = 3, beta = 0.5: raw weights (3 * 0.5) ** -0.5 and twice (3 * 0.25) ** -0.5, the max.
    w = targets.importance_weights(torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64), 3, 0.5)
    assert w.dtype == torch.float32
    _assert_close(w, [(3 * 0.5) ** -0.5 / (3 * 0.25) ** -0.5, 1.0, 1.0])


def test_td_priorities_hand_worked() -> None:
    td = torch.tensor([-2.0, 0.0, 3.0], requires_grad=True)
    p = targets.td_priorities(td, eps=0.01)
    assert p.dtype == torch.float64
    assert not p.requires_grad
    torch.testing.assert_close(p, torch.tensor([2 + 0.01, 0.01, 3 + 0.01], dtype=torch.float64))


def test_per_actor_epsilon_hand_worked() -> None:
    assert targets.per_actor_epsilon(1, 3) == pytest.approx(0.4 ** (1 + 7 * 1 / 2))
    assert targets.per_actor_epsilon(2, 5, epsilon=0.5, alpha=3.0) == pytest.approx(
        0.5 ** (1 + 3 * 2 / 4)
    )


# The rollouts below have three steps with rewards 1, 2, 3. V(s_0), V(s_1), V(s_2) are 1, 4, 3 and
# the bootstrap value after step 2 is 5. At an episode end after step 1, the episode's final
# observation has value 7 and s_2 is the first observation of the next episode.
V_TM1 = [1.0, 4.0, 3.0]
GAMMAS = [0.9, 0.9, 0.9]
NOT_DONE = [False, False, False]
DONE_AT_1 = [False, True, False]


def test_vtrace_off_policy_no_episode_end() -> None:
    # pi / mu = 2, 0.5, 1 with all thresholds 1: rho = c = 1, 0.5, 1.
    out = _vtrace(R[:3], V_TM1, [4.0, 3.0, 5.0], GAMMAS, NOT_DONE, [2.0, 0.5, 1.0])
    d0 = 1 * (1 + 0.9 * 4 - 1)
    d1 = 0.5 * (2 + 0.9 * 3 - 4)
    d2 = 1 * (3 + 0.9 * 5 - 3)
    vs = [1 + d0 + 0.9 * 1 * (d1 + 0.9 * 0.5 * d2), 4 + d1 + 0.9 * 0.5 * d2, 3 + d2]
    _assert_close(out.vs, vs)
    _assert_close(
        out.pg_advantage,
        [1 * (1 + 0.9 * vs[1] - 1), 0.5 * (2 + 0.9 * vs[2] - 4), 1 * (3 + 0.9 * 5 - 3)],
    )


def test_vtrace_thresholds_act_separately() -> None:
    # No clipping in delta or the advantage; c still clipped at 1: rho = 2, 0.5, 1; c = 1, 0.5, 1.
    inf = math.inf
    out = _vtrace(
        R[:3],
        V_TM1,
        [4.0, 3.0, 5.0],
        GAMMAS,
        NOT_DONE,
        [2.0, 0.5, 1.0],
        clip_rho=inf,
        clip_pg_rho=inf,
    )
    d0 = 2 * (1 + 0.9 * 4 - 1)
    d1 = 0.5 * (2 + 0.9 * 3 - 4)
    d2 = 1 * (3 + 0.9 * 5 - 3)
    vs = [1 + d0 + 0.9 * 1 * (d1 + 0.9 * 0.5 * d2), 4 + d1 + 0.9 * 0.5 * d2, 3 + d2]
    _assert_close(out.vs, vs)
    _assert_close(out.pg_advantage[:1], [2 * (1 + 0.9 * vs[1] - 1)])


def test_vtrace_termination_inside_window() -> None:
    # Step 1 terminates (discount 0): the final observation's value (here 99) is never used and
    # step 0's target stops at step 1's reward. On-policy, so v_s is the n-step return.
    out = _vtrace(R[:3], V_TM1, [4.0, 99.0, 5.0], [0.9, 0.0, 0.9], DONE_AT_1, [1.0, 1.0, 1.0])
    _assert_close(out.vs, [1 + 0.9 * 2, 2, 3 + 0.9 * 5])
    _assert_close(out.pg_advantage, [1 + 0.9 * 2 - 1, 2 - 4, 3 + 0.9 * 5 - 3])


def test_vtrace_truncation_inside_window() -> None:
    # Step 1 is truncated: it keeps gamma and bootstraps from the final observation (value 7),
    # not from V(s_2) = 3, which belongs to the next episode.
    out = _vtrace(R[:3], V_TM1, [4.0, 7.0, 5.0], GAMMAS, DONE_AT_1, [1.0, 1.0, 1.0])
    _assert_close(out.vs, [1 + 0.9 * 2 + 0.9**2 * 7, 2 + 0.9 * 7, 3 + 0.9 * 5])
    _assert_close(out.pg_advantage, [1 + 0.9 * (2 + 0.9 * 7) - 1, 2 + 0.9 * 7 - 4, 3 + 0.9 * 5 - 3])


def test_gae_no_episode_end() -> None:
    adv = _gae(R[:3], V_TM1, [4.0, 3.0, 5.0], GAMMAS, NOT_DONE, lambda_=0.5)
    d0, d1, d2 = 1 + 0.9 * 4 - 1, 2 + 0.9 * 3 - 4, 3 + 0.9 * 5 - 3
    _assert_close(adv, [d0 + 0.9 * 0.5 * d1 + (0.9 * 0.5) ** 2 * d2, d1 + 0.9 * 0.5 * d2, d2])


def test_gae_termination_inside_window() -> None:
    # Step 1 terminates: no bootstrap there (its 99 is unused) and step 2 does not reach step 1.
    adv = _gae(R[:3], V_TM1, [4.0, 99.0, 5.0], [0.9, 0.0, 0.9], DONE_AT_1, lambda_=0.5)
    _assert_close(adv, [(1 + 0.9 * 4 - 1) + 0.9 * 0.5 * (2 - 4), 2 - 4, 3 + 0.9 * 5 - 3])


def test_gae_truncation_inside_window() -> None:
    # Step 1 is truncated: it bootstraps from the final observation (value 7) with gamma, and
    # step 2 (the next episode) does not reach step 1.
    adv = _gae(R[:3], V_TM1, [4.0, 7.0, 5.0], GAMMAS, DONE_AT_1, lambda_=0.5)
    d1 = 2 + 0.9 * 7 - 4
    _assert_close(adv, [(1 + 0.9 * 4 - 1) + 0.9 * 0.5 * d1, d1, 3 + 0.9 * 5 - 3])


def test_ppo_clip_loss_hand_worked() -> None:
    # Ratios 1.5, 0.5, 1.1 with eps = 0.2: the first two are clipped to 1.2 and 0.8 (both lower the
    # objective), the third is inside the range.
    logp_old = torch.tensor([-1.0, -2.0, -0.5])
    logp = logp_old + torch.log(torch.tensor([1.5, 0.5, 1.1]))
    loss = targets.ppo_clip_loss(logp, logp_old, torch.tensor([2.0, -1.0, 3.0]), clip=0.2)
    _assert_close(loss, -(1.2 * 2 + 0.8 * -1 + 1.1 * 3) / 3)


def test_clipped_value_loss_hand_worked() -> None:
    # Element 0 moved 0.5 from v_old = 0.5; clipped to 0.7 it is further from the target 2.
    # Element 1 moved 1.0 from v_old = 2; clipped to 2.2 it would be closer to 2.5, so the
    # unclipped error is kept.
    v_pred, v_old, v_target = (
        torch.tensor([1.0, 3.0]),
        torch.tensor([0.5, 2.0]),
        torch.tensor([2.0, 2.5]),
    )
    loss = targets.clipped_value_loss(v_pred, v_old, v_target, clip=0.2)
    _assert_close(loss, 0.5 * ((0.5 + 0.2 - 2) ** 2 + (3 - 2.5) ** 2) / 2)
    loss = targets.clipped_value_loss(v_pred, v_old, v_target, clip=None)
    _assert_close(loss, 0.5 * ((1 - 2) ** 2 + (3 - 2.5) ** 2) / 2)


# --------------------------------------------------------------------------------------------------
# Oracle
# --------------------------------------------------------------------------------------------------


def _n_step_oracle(
    r: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, gamma: float, n: int
) -> dict[str, np.ndarray]:
    """The definition, one (t, b) at a time: sum gamma^k r_{t+k} until n steps or an episode end."""
    num_time_steps, batch = r.shape
    out = {
        key: np.zeros((num_time_steps - n + 1, batch), dtype=dtype)
        for key, dtype in [
            ("reward", np.float64),
            ("num_steps", np.int64),
            ("terminated", bool),
            ("truncated", bool),
            ("bootstrap_index", np.int64),
        ]
    }
    for t in range(num_time_steps - n + 1):
        for b in range(batch):
            total, m = 0.0, 0
            for k in range(n):
                total += gamma**k * r[t + k, b]
                m = k + 1
                if terminated[t + k, b] or truncated[t + k, b]:
                    break
            end = t + m - 1
            out["reward"][t, b] = total
            out["num_steps"][t, b] = m
            out["terminated"][t, b] = terminated[end, b]
            out["truncated"][t, b] = truncated[end, b] and not terminated[end, b]
            out["bootstrap_index"][t, b] = end
    return out


@pytest.mark.parametrize("seed", range(20))
def test_n_step_window_matches_oracle(seed: int) -> None:
    rng = np.random.default_rng(seed)
    num_time_steps = int(rng.integers(1, 12))
    batch = int(rng.integers(1, 6))
    n = int(rng.integers(1, num_time_steps + 1))
    gamma = float(rng.uniform(0.5, 1.0))
    r = rng.normal(size=(num_time_steps, batch))
    terminated = rng.random((num_time_steps, batch)) < 0.2
    truncated = rng.random((num_time_steps, batch)) < 0.15

    window = targets.n_step_window(
        torch.from_numpy(r), torch.from_numpy(terminated), torch.from_numpy(truncated), gamma, n
    )
    expected = _n_step_oracle(r, terminated, truncated, gamma, n)
    np.testing.assert_allclose(window.reward.numpy(), expected["reward"], rtol=1e-5, atol=1e-5)
    assert window.reward.dtype == torch.float32
    assert window.num_steps.dtype == torch.int64
    assert window.bootstrap_index.dtype == torch.int64
    for key in ("num_steps", "terminated", "truncated", "bootstrap_index"):
        np.testing.assert_array_equal(getattr(window, key).numpy(), expected[key], err_msg=key)


@pytest.mark.parametrize("seed", range(5))
def test_n_step_target_matches_oracle(seed: int) -> None:
    rng = np.random.default_rng(seed)
    batch = 16
    reward = rng.normal(size=batch)
    num_steps = rng.integers(1, 6, size=batch)
    terminated = rng.random(batch) < 0.4
    q = rng.normal(size=batch)
    expected = [
        reward[i] + (0.0 if terminated[i] else GAMMA ** num_steps[i] * q[i]) for i in range(batch)
    ]
    actual = targets.n_step_target(
        torch.from_numpy(reward),
        torch.from_numpy(num_steps),
        torch.from_numpy(terminated),
        torch.from_numpy(q),
        GAMMA,
    )
    np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-12)


def _vtrace_oracle(
    rollout: dict[str, np.ndarray],
    discount: np.ndarray,
    log_rho: np.ndarray,
    clip_rho: float,
    clip_c: float,
    clip_pg_rho: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Espeholt et al. 2018, eq. 1, one (s, b) at a time: the sum over t of the product of c_i.

    gamma^{t-s} is the product of per-step discounts, and the sum stops at the step that ends
    the episode (terminated or truncated).
    """
    r, v_tm1, v_t, done = rollout["r"], rollout["v_tm1"], rollout["v_t"], rollout["done"]
    num_time_steps, batch = r.shape
    rho = np.exp(log_rho)
    rho_bar, c, pg_rho = (
        np.minimum(clip_rho, rho),
        np.minimum(clip_c, rho),
        np.minimum(clip_pg_rho, rho),
    )
    vs = np.zeros_like(v_tm1)
    for s in range(num_time_steps):
        for b in range(batch):
            v_s = v_tm1[s, b]
            for t in range(s, num_time_steps):
                weight = np.prod(discount[s:t, b]) * np.prod(c[s:t, b])
                v_s += weight * rho_bar[t, b] * (r[t, b] + discount[t, b] * v_t[t, b] - v_tm1[t, b])
                if done[t, b]:
                    break
            vs[s, b] = v_s
    pg_advantage = np.zeros_like(v_tm1)
    for s in range(num_time_steps):
        for b in range(batch):
            # v_{s+1}: the next target, or V of the final observation where the episode ended.
            last = s == num_time_steps - 1 or done[s, b]
            v_next = v_t[s, b] if last else vs[s + 1, b]
            pg_advantage[s, b] = pg_rho[s, b] * (r[s, b] + discount[s, b] * v_next - v_tm1[s, b])
    return vs, pg_advantage


@pytest.mark.parametrize("seed", range(20))
def test_vtrace_matches_oracle(seed: int) -> None:
    rng = np.random.default_rng(seed)
    num_time_steps = int(rng.integers(1, 10))
    batch = int(rng.integers(1, 5))
    rollout = _rollout(rng, num_time_steps, batch)
    # Per-step discounts in [0, 1), and 0 at every termination.
    discount = np.where(
        rollout["terminated"], 0.0, rng.uniform(0.0, 1.0, size=(num_time_steps, batch))
    )
    log_rho = rng.normal(scale=1.0, size=(num_time_steps, batch))
    clip_rho, clip_c, clip_pg_rho = (float(x) for x in rng.uniform(0.3, 2.0, size=3))

    out = targets.vtrace(
        torch.from_numpy(rollout["r"]),
        torch.from_numpy(rollout["v_tm1"]),
        torch.from_numpy(rollout["v_t"]),
        torch.from_numpy(discount),
        torch.from_numpy(rollout["done"]),
        torch.from_numpy(log_rho),
        clip_rho=clip_rho,
        clip_c=clip_c,
        clip_pg_rho=clip_pg_rho,
    )
    vs, pg_advantage = _vtrace_oracle(rollout, discount, log_rho, clip_rho, clip_c, clip_pg_rho)
    np.testing.assert_allclose(out.vs.numpy(), vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(out.pg_advantage.numpy(), pg_advantage, rtol=1e-10, atol=1e-10)


def _gae_oracle(rollout: dict[str, np.ndarray], discount: np.ndarray, lambda_: float) -> np.ndarray:
    """The GAE recursion, one scalar at a time, restarting at each episode end."""
    r, v_tm1, v_t, done = rollout["r"], rollout["v_tm1"], rollout["v_t"], rollout["done"]
    num_time_steps, batch = r.shape
    adv = np.zeros_like(v_tm1)
    for b in range(batch):
        next_adv = 0.0
        for t in reversed(range(num_time_steps)):
            if done[t, b]:
                next_adv = 0.0
            delta = r[t, b] + discount[t, b] * v_t[t, b] - v_tm1[t, b]
            next_adv = delta + discount[t, b] * lambda_ * next_adv
            adv[t, b] = next_adv
    return adv


@pytest.mark.parametrize("seed", range(20))
def test_gae_matches_oracle(seed: int) -> None:
    rng = np.random.default_rng(seed)
    num_time_steps = int(rng.integers(1, 12))
    batch = int(rng.integers(1, 6))
    rollout = _rollout(rng, num_time_steps, batch)
    discount = np.where(
        rollout["terminated"], 0.0, rng.uniform(0.0, 1.0, size=(num_time_steps, batch))
    )
    lambda_ = float(rng.uniform(0.0, 1.0))
    adv = targets.gae(
        torch.from_numpy(rollout["r"]),
        torch.from_numpy(rollout["v_tm1"]),
        torch.from_numpy(rollout["v_t"]),
        torch.from_numpy(discount),
        torch.from_numpy(rollout["done"]),
        lambda_,
    )
    np.testing.assert_allclose(
        adv.numpy(), _gae_oracle(rollout, discount, lambda_), rtol=1e-10, atol=1e-10
    )


# --------------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------------


def test_n_equals_one_reduces_to_one_step_target() -> None:
    gen = torch.Generator().manual_seed(0)
    r = torch.randn(7, 3, generator=gen)
    terminated = torch.rand(7, 3, generator=gen) < 0.3
    truncated = torch.rand(7, 3, generator=gen) < 0.3
    q_next = torch.randn(7, 3, generator=gen)
    w = targets.n_step_window(r, terminated, truncated, GAMMA, n=1)
    y = targets.n_step_target(w.reward, w.num_steps, w.terminated, q_next, GAMMA)
    torch.testing.assert_close(y, r + GAMMA * (1 - terminated.float()) * q_next)


def test_n_step_window_does_not_mutate_inputs() -> None:
    r = torch.randn(5, 2)
    terminated = torch.tensor([[False, True]] * 5)
    truncated = torch.tensor([[True, False]] * 5)
    copies = (r.clone(), terminated.clone(), truncated.clone())
    targets.n_step_window(r, terminated, truncated, GAMMA, n=3)
    for original, copy in zip((r, terminated, truncated), copies, strict=True):
        assert torch.equal(original, copy)


def test_truncation_bootstraps_and_termination_does_not() -> None:
    reward = torch.tensor([1.0, 1.0])
    num_steps = torch.tensor([2, 2])
    q = torch.tensor([5.0, 5.0])
    y = targets.n_step_target(reward, num_steps, torch.tensor([False, True]), q, GAMMA)
    _assert_close(y, [1 + 0.9**2 * 5, 1])


def test_double_q_bootstrap_equals_max_when_networks_agree() -> None:
    q = torch.randn(32, 6, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(targets.double_q_bootstrap(q, q), q.max(dim=-1).values)


def test_importance_weights_max_is_one_and_uniform_is_all_ones() -> None:
    rng = np.random.default_rng(0)
    probs = rng.uniform(1e-6, 1e-3, size=64)
    w = targets.importance_weights(probs, table_size=10_000, beta=0.4)
    assert w.max().item() == 1.0
    assert bool(torch.all((w > 0) & (w <= 1)))
    # The rarest sample gets the largest weight.
    assert int(torch.argmax(w)) == int(np.argmin(probs))
    uniform = targets.importance_weights(torch.full((8,), 1 / 100, dtype=torch.float32), 100, 0.6)
    torch.testing.assert_close(uniform, torch.ones(8))


def test_importance_weights_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="> 0"):
        targets.importance_weights(torch.tensor([0.5, 0.0]), 2, 0.4)
    with pytest.raises(ValueError, match="> 0"):
        targets.importance_weights(torch.tensor([0.5, -0.1]), 2, 0.4)
    with pytest.raises(ValueError, match="table_size"):
        targets.importance_weights(torch.tensor([0.5, 0.5]), 0, 0.4)


def test_per_actor_epsilon_endpoints_and_monotone() -> None:
    num_actors = 8
    eps = [targets.per_actor_epsilon(i, num_actors) for i in range(num_actors)]
    assert eps[0] == pytest.approx(0.4)
    assert eps[-1] == pytest.approx(0.4**8)
    assert all(a > b for a, b in zip(eps, eps[1:], strict=False))
    assert targets.per_actor_epsilon(0, 1) == pytest.approx(0.4)


@pytest.mark.parametrize("index, num_actors", [(-1, 4), (4, 4), (0, 0)])
def test_per_actor_epsilon_rejects_bad_index(index: int, num_actors: int) -> None:
    with pytest.raises(ValueError):
        targets.per_actor_epsilon(index, num_actors)


def test_epsilon_greedy_zero_is_argmax() -> None:
    rng = np.random.default_rng(0)
    q = rng.normal(size=(100, 5))
    actions = targets.epsilon_greedy(q, 0.0, rng)
    assert actions.dtype == np.int64
    np.testing.assert_array_equal(actions, q.argmax(axis=1))


def test_epsilon_greedy_one_is_uniform() -> None:
    rng = np.random.default_rng(0)
    num_rows, num_actions = 40_000, 4
    q = np.zeros((num_rows, num_actions))
    q[:, 0] = 1.0  # greedy would always pick 0
    actions = targets.epsilon_greedy(q, 1.0, rng)
    counts = np.bincount(actions, minlength=num_actions)
    # Each count is Binomial(40000, 1/4): std ~87, so 5 % (500) is more than 5 sigma.
    np.testing.assert_allclose(counts, num_rows / num_actions, rtol=0.05)


def test_epsilon_greedy_per_row_epsilon() -> None:
    rng = np.random.default_rng(1)
    num_rows, num_actions = 20_000, 4
    q = np.zeros((num_rows, num_actions))
    q[:, 2] = 1.0
    epsilon = np.where(np.arange(num_rows) % 2 == 0, 0.0, 0.5)
    actions = targets.epsilon_greedy(q, epsilon, rng)
    assert np.all(actions[0::2] == 2)
    # Odd rows: greedy with probability 1 - 0.5 + 0.5 / 4.
    assert np.mean(actions[1::2] == 2) == pytest.approx(1 - 0.5 + 0.5 / 4, abs=0.02)


def test_epsilon_greedy_rejects_bad_epsilon() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="epsilon"):
        targets.epsilon_greedy(np.zeros((3, 2)), np.array([0.1, 0.2]), rng)
    with pytest.raises(ValueError, match="epsilon"):
        targets.epsilon_greedy(np.zeros((3, 2)), 1.5, rng)


def _bootstrapped_returns(rollout: dict[str, np.ndarray], gamma: float) -> torch.Tensor:
    """For every start s, the discounted return to the end of the rollout or the episode,
    bootstrapped from v_t there, computed with n_step_window / n_step_target (n = T - s)."""
    r = torch.from_numpy(rollout["r"])
    terminated = torch.from_numpy(rollout["terminated"])
    truncated = torch.from_numpy(rollout["truncated"])
    v_t = torch.from_numpy(rollout["v_t"])
    num_time_steps = r.shape[0]
    rows = []
    for s in range(num_time_steps):
        n = num_time_steps - s
        w = targets.n_step_window(r[s:], terminated[s:], truncated[s:], gamma, n)
        q_bootstrap = torch.gather(v_t[s:], 0, w.bootstrap_index)
        rows.append(targets.n_step_target(w.reward, w.num_steps, w.terminated, q_bootstrap, gamma))
    return torch.cat(rows)


def _torch_rollout(
    rollout: dict[str, np.ndarray], gamma: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(r_t, v_tm1, v_t, discount_t, done_t) as vtrace and gae take them."""
    discount = gamma * (1.0 - rollout["terminated"].astype(np.float64))
    return (
        torch.from_numpy(rollout["r"]),
        torch.from_numpy(rollout["v_tm1"]),
        torch.from_numpy(rollout["v_t"]),
        torch.from_numpy(discount),
        torch.from_numpy(rollout["done"]),
    )


@pytest.mark.parametrize("seed", range(5))
def test_on_policy_vtrace_is_the_bootstrapped_return(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rollout = _rollout(rng, 9, 4)
    gamma = float(rng.uniform(0.5, 1.0))
    r_t, v_tm1, v_t, discount_t, done_t = _torch_rollout(rollout, gamma)
    out = targets.vtrace(
        r_t,
        v_tm1,
        v_t,
        discount_t,
        done_t,
        torch.zeros_like(r_t),
        clip_rho=float(rng.uniform(1.0, 3.0)),
        clip_c=float(rng.uniform(1.0, 3.0)),
    )
    # Espeholt et al. 2018, remark 1 in sec. 4.1: on-policy, v_s is the n-step Bellman target.
    torch.testing.assert_close(out.vs, _bootstrapped_returns(rollout, gamma))
    # With c = 1 the trace is GAE's with lambda = 1: v_s - V(x_s) and the advantage both equal it.
    adv = targets.gae(r_t, v_tm1, v_t, discount_t, done_t, lambda_=1.0)
    torch.testing.assert_close(out.vs, adv + v_tm1)
    torch.testing.assert_close(out.pg_advantage, adv)


@pytest.mark.parametrize("seed", range(5))
def test_gae_lambda_one_plus_value_is_the_bootstrapped_return(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rollout = _rollout(rng, 9, 4)
    gamma = float(rng.uniform(0.5, 1.0))
    r_t, v_tm1, v_t, discount_t, done_t = _torch_rollout(rollout, gamma)
    adv = targets.gae(r_t, v_tm1, v_t, discount_t, done_t, lambda_=1.0)
    torch.testing.assert_close(adv + v_tm1, _bootstrapped_returns(rollout, gamma))


def test_gae_lambda_zero_is_the_td_error() -> None:
    rollout = _rollout(np.random.default_rng(0), 9, 4)
    r_t, v_tm1, v_t, discount_t, done_t = _torch_rollout(rollout, GAMMA)
    adv = targets.gae(r_t, v_tm1, v_t, discount_t, done_t, lambda_=0.0)
    torch.testing.assert_close(adv, r_t + discount_t * v_t - v_tm1)


def test_vtrace_and_gae_carry_no_gradient_and_do_not_mutate_inputs() -> None:
    rollout = _rollout(np.random.default_rng(1), 6, 3)
    inputs = [x.requires_grad_() for x in _torch_rollout(rollout, GAMMA)[:4]]
    r_t, v_tm1, v_t, discount_t = inputs
    done_t = torch.from_numpy(rollout["done"])
    log_rho = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    copies = [x.detach().clone() for x in (*inputs, done_t, log_rho)]
    out = targets.vtrace(r_t, v_tm1, v_t, discount_t, done_t, log_rho)
    adv = targets.gae(r_t, v_tm1, v_t, discount_t, done_t, lambda_=0.95)
    assert not out.vs.requires_grad
    assert not out.pg_advantage.requires_grad
    assert not adv.requires_grad
    for original, copy in zip((*inputs, done_t, log_rho), copies, strict=True):
        assert torch.equal(original.detach(), copy)


def test_ppo_clip_loss_on_policy_is_minus_mean_advantage() -> None:
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(5, 4, generator=gen).requires_grad_()
    advantage = torch.randn(5, 4, generator=gen)
    loss = targets.ppo_clip_loss(logp, logp.detach().clone(), advantage, clip=0.2)
    torch.testing.assert_close(loss, -advantage.mean())
    # At ratio 1 nothing is clipped: d loss / d logp = -A / N.
    loss.backward()
    torch.testing.assert_close(logp.grad, -advantage / advantage.numel())


def test_ppo_clip_loss_clips_only_outside_the_range_in_the_direction_of_a() -> None:
    # (ratio, A): past 1 + eps with A > 0 and below 1 - eps with A < 0 are clipped (zero gradient);
    # the opposite directions and ratios inside [1 - eps, 1 + eps] keep the unclipped gradient.
    ratio = torch.tensor([1.5, 0.5, 1.5, 0.5, 1.1, 0.9])
    advantage = torch.tensor([2.0, -2.0, -2.0, 2.0, 2.0, -2.0])
    clipped = torch.tensor([True, True, False, False, False, False])
    logp_old = torch.full((6,), -1.0)
    logp = (logp_old + torch.log(ratio)).requires_grad_()
    targets.ppo_clip_loss(logp, logp_old, advantage, clip=0.2).backward()
    # d/d logp of -(ratio * A) / N is -ratio * A / N.
    expected = torch.where(clipped, torch.zeros(6), -ratio * advantage / 6)
    torch.testing.assert_close(logp.grad, expected)


def test_ppo_clip_loss_does_not_differentiate_through_old_logp_or_advantage() -> None:
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    logp_old = torch.tensor([-1.1, -1.5], requires_grad=True)
    advantage = torch.tensor([1.0, -1.0], requires_grad=True)
    targets.ppo_clip_loss(logp, logp_old, advantage, clip=0.2).backward()
    assert logp.grad is not None
    assert logp_old.grad is None
    assert advantage.grad is None


def test_clipped_value_loss_without_clip_is_half_mse() -> None:
    gen = torch.Generator().manual_seed(0)
    v_pred, v_old, v_target = (torch.randn(6, 3, generator=gen) for _ in range(3))
    loss = targets.clipped_value_loss(v_pred, v_old, v_target, clip=None)
    torch.testing.assert_close(loss, 0.5 * torch.nn.functional.mse_loss(v_pred, v_target))
    # A prediction within eps of v_old is not clipped either.
    near_old = v_old + 0.05 * torch.tanh(v_pred)
    torch.testing.assert_close(
        targets.clipped_value_loss(near_old, v_old, v_target, clip=0.1),
        0.5 * torch.nn.functional.mse_loss(near_old, v_target),
    )


# --------------------------------------------------------------------------------------------------
# Shape checks
# --------------------------------------------------------------------------------------------------


def test_shape_mismatches_name_both_shapes() -> None:
    r = torch.zeros(4, 2)
    flags = torch.zeros(4, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"\(4, 2\).*\(4, 3\)"):
        targets.n_step_window(r, torch.zeros(4, 3, dtype=torch.bool), flags, GAMMA, 2)
    with pytest.raises(ValueError, match=r"\(3,\).*\(4,\)"):
        targets.n_step_target(
            torch.zeros(3),
            torch.ones(4, dtype=torch.int64),
            torch.zeros(4, dtype=torch.bool),
            torch.zeros(4),
            GAMMA,
        )
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(2, 4\)"):
        targets.double_q_bootstrap(torch.zeros(2, 3), torch.zeros(2, 4))


def test_n_step_window_rejects_short_input_and_non_bool_flags() -> None:
    r = torch.zeros(2, 1)
    flags = torch.zeros(2, 1, dtype=torch.bool)
    with pytest.raises(ValueError, match="n = 3"):
        targets.n_step_window(r, flags, flags, GAMMA, 3)
    with pytest.raises(ValueError, match="bool"):
        targets.n_step_window(r, flags.float(), flags, GAMMA, 1)


def test_vtrace_gae_and_ppo_losses_name_both_shapes() -> None:
    x, y = torch.zeros(4, 2), torch.zeros(4, 3)
    done = torch.zeros(4, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"\(4, 2\).*\(4, 3\)"):
        targets.vtrace(x, x, y, x, done, x)
    with pytest.raises(ValueError, match=r"\(4, 2\).*\(4, 3\)"):
        targets.vtrace(x, x, x, x, done, y)
    with pytest.raises(ValueError, match=r"\(4, 2\).*\(4, 3\)"):
        targets.vtrace(x, x, x, x, torch.zeros(4, 3, dtype=torch.bool), x)
    with pytest.raises(ValueError, match=r"\(4, 2\).*\(4, 3\)"):
        targets.gae(x, y, x, x, done, 0.95)
    with pytest.raises(ValueError, match=r"\(4, 2\).*\(4, 3\)"):
        targets.gae(x, x, x, y, done, 0.95)
    with pytest.raises(ValueError, match=r"\(4, 2\).*\(4, 3\)"):
        targets.ppo_clip_loss(x, y, x, 0.2)
    with pytest.raises(ValueError, match=r"\(4, 2\).*\(4, 3\)"):
        targets.ppo_clip_loss(x, x, y, 0.2)
    with pytest.raises(ValueError, match=r"\(4, 2\).*\(4, 3\)"):
        targets.clipped_value_loss(x, y, x, 0.2)
    with pytest.raises(ValueError, match=r"\(4, 2\).*\(4, 3\)"):
        targets.clipped_value_loss(x, x, y, None)


def test_vtrace_and_gae_reject_bad_input() -> None:
    x = torch.zeros(4, 2)
    done = torch.zeros(4, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="bool"):
        targets.gae(x, x, x, x, done.float(), 0.95)
    with pytest.raises(ValueError, match=r"\[T, B\]"):
        targets.vtrace(
            *(torch.zeros(4) for _ in range(4)), torch.zeros(4, dtype=torch.bool), torch.zeros(4)
        )
    with pytest.raises(ValueError, match="lambda_"):
        targets.gae(x, x, x, x, done, 1.5)
    with pytest.raises(ValueError, match="clip_rho"):
        targets.vtrace(x, x, x, x, done, x, clip_rho=0.0)
    with pytest.raises(ValueError, match="clip"):
        targets.ppo_clip_loss(x, x, x, -0.1)


def test_linear_remaining_worked_by_hand() -> None:
    # A run of 4 rollouts: the first trains with all of the value, the second with 3/4 ...
    assert [schedules.linear_remaining(k, 4) for k in range(6)] == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    assert schedules.linear_remaining(1_000_000, 10_000_000) == pytest.approx(0.9)
    with pytest.raises(ValueError, match="total must be positive"):
        schedules.linear_remaining(0, 0)
    with pytest.raises(ValueError, match="done must be non-negative"):
        schedules.linear_remaining(-1, 4)
