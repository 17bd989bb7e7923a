"""pagedllm/benchmarks/hf_folder.py: a GGUF written as a HF folder loads with transformers'
AutoModelForCausalLM.from_pretrained (the reference) to the same logits as the float32 model
hf_backend.py builds from the GGUF itself, and is written once."""

import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pagedllm.benchmarks.hf_backend import load_hf_model
from pagedllm.benchmarks.hf_folder import ADDED_TOKEN_FIELDS, hf_folder_path, write_tokenizer
from pagedllm.config import ModelConfig, default_model_path
from pagedllm.gguf.tokenizer import load_gguf_tokenizer


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


def test_the_tokenizer_lists_its_added_tokens_and_loads_as_the_ggufs(tmp_path: object) -> None:
    """The default model's tokenizer, saved with its added tokens listed in
    tokenizer_config.json (so transformers need not parse tokenizer.json in Python to find
    them), loads with AutoTokenizer to the GGUF tokenizer's tokens, specials and chat text."""
    gguf = default_model_path()
    write_tokenizer(gguf, str(tmp_path))
    reference, loaded = load_gguf_tokenizer(gguf), AutoTokenizer.from_pretrained(str(tmp_path))
    with open(f"{tmp_path}/tokenizer_config.json", encoding="utf-8") as f:
        listed = json.load(f)["added_tokens_decoder"]
    assert listed == {
        str(i): {field: getattr(token, field) for field in ADDED_TOKEN_FIELDS}
        for i, token in reference.added_tokens_decoder.items()
    }
    assert len(listed) > 10 and listed["0"]["special"]
    text = "Hi <|im_start|>user\ncafé 世界<|im_end|>"
    assert loaded.encode(text) == reference.encode(text)
    assert loaded.all_special_tokens == reference.all_special_tokens
    chat = [{"role": "user", "content": "Hello"}]
    assert loaded.apply_chat_template(chat, tokenize=False) == reference.apply_chat_template(
        chat, tokenize=False
    )
