#!/usr/bin/env bash
# Every distval command on the GPU backend, one line per item (PASS / FAIL / SKIP with the figure).
# Uses this machine's own torch (no CPU pin): run it from a checkout on a GPU machine,
#   bash benchmarks/gpu_check.sh [--only check,bench,train,compare,resume,drill,doctor,run] [--model small]
# The Python package needs typer and rich beside torch and numpy; `pip install -e . --no-deps`
# is not required: the checkout's src/ is put on the path.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
missing=$("$PY" -c 'import importlib.util as u; print(" ".join(m for m in ("torch", "numpy", "typer", "rich") if u.find_spec(m) is None))')
if [ -n "$missing" ]; then
  echo "FAIL  setup: $PY lacks $missing; install them (pip install $missing) next to this machine's torch" >&2
  exit 2
fi
exec "$PY" benchmarks/gpu_check.py "$@"
