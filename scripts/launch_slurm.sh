#!/usr/bin/env bash
# Submit a whole apexrl run as one SLURM batch job: replay server, parameter server and the
# learners on the first node, the actors on the others, each role a job step of its own.
#
#   scripts/launch_slurm.sh --actors 32 --learners 2 --nodes 5 --gpus-per-learner 1 \
#       --partition gpu --time 04:00:00 [--config FILE] [--dry-run] [--set k=v ...]
#
# Run it on a login node, from a directory the nodes share. Without --config it runs the Ape-X
# CartPole config. See `python -m apexrl slurm --help` and docs/clusters.md.
exec bash "$(dirname "${BASH_SOURCE[0]}")/run_apexrl.sh" slurm "$@"
