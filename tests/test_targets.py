"""Tests for apexrl/targets.py: hand-worked arithmetic, slow oracles, and properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from apexrl import targets

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


def _assert_close(actual: torch.Tensor, expected: list[float]) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype))


R = [1.0, 2.0, 3.0, 4.0]
Q_NEXT = [10.0, 20.0, 30.0, 40.0]  # value of next_obs[t], the state after step t
NO = [False, False, False, False]


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
