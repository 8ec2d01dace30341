"""The math of the algorithms, as pure functions of tensors checked against numbers worked by hand
(``tests/test_targets.py`` and the families' tests): no config, no module, no state.

- ``targets``: n-step returns, double Q, R2D2's value rescaling, V-trace, GAE, PPO's clipped
  objective and value loss, prioritized replay's weights, and the actors' exploration
  (per-actor epsilon, epsilon-greedy over legal actions);
- ``distributional``: C51's support, the projection of the n-step target distribution, its
  cross-entropy and the distributions' means;
- ``continuous_targets``: SAC's, TD3's and DDPG's targets and losses;
- ``distributions``: the policies' distributions (categorical with masked logits, diagonal
  Gaussian, tanh-squashed Gaussian, products of parts): samples, log-probabilities, entropies;
- ``schedules``: the fraction of a run left, for linearly annealed hyperparameters.
"""
