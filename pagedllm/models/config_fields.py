"""Fields of a transformers config that versions and model families spell differently.

transformers 5.x keeps rope theta and scaling in `rope_parameters`, 4.x in `rope_theta` and
`rope_scaling`; some configs state `head_dim`, others leave it to hidden_size / heads; Qwen-MoE
says `num_experts`, Mixtral `num_local_experts`. Models read them here, one way.
"""

from transformers import PretrainedConfig


def rope_parameters(
    hf_config: PretrainedConfig, layer_type: str = "full_attention"
) -> tuple[float, dict | None]:
    """(rope_theta, rope scaling dict or None) from 5.x `rope_parameters` or 4.x fields.
    Configs whose layer types rotate differently (Gemma 3: local layers at their own theta,
    unscaled) key `rope_parameters` by layer type; `layer_type` picks one."""
    params = getattr(hf_config, "rope_parameters", None)
    if params and isinstance(params.get(layer_type), dict):
        params = params[layer_type]
    if params:
        params = dict(params)
        theta = float(params.pop("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))
    else:
        theta = float(getattr(hf_config, "rope_theta", 10000.0))
        params = dict(getattr(hf_config, "rope_scaling", None) or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type in ("longrope", "su"):  # Phi-3 states its original length on the config
        original = getattr(hf_config, "original_max_position_embeddings", None)
        params.setdefault("original_max_position_embeddings", original)
    return theta, (None if rope_type == "default" or not params else params)


def rotary_dim(hf_config: PretrainedConfig, head_size: int) -> int:
    """The channels of a head the rotary embedding turns: head_size times
    `partial_rotary_factor` (5.x keeps it in `rope_parameters`, 4.x on the config; Phi-4-mini
    turns 3/4 of each head)."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    factor = params.get("partial_rotary_factor")
    if factor is None:
        factor = getattr(hf_config, "partial_rotary_factor", None) or 1.0
    return int(head_size * float(factor))


def head_dim(hf_config: PretrainedConfig) -> int:
    explicit = getattr(hf_config, "head_dim", None)
    return explicit or hf_config.hidden_size // hf_config.num_attention_heads


def norm_eps(hf_config: PretrainedConfig) -> float:
    """The epsilon of the model's norms: `rms_norm_eps` (RMSNorm families), `norm_epsilon`
    (StarCoder 2's LayerNorms)."""
    eps = getattr(hf_config, "rms_norm_eps", None)
    return float(hf_config.norm_epsilon if eps is None else eps)


def num_experts(hf_config: PretrainedConfig) -> int:
    for name in ("num_experts", "num_local_experts"):
        value = getattr(hf_config, name, None)
        if value:
            return int(value)
    return 0


LAYER_TYPES = ("full_attention", "sliding_attention")


def layer_type(hf_config: PretrainedConfig, layer_idx: int) -> str:
    """transformers' `layer_types[layer_idx]` ("full_attention", "sliding_attention"), or
    "full_attention" where the config lists none; another type is a ValueError."""
    types = getattr(hf_config, "layer_types", None)
    if not types:
        return "full_attention"
    if types[layer_idx] not in LAYER_TYPES:
        raise ValueError(
            f"layer_types[{layer_idx}] is {types[layer_idx]!r}; pagedllm runs "
            f"{' and '.join(LAYER_TYPES)} layers"
        )
    return types[layer_idx]


def sliding_window(hf_config: PretrainedConfig, layer_idx: int) -> int | None:
    """How many positions a query of layer `layer_idx` attends, itself included (None: all),
    as transformers decides: the config's `sliding_window` on its "sliding_attention" layers
    where it lists `layer_types` (Gemma 2/3, Qwen2/3 past `max_window_layers`), on every layer
    where it lists none (Mistral), on none where `use_sliding_window` is false."""
    window = getattr(hf_config, "sliding_window", None)
    if not window or getattr(hf_config, "use_sliding_window", True) is False:
        return None
    if getattr(hf_config, "layer_types", None):
        return window if layer_type(hf_config, layer_idx) == "sliding_attention" else None
    return int(window)


def uses_rope(hf_config: PretrainedConfig, layer_idx: int) -> bool:
    """Whether layer `layer_idx` rotates q and k: transformers' `no_rope_layers[layer_idx]`
    (1: rope, 0: none, a NoPE layer; SmolLM3's config fills it as every
    `no_rope_layer_interval`-th layer without), every layer where the config lists none."""
    flags = getattr(hf_config, "no_rope_layers", None)
    if flags is None:
        return True
    layers = hf_config.num_hidden_layers
    if len(flags) < layers or any(flag not in (0, 1) for flag in flags):
        raise ValueError(
            f"no_rope_layers must give 1 (rope) or 0 (none) for each of the "
            f"{layers} layers, got {list(flags)}"
        )
    return bool(flags[layer_idx])
