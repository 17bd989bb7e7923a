"""pagedllm/models/registry.py. Reference: transformers' model classes: every registered
architecture string is the name of a transformers class (what config.json's `architectures`
holds; a bare decoder `*Model` and a classifier `*ForSequenceClassification` or
`*ForTokenClassification` resolve to their
`*ForCausalLM` class, run by pooling models without its LM head), or a class of a model's
own code that transformers runs as one of its classes; and the model class of every tiny
test config is registered."""

import pytest
import transformers
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from pagedllm.models.registry import ModelRegistry
from tests.models.tiny_models import REMOTE_CODE_CHECKPOINTS, tiny_configs

RUN_AS = {
    fields["architectures"][0]: MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    for model_type, fields in REMOTE_CODE_CHECKPOINTS.items()
}
RUN_AS["Ernie4_5_ForCausalLM"] = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES["ernie4_5"]
"""The classes remote-code checkpoints name -> transformers' class of their model_type
(InternLM3ForCausalLM -> LlamaForCausalLM; ERNIE 4.5's released checkpoints, whose tiny
form tests/models/test_ernie4_5.py writes, -> Ernie4_5ForCausalLM)."""


@pytest.mark.parametrize("arch", ModelRegistry.get_supported_archs())
def test_every_registered_architecture_resolves_to_its_namesake(arch: str) -> None:
    model_cls = ModelRegistry.resolve_model_cls(arch)
    family = arch.removesuffix("Model").removesuffix("ForSequenceClassification")
    family = family.removesuffix("ForTokenClassification")
    family = family.removesuffix("Text")  # Gemma3TextModel: Gemma 3's text decoder
    assert model_cls.__name__ in (arch, family + "ForCausalLM", RUN_AS.get(arch))
    hf_arch = RUN_AS.get(arch, arch)
    assert hasattr(transformers, hf_arch), f"{hf_arch} is not a transformers architecture"
    assert callable(model_cls.load_weights) and callable(model_cls.compute_logits)


@pytest.mark.parametrize("name", list(tiny_configs()))
def test_every_tiny_configs_transformers_class_is_supported(name: str) -> None:
    hf_cls = type(transformers.AutoModelForCausalLM.from_config(tiny_configs()[name]))
    assert hf_cls.__name__ in ModelRegistry.get_supported_archs()


def test_supported_archs_are_sorted() -> None:
    archs = ModelRegistry.get_supported_archs()
    assert archs == sorted(archs) and len(archs) == len(set(archs)) >= 5


def test_unknown_architecture_names_itself_and_the_supported_ones() -> None:
    with pytest.raises(ValueError) as info:
        ModelRegistry.resolve_model_cls("GPT2LMHeadModel")
    message = str(info.value)
    assert "'GPT2LMHeadModel' is not supported" in message
    assert all(arch in message for arch in ModelRegistry.get_supported_archs())


def test_the_multimodal_gemma3_is_not_taken_for_its_text_decoder() -> None:
    archs = ModelRegistry.get_supported_archs()
    assert "Gemma3TextModel" in archs
    assert "Gemma3Model" not in archs and "Gemma3ForSequenceClassification" not in archs
