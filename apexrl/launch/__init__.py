"""Orchestration: starting, watching and stopping a whole run.

- ``local``: ``apexrl local`` / ``scripts/launch_local.sh``, every role on this machine: the
  command, the checks before the start and the order of starting;
- ``processes``: the local launcher's child processes (forked or exec'd, followed, stopped);
- ``supervisor``: the watch over a started run's children, and the restart policy;
- ``forkserver``: the pre-imported process that forks the launcher's roles;
- ``serial``: ``--serial``, every role a thread of one process (for debuggers), and
  ``stats_relay``, its loopback window for ``apexrl status``;
- ``run_state``: what a run's directory records of its state (``result.json``, ``roles.json``);
- ``slurm``: ``apexrl slurm``, a whole run as one SLURM batch job (``slurm_job.sh``, the batch
  script's template, is package data beside it);
- ``k8s``: ``apexrl k8s``, the command; ``k8s_manifests``: a whole run's Kubernetes objects;
- ``preflight``: the checks made before anything starts.

Nothing in the roles imports this package: it starts them, through ``apexrl.roles``.
"""
