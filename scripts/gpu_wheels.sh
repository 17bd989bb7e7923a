#!/usr/bin/env bash
# Wheels of the packages pagedllm needs that a lent GPU machine's image lacks (docs/gpus.md,
# "On a lent GPU machine"). The image holds torch, Triton, CUDA, numpy, pytest and most of
# transformers' own needs (huggingface-hub 1.33 and safetensors 0.8, which this
# transformers accepts), but not pagedllm's server, GGUF and grammar packages, an older
# transformers, and regex (pagedllm's tool parsers use it; the image's is of unknown age, and
# this transformers checks for a 2025.10 or later one at import); nothing can be fetched
# there. Each package comes at the version this tree's virtualenv holds (what `make install` resolved), built for that machine's Python
# (3.12, x86-64 manylinux), into OUT_DIR (default .whl/, git-ignored): well under the 64 MiB
# a call may carry.
# Usage: scripts/gpu_wheels.sh [OUT_DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
DEST="${1:-$ROOT/.whl}"
PACKAGES=(
    transformers tokenizers regex gguf llguidance
    fastapi starlette pydantic pydantic-core annotated-types typing-inspection annotated-doc
    typing-extensions opentelemetry-api uvicorn
)
PLATFORMS=()
for p in manylinux_2_{17,24,27,28,31,34,35}_x86_64 manylinux2014_x86_64; do
    PLATFORMS+=(--platform "$p")
done
mkdir -p "$DEST"
for name in "${PACKAGES[@]}"; do
    version="$("$PY" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$name")"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${PLATFORMS[@]}" -d "$DEST" "$name==$version"
done
echo "gpu_wheels: $(ls "$DEST" | wc -l) wheels, $(du -sh "$DEST" | cut -f1) in $DEST"
