"""sampling_defaults.py: the model's recommended sampling params, by vLLM's rule
(ModelConfig.get_diff_sampling_param): the generation config's repetition_penalty,
temperature, top_k, top_p, min_p and max_new_tokens (as max_tokens), only those the file
sets; "vllm" reads none; override_generation_config sets fields over them. End to end:
LLM.generate without params and a server request without the fields use them."""

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from pagedllm import LLM, SamplingParams
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.entrypoints.openai import api_server
from pagedllm.sampling_defaults import sampling_defaults
from tests.embedding_models import save_byte_tokenizer

RECOMMENDED = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 5}


def folder_with(tmp_path: Path, source: str, generation_config: dict) -> str:
    folder = tmp_path / "model"
    shutil.copytree(source, folder)
    (folder / "generation_config.json").write_text(json.dumps(generation_config))
    return str(folder)


def test_the_fields_the_file_sets(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(
        json.dumps({**RECOMMENDED, "do_sample": True, "bos_token_id": 1})
    )
    expected = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 5}
    assert sampling_defaults(str(tmp_path), "auto") == expected
    assert sampling_defaults(str(tmp_path), "vllm") == {}
    override = sampling_defaults(str(tmp_path), "auto", '{"temperature": 0.2, "min_p": 0.1}')
    assert override == {**expected, "temperature": 0.2, "min_p": 0.1}
    assert sampling_defaults(str(tmp_path / "none"), "auto") == {}, "a model without one"
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.7}))
    assert sampling_defaults(str(tmp_path), "auto") == {"temperature": 0.7}, "no top_k of 50"


def test_bad_defaults_are_refused_at_start_up(tiny_model_path: Callable[[str], str]) -> None:
    """Else every request leaving the field unset would fail, naming a field it never set."""
    with pytest.raises(ValueError, match="override_generation_config.*temperature"):
        LLM(tiny_model_path("llama-gqa4"), override_generation_config={"temperature": -1})


def test_a_named_folder_must_hold_one_and_overrides_must_be_objects(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="generation_config .* 'auto', 'vllm' or a folder"):
        sampling_defaults(str(tmp_path), str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="override_generation_config"):
        sampling_defaults(str(tmp_path), "auto", "[1]")


def test_llm_generate_without_params_uses_them(
    tiny_model_path: Callable[[str], str], tmp_path: Path
) -> None:
    folder = folder_with(tmp_path, tiny_model_path("llama-gqa4"), RECOMMENDED)
    prompt = {"prompt_token_ids": [5, 6, 7]}
    for generation_config, expected in [("auto", 5), ("vllm", 16)]:
        kwargs = dict(skip_tokenizer_init=True, dtype="float32", num_kv_blocks=32)
        with LLM(folder, generation_config=generation_config, **kwargs) as llm:
            defaults = llm.get_default_sampling_params()
            (out,) = llm.generate(prompt, use_tqdm=False)
        assert len(out.outputs[0].token_ids) == expected
        if generation_config == "auto":
            assert (defaults.temperature, defaults.top_p, defaults.top_k) == (0.6, 0.95, 20)
        else:
            assert defaults == SamplingParams()


def test_a_server_request_leaving_fields_unset_gets_them(
    tiny_model_path: Callable[[str], str], tmp_path: Path
) -> None:
    """Greedy by the model's default temperature 0; max_tokens by its max_new_tokens (chat,
    whose max_tokens has no default of its own); a field the request sets wins."""
    folder = folder_with(
        tmp_path, tiny_model_path("llama-gqa4"), {"temperature": 0.0, "max_new_tokens": 3}
    )
    save_byte_tokenizer(folder, specials=True)
    llm = LLM(folder, dtype="float32", num_kv_blocks=32)
    app = api_server.build_app(AsyncLLM(llm.llm_engine), ["m"])
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    with TestClient(app) as client:
        answers = [client.post("/v1/chat/completions", json=chat).json() for _ in range(2)]
        assert [a["usage"]["completion_tokens"] for a in answers] == [3, 3]
        assert answers[0]["choices"][0]["message"] == answers[1]["choices"][0]["message"]
        null = client.post("/v1/chat/completions", json={**chat, "temperature": None}).json()
        assert null["choices"][0]["message"] == answers[0]["choices"][0]["message"]
        sampled = {**chat, "temperature": 1.0, "max_tokens": 40, "seed": 1, "ignore_eos": True}
        texts = {
            client.post("/v1/chat/completions", json={**sampled, "seed": s}).json()["choices"][0][
                "message"
            ]["content"]
            for s in range(4)
        }
        assert len(texts) > 1, "the request's own temperature wins"
    llm.close()


def test_an_overridden_max_new_tokens_caps_every_request(
    tiny_model_path: Callable[[str], str], tmp_path: Path
) -> None:
    """vLLM's override_max_tokens: override_generation_config's max_new_tokens bounds a
    request's own max_tokens too."""
    folder = folder_with(tmp_path, tiny_model_path("llama-gqa4"), {})
    save_byte_tokenizer(folder, specials=True)
    llm = LLM(
        folder, dtype="float32", num_kv_blocks=32, override_generation_config={"max_new_tokens": 4}
    )
    app = api_server.build_app(AsyncLLM(llm.llm_engine), ["m"])
    body = {"prompt": "hi", "max_tokens": 30, "ignore_eos": True}
    with TestClient(app) as client:
        assert client.post("/v1/completions", json=body).json()["usage"]["completion_tokens"] == 4
    llm.close()
