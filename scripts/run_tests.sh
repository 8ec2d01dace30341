#!/usr/bin/env bash
# Run the tests with the Python that scripts/install.sh installed into (scripts/project_python.sh:
# the project's .venv where the system Python is externally managed, else python3 or $PYTHON).
# Arguments go to pytest: scripts/run_tests.sh -m slow -s, scripts/run_tests.sh tests/test_cli.py
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="$(bash "$repo/scripts/project_python.sh")"
exec "$python" -m pytest "$@"
