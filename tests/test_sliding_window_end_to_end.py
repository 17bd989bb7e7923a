"""Models whose layers attend within a sliding window or cap their attention scores (the
tiny Gemma 2, Gemma 3, Mistral, OLMo 3, EXAONE 4 and StarCoder 2 models: windows of 5 to 7 tokens,
Gemma 2's soft caps), served by the engine on its CPU path. References: transformers'
greedy tokens and logprobs; and, bit for bit, the request alone on a cold engine, against
the request after a prefix-cache hit, batched with others, prefilled in chunks, and decoded
eagerly instead of by replayed CPU decode graphs."""

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.outputs import CompletionOutput

NAMES = ["gemma2", "gemma3", "mistral", "olmo3", "exaone4", "starcoder2"]
MAX_TOKENS = 8


def generate(path: str, prompts: list[list[int]], **engine: object) -> list[CompletionOutput]:
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=3)
    settings = dict(skip_tokenizer_init=True, num_kv_blocks=96, max_model_len=256) | engine
    with LLM(path, **settings) as llm:
        return run(llm, prompts, params)


def run(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[CompletionOutput]:
    requests = [{"prompt_token_ids": p} for p in prompts]
    return [out.outputs[0] for out in llm.generate(requests, params, use_tqdm=False)]


def answer(completion: CompletionOutput) -> tuple:
    return completion.token_ids, completion.logprobs


@pytest.mark.parametrize("name", NAMES)
def test_the_engine_gives_transformers_greedy_tokens(
    name: str, tiny_model_path, hf_greedy, spread_prompts
) -> None:
    """Prompts of 23 to 200 tokens, far past the windows: tokens equal and logprobs within
    1e-4 of transformers' in float32."""
    prompts = spread_prompts[2:]
    reference = hf_greedy(name, prompts, MAX_TOKENS)
    outputs = generate(tiny_model_path(name), prompts, dtype="float32")
    for out, ref in zip(outputs, reference, strict=True):
        ref.assert_matches(out)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", NAMES)
def test_the_same_request_gets_the_same_answer(
    name: str, dtype: str, tiny_model_path, spread_prompts
) -> None:
    path, target, others = tiny_model_path(name), spread_prompts[5], spread_prompts[1:5]
    cold = answer(generate(path, [target], dtype=dtype, enable_prefix_caching=False)[0])
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=3)
    with LLM(path, skip_tokenizer_init=True, dtype=dtype, num_kv_blocks=96) as llm:
        assert answer(run(llm, [target], params)[0]) == cold
        assert answer(run(llm, [target], params)[0]) == cold, "a prefix-cache hit"
    batched = generate(path, [*others, target], dtype=dtype, enable_prefix_caching=False)
    assert answer(batched[-1]) == cold
    chunked = generate(path, [*others, target], dtype=dtype, max_num_batched_tokens=16)
    assert answer(chunked[-1]) == cold
    eager = generate(path, [target], dtype=dtype, enforce_eager=True)
    assert answer(eager[0]) == cold
