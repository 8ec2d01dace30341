"""The learner's parts; the loop that strings them together is ``apexrl.learner.main``.

- ``replay_link``: the link to replay: batches kept in flight (``BatchStream``), priorities,
  ``Stats`` and the run's env steps, re-connected when replay goes away (``ReplayLinks``).
- ``publisher``: the link to the parameter server: weights published, at most one waiting for its
  ack (``Publisher``).
- ``replies``: what both links share: reading a server's replies, how often drops are looked for.
- ``update``: the update step (``UpdateStep``), the algorithm's core built or resumed
  (``build_algo``) and a learner group joined (``join_group``, ``share_start_state``).
- ``group``: the learner group that averages gradients over ranks (``LearnerGroup``).
- ``checkpoint``: ``checkpoint.pt`` (and ``.prev.pt``, ``checkpoint_best.pt``) written, loaded
  and resumed from.
- ``judged``: the weights of the versions evaluation judged (``JudgedWeights``).
- ``reporting``: TensorBoard scalars, ``result.json`` lines, the console line and the stop rule
  (``Reporter``, ``stop_reason``).
- ``finite``: the checks that keep NaN and infinite values out of training and checkpoints.
- ``user_requests``: what the user's Python asks of a running learner through the run directory
  (``apexrl.api``): weights to publish as a new version, a checkpoint now (``UserRequests``).
- ``optim``: the learners' Adam, without ``torch.optim.Optimizer``'s compiler imports (``Adam``).

Every part logs as ``apexrl.learner``, the role's logger.
"""
