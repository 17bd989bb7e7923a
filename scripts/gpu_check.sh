#!/usr/bin/env bash
# The GPU check (docs/gpus.md, "The GPU check"): pagedllm/benchmarks/gpu_check.py says what
# it runs. Usage: scripts/gpu_check.sh [OUT_DIR] [--deadline S]  (default OUT_DIR: $OUT,
# else ./gpu-check-out). Exit status 0 passed, 1 a phase failed or was cut, 2 no GPU.
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m pagedllm.benchmarks.gpu_check "$@"
