"""Quantized image-and-text Gemma 3 checkpoints (Gemma3ForConditionalGeneration) run as
their language model: the loader's plan of block types, its reads and `inspect` go by the
model's names of the checkpoint's (Gemma3ForCausalLM.hf_to_pagedllm_mapper, in
transformers' older `language_model.model.` and newer `model.language_model.` layouts), and
the vision tower, float or quantized, is never read. Reference: the float32 checkpoint of
the weights they dequantize to (tests/quantized_checkpoints.py), within the tolerance of
the text models' quantized tests (test_quantized_weights.py)."""

from collections.abc import Callable

import pytest
import torch
import transformers

from pagedllm.config import ModelConfig
from pagedllm.entrypoints.inspect import inspect_model
from pagedllm.model_loader import quantized_weights
from pagedllm.model_loader.loader import get_model
from tests import quantized_checkpoints as qc
from tests.model_loader.test_quantized_weights import FORMATS, prompt_logprobs
from tests.models.tiny_models import GEMMA3_VISION, save_tiny_gemma3_multimodal, tiny_configs

NEWER_NAMES = {
    "language_model.model.": "model.language_model.",
    "language_model.lm_head.": "lm_head.",
    "vision_tower.": "model.vision_tower.",
    "multi_modal_projector.": "model.multi_modal_projector.",
}
"""transformers' newer names of a Gemma3ForConditionalGeneration's tensors (it writes the
older ones)."""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[str, str]]:
    """(format, layout "older" / "newer", vision tower "float" / "quantized") ->
    (quantized folder, reference float32 folder) of the tiny multimodal Gemma 3."""
    source = str(tmp_path_factory.mktemp("gemma3-mm"))
    save_tiny_gemma3_multimodal(source)
    folders: dict[tuple[str, str, str], tuple[str, str]] = {}

    def get(fmt: str, layout: str = "older", vision: str = "float") -> tuple[str, str]:
        if (fmt, layout, vision) not in folders:
            writer, kwargs, _ = FORMATS[fmt]
            out = tmp_path_factory.mktemp(f"{fmt}-{layout}-{vision}") / "model"
            quantized, reference = writer(source, str(out), **kwargs)
            if vision == "float":
                qc.with_float_vision(source, quantized, reference)
            if layout == "newer":
                qc.rename_tensors(quantized, NEWER_NAMES)
            folders[fmt, layout, vision] = quantized, reference
        return folders[fmt, layout, vision]

    return get


BLOCK_FORMATS = ["gptq-4bit-sym", "gptq-4bit-asym", "awq", "ct-w4a16", "ct-w8-channel"]


@pytest.mark.parametrize("layout", ["older", "newer"])
@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
def test_run_as_stored_follows_the_reference(fmt: str, layout: str, checkpoint) -> None:
    """The language model's layers run in the GGUF blocks their layout maps to (the plan
    keyed by the model's names, as the layers ask for them) and follow the reference."""
    quantized, reference = checkpoint(fmt, layout)
    model = get_model(ModelConfig.create(quantized, "float32"))
    layer = model.model.layers[1]
    for module in (layer.self_attn.qkv_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        assert module.weight.dtype == torch.uint8
        assert module.quant_method.shard_types[0] == FORMATS[fmt][2]
    got, want = prompt_logprobs(quantized), prompt_logprobs(reference)
    torch.testing.assert_close(got, want, atol=0.06, rtol=0)


@pytest.mark.parametrize("layout", ["older", "newer"])
@pytest.mark.parametrize("fmt", ["gptq-4bit-sym", "gptq-act-order", "ct-w4a16"])
def test_a_quantized_vision_tower_is_never_read(
    fmt: str, layout: str, checkpoint, monkeypatch
) -> None:
    """A checkpoint whose vision tower is quantized too loads without reading a tensor of
    it (not its act-order column groups nor its shapes), and follows the reference."""
    quantized, reference = checkpoint(fmt, layout, vision="quantized")
    read = []
    get = quantized_weights.CheckpointTensors.get

    def spy(self: quantized_weights.CheckpointTensors, name: str) -> torch.Tensor:
        read.append(name)
        return get(self, name)

    monkeypatch.setattr(quantized_weights.CheckpointTensors, "get", spy)
    get_model(ModelConfig.create(quantized, "float32"))
    assert read and not [name for name in read if qc.VISION_PARTS.match(name)]
    atol = 1e-5 if FORMATS[fmt][2] is None else 0.06
    got, want = prompt_logprobs(quantized), prompt_logprobs(reference)
    torch.testing.assert_close(got, want, atol=atol, rtol=0)


@pytest.mark.parametrize("fmt", ["gptq-4bit-sym", "awq"])
def test_inspect_sizes_the_layers_as_the_loader_runs_them(fmt: str, checkpoint) -> None:
    """From the weight files' headers (by the model's names), as from the config alone:
    the layers in blocks take the bytes the loader gives them (packed for the CPU kernels,
    a little more than the file's)."""
    quantized, _ = checkpoint(fmt, "newer")
    config = ModelConfig.create(quantized, "float32")
    report = inspect_model(config)
    blocks = [p for p in get_model(config).parameters() if p.dtype == torch.uint8]
    by_type = report["bytes_per_rank_by_type"]
    assert set(by_type) == {"F32", FORMATS[fmt][2].name}
    assert by_type[FORMATS[fmt][2].name] == pytest.approx(sum(p.nbytes for p in blocks), rel=0.01)
    from_config = inspect_model(ModelConfig.create(f"{quantized}/config.json", "float32"))
    assert from_config["bytes_per_rank"] == report["bytes_per_rank"]


@pytest.mark.parametrize(
    "target", [r"re:.*language_model\.model\..*mlp\..*", r"re:model\.language_model\..*mlp\..*"]
)
def test_inspect_of_a_config_matches_targets_on_the_checkpoints_names(target, tmp_path) -> None:
    """Targets naming the language model in either layout match the model's layers."""
    config = transformers.Gemma3Config(
        text_config=tiny_configs()["gemma3"].to_dict(),
        vision_config=GEMMA3_VISION,
        architectures=["Gemma3ForConditionalGeneration"],
    )
    config.quantization_config = {
        "quant_method": "compressed-tensors",
        "config_groups": {
            "mlp": {
                "targets": [target],
                "format": "pack-quantized",
                "weights": {"num_bits": 4, "strategy": "group", "group_size": 32},
            }
        },
    }
    config.save_pretrained(tmp_path)
    report = inspect_model(ModelConfig.create(str(tmp_path / "config.json"), "float32"))
    assert set(report["bytes_per_rank_by_type"]) == {"F32", "Q4_0"}
