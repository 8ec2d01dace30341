"""Neural networks (``nn.Module`` only) and the weight format that carries them over the wire.

- ``torsos``: observation -> features (MLP, Nature CNN, IMPALA ResNet, MinAtar CNN), picked from
  the observation space or named in the config;
- ``q``: Q-networks (Ape-X), ``build_q_network``;
- ``recurrent``: R2D2's torso + LSTM + dueling head, IMPALA's and PPO's torso + LSTM +
  policy and value heads (``algo.lstm_size`` > 0);
- ``actor_critic``: policy and value heads (IMPALA, PPO), ``build_policy_network``;
- ``arrays``: ``params_to_arrays`` / ``arrays_to_params``, a network as the named numpy arrays
  a publish carries (``apexrl.transport.weights`` checks their layout);
- ``precision``: the networks' numeric precision, ``fp32``, ``bf16`` or ``auto``.

Actors and learners build the same network from the config. Models return ``NamedTuple`` outputs
so that callers name what they use (``out.q``).
"""

from apexrl.models.actor_critic import (
    LOG_STD_MAX,
    LOG_STD_MIN,
    CategoricalOutput,
    GaussianOutput,
    ImageActorCritic,
    MirroredBoardNetwork,
    MLPActorCritic,
    NormalizedObsNetwork,
    ObsNormalizer,
    PolicyValueOutput,
    build_policy_network,
)
from apexrl.models.arrays import arrays_to_params, params_to_arrays
from apexrl.models.q import ConvQNetwork, MLPQNetwork, QOutput, build_q_network
from apexrl.models.recurrent import (
    LSTMState,
    RecurrentActorCritic,
    RecurrentQNetwork,
    RecurrentQOutput,
    RecurrentUnroll,
)
from apexrl.models.torsos import TORSOS, build_torso, choose_torso

__all__ = [
    "LOG_STD_MAX",
    "LOG_STD_MIN",
    "TORSOS",
    "CategoricalOutput",
    "ConvQNetwork",
    "GaussianOutput",
    "ImageActorCritic",
    "LSTMState",
    "MLPActorCritic",
    "MLPQNetwork",
    "MirroredBoardNetwork",
    "NormalizedObsNetwork",
    "ObsNormalizer",
    "PolicyValueOutput",
    "QOutput",
    "RecurrentActorCritic",
    "RecurrentQNetwork",
    "RecurrentQOutput",
    "RecurrentUnroll",
    "arrays_to_params",
    "build_policy_network",
    "build_q_network",
    "build_torso",
    "choose_torso",
    "params_to_arrays",
]
