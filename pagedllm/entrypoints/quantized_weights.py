"""Weight bytes of a model under a GGUF quantization plan (pagedllm.gguf.quant_plan), whole and
per tensor-parallel rank, from the model built on the meta device.

The plan types checkpoint tensors, so pagedllm's fused parameters are split back into them:
qkv_proj into q/k/v_proj and gate_up_proj into gate/up_proj (by the model's
stacked_params_mapping), FusedMoE's stacks into each expert's gate/up/down_proj (by its
expert_params_mapping). A quantized row (the input dimension) is whole blocks, so a rank's
shard along it must be too. Under expert parallelism a rank holds its experts whole and
none of the others (rows 0).
"""

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from torch import nn

from pagedllm.checkpoint_quant import CheckpointQuant
from pagedllm.config import ModelConfig
from pagedllm.gguf.quant_plan import Category, PlanModel, category, tensor_bytes, tensor_type
from pagedllm.layers.fused_moe import FusedMoE
from pagedllm.layers.linear import MergedColumnParallelLinear, QKVParallelLinear
from pagedllm.layers.quantization.gguf import GGUFConfig
from pagedllm.layers.vocab_embedding import VocabParallelEmbedding
from pagedllm.model_loader.group_blocks import native_block_type
from pagedllm.model_loader.quantized_weights import checkpoint_tensor_types, type_name
from pagedllm.models.config_fields import num_experts
from pagedllm.models.weight_loading import WeightsMapper

FLOAT_TYPES = {
    torch.float32: GGMLQuantizationType.F32,
    torch.float16: GGMLQuantizationType.F16,
    torch.bfloat16: GGMLQuantizationType.BF16,
}


@dataclass(frozen=True)
class RankTensor:
    name: str  # the checkpoint's (Hugging Face) name
    shape: tuple[int, ...]  # the whole checkpoint tensor, [out, in] for a linear weight
    rank_shape: tuple[int, ...]  # what each rank holds (vocab rows padded as pagedllm pads)


def quantized_weight_bytes(
    model_config: ModelConfig, full: nn.Module, shard: nn.Module, file_type: str, tp: int
) -> dict:
    """{"bytes_per_rank", "total_weight_bytes", "bytes_per_rank_by_type"} under `file_type`
    (or, for the checkpoint's own quantization, CHECKPOINT); `full` is the model built for
    one rank, `shard` for one rank of `tp`."""
    plan = plan_model(model_config)
    if file_type == CHECKPOINT:
        types = checkpoint_types(model_config, full)

        def type_of(name: str, shape: tuple[int, ...]) -> GGMLQuantizationType:
            return types(name, shape) or plan.float_type
    else:

        def type_of(name: str, shape: tuple[int, ...]) -> GGMLQuantizationType:
            return tensor_type(file_type, name, shape, plan)

    by_type: dict[str, int] = {}
    total = 0
    for tensor in rank_tensors(full, shard):
        qtype = type_of(tensor.name, tensor.shape)
        check_whole_blocks(tensor, qtype, tp)
        total += tensor_bytes(qtype, tensor.shape)
        by_type[qtype.name] = by_type.get(qtype.name, 0) + tensor_bytes(qtype, tensor.rank_shape)
    return {
        "bytes_per_rank": sum(by_type.values()),
        "total_weight_bytes": total,
        "bytes_per_rank_by_type": dict(sorted(by_type.items())),
    }


CHECKPOINT = "checkpoint"
"""The file type of a quantized checkpoint's own layers (its quantization_config)."""


def checkpoint_types(
    model_config: ModelConfig, full: nn.Module
) -> Callable[[str, tuple[int, ...]], GGMLQuantizationType | None]:
    """(name, shape) -> the GGUF type a quantized checkpoint's tensor runs in, None for one
    in the dtype: the loader's plan when the weight files are there, else (a config alone)
    the tools' default, every linear layer but the LM head and the MoE router quantized. A
    fused layer runs in blocks only when all its parts do, as the loader decides (GGUFConfig)."""
    quant = model_config.checkpoint_quant
    folder = model_config.model
    mapper = full.hf_to_pagedllm_mapper
    if os.path.isdir(folder) and any(name.endswith(".safetensors") for name in os.listdir(folder)):
        types = checkpoint_tensor_types(folder, quant, mapper)
    else:
        types = {}
        for tensor in rank_tensors(full, full):
            qtype = _scheme_type(quant, tensor.name, tensor.shape, mapper)
            if qtype is not None:
                types[type_name(tensor.name)] = int(qtype)
    config = GGUFConfig(types)
    config.packed_modules_mapping = full.packed_modules_mapping()

    def planned(name: str, shape: tuple[int, ...]) -> GGMLQuantizationType | None:
        name = _stored_name(name, config.packed_modules_mapping, types)
        return GGMLQuantizationType(types[type_name(name)]) if config.is_raw(name) else None

    return planned


def _stored_name(name: str, packed: dict[str, list[str]], types: dict[str, int]) -> str:
    """The checkpoint weight that holds weight `name` (q_proj's, gate_proj's, ...): the
    fused layer's whole weight where the checkpoint stores that (Phi-3's qkv_proj and
    gate_up_proj, quantized whole by the tools), else `name` itself."""
    parent, _, leaf = name.removesuffix(".weight").rpartition(".")
    for fused, members in packed.items():
        whole = f"{parent}.{fused}.weight"
        if leaf in members and whole in types:
            return whole
    return name


def _scheme_type(
    quant: CheckpointQuant, name: str, shape: tuple[int, ...], mapper: WeightsMapper
) -> GGMLQuantizationType | None:
    """The type of the model's tensor `name` by the quantization_config's targets, which
    match the checkpoint's names of it (those `mapper` renames to it)."""
    kind = category(name, shape)
    if kind in (Category.FLOAT, Category.ROUTER, Category.OUTPUT, Category.TOKEN_EMBD):
        return None
    scheme = quant.find_scheme(*(n.removesuffix(".weight") for n in mapper.checkpoint_names(name)))
    if scheme is None or scheme.kind != "int":  # no target: a float layer
        return None
    columns = shape[-1]
    return native_block_type(scheme.bits, scheme.symmetric, scheme.group_size or columns, columns)


def plan_model(model_config: ModelConfig) -> PlanModel:
    hf_config = model_config.hf_config
    heads = hf_config.num_attention_heads
    return PlanModel(
        model_type=hf_config.model_type,
        num_layers=hf_config.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
        num_experts=num_experts(hf_config),
        tied_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        float_type=FLOAT_TYPES[model_config.dtype],
    )


def check_whole_blocks(tensor: RankTensor, qtype: GGMLQuantizationType, tp: int) -> None:
    block_size = GGML_QUANT_SIZES[qtype][0]
    if tensor.rank_shape[-1] % block_size:
        raise ValueError(
            f"tensor parallel size {tp} cuts {qtype.name} blocks of {block_size} in "
            f"{tensor.name}: its rows of {tensor.shape[-1]} split into {tensor.rank_shape[-1]} "
            f"values per rank; use a tensor parallel size that leaves whole blocks"
            + (", or --enable-expert-parallel" if ".experts." in tensor.name else "")
        )


def rank_tensors(full: nn.Module, shard: nn.Module) -> Iterator[RankTensor]:
    """Every checkpoint tensor of the model (a tied LM head once, as the embedding)."""
    for name, param in shard.named_parameters():
        module_name = name.rpartition(".")[0]
        module, full_module = shard.get_submodule(module_name), full.get_submodule(module_name)
        full_param = full.get_parameter(name)
        if isinstance(module, FusedMoE):
            mapping = shard.expert_params_mapping()
            yield from _experts(name, full_param, param, mapping, module.local_experts)
        elif isinstance(module, (QKVParallelLinear, MergedColumnParallelLinear)):
            yield from _stacked(name, param, module, full_module, shard.stacked_params_mapping)
        elif isinstance(module, VocabParallelEmbedding):
            rows = (module.num_embeddings, *param.shape[1:])
            yield RankTensor(name, rows, tuple(param.shape))
        else:
            yield RankTensor(name, tuple(full_param.shape), tuple(param.shape))


def _stacked(
    name: str,
    param: nn.Parameter,
    module: nn.Module,
    full_module: nn.Module,
    mapping: list[tuple[str, str, object]],
) -> Iterator[RankTensor]:
    rows, full_rows = _fused_rows(module), _fused_rows(full_module)
    rest = tuple(param.shape[1:])
    for param_part, weight_part, shard_id in mapping:
        if param_part in name:
            checkpoint_name = name.replace(param_part, weight_part)
            yield RankTensor(checkpoint_name, (full_rows[shard_id], *rest), (rows[shard_id], *rest))


def _fused_rows(linear: nn.Module) -> dict[object, int]:
    """Output rows of each fused matrix on one rank, by the shard id its loader takes."""
    if isinstance(linear, QKVParallelLinear):
        kv_rows = linear.num_kv_heads * linear.head_size
        return {"q": linear.num_heads * linear.head_size, "k": kv_rows, "v": kv_rows}
    return dict(enumerate(linear.shard_sizes))


def _experts(
    name: str,
    full_param: nn.Parameter,
    param: nn.Parameter,
    mapping: list[tuple[str, str, int, str]],
    local_experts: range,
) -> Iterator[RankTensor]:
    for param_part, weight_part, expert_id, shard_id in mapping:
        if param_part in name:
            checkpoint_name = name.replace(param_part, weight_part)
            full_shape = _expert_shape(full_param, shard_id)
            rows, cols = _expert_shape(param, shard_id)
            rank_shape = (rows if expert_id in local_experts else 0, cols)
            yield RankTensor(checkpoint_name, full_shape, rank_shape)


def _expert_shape(stacked: nn.Parameter, shard_id: str) -> tuple[int, int]:
    """One expert's matrix in FusedMoE's stacks: w13 [E, 2I, H] holds gate ("w1") and up
    ("w3") as halves [I, H]; w2 [E, H, I] holds down."""
    _, rows, cols = stacked.shape
    return (rows, cols) if shard_id == "w2" else (rows // 2, cols)
