"""pagedllm/models/config_fields.py: a transformers 4.x config reads like a 5.x one."""

from pathlib import Path

from pagedllm.config import ModelConfig
from pagedllm.models.config_fields import rope_parameters


def test_transformers_4x_config_fields_are_read() -> None:
    """A 4.x config.json (rope_theta, rope_scaling, num_experts) reads like a 5.x one."""
    path = Path(__file__).parents[1] / "fixtures" / "configs" / "DeepSeek-R1-Distill-Llama-70B.json"
    theta, scaling = rope_parameters(ModelConfig.create(str(path)).hf_config)
    assert theta == 500000.0
    assert scaling["rope_type"] == "llama3" and scaling["factor"] == 8.0
