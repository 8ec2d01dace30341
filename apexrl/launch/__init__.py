"""Orchestration: starting, watching and stopping a whole run.

- ``local``: ``apexrl local`` / ``scripts/launch_local.sh``, every role on this machine, supervised;
- ``forkserver``: the pre-imported process that forks the launcher's roles;
- ``serial``: ``--serial``, every role a thread of one process (for debuggers);
- ``slurm``: ``apexrl slurm``, a whole run as one SLURM batch job;
- ``k8s``: ``apexrl k8s``, a whole run's Kubernetes manifests;
- ``preflight``: the checks made before anything starts.

Nothing in the roles imports this package: it starts them, through ``apexrl.roles``.
"""
