"""The parts an acting role is made of: the training actor (``apexrl.actor``) and the evaluation
actor (``apexrl.evaluation``) both build on them, and neither imports the other.

``startup``     the envs, the algorithm and the network an acting role plays with
``episodes``    a training actor's finished episodes and throughput: its reports to replay and
                its TensorBoard scalars (``EpisodeMetrics``)
``step_block``  the time-major steps an actor adds one vector step at a time (``StepBlock``)
``chunks``      the replay items an actor core cut from a full step block, as one
                ``TrajectoryChunk``

Elsewhere: the envs ``apexrl.envs``, the algorithms' actor cores ``apexrl.algos``, the clients
that reach replay and the parameter server ``apexrl.clients``, and a run's episode callbacks
``apexrl.callbacks``.
"""
