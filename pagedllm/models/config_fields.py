"""Fields of a transformers config that versions and model families spell differently.

transformers 5.x keeps rope theta and scaling in `rope_parameters`, 4.x in `rope_theta` and
`rope_scaling`; some configs state `head_dim`, others leave it to hidden_size / heads; Qwen-MoE
says `num_experts`, Mixtral `num_local_experts`. Models read them here, one way.
"""

from transformers import PretrainedConfig


def rope_parameters(hf_config: PretrainedConfig) -> tuple[float, dict | None]:
    """(rope_theta, rope scaling dict or None) from 5.x `rope_parameters` or 4.x fields."""
    params = getattr(hf_config, "rope_parameters", None)
    if params:
        params = dict(params)
        theta = float(params.pop("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))
        rope_type = params.get("rope_type", params.get("type", "default"))
        return theta, (None if rope_type == "default" else params)
    theta = float(getattr(hf_config, "rope_theta", 10000.0))
    return theta, getattr(hf_config, "rope_scaling", None)


def head_dim(hf_config: PretrainedConfig) -> int:
    explicit = getattr(hf_config, "head_dim", None)
    return explicit or hf_config.hidden_size // hf_config.num_attention_heads


def num_experts(hf_config: PretrainedConfig) -> int:
    for name in ("num_experts", "num_local_experts"):
        value = getattr(hf_config, name, None)
        if value:
            return int(value)
    return 0
