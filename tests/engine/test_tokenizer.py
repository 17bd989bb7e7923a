"""The tokenizer and EOS ids of a model (pagedllm/engine/tokenizer.py). Reference: transformers'
GenerationConfig.save_pretrained / from_pretrained for generation_config.json, AutoTokenizer and
the GGUF tokenizer of the files a `tokenizer` names, and the rule that the tokenizer's
eos_token_id wins over the model config's (the first one when it is a list)."""

import builtins
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers

from pagedllm.config import ModelConfig, default_model_path
from pagedllm.engine.tokenizer import (
    eos_token_ids,
    generation_config_dict,
    get_tokenizer,
    model_eos_token_id,
)
from pagedllm.gguf.tokenizer import load_gguf_tokenizer
from tests.embedding_models import save_byte_tokenizer
from tests.engine.engine_helpers import LLAMA

TEXT = "Hello, wörld 12"


def folder_with_config(tiny_model_path: Callable[[str], str], tmp_path: Path) -> ModelConfig:
    """A model folder holding only config.json."""
    shutil.copy(Path(tiny_model_path(LLAMA)) / "config.json", tmp_path)
    return ModelConfig.create(str(tmp_path), "float32")


def test_generation_config_dict_without_the_file_is_empty(tiny_model_path, tmp_path) -> None:
    assert generation_config_dict(folder_with_config(tiny_model_path, tmp_path)) == {}


def test_generation_config_dict_reads_the_file(tiny_model_path, tmp_path) -> None:
    model_config = folder_with_config(tiny_model_path, tmp_path)
    transformers.GenerationConfig(
        eos_token_id=[2, 7], do_sample=True, temperature=0.6
    ).save_pretrained(tmp_path)
    config = generation_config_dict(model_config)
    assert config["eos_token_id"] == [2, 7] and config["temperature"] == 0.6


def test_a_generation_config_that_is_not_json_is_a_value_error(tiny_model_path, tmp_path):
    model_config = folder_with_config(tiny_model_path, tmp_path)
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read .*generation_config.json"):
        generation_config_dict(model_config)


def model_config_with_eos(eos: object) -> ModelConfig:
    hf_config = transformers.LlamaConfig(eos_token_id=eos)
    return ModelConfig("unused", hf_config, torch.float32, 64)


@pytest.mark.parametrize(
    "tokenizer_eos, config_eos, expected",
    [
        (9, 2, 9),  # the tokenizer's wins
        (None, 2, 2),  # a tokenizer without one: the model config's
        (None, [4, 5], 4),  # a list: its first
        (None, None, None),
    ],
)
def test_model_eos_token_id(tokenizer_eos, config_eos, expected) -> None:
    tokenizer = SimpleNamespace(eos_token_id=tokenizer_eos)
    model_config = model_config_with_eos(config_eos)
    assert model_eos_token_id(model_config, tokenizer) == expected
    assert model_eos_token_id(model_config, None) == (expected if tokenizer_eos is None else 2)


def test_model_eos_token_id_of_an_empty_list_is_none() -> None:
    assert model_eos_token_id(model_config_with_eos([]), None) is None


def test_folder_without_a_tokenizer_raises_with_advice(tiny_model_path, tmp_path) -> None:
    model_config = folder_with_config(tiny_model_path, tmp_path)
    with pytest.raises(
        ValueError, match="(?s)cannot load a tokenizer from .*skip_tokenizer_init=True"
    ):
        get_tokenizer(model_config)


@pytest.mark.parametrize(
    "eos, generation_config, expected",
    [
        (2, {}, [2]),
        (2, {"eos_token_id": 7}, [2, 7]),
        (2, {"eos_token_id": [7, 2]}, [2, 7]),
        (None, {"eos_token_id": [7, 2]}, [7, 2]),
        (None, {}, []),
    ],
)
def test_eos_token_ids_put_the_models_first(eos, generation_config, expected) -> None:
    assert eos_token_ids(eos, generation_config) == expected


def test_a_named_tokenizer_folder_replaces_the_models(tiny_model_path, tmp_path) -> None:
    """vLLM's `tokenizer`: the model folder has none; the named folder's loads instead."""
    save_byte_tokenizer(str(tmp_path / "tok"))
    shutil.copy(Path(tiny_model_path(LLAMA)) / "config.json", tmp_path)
    model_config = ModelConfig.create(str(tmp_path), "float32", tokenizer=str(tmp_path / "tok"))
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert get_tokenizer(model_config).encode(TEXT) == reference.encode(TEXT)


def test_a_named_gguf_file_gives_its_tokenizer(tiny_model_path, tmp_path) -> None:
    gguf = default_model_path()
    model_config = ModelConfig.create(tiny_model_path(LLAMA), "float32", tokenizer=gguf)
    assert get_tokenizer(model_config).encode(TEXT) == load_gguf_tokenizer(gguf).encode(TEXT)


def test_slow_mode_loads_the_fast_tokenizer_and_says_so(tiny_model_path, tmp_path, caplog):
    """transformers 5 has no slow tokenizer classes; vLLM's "slow" gets the same tokenizer."""
    save_byte_tokenizer(str(tmp_path))
    shutil.copy(Path(tiny_model_path(LLAMA)) / "config.json", tmp_path)
    auto = get_tokenizer(ModelConfig.create(str(tmp_path), "float32"))
    with caplog.at_level(logging.WARNING, logger="pagedllm"):
        slow = get_tokenizer(ModelConfig.create(str(tmp_path), "float32", tokenizer_mode="slow"))
    assert slow.encode(TEXT) == auto.encode(TEXT)
    assert "has fast tokenizers only" in caplog.text


def test_a_tokenizer_with_its_own_code_is_refused_without_asking(
    tiny_model_path, tmp_path, monkeypatch
) -> None:
    """transformers asks on stdin whether to run a tokenizer's own code unless told not to;
    pagedllm never runs it, and says so."""
    model_config = folder_with_config(tiny_model_path, tmp_path)
    save_byte_tokenizer(str(tmp_path))
    path = tmp_path / "tokenizer_config.json"
    tokenizer_config = json.loads(path.read_text())
    tokenizer_config |= {
        "tokenizer_class": "MyTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_my.MyTokenizer", None]},
    }
    path.write_text(json.dumps(tokenizer_config))
    monkeypatch.setattr(builtins, "input", lambda *args: pytest.fail("asked on stdin"))
    with pytest.raises(ValueError, match="needs its own Python code .* pagedllm never runs"):
        get_tokenizer(model_config)
