"""What every role's process shares, whatever the role:

- ``lifecycle``: the stop event set by SIGINT/SIGTERM, logging, device and thread set-up;
- ``cores``: the CPU cores this process may run on;
- ``rundir``: the run directory's layout, every file and folder a run writes;
- ``metrics``: TensorBoard scalars, throughput meters and ``result.json`` lines.

The roles themselves (``apexrl.actor``, ``apexrl.learner``, ``apexrl.replay_server``,
``apexrl.param_server``, ``apexrl.evaluation``) stay at the package's top level.
"""
