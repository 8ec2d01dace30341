"""The league's pure math against numbers worked by hand (``apexrl.league.ratings``)."""

from __future__ import annotations

import numpy as np
import pytest

from apexrl.league.ratings import PayoffTable, elo_expected, elo_update, pfsp_weights


def test_elo_expected_scores() -> None:
    assert elo_expected(1500, 1500) == 0.5
    # 1 / (1 + 10^(-200/400)) = 1 / (1 + 0.316228) = 0.759747
    assert elo_expected(1600, 1400) == pytest.approx(0.759747, abs=1e-6)
    assert elo_expected(1400, 1600) == pytest.approx(1 - 0.759747, abs=1e-6)


def test_elo_update_moves_both_ratings_by_the_same_step() -> None:
    # The weaker player wins: 32 * (1 - 0.240253) = 24.3119
    weak, strong = elo_update(1400, 1600, 1.0, k=32)
    assert weak == pytest.approx(1424.3119, abs=1e-4)
    assert strong == pytest.approx(1575.6881, abs=1e-4)
    # A draw between equals changes nothing; a draw against a stronger player gains 32 * 0.259747
    assert elo_update(1500, 1500, 0.5) == (1500, 1500)
    assert elo_update(1400, 1600, 0.5, k=32)[0] == pytest.approx(1408.3119, abs=1e-4)
    with pytest.raises(ValueError, match="score is in"):
        elo_update(1500, 1500, 2.0)


def test_pfsp_weights_hard_variance_and_uniform() -> None:
    rates = [0.2, 0.5, 0.9]
    # hard, p = 2: (0.64, 0.25, 0.01) / 0.9
    np.testing.assert_allclose(pfsp_weights(rates, "hard", 2.0), [0.711111, 0.277778, 0.011111],
                               atol=1e-6)  # fmt: skip
    # variance: (0.16, 0.25, 0.09) / 0.5
    np.testing.assert_allclose(pfsp_weights(rates, "variance"), [0.32, 0.5, 0.18], atol=1e-12)
    np.testing.assert_allclose(pfsp_weights(rates, "uniform"), [1 / 3] * 3, atol=1e-12)
    # a pool the learner always beats: uniform, not 0 / 0
    np.testing.assert_allclose(pfsp_weights([1.0, 1.0], "hard"), [0.5, 0.5])
    for bad, message in [([], "at least one"), ([1.5], r"in \[0, 1\]"), ([np.nan], r"in \[0, 1\]")]:
        with pytest.raises(ValueError, match=message):
            pfsp_weights(bad)
    with pytest.raises(ValueError, match="weighting must be one of"):
        pfsp_weights([0.5], "softmax")


def test_payoff_table_counts_both_sides_and_round_trips() -> None:
    table = PayoffTable()
    table.add("main", "main@100", 1.0)
    table.add("main", "main@100", 1.0)
    table.add("main", "main@100", 0.5)
    table.add("main@100", "main", 1.0)  # the snapshot wins one
    assert table.record("main", "main@100") == (2, 1, 1)
    assert table.record("main@100", "main") == (1, 1, 2)
    assert table.win_rate("main", "main@100") == pytest.approx((2 + 0.5) / 4)
    assert table.win_rate("main", "random") == 0.5  # never met
    again = PayoffTable.from_dict(table.to_dict())
    assert again.games == table.games
    with pytest.raises(ValueError, match="do not agree"):
        PayoffTable.from_dict({"a|b": [1, 0, 0], "b|a": [1, 0, 0]})
    for bad in ({"ab": [1, 0, 0]}, {"a|b": [1, 0]}, {"a|b": [-1, 0, 0]}):
        with pytest.raises(ValueError, match="payoff"):
            PayoffTable.from_dict(bad)
    with pytest.raises(ValueError, match="does not play itself"):
        table.add("main", "main", 1.0)
    with pytest.raises(ValueError, match="1, 1/2 or 0"):
        table.add("main", "random", 0.7)
