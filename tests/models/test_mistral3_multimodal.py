"""Image-and-text Mistral 3 checkpoints (Mistral3ForConditionalGeneration: Mistral Small
3.1 / 3.2, Magistral Small, Ministral 3) run as their language model, MistralForCausalLM or
Ministral3ForCausalLM by the text_config's model_type (reference: transformers'
Mistral3ForConditionalGeneration on text alone); another text model_type is refused."""

from collections.abc import Callable

import pytest
import transformers

from pagedllm import LLM
from pagedllm.config import ModelConfig
from tests.model_loader.test_quantized_gemma3_multimodal import NEWER_NAMES
from tests.models.test_models_vs_transformers import assert_language_model_matches
from tests.models.tiny_models import PIXTRAL_VISION, save_tiny_mistral3, tiny_configs
from tests.quantized_checkpoints import rename_tensors

CHECKPOINTS = {
    # text model_type: (tied LM head, pagedllm's text architecture)
    "mistral": (False, "MistralForCausalLM"),  # Mistral Small 3.1's
    "ministral3": (True, "Ministral3ForCausalLM"),  # Ministral 3 3B's
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], str]:
    """(text model_type, layout "older" / "newer") -> the tiny Mistral 3's folder, its
    tensors under transformers' older or newer names."""
    folders: dict[tuple[str, str], str] = {}

    def get(text: str, layout: str) -> str:
        if (text, layout) not in folders:
            folder = str(tmp_path_factory.mktemp(f"mistral3-{text}-{layout}"))
            save_tiny_mistral3(folder, text, tied=CHECKPOINTS[text][0])
            if layout == "newer":
                rename_tensors(folder, NEWER_NAMES)
            folders[text, layout] = folder
        return folders[text, layout]

    return get


@pytest.mark.parametrize("layout", ["older", "newer"])
@pytest.mark.parametrize("text", list(CHECKPOINTS))
def test_a_mistral3_runs_its_language_model(text: str, layout: str, checkpoint) -> None:
    """Logits of a prefill and 8 decodes within 1e-4 of transformers' multimodal model on
    the same text, greedy tokens identical; the vision tower is never read."""
    assert_language_model_matches(
        checkpoint(text, layout),
        transformers.Mistral3ForConditionalGeneration,
        CHECKPOINTS[text][1],
    )


def test_a_mistral3_serves_text(checkpoint) -> None:
    with LLM(checkpoint("ministral3", "older"), skip_tokenizer_init=True, num_kv_blocks=40) as llm:
        out = llm.generate({"prompt_token_ids": [5, 6, 7]}, use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) > 0


def test_another_text_model_type_is_refused_by_name(tmp_path) -> None:
    config = transformers.Mistral3Config(
        text_config=tiny_configs()["qwen3"].to_dict(),
        vision_config=PIXTRAL_VISION,
        architectures=["Mistral3ForConditionalGeneration"],
    )
    config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="text_config has model_type 'qwen3'.*'ministral3'"):
        ModelConfig.create(str(tmp_path), dtype="float32")
