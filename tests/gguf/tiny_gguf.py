"""Tiny random HF models written to GGUF with llama.cpp's conventions (gguf's tensor-name map,
convert_hf_to_gguf.py's q/k permutation of llama, granite and smollm3, its Gemma norms plus
one, Phi-3's LongRoPE factor tensors, Mixtral as llama with stacked experts, and the metadata
each of its model classes writes), and the HF checkpoint tensors they should read back as
(for Mixtral, the names pagedllm's model takes, as it renames its checkpoints':
models/mixtral.py).
"""

import math
from collections.abc import Callable

import gguf
import numpy as np
import torch
from gguf.quants import dequantize, quantize
from transformers import AutoConfig, AutoModelForCausalLM

TINY = {
    "llama": dict(model_type="llama", head_dim=8),
    "granite": dict(
        model_type="granite",
        head_dim=8,  # not a Granite field: hidden / heads, named as the other configs name it
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        attention_multiplier=0.0625,
        logits_scaling=8.0,
    ),
    "gemma": dict(model_type="gemma", head_dim=16, tie_word_embeddings=True),
    "gemma2": dict(
        model_type="gemma2",
        head_dim=16,
        query_pre_attn_scalar=16,  # head_dim: what llama.cpp takes for all but the 27B
        sliding_window=6,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=4.0,
        tie_word_embeddings=True,
    ),
    "gemma3": dict(
        model_type="gemma3_text",
        num_hidden_layers=7,  # llama.cpp's default pattern: layer 5 of each 6 is global
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=5,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 50000.0},
            # llama.cpp's for sliding layers: the converter writes none
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        tie_word_embeddings=True,
    ),
    "phi3": dict(
        model_type="phi3",
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,  # not a Phi3Config field: hidden / heads, named as the other configs name it
        original_max_position_embeddings=16,  # LongRoPE to 256: the long factors serve
        sliding_window=6,
        pad_token_id=None,  # Phi3Config's default, 32000, is past the tiny vocabulary
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.75,  # Phi-4-mini's: 12 of 16 channels
            # float32 values, which the file's F32 tensors hold exactly
            "short_factor": [1.0, 1.125, 1.25, 1.5, 1.75, 2.0],
            "long_factor": [1.0, 2.0, 3.0, 4.0, 6.0, 8.0],
        },
    ),
    "qwen2": dict(model_type="qwen2", head_dim=8),
    "qwen3": dict(model_type="qwen3", head_dim=16),  # not hidden/heads: read from key_length
    "qwen3moe": dict(
        model_type="qwen3_moe",
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        norm_topk_prob=True,
    ),
    "smollm3": dict(
        model_type="smollm3",
        num_hidden_layers=4,  # layer 3 without rope: llama.cpp's (and the config's) every 4th
        head_dim=8,  # not a SmolLM3Config field: hidden / heads, named as the others name it
        pad_token_id=None,  # SmolLM3Config's default, 128004, is past the tiny vocabulary
    ),
    "olmo2": dict(
        model_type="olmo2",
        head_dim=8,  # not an Olmo2Config field: hidden / heads, named as the others name it
    ),
    # llama.cpp's olmo2 with a window: three sliding layers of four, the global one scaled
    "olmo3": dict(
        model_type="olmo3",
        num_hidden_layers=4,
        head_dim=8,  # not an Olmo3Config field: hidden / heads, named as the others name it
        sliding_window=4,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    ),
    "glm4": dict(
        model_type="glm4",
        head_dim=16,  # not hidden / heads: read from key_length
        attention_bias=True,
        pad_token_id=None,  # Glm4Config's default, 151329, is past the tiny vocabulary
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
    ),
    "ernie4_5": dict(
        model_type="ernie4_5",
        head_dim=16,  # not hidden / heads, as ERNIE-4.5-0.3B's 128: read from key_length
        tie_word_embeddings=True,  # as ERNIE-4.5-0.3B
    ),
    "exaone4": dict(
        model_type="exaone4",
        head_dim=8,  # not an Exaone4Config field: hidden / heads, named as the others name it
        # the 1.2B's: no window, every layer rotated (a 64-layer hybrid: test_gguf_exaone4.py)
        sliding_window=None,
        layer_types=["full_attention"] * 2,
    ),
    "starcoder2": dict(
        model_type="starcoder2",
        head_dim=8,  # not a Starcoder2Config field: hidden / heads
        norm_epsilon=1e-5,
        sliding_window=None,  # llama.cpp applies none (see pagedllm/gguf/starcoder2.py)
    ),
    # convert_hf_to_gguf.py's LlamaModel writes Mixtral as llama (ARCH_ENUMS) with experts
    "mixtral": dict(
        model_type="mixtral",
        head_dim=8,
        num_local_experts=4,
        num_experts_per_tok=2,
        intermediate_size=16,
    ),
    # the MoE families of pagedllm/gguf/moe.py, routed as llama.cpp routes them
    "qwen2moe": dict(
        model_type="qwen2_moe",
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=24,
        norm_topk_prob=False,
    ),
    "olmoe": dict(
        model_type="olmoe",
        head_dim=8,  # not an OlmoeConfig field: hidden / heads, named as the others name it
        num_experts=4,
        num_experts_per_tok=2,
        rms_norm_eps=1e-5,  # OlmoeModel writes 1e-5 whatever the config says
        norm_topk_prob=False,
    ),
    "granitemoe": dict(
        model_type="granitemoe",
        head_dim=8,  # not a GraniteMoeConfig field: hidden / heads
        num_local_experts=4,
        num_experts_per_tok=2,
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        attention_multiplier=0.0625,
        logits_scaling=8.0,
    ),
}
MOE_FAMILIES = ("qwen2moe", "olmoe", "granitemoe")
ARCH_ENUMS = {
    "gemma": gguf.MODEL_ARCH.GEMMA,
    "gemma2": gguf.MODEL_ARCH.GEMMA2,
    "gemma3": gguf.MODEL_ARCH.GEMMA3,
    "llama": gguf.MODEL_ARCH.LLAMA,
    "phi3": gguf.MODEL_ARCH.PHI3,
    "granite": gguf.MODEL_ARCH.GRANITE,
    "qwen2": gguf.MODEL_ARCH.QWEN2,
    "qwen3": gguf.MODEL_ARCH.QWEN3,
    "qwen3moe": gguf.MODEL_ARCH.QWEN3MOE,
    "smollm3": gguf.MODEL_ARCH.SMOLLM3,
    "mixtral": gguf.MODEL_ARCH.LLAMA,
    "olmo2": gguf.MODEL_ARCH.OLMO2,
    "olmo3": gguf.MODEL_ARCH.OLMO2,
    "glm4": gguf.MODEL_ARCH.GLM4,
    "starcoder2": gguf.MODEL_ARCH.STARCODER2,
    "ernie4_5": gguf.MODEL_ARCH.ERNIE4_5,
    "exaone4": gguf.MODEL_ARCH.EXAONE4,
    "qwen2moe": gguf.MODEL_ARCH.QWEN2MOE,
    "olmoe": gguf.MODEL_ARCH.OLMOE,
    "granitemoe": gguf.MODEL_ARCH.GRANITE_MOE,
}


GEMMAS = ("gemma", "gemma2", "gemma3")
LLAMA_PERMUTED = ("llama", "granite", "smollm3", "granitemoe")
"""Architectures whose converter is LlamaModel's, which permutes the q/k rows."""


def gguf_arch(name: str) -> str:
    """The `general.architecture` the file of TINY entry `name` carries ("llama" for mixtral)."""
    return gguf.MODEL_ARCH_NAMES[ARCH_ENUMS[name]]


def tiny_model(arch: str, **overrides: object):
    """A random HF model of `arch`; overrides replace config fields (sizes, say). A Gemma's
    norm weights, offsets from 1 that start at 0, are random and bfloat16 values, as in the
    released checkpoints (so 1 + w is exact in float32); its attention is transformers'
    eager one, which applies Gemma 2's soft cap."""
    torch.manual_seed(0)
    fields = dict(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=48,
        vocab_size=64,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    config = AutoConfig.for_model(**(fields | TINY[arch] | overrides))
    if arch not in GEMMAS:
        return AutoModelForCausalLM.from_config(config)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(torch.randn(param.shape).mul(0.3).bfloat16())
    return model


def llama_cpp_permute(weights: torch.Tensor, n_head: int) -> torch.Tensor:
    """convert_hf_to_gguf.py LlamaModel.permute (n_head already the kv count for k)."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def checkpoint_tensors(model) -> dict[str, torch.Tensor]:
    """HF checkpoint names: transformers fuses experts in memory, checkpoints list them, and
    a tied lm_head is not saved."""
    out = {}
    for name, tensor in _saved(model.config, model.state_dict()).items():
        prefix, _, kind = name.rpartition(".")
        if kind == "gate_up_proj":
            gate, up = tensor.chunk(2, dim=1)
            for e in range(tensor.shape[0]):
                out[f"{prefix}.{e}.gate_proj.weight"] = gate[e]
                out[f"{prefix}.{e}.up_proj.weight"] = up[e]
        elif kind == "down_proj" and tensor.dim() == 3:
            for e in range(tensor.shape[0]):
                out[f"{prefix}.{e}.down_proj.weight"] = tensor[e]
        else:
            out[name] = tensor
    return out


def _saved(config, state_dict: dict) -> dict[str, torch.Tensor]:
    """The state dict without a tied lm_head (which neither checkpoints nor GGUFs hold); Granite
    MoE's block and router under the names pagedllm's model takes (models/granitemoe.py)."""
    tied = config.tie_word_embeddings
    saved = {name: t for name, t in state_dict.items() if not (tied and name == "lm_head.weight")}
    if config.model_type != "granitemoe":
        return saved
    renamed = {}
    for name, tensor in saved.items():
        name = name.replace(".block_sparse_moe.router.", ".mlp.gate.")
        renamed[name.replace(".block_sparse_moe.", ".mlp.")] = tensor
    return renamed


def gguf_tensors(arch: str, config, state_dict: dict) -> dict[str, np.ndarray]:
    """The model's tensors under GGUF names, as llama.cpp's converter writes them."""
    names = gguf.get_tensor_name_map(ARCH_ENUMS[arch], config.num_hidden_layers)
    out = {}
    for name, tensor in _saved(config, state_dict).items():
        base, suffix = name.rsplit(".", 1)
        if suffix == "gate_up_proj":
            gate, up = tensor.chunk(2, dim=1)
            out[names.get_name(f"{base}.gate_proj") + ".weight"] = gate
            out[names.get_name(f"{base}.up_proj") + ".weight"] = up
            continue
        if suffix == "down_proj":
            out[names.get_name(f"{base}.down_proj") + ".weight"] = tensor
            continue
        if gguf_arch(arch) in LLAMA_PERMUTED and base.endswith("q_proj"):
            tensor = llama_cpp_permute(tensor, config.num_attention_heads)
        if gguf_arch(arch) in LLAMA_PERMUTED and base.endswith("k_proj"):
            tensor = llama_cpp_permute(tensor, config.num_key_value_heads)
        if arch in GEMMAS and name.endswith("norm.weight"):  # GemmaModel.modify_tensors
            tensor = tensor + 1
        if name.endswith("shared_expert_gate.weight"):  # the converter squeezes it to [hidden]
            tensor = tensor.squeeze(0)
        out[f"{names.get_name(base)}.{suffix}"] = tensor
    if arch == "phi3":
        out |= _phi3_rope_factors(config)
    return {name: t.detach().contiguous().numpy() for name, t in out.items()}


def _phi3_rope_factors(config) -> dict[str, torch.Tensor]:
    """Phi3MiniModel.generate_extra_tensors: LongRoPE's factors as F32 tensors, if any."""
    rope = config.rope_parameters
    if not rope.get("long_factor"):
        return {}
    return {
        f"rope_factors_{kind}.weight": torch.tensor(rope[f"{kind}_factor"], dtype=torch.float32)
        for kind in ("long", "short")
    }


def write_gguf(
    path: str,
    arch: str,
    config,
    tensors: dict,
    rope: dict | None = None,
    edit: Callable[[gguf.GGUFWriter], None] | None = None,
) -> None:
    """tensors: GGUF name -> float array, or (uint8 blocks [..., bytes], GGUF type). `edit`
    gets the writer after the metadata is added (see set_metadata), before it writes."""
    writer = gguf.GGUFWriter(path, gguf_arch(arch))
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    if arch != "phi3":  # Phi3MiniModel writes the rotary width instead (see _add_phi3_metadata)
        writer.add_key_length(
            getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)
        )
    if arch == "starcoder2":  # TextModel writes norm_epsilon as layer_norm_eps
        writer.add_layer_norm_eps(config.norm_epsilon)
    else:
        writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    if arch in GEMMAS:
        _add_gemma_metadata(writer, arch, config)
    elif arch == "phi3":
        _add_phi3_metadata(writer, config)
    else:  # Olmo3's global layers' theta, which its converter writes
        params = config.rope_parameters
        writer.add_rope_freq_base(params.get("full_attention", params)["rope_theta"])
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    if arch == "granite":  # convert_hf_to_gguf.py's GraniteModel: _multiplier -> _scale
        writer.add_embedding_scale(config.embedding_multiplier)
        writer.add_residual_scale(config.residual_multiplier)
        writer.add_attention_scale(config.attention_multiplier)
        writer.add_logit_scale(config.logits_scaling)
    if arch in ("qwen3moe", "mixtral", *MOE_FAMILIES):
        writer.add_expert_count(getattr(config, "num_experts", None) or config.num_local_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
    if arch in MOE_FAMILIES:
        _add_moe_metadata(writer, arch, config)
    if arch == "qwen3moe":
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    if arch == "glm4":
        _add_glm4_metadata(writer, config)
    if arch == "olmo3":
        writer.add_sliding_window(config.sliding_window)
    if arch == "exaone4" and config.sliding_window is not None:
        # Exaone4Model: the window, and the layer types as one flag per layer
        writer.add_sliding_window(config.sliding_window)
        writer.add_sliding_window_pattern([t == "sliding_attention" for t in config.layer_types])
    if rope:
        writer.add_rope_scaling_type(rope["type"])
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original"])
    if edit is not None:
        edit(writer)
    for name, array in tensors.items():
        if isinstance(array, tuple):
            array, qtype = array
            float32 = qtype == gguf.GGMLQuantizationType.F32
            writer.add_tensor(name, array, raw_dtype=None if float32 else qtype)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _add_moe_metadata(writer: gguf.GGUFWriter, arch: str, config) -> None:
    """What convert_hf_to_gguf.py's Qwen2MoeModel and GraniteMoeModel write beyond the sizes
    and expert counts (OlmoeModel writes nothing more)."""
    if arch == "qwen2moe":
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
        writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
    if arch == "granitemoe":
        writer.add_embedding_scale(config.embedding_multiplier)
        writer.add_residual_scale(config.residual_multiplier)
        writer.add_attention_scale(config.attention_multiplier)
        writer.add_logit_scale(config.logits_scaling)


def _add_gemma_metadata(writer: gguf.GGUFWriter, arch: str, config) -> None:
    """What convert_hf_to_gguf.py's GemmaModel, Gemma2Model and Gemma3Model write beyond the
    sizes: no rope theta for Gemma and Gemma 2 (llama.cpp's default, 10000, is theirs)."""
    writer.add_value_length(config.head_dim)
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
        writer.add_final_logit_softcapping(config.final_logit_softcapping)
        writer.add_sliding_window(config.sliding_window)
    if arch == "gemma3":  # TextModel's rope scaling and Gemma3Model's keys, of global layers
        rope = config.rope_parameters["full_attention"]
        writer.add_rope_freq_base(rope["rope_theta"])
        if rope["rope_type"] == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(rope["factor"])
        if config.final_logit_softcapping:
            writer.add_final_logit_softcapping(config.final_logit_softcapping)
        writer.add_sliding_window(config.sliding_window)


def _add_phi3_metadata(writer: gguf.GGUFWriter, config) -> None:
    """What convert_hf_to_gguf.py's Phi3MiniModel writes beyond the sizes: the rotary width as
    rope.dimension_count, the original length, a sliding window of 0 where there is none
    (Phi-4), and with LongRoPE factors their cos/sin scale, computed as it computes it."""
    rope = config.rope_parameters
    rotary = int(rope["partial_rotary_factor"] * config.hidden_size) // config.num_attention_heads
    original = config.original_max_position_embeddings
    writer.add_rope_scaling_orig_ctx_len(original)
    writer.add_rope_dimension_count(rotary)
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_sliding_window(config.sliding_window or 0)
    if rope.get("long_factor"):
        scale = config.max_position_embeddings / original
        attn_factor = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
        writer.add_rope_scaling_attn_factors(attn_factor)


def _add_glm4_metadata(writer: gguf.GGUFWriter, config) -> None:
    """What convert_hf_to_gguf.py's Glm4Model writes beyond the sizes: the rotary width."""
    partial = config.rope_parameters["partial_rotary_factor"]
    writer.add_rope_dimension_count(int(config.head_dim * partial))


def set_metadata(values: dict[str, tuple]) -> Callable[[gguf.GGUFWriter], None]:
    """A write_gguf `edit` that sets metadata keys whatever their type: key -> (value, GGUF
    value type[, array element type]), or () to drop the key."""

    def edit(writer: gguf.GGUFWriter) -> None:
        for key, value in values.items():
            writer.kv_data[0].pop(key, None)
            if value:
                writer.kv_data[0][key] = gguf.GGUFValue(*value)

    return edit


def write_tiny(path: str, arch: str = "llama", **metadata: tuple) -> str:
    """tiny_model(arch) written to `path`, with metadata keys set as set_metadata sets them."""
    model = tiny_model(arch)
    tensors = gguf_tensors(arch, model.config, model.state_dict())
    write_gguf(path, arch, model.config, tensors, edit=set_metadata(metadata))
    return path


def write_tiny_q8_0(path: str, arch: str):
    """tiny_model(arch) with each 2-D weight whose rows are whole Q8_0 blocks (32 values)
    rounded to Q8_0, written to `path` with those weights as Q8_0 blocks, as llama.cpp's
    Q8_0 files store them (norms and biases F32); returns the rounded model, the file's float
    reference (re-quantizing Q8_0 values gives the same blocks)."""
    model = tiny_model(arch)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2 and param.shape[-1] % 32 == 0:
                rows = param.detach().numpy()
                blocks = quantize(rows, gguf.GGMLQuantizationType.Q8_0)
                param.copy_(torch.from_numpy(dequantize(blocks, gguf.GGMLQuantizationType.Q8_0)))
    stored = {}
    for name, array in gguf_tensors(arch, model.config, model.state_dict()).items():
        if array.ndim == 2 and array.shape[-1] % 32 == 0:
            q8 = gguf.GGMLQuantizationType.Q8_0
            stored[name] = (quantize(array, q8), q8)
        else:
            stored[name] = array
    write_gguf(path, arch, model.config, stored)
    return model
