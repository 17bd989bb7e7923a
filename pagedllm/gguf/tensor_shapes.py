"""The shape each GGUF tensor must have under the config its metadata describes.

llama.cpp checks every tensor against the hyperparameters before it allocates anything. A file
whose metadata disagrees with its tensors (an embedding_length of 262144 over a [64, 64]
token_embd, a block_count of 10^7 over one layer) would otherwise have the metadata's model
allocated, hundreds of GB or millions of layers, before any weight is compared with it.
"""

from transformers import PretrainedConfig

from pagedllm.gguf.glm4 import GLM4
from pagedllm.gguf.moe import OLMOE, SHARED_EXPERT_GATE
from pagedllm.gguf.olmo2 import OLMO2
from pagedllm.gguf.phi3 import PHI3
from pagedllm.gguf.reader import GGUFFile, TensorInfo

# GGUF tensor name (without "blk.N." and ".weight") -> its dimensions, in torch order
_SHAPES = {
    "token_embd": ("vocab", "hidden"),
    "output": ("vocab", "hidden"),
    "output_norm": ("hidden",),
    "attn_norm": ("hidden",),
    "attn_q": ("q", "hidden"),
    "attn_k": ("kv", "hidden"),
    "attn_v": ("kv", "hidden"),
    "attn_qkv": ("qkv", "hidden"),
    "attn_output": ("hidden", "q"),
    "attn_q_norm": ("head_dim",),
    "attn_k_norm": ("head_dim",),
    "ffn_norm": ("hidden",),
    "post_attention_norm": ("hidden",),
    "post_ffw_norm": ("hidden",),
    "ffn_gate": ("ffn", "hidden"),
    "ffn_up": ("ffn", "hidden"),
    "ffn_down": ("hidden", "ffn"),
    "ffn_gate_inp": ("experts", "hidden"),
    "ffn_gate_exps": ("experts", "expert_ffn", "hidden"),
    "ffn_up_exps": ("experts", "expert_ffn", "hidden"),
    "ffn_down_exps": ("experts", "hidden", "expert_ffn"),
    # one expert's, `blk.N.ffn_gate.E` (older llama files)
    "ffn_gate_exp": ("expert_ffn", "hidden"),
    "ffn_up_exp": ("expert_ffn", "hidden"),
    "ffn_down_exp": ("hidden", "expert_ffn"),
    # Qwen2-MoE's shared expert, and its gate (written [hidden] or [1, hidden])
    "ffn_gate_shexp": ("shared_ffn", "hidden"),
    "ffn_up_shexp": ("shared_ffn", "hidden"),
    "ffn_down_shexp": ("hidden", "shared_ffn"),
    SHARED_EXPERT_GATE: ("hidden",),
}
# Phi-3's and GLM-4's ffn_up holds gate and up
_GATE_UP_SHAPES = _SHAPES | {"ffn_up": ("gate_up", "hidden")}
# OLMo 2 and OLMoE norm q and k over their whole projections
_WHOLE_QK_NORM_SHAPES = _SHAPES | {"attn_q_norm": ("q",), "attn_k_norm": ("kv",)}
_ARCH_SHAPES = {
    PHI3: _GATE_UP_SHAPES,
    GLM4: _GATE_UP_SHAPES,
    OLMO2: _WHOLE_QK_NORM_SHAPES,
    OLMOE: _WHOLE_QK_NORM_SHAPES,
}
# each dimension as the metadata states it
_DIMENSION_SOURCES = {
    "vocab": "token_embd's rows",
    "hidden": "embedding_length",
    "q": "head_count * head_dim",
    "kv": "head_count_kv * head_dim",
    "qkv": "(head_count + 2 * head_count_kv) * head_dim",
    "head_dim": "head_dim",
    "ffn": "feed_forward_length",
    "gate_up": "2 * feed_forward_length",
    "experts": "expert_count",
    "expert_ffn": "expert_feed_forward_length (llama: feed_forward_length)",
    "shared_ffn": "expert_shared_feed_forward_length",
}


def check_tensor_shapes(gguf: GGUFFile, arch: str, config: PretrainedConfig) -> None:
    """ValueError naming the first tensor whose shape is not the config's, or a layer count
    that is not block_count. Tensors of other names are left to the weight loader."""
    _check_layer_count(gguf, arch, config.num_hidden_layers)
    sizes = _dimensions(config)
    shapes = _ARCH_SHAPES.get(arch, _SHAPES)
    for info in gguf.tensors.values():
        base = _base_name(info.name)
        dims = shapes.get(base)
        if dims is None or any(sizes[d] is None for d in dims):
            continue
        if info.name.endswith(".bias") and len(dims) > 1:  # a linear layer's: its outputs
            dims = dims[:-1]
        expected = tuple(sizes[d] for d in dims)
        shape = (
            info.shape[1:] if base == SHARED_EXPERT_GATE and info.shape[:1] == (1,) else info.shape
        )
        if shape != expected:
            raise ValueError(_mismatch(gguf, arch, info, dims, expected))


def _dimensions(config: PretrainedConfig) -> dict[str, int | None]:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    ffn = getattr(config, "intermediate_size", None)
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    return {
        "vocab": config.vocab_size,
        "hidden": config.hidden_size,
        "q": heads * head_dim,
        "kv": config.num_key_value_heads * head_dim,
        "qkv": (heads + 2 * config.num_key_value_heads) * head_dim,
        "head_dim": head_dim,
        "ffn": ffn,
        "gate_up": None if ffn is None else 2 * ffn,
        "experts": experts,
        # Mixtral's experts are of intermediate_size, the Qwen-MoEs' of moe_intermediate_size
        "expert_ffn": getattr(config, "moe_intermediate_size", None) or (ffn if experts else None),
        "shared_ffn": getattr(config, "shared_expert_intermediate_size", None),
    }


def _base_name(name: str) -> str:
    """`blk.3.attn_q.weight` -> `attn_q`; `token_embd.weight` -> `token_embd`; one expert's
    `blk.3.ffn_gate.5.weight` -> `ffn_gate_exp`."""
    parts = name.rpartition(".")[0].split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3].isdigit():
        return f"{parts[2]}_exp"
    return parts[2] if len(parts) == 3 and parts[0] == "blk" else ".".join(parts)


def _check_layer_count(gguf: GGUFFile, arch: str, block_count: int) -> None:
    layers = {
        int(parts[1])
        for parts in (name.split(".") for name in gguf.tensors)
        if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit()
    }
    if layers != set(range(len(layers))) or len(layers) != block_count:
        held = f"blk.{min(layers)} to blk.{max(layers)}" if layers else "none"
        raise ValueError(
            f"{gguf.path}: metadata {arch}.block_count is {block_count}, but the file holds "
            f"tensors of {len(layers)} layers ({held})"
        )


def _mismatch(
    gguf: GGUFFile, arch: str, info: TensorInfo, dims: tuple[str, ...], expected: tuple
) -> str:
    sources = " x ".join(_DIMENSION_SOURCES[d] for d in dims)
    return (
        f"{gguf.path}: tensor {info.name} has shape {list(info.shape)}, but the metadata "
        f"({arch}.*) gives {list(expected)} ({sources})"
    )
