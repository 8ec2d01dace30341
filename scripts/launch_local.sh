#!/usr/bin/env bash
# Start a whole apexrl run on this machine: replay server, parameter server, learner(s), N actors
# and an evaluation actor, each a separate process, supervised until the run's stop condition.
#
#   scripts/launch_local.sh --actors 4 --learners 1 [--config FILE] [--logdir DIR] [--set k=v ...]
#   scripts/launch_local.sh --actors 4 --learners 1 --resume --run-dir DIR   (continue a run)
#
# The run's CURVE keys are made in <run dir>/keys and every role gets them, so the servers admit
# only this run's roles (--no-curve: no keys). Ctrl-C or SIGTERM stops every process it started.
# See `python -m apexrl local --help`.
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
# exec: the supervisor gets our PID, so a signal to this script reaches it directly.
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" exec "$python" -m apexrl local "${args[@]}"
