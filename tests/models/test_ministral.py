"""pagedllm/models/ministral.py: Ministral 3's query scale from its rope_parameters, as
transformers' Ministral3Attention reads it, left out where no position passes the original
context; a beta without the length it needs is refused."""

import copy
import logging

import pytest
import torch
import transformers

from pagedllm import LLM, SamplingParams
from pagedllm.layers.rotary_embedding import use_max_model_len
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


@pytest.mark.parametrize("max_model_len, scaled", [(8, False), (9, True), (None, True)])
def test_the_scale_is_left_out_when_every_position_is_within_the_original_context(
    max_model_len: int | None, scaled: bool
) -> None:
    """Positions 0 .. max_model_len - 1 below the original 8 all scale by exactly 1."""
    config = copy.deepcopy(tiny_configs()["ministral3"])
    with use_max_model_len(max_model_len):
        options = Ministral3ForCausalLM.attention_options(config)
    assert (options.llama_4_scaling is not None) == scaled


def test_an_engine_within_the_original_context_replays_its_decode_steps(
    tiny_model_path, caplog: pytest.LogCaptureFixture
) -> None:
    """Reference: transformers' greedy tokens; the decode steps replay (no torch op left in
    the forward), where a longer max_model_len runs them eagerly."""
    path = tiny_model_path("ministral3")
    prompt = [5, 17, 60]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    want = hf.generate(torch.tensor([prompt]), max_new_tokens=5, do_sample=False)[0, 3:]
    for max_model_len, eager in ((8, False), (16, True)):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pagedllm.executor.cpu_graph"):
            llm = LLM(path, dtype="float32", max_model_len=max_model_len, skip_tokenizer_init=True)
            out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=5))
        assert out[0].outputs[0].token_ids == want.tolist()
        assert ("run eagerly" in caplog.text) == eager, caplog.text
        del llm
