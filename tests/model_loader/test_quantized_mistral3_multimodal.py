"""Quantized image-and-text Mistral 3 checkpoints run as their language model, as Ministral 3
ships: fp8 with one scale per tensor (weight_scale_inv) and a static activation_scale beside
it, under transformers' older or newer names. The vision tower and projector, float or fp8,
are never read. Reference: the float32 checkpoint of the weights they dequantize to
(tests/quantized_checkpoints.py), which fp8 weights are read as exactly."""

from collections.abc import Callable

import pytest
import torch

from pagedllm.config import ModelConfig
from pagedllm.entrypoints.inspect import inspect_model
from pagedllm.model_loader import quantized_weights
from pagedllm.model_loader.loader import get_model
from tests import quantized_checkpoints as qc
from tests.model_loader.test_quantized_gemma3_multimodal import NEWER_NAMES
from tests.model_loader.test_quantized_weights import prompt_logprobs
from tests.models.tiny_models import save_tiny_mistral3


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], tuple[str, str]]:
    """(layout "older" / "newer", vision tower "float" / "fp8") -> (fp8 folder, reference
    float32 folder) of the tiny Mistral 3 with a Ministral 3 language model."""
    source = str(tmp_path_factory.mktemp("ministral3-mm"))
    save_tiny_mistral3(source, "ministral3", tied=True)
    folders: dict[tuple[str, str], tuple[str, str]] = {}

    def get(layout: str, vision: str) -> tuple[str, str]:
        if (layout, vision) not in folders:
            out = tmp_path_factory.mktemp(f"fp8-{layout}-{vision}") / "model"
            quantized, reference = qc.save_fp8(source, str(out), block=None, static=True)
            if vision == "float":
                qc.with_float_vision(source, quantized, reference)
            if layout == "newer":
                qc.rename_tensors(quantized, NEWER_NAMES)
            folders[layout, vision] = quantized, reference
        return folders[layout, vision]

    return get


@pytest.mark.parametrize("vision", ["float", "fp8"])
@pytest.mark.parametrize("layout", ["older", "newer"])
def test_an_fp8_mistral3_loads_without_reading_its_vision_tower(
    layout: str, vision: str, checkpoint, monkeypatch
) -> None:
    quantized, reference = checkpoint(layout, vision)
    read = []
    get = quantized_weights.CheckpointTensors.get

    def spy(self: quantized_weights.CheckpointTensors, name: str) -> torch.Tensor:
        read.append(name)
        return get(self, name)

    monkeypatch.setattr(quantized_weights.CheckpointTensors, "get", spy)
    model_config = ModelConfig.create(quantized, "float32")
    assert model_config.architecture == "Ministral3ForCausalLM"
    get_model(model_config)
    assert any(name.endswith("weight_scale_inv") for name in read)
    assert not [name for name in read if qc.VISION_PARTS.match(name)]
    got, want = prompt_logprobs(quantized), prompt_logprobs(reference)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_inspect_sizes_the_language_model_alone(checkpoint) -> None:
    """`pagedllm inspect` of the fp8 checkpoint (its vision tower fp8 too), of its config.json
    and of the float32 reference count the same bytes: the language model's, as loaded."""
    quantized, reference = checkpoint("newer", "fp8")
    reports = [
        inspect_model(ModelConfig.create(path, "float32"))
        for path in (quantized, f"{quantized}/config.json", reference)
    ]
    assert {report["architecture"] for report in reports} == {"Ministral3ForCausalLM"}
    assert len({report["bytes_per_rank"] for report in reports}) == 1
