"""`pagedllm inspect`: sizes of a model built on the meta device, so any size is free to inspect.

Figures are per tensor-parallel rank where they differ between ranks' shapes: every rank
of a pipeline stage holds tensors of the same shapes, so its rank 0 stands for all. Under
expert parallelism rank 0 holds the most experts (the first E % tp ranks hold one more), so
it stands for the largest rank of its stage. Under pipeline parallelism stages differ (their
layers, the embedding on the first, norm and LM head on the last): "bytes_per_rank" is the
largest stage's rank, and "bytes_per_rank_by_stage" lists each. With a
quantization (a GGUF file type, or pagedllm's int8), weight bytes follow its plan
(pagedllm.gguf.quant_plan; quantized_weights.py splits fused parameters for it); a quantized
checkpoint (GPTQ, AWQ, ...) without one is sized as the loader runs its layers.
"""

import argparse
import json
from dataclasses import replace

import torch
from torch import nn

from pagedllm._custom_ops import packs_linear_weight
from pagedllm.config import KV_CACHE_DTYPES, CacheConfig, ModelConfig
from pagedllm.distributed.parallel_state import (
    override_pipeline_parallel,
    override_tensor_parallel,
    set_expert_parallel,
)
from pagedllm.entrypoints.quantized_weights import (
    CHECKPOINT,
    FLOAT_TYPES,
    quantized_weight_bytes,
)
from pagedllm.executor.kv_cache import kv_cache_bytes_per_token
from pagedllm.gguf.quant_plan import FILE_TYPES
from pagedllm.layers.fused_moe import FusedMoE
from pagedllm.layers.vocab_embedding import ParallelLMHead
from pagedllm.model_loader.loader import build_model


def count_params(model: nn.Module) -> int:
    """Unique parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters())


def inactive_expert_params(model: nn.Module) -> int:
    """Parameters of the experts a token does not use: (E - top_k) / E of every FusedMoE."""
    total = 0
    for moe in model.modules():
        if isinstance(moe, FusedMoE):
            expert_params = moe.w13_weight.numel() + moe.w2_weight.numel()
            total += expert_params * (moe.num_experts - moe.top_k) // moe.num_experts
    return total


def tied_head_copy_bytes(stage: nn.Module) -> int:
    """Bytes of a float LM head's packed copy, which a tied head holds beside the
    embedding's rows where this CPU's linear kernel reads a packed order
    (UnquantizedEmbeddingMethod, _custom_ops.packs_linear_weight); 0 elsewhere."""
    total = 0
    for head in stage.modules():
        if isinstance(head, ParallelLMHead) and head.tied:
            weight = head.weight
            if packs_linear_weight(tuple(weight.shape), weight.dtype):
                total += weight.numel() * weight.element_size()
    return total


def build_rank(
    model_config: ModelConfig, tp: int, stage: int = 0, pp: int = 1, expert_parallel: bool = False
) -> nn.Module:
    """Tensor-parallel rank 0 of pipeline stage `stage`, on the meta device."""
    with (
        override_tensor_parallel(0, tp),
        override_pipeline_parallel(stage, pp),
        set_expert_parallel(expert_parallel),
    ):
        return build_model(model_config, "meta")


def inspect_model(
    model_config: ModelConfig,
    tp: int = 1,
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
    pp: int = 1,
    enable_expert_parallel: bool = False,
) -> dict:
    """Sizes in the model's dtype, or under `quantization` (one of FILE_TYPES): then also
    "bytes_per_rank_by_type", GGUF type name -> bytes (of the largest stage's rank). The KV
    cache holds `kv_cache_dtype` (one of KV_CACHE_DTYPES; "auto": the model's dtype), as
    the engine's would; per token, the most of any stage's rank (it sizes every cache). With
    `enable_expert_parallel` each rank holds whole experts (layers/fused_moe.py)."""
    kv_dtype = CacheConfig(cache_dtype=kv_cache_dtype).kv_dtype(model_config.dtype)
    if quantization is None and model_config.checkpoint_quant is not None:
        quantization = CHECKPOINT  # a quantized checkpoint: the layers as it runs them
    model_config = replace(model_config, quantization=None)  # float weights, even from a GGUF
    full = build_model(model_config, "meta")
    ep = enable_expert_parallel
    shard = build_rank(model_config, tp, expert_parallel=ep)
    stages = [build_rank(model_config, tp, s, pp, ep) for s in range(pp)] if pp > 1 else [shard]
    element = torch.empty((), dtype=model_config.dtype).element_size()
    total = count_params(full)
    copies = [tied_head_copy_bytes(stage) for stage in stages]
    by_stage = [count_params(stage) * element + copy for stage, copy in zip(stages, copies)]
    report = {
        "architecture": model_config.architecture,
        "dtype": str(model_config.dtype).removeprefix("torch."),
        "quantization": (
            model_config.checkpoint_quant.method if quantization == CHECKPOINT else quantization
        ),
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "enable_expert_parallel": enable_expert_parallel,
        "total_params": total,
        "active_params": total - inactive_expert_params(full),
        "bytes_per_rank": max(by_stage),
        "bytes_per_rank_by_stage": by_stage,
        "total_weight_bytes": total * element,
        "kv_cache_dtype": str(kv_dtype).removeprefix("torch."),
        "kv_cache_bytes_per_token": max(kv_cache_bytes_per_token(s, kv_dtype) for s in stages),
        "max_model_len": model_config.max_model_len,
    }
    if quantization is not None:
        head_copies = copies if quantization == CHECKPOINT else [0] * len(stages)
        report |= _quantized(model_config, full, shard, stages, quantization, tp, head_copies)
    return report


def _quantized(
    model_config: ModelConfig,
    full: nn.Module,
    shard: nn.Module,
    stages: list[nn.Module],
    quantization: str,
    tp: int,
    head_copies: list[int],
) -> dict:
    """The quantized figures: the total over the whole shard, the rest per stage, each
    stage's with its tied-head copy (a quantized checkpoint's embedding, and so a tied
    head, stays float; a GGUF plan quantizes it)."""
    total = quantized_weight_bytes(model_config, full, shard, quantization, tp)
    per_stage = [total]
    if len(stages) > 1:
        per_stage = [
            quantized_weight_bytes(model_config, full, stage, quantization, tp) for stage in stages
        ]
    per_stage = [_with_copy(f, copy, model_config.dtype) for f, copy in zip(per_stage, head_copies)]
    largest = max(per_stage, key=lambda figures: figures["bytes_per_rank"])
    return largest | {
        "total_weight_bytes": total["total_weight_bytes"],
        "bytes_per_rank_by_stage": [figures["bytes_per_rank"] for figures in per_stage],
    }


def _with_copy(figures: dict, copy: int, dtype: torch.dtype) -> dict:
    """A stage's figures with `copy` bytes of the model's dtype added."""
    if not copy:
        return figures
    by_type = dict(figures["bytes_per_rank_by_type"])
    name = FLOAT_TYPES[dtype].name
    by_type[name] = by_type.get(name, 0) + copy
    return figures | {
        "bytes_per_rank": figures["bytes_per_rank"] + copy,
        "bytes_per_rank_by_type": dict(sorted(by_type.items())),
    }


def format_report(report: dict) -> str:
    total, active = report["total_params"], report["active_params"]
    by_type = report.get("bytes_per_rank_by_type", {})
    rows = [
        ("architecture", report["architecture"]),
        ("dtype", report["dtype"]),
        ("quantization", report["quantization"] or "none"),
        ("tensor parallel size", report["tensor_parallel_size"]),
        ("pipeline parallel size", report["pipeline_parallel_size"]),
        ("expert parallel", "on" if report["enable_expert_parallel"] else "off"),
        ("total parameters", f"{total:,} ({total / 1e9:.2f} B)"),
        ("active params / token", f"{active:,} ({active / 1e9:.2f} B)"),
        ("weight bytes per rank", _size(report["bytes_per_rank"])),
        *((f"  {name}", _size(size)) for name, size in by_type.items()),
        *_stage_rows(report["bytes_per_rank_by_stage"]),
        ("total weight bytes", _size(report["total_weight_bytes"])),
        (
            "KV cache / token / rank",
            f"{report['kv_cache_bytes_per_token']:,} bytes ({report['kv_cache_dtype']})",
        ),
        ("max model len", f"{report['max_model_len']:,}"),
    ]
    return "\n".join(f"{name:<24}{value}" for name, value in rows)


def _stage_rows(by_stage: list[int]) -> list[tuple[str, str]]:
    """Each pipeline stage's rank, when there are several."""
    if len(by_stage) == 1:
        return []
    return [(f"  stage {i} rank", _size(size)) for i, size in enumerate(by_stage)]


def _size(nbytes: int) -> str:
    return f"{nbytes:,} ({nbytes / 1e9:.2f} GB, {nbytes / 1024**3:.2f} GiB)"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="parameter counts, weight bytes per rank (optionally quantized) and KV bytes per "
        "token, without loading",
        description="Build the model on the meta device (no memory) and report its sizes.",
    )
    parser.add_argument("model", help="config.json, a HF model folder or a .gguf file")
    parser.add_argument(
        "--tp",
        "--tensor-parallel-size",
        "-tp",
        dest="tp",
        type=int,
        default=1,
        help="tensor parallel size (default 1)",
    )
    parser.add_argument(
        "--pipeline-parallel-size",
        "-pp",
        dest="pp",
        type=int,
        default=1,
        help="pipeline parallel size (default 1): bytes per rank of each stage",
    )
    parser.add_argument(
        "--enable-expert-parallel",
        action="store_true",
        help="MoE layers place whole experts on the --tp ranks instead of splitting each",
    )
    parser.add_argument(
        "--dtype", default=None, help="weight dtype (default: the config's, else float32)"
    )
    parser.add_argument(
        "--quantization",
        choices=FILE_TYPES,
        default=None,
        help="weight bytes under a llama.cpp file type (q4_k_m, q8_0: its per-tensor types) "
        "or pagedllm's int8 (Q8_0 linears, embedding and LM head); default: the dtype",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        default="auto",
        help="KV cache element type (default auto: the weight dtype)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    if args.tp < 1:
        raise ValueError(f"--tp {args.tp} must be >= 1")
    if args.pp < 1:
        raise ValueError(f"--pipeline-parallel-size {args.pp} must be >= 1")
    model_config = ModelConfig.create(args.model, dtype=args.dtype or "float32")
    if args.dtype is None:
        model_config.dtype = checkpoint_dtype(model_config)
    report = inspect_model(
        model_config,
        args.tp,
        args.quantization,
        args.kv_cache_dtype,
        pp=args.pp,
        enable_expert_parallel=args.enable_expert_parallel,
    )
    print(json.dumps(report) if args.json else format_report(report))


def checkpoint_dtype(model_config: ModelConfig) -> torch.dtype:
    dtype = getattr(model_config.hf_config, "dtype", None) or getattr(
        model_config.hf_config, "torch_dtype", None
    )
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32
