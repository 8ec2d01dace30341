#!/usr/bin/env bash
# Install apexrl and what it needs into the current Python environment.
# torch goes first, pinned to the CPU build when no torch is present, so that the `torch>=2.1`
# requirement does not pull a multi-GB CUDA build; an existing torch (CPU or CUDA) is kept.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
if ! "$python" -c "import torch" >/dev/null 2>&1; then
  "$python" -m pip install --quiet "torch==2.13.0"
fi
"$python" -m pip install --quiet -e "$repo[test]"
