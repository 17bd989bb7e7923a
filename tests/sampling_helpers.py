"""Shared by the end-to-end sampling tests: tiny-model LLMs built once per module, greedy
params, prompts as token ids, and transformers' greedy generate as the reference."""

from collections.abc import Callable

import pytest
from torch import nn

from pagedllm import LLM, SamplingParams
from pagedllm.outputs import CompletionOutput
from tests.hf_reference import hf_generate

LLAMA = "llama-gqa-llama3"
MAX_TOKENS = 16
TINY_KWARGS = dict(skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=256)


@pytest.fixture(scope="module")
def tiny_llm(tiny_model_path: Callable[[str], str]) -> Callable[..., LLM]:
    """(name, **engine kwargs) -> an LLM on that tiny model, built once per module."""
    llms: dict[str, LLM] = {}

    def get(name: str = LLAMA, **kwargs: object) -> LLM:
        kwargs = {"num_kv_blocks": 128, **TINY_KWARGS, **kwargs}
        key = repr((name, sorted(kwargs.items())))
        if key not in llms:
            llms[key] = LLM(tiny_model_path(name), **kwargs)
        return llms[key]

    return get


def greedy(max_tokens: int = MAX_TOKENS, **kwargs: object) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kwargs)


def as_prompts(token_lists: list[list[int]]) -> list[dict]:
    return [{"prompt_token_ids": ids} for ids in token_lists]


def completions(llm: LLM, prompts: list, params: list[SamplingParams]) -> list[CompletionOutput]:
    """The first completion of each request, generated in one batch."""
    return [out.outputs[0] for out in llm.generate(prompts, params, use_tqdm=False)]


def hf_generate_greedy(
    model: nn.Module, prompt: list[int], max_new_tokens: int, **kw: object
) -> list[int]:
    """transformers' `generate(do_sample=False, **kw)` for one prompt, never stopping at EOS."""
    out = hf_generate(model, prompt, max_new_tokens, **kw)
    return out.sequences[0, len(prompt) :].tolist()
