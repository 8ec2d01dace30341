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
exec bash "$(dirname "${BASH_SOURCE[0]}")/run_apexrl.sh" local "$@"
