#!/usr/bin/env bash
# Install apexrl and what it needs into the Python that apexrl's scripts run
# (scripts/project_python.sh: $PYTHON, the active virtual environment, the project's .venv when it
# exists, else python3). Where that Python is externally managed (PEP 668: current Debian and Ubuntu
# refuse `pip install` into the system Python), it makes the project's own virtual environment
# <repo>/.venv and installs there; scripts/launch_local.sh and scripts/run_tests.sh then use it.
# The environment sees the system's packages (--system-site-packages), so a torch that the system
# already has is kept, as below; what is missing or too old is installed into the environment.
# torch goes first, pinned to the CPU build when no torch (or one older than 2.6) is present, so that
# the `torch>=2.6` requirement does not pull a multi-GB CUDA build; an existing torch >= 2.6 (CPU or
# CUDA) is kept.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="$(bash "$repo/scripts/project_python.sh")"
venv="$repo/.venv"
# PEP 668: an interpreter outside any virtual environment whose stdlib directory holds the marker.
is_externally_managed='import os, sys, sysconfig
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
sys.exit(0 if sys.prefix == sys.base_prefix and os.path.isfile(marker) else 1)'
if "$python" -c "$is_externally_managed"; then
  echo "apexrl: $python is externally managed (PEP 668): using the project's virtual environment $venv"
  if [ ! -x "$venv/bin/python" ]; then
    existed=0
    [ -e "$venv" ] && existed=1
    if ! "$python" -m venv --system-site-packages "$venv"; then
      [ "$existed" = 1 ] || rm -rf "$venv"  # what a failed attempt left, never the user's files
      echo "apexrl: could not make $venv; install Python's venv module (Debian, Ubuntu:" \
        "apt install python3-venv) and run this again" >&2
      exit 1
    fi
  fi
  python="$venv/bin/python"
fi
if ! "$python" -c "import sys, torch; sys.exit(tuple(map(int, torch.__version__.split('.')[:2])) < (2, 6))" >/dev/null 2>&1; then
  "$python" -m pip install --quiet "torch==2.13.0"
fi
# pygame and pygame-ce install the same module, pygame; apexrl depends on pygame-ce (mpe2 and
# PettingZoo's games need it). With both present, removing either breaks the other: remove pygame,
# then reinstall pygame-ce's files.
if "$python" -m pip show --quiet pygame >/dev/null 2>&1; then
  "$python" -m pip uninstall --quiet --yes pygame
  "$python" -m pip install --quiet --force-reinstall --no-deps "pygame-ce>=2.3.0"
fi
"$python" -m pip install --quiet -e "$repo[test]"
echo "apexrl: installed into $("$python" -c 'import sys; print(sys.prefix)')"
