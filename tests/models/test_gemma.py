"""pagedllm/models/gemma.py and gemma2.py beyond the shared comparison with transformers
(test_models_vs_transformers.py): Gemma 3's image-and-text checkpoints run as their language
model (reference: transformers' Gemma3ForConditionalGeneration on text alone), norms kept
as 1 + the checkpoint's weight, and what is refused."""

import pytest
import torch
import transformers

from pagedllm import LLM
from pagedllm.config import ModelConfig
from pagedllm.layers.layernorm import GemmaRMSNorm
from pagedllm.model_loader.loader import build_model, get_model
from tests.models.test_models_vs_transformers import assert_language_model_matches
from tests.models.tiny_models import save_tiny_gemma3_multimodal, tiny_configs


@pytest.fixture(scope="module")
def multimodal_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = str(tmp_path_factory.mktemp("gemma3-mm"))
    save_tiny_gemma3_multimodal(folder)
    return folder


def test_a_multimodal_gemma3_runs_its_language_model(multimodal_folder: str) -> None:
    """Logits of a prefill and 8 decodes within 1e-4 of transformers' multimodal model on
    the same text, greedy tokens identical; the vision tower is never read."""
    assert_language_model_matches(
        multimodal_folder, transformers.Gemma3ForConditionalGeneration, "Gemma3ForCausalLM"
    )


def test_a_multimodal_gemma3_serves_text(multimodal_folder: str) -> None:
    with LLM(multimodal_folder, skip_tokenizer_init=True, num_kv_blocks=40) as llm:
        out = llm.generate({"prompt_token_ids": [5, 6, 7]}, use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) > 0


def test_gemma_norms_hold_one_plus_the_checkpoint_weight() -> None:
    norm = GemmaRMSNorm(4)
    weight = torch.tensor([-1.0, 0.0, 0.25, 3.0])
    norm.weight.weight_loader(norm.weight, weight)
    assert norm.weight.tolist() == [0.0, 1.0, 1.25, 4.0]


def test_a_bidirectional_gemma3_is_refused(tmp_path) -> None:
    config = tiny_configs()["gemma3"]
    config.use_bidirectional_attention = True
    config.architectures = ["Gemma3ForCausalLM"]
    config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="attends bidirectionally"):
        get_model(ModelConfig.create(str(tmp_path), dtype="float32", load_format="dummy"))


@pytest.mark.parametrize("name", ["gemma", "gemma2", "gemma3"])
def test_gemma_builds_on_the_meta_device(name: str, tiny_model_path) -> None:
    """As `pagedllm inspect` builds it: no tensor the constructor reads may be a meta one."""
    model = build_model(ModelConfig.create(tiny_model_path(name), dtype="bfloat16"), "meta")
    assert model.model.embedding_multiplier == 8.0  # sqrt(64), exact in bfloat16
