#!/usr/bin/env bash
# `python -m apexrl COMMAND ARGS...` as the launch scripts run it: with the project's Python
# (scripts/project_python.sh), this checkout on PYTHONPATH, and, when neither --config nor
# --resume (a resumed run reads its own config.yaml) is given, the Ape-X CartPole config.
#
#   scripts/run_apexrl.sh local --actors 4 ...     (scripts/launch_local.sh)
#   scripts/run_apexrl.sh slurm --actors 32 ...    (scripts/launch_slurm.sh)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="$(bash "$repo/scripts/project_python.sh")"  # $PYTHON, a venv, .venv or python3
command=$1
shift
args=("$@")
has_config=0
for a in "$@"; do
  case "$a" in --config|--config=*|--resume) has_config=1 ;; esac
done
if [ "$has_config" = 0 ]; then
  args=(--config "$repo/configs/apex_dqn_cartpole.yaml" "${args[@]}")
fi
# exec: the command gets our PID (and the launch script's, which execs this), so a signal to the
# script reaches it directly.
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" exec "$python" -m apexrl "$command" "${args[@]}"
