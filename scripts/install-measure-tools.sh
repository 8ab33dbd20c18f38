#!/usr/bin/env bash
# The measuring venv of bench/sizing_measure.py (.venv-measure): PyTorch, transformers and peft,
# pinned in bench/sizing_measure.requirements.txt. Kept apart from .venv so the storefront never
# depends on PyTorch; tests/bench/test_sizing_measure.py runs the script's CPU grid with it (with
# CI=true it fails when the venv is missing). Idempotent: rebuilt only when the pins change.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-measure
REQ=bench/sizing_measure.requirements.txt
STAMP="$VENV/.installed-$(sha256sum "$REQ" | cut -c1-16)"
if [ -f "$STAMP" ]; then
  echo "$VENV is up to date"
  exit 0
fi
rm -rf "$VENV"
"${PY:-python3}" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q -r "$REQ"
"$VENV/bin/python" -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"
touch "$STAMP"
