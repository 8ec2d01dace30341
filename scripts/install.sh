#!/usr/bin/env bash
# Install apexrl and what it needs into the current Python environment.
# torch goes first, pinned to the CPU build when no torch (or one older than 2.6) is present, so that
# the `torch>=2.6` requirement does not pull a multi-GB CUDA build; an existing torch >= 2.6 (CPU or
# CUDA) is kept.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
if ! "$python" -c "import sys, torch; sys.exit(tuple(map(int, torch.__version__.split('.')[:2])) < (2, 6))" >/dev/null 2>&1; then
  "$python" -m pip install --quiet "torch==2.13.0"
fi
"$python" -m pip install --quiet -e "$repo[test]"
