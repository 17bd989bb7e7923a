"""pagedllm/models/config_fields.py: a transformers 4.x config reads like a 5.x one; a
layer type pagedllm cannot run is refused; the norms' epsilon under either family's name."""

from pathlib import Path

import pytest
import transformers

from pagedllm.config import ModelConfig
from pagedllm.models import config_fields
from pagedllm.models.config_fields import rope_parameters


def test_transformers_4x_config_fields_are_read() -> None:
    """A 4.x config.json (rope_theta, rope_scaling, num_experts) reads like a 5.x one."""
    path = Path(__file__).parents[1] / "fixtures" / "configs" / "DeepSeek-R1-Distill-Llama-70B.json"
    theta, scaling = rope_parameters(ModelConfig.create(str(path)).hf_config)
    assert theta == 500000.0
    assert scaling["rope_type"] == "llama3" and scaling["factor"] == 8.0


def test_an_unknown_layer_type_is_refused() -> None:
    config = transformers.Gemma3TextConfig(
        num_hidden_layers=2, layer_types=["sliding_attention", "chunked_attention"]
    )
    assert config_fields.layer_type(config, 0) == "sliding_attention"
    with pytest.raises(ValueError, match="layer_types\\[1\\] is 'chunked_attention'"):
        config_fields.layer_type(config, 1)


def test_no_rope_layers_are_the_layers_without_rope() -> None:
    """Reference: transformers' SmolLM3Config, whose default leaves every
    no_rope_layer_interval-th layer without rope; a config listing none ropes every layer."""
    config = transformers.SmolLM3Config(num_hidden_layers=8)
    assert [config_fields.uses_rope(config, i) for i in range(8)] == [1, 1, 1, 0, 1, 1, 1, 0]
    llama = transformers.LlamaConfig(num_hidden_layers=2)
    assert config_fields.uses_rope(llama, 0) and config_fields.uses_rope(llama, 1)


@pytest.mark.parametrize("flags", [[1, 0], [1, 0, 2, 1]])
def test_a_bad_no_rope_layers_is_refused(flags: list[int]) -> None:
    """(transformers reads the flags only where the config lists no layer_types.)"""
    types = ["full_attention"] * 4
    config = transformers.SmolLM3Config(
        num_hidden_layers=4, no_rope_layers=flags, layer_types=types
    )
    with pytest.raises(ValueError, match=r"no_rope_layers must give 1 \(rope\) or 0 .* 4 layers"):
        config_fields.uses_rope(config, 0)


def test_the_norm_epsilon_is_read_under_either_name() -> None:
    """Reference: the field transformers' model reads: LlamaRMSNorm's rms_norm_eps,
    Starcoder2's nn.LayerNorm's norm_epsilon."""
    assert config_fields.norm_eps(transformers.LlamaConfig(rms_norm_eps=1e-6)) == 1e-6
    assert config_fields.norm_eps(transformers.Starcoder2Config(norm_epsilon=3e-5)) == 3e-5
