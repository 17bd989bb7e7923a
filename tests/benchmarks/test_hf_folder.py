"""pagedllm/benchmarks/hf_folder.py: a GGUF written as a HF folder loads with transformers'
AutoModelForCausalLM.from_pretrained (the reference) to the same logits as the float32 model
hf_backend.py builds from the GGUF itself, and is written once."""

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from pagedllm.benchmarks.hf_backend import load_hf_model
from pagedllm.benchmarks.hf_folder import hf_folder_path
from pagedllm.config import ModelConfig


def test_hf_folder_loads_with_from_pretrained_to_the_ggufs_logits(
    tiny_gguf_path: str, tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", f"{tmp_path}/cache")
    folder = hf_folder_path(tiny_gguf_path)
    assert folder == f"{tmp_path}/cache/pagedllm/tiny-llama.hf"
    written = os.path.getmtime(f"{folder}/config.json")
    assert hf_folder_path(tiny_gguf_path) == folder
    assert os.path.getmtime(f"{folder}/config.json") == written

    loaded = AutoModelForCausalLM.from_pretrained(folder)
    assert loaded.dtype == torch.float32
    gguf = load_hf_model(ModelConfig.create(tiny_gguf_path, "float32", quantization="none"))
    ids = torch.tensor([[3, 17, 12, 9, 5]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, gguf(ids).logits, rtol=0, atol=0)
