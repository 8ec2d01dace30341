#!/usr/bin/env bash
# Submit a whole apexrl run as one SLURM batch job: replay server, parameter server and the
# learners on the first node, the actors on the others, each role a job step of its own.
#
#   scripts/launch_slurm.sh --actors 32 --learners 2 --nodes 5 --gpus-per-learner 1 \
#       --partition gpu --time 04:00:00 [--config FILE] [--dry-run] [--set k=v ...]
#
# Run it on a login node, from a directory the nodes share. Without --config it runs the Ape-X
# CartPole config. See `python -m apexrl slurm --help` and README's "Clusters".
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="$(bash "$repo/scripts/project_python.sh")"  # $PYTHON, a venv, .venv or python3
args=("$@")
has_config=0
for a in "$@"; do
  # A resumed run reads its own config.yaml unless --config is given.
  case "$a" in --config|--config=*|--resume) has_config=1 ;; esac
done
if [ "$has_config" = 0 ]; then
  args=(--config "$repo/configs/apex_dqn_cartpole.yaml" "${args[@]}")
fi
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" exec "$python" -m apexrl slurm "${args[@]}"
