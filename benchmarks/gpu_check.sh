#!/usr/bin/env bash
# Device check for a lent GPU machine (benchmarks/gpu_check.py says what it checks):
#     bash benchmarks/gpu_check.sh [--only NAME] [--cpu]
# One `CHECK name: ok|FAIL|skip ...` line per check; $OUT/gpu_check.json when $OUT is set.
# Exit status: gpu_check.py's (1 when a check failed, 2 when no python with torch is found).
# Python: $PYTHON if set, else the first of python3, python, .venv/bin/python that imports torch.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    for c in python3 python .venv/bin/python; do
        if command -v "$c" >/dev/null 2>&1 && "$c" -c "import torch" >/dev/null 2>&1; then
            PY="$c"
            break
        fi
    done
fi
if [ -z "$PY" ]; then
    echo "CHECK setup: FAIL no python that imports torch (set PYTHON=...)"
    exit 2
fi

# nvidia-ml-py missing: use a carried copy of its single module (pynvml.py) if there is one.
NVML_DIR=""
if ! "$PY" -c "import pynvml" >/dev/null 2>&1; then
    for f in .venv/lib/python*/site-packages/pynvml.py; do
        if [ -f "$f" ]; then
            NVML_DIR="$(mktemp -d)"
            cp "$f" "$NVML_DIR/"
            export PYTHONPATH="$PYTHONPATH:$NVML_DIR"
            break
        fi
    done
fi

"$PY" benchmarks/gpu_check.py "$@"
rc=$?
[ -n "$NVML_DIR" ] && rm -rf "$NVML_DIR"
exit $rc
