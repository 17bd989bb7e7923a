"""pagedllm/models/ministral.py: Ministral 3's query scale from its rope_parameters, as
transformers' Ministral3Attention reads it; a beta without the length it needs is refused."""

import copy

import pytest

from pagedllm.models.llama import AttentionOptions
from pagedllm.models.ministral import Ministral3ForCausalLM
from tests.models.tiny_models import tiny_configs


def test_llama_4_scaling_is_read_from_rope_parameters() -> None:
    config = copy.deepcopy(tiny_configs()["ministral3"])
    assert Ministral3ForCausalLM.attention_options(config).llama_4_scaling == (0.1, 8)
    config.rope_parameters["llama_4_scaling_beta"] = 0.0  # no scaling
    assert Ministral3ForCausalLM.attention_options(config) == AttentionOptions()


def test_a_beta_without_original_length_is_refused() -> None:
    config = copy.deepcopy(tiny_configs()["ministral3"])
    del config.rope_parameters["original_max_position_embeddings"]
    with pytest.raises(ValueError, match="llama_4_scaling_beta 0.1 .* original_max_position"):
        Ministral3ForCausalLM.attention_options(config)
