#!/usr/bin/env bash
# Print the Python that apexrl's scripts run (scripts/install.sh, launch_local.sh, run_tests.sh):
# $PYTHON when set; the active virtual environment's python3; else the project's own virtual
# environment <repo>/.venv when it exists (scripts/install.sh makes it where the system Python is
# externally managed, PEP 668); else python3.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${PYTHON:-}" ]; then
  echo "$PYTHON"
elif [ -z "${VIRTUAL_ENV:-}" ] && [ -x "$repo/.venv/bin/python" ]; then
  echo "$repo/.venv/bin/python"
else
  echo python3
fi
