"""InputProcessor (pagedllm/engine/input_processor.py): prompt and SamplingParams -> a validated
Request. Reference: its contract: prompt ids in [0, vocab_size) and 1..max_model_len long, text
tokenized by the tokenizer's `encode`, n x min(max_tokens, max_model_len - prompt) tokens within
num_kv_blocks x block_size, completion k of a seeded request drawing from seed + k, and the
caller's SamplingParams left unchanged."""

from collections.abc import Callable

import pytest
import torch

from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.input_processor import InputProcessor, check_token_ids
from pagedllm.sampling_params import SamplingParams
from tests.engine.engine_helpers import LLAMA, make_engine, run_all

VOCAB = 320  # the tiny models'
MAX_MODEL_LEN = 256
NUM_KV_BLOCKS = 40  # x 16 = 640 tokens


class ByteTokenizer:
    """Each UTF-8 byte is a token (ids 0..255, inside the tiny models' vocabulary)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode())


@pytest.fixture
def make_processor(tiny_model_path: Callable[[str], str]) -> Callable[..., InputProcessor]:
    def make(
        tokenizer: ByteTokenizer | None = None,
        generation_config: dict | None = None,
        validate_params: Callable[[SamplingParams], None] = lambda params: None,
        **engine_args: object,
    ) -> InputProcessor:
        args = dict(skip_tokenizer_init=True, dtype="float32", device="cpu")
        args |= dict(max_model_len=MAX_MODEL_LEN, max_n=8, max_logprobs=5) | engine_args
        config = EngineArgs(tiny_model_path(LLAMA), **args).create_engine_config()
        return InputProcessor(
            config, tokenizer, 2, generation_config or {}, validate_params, NUM_KV_BLOCKS
        )

    return make


def test_check_token_ids_names_the_field_and_the_bad_ids() -> None:
    """Definition: ints (not bools) in [0, vocab_size); the first 5 bad ones are shown."""
    check_token_ids([0, 5, VOCAB - 1], VOCAB)
    with pytest.raises(ValueError, match=r"stop token ids \[320, -1, True, 2.0\] .* \[0, 320\)"):
        check_token_ids([1, 320, -1, True, 2.0, 3], VOCAB, "stop")
    with pytest.raises(ValueError, match=r"prompt token ids \[400, 401, 402, 403, 404\] "):
        check_token_ids(list(range(400, 410)), VOCAB)


@pytest.mark.parametrize(
    "prompt, text, token_ids",
    [
        ("héllo", "héllo", list("héllo".encode())),
        ([7, 8, 9], None, [7, 8, 9]),
        ((7, 8, 9), None, [7, 8, 9]),
        ({"prompt": "hi"}, "hi", [104, 105]),
        ({"prompt": "shown", "prompt_token_ids": [4, 5]}, "shown", [4, 5]),
    ],
    ids=["str", "list", "tuple", "dict-text", "dict-both"],
)
def test_prompt_forms_give_text_and_ids(make_processor, prompt, text, token_ids) -> None:
    """Reference: the tokenizer's encode for text; given ids are used as they are."""
    request = make_processor(ByteTokenizer()).process("r", prompt, SamplingParams())
    assert (request.prompt, request.prompt_token_ids) == (text, token_ids)
    seq = request.completions[0].seq
    assert seq.token_ids == token_ids and seq.request_id == "r" and seq.block_size == 16


@pytest.mark.parametrize(
    "prompt, error, match",
    [
        ([], ValueError, r"the prompt is empty \(0 tokens\)"),
        ({"prompt_token_ids": []}, ValueError, "the prompt is empty"),
        ({}, ValueError, "prompt dict needs 'prompt' or 'prompt_token_ids'"),
        ("text", ValueError, "text prompts need a tokenizer"),
        (5, TypeError, "prompt must be a str, a list of token ids or a dict, got 5"),
        ([3, VOCAB], ValueError, r"prompt token ids \[320\] are outside"),
        ([3] * (MAX_MODEL_LEN + 1), ValueError, "has 257 tokens, more than max_model_len=256"),
    ],
    ids=["empty", "empty-dict", "dict-without-prompt", "no-tokenizer", "int", "vocab", "long"],
)
def test_bad_prompts_are_rejected(make_processor, prompt, error, match) -> None:
    with pytest.raises(error, match=match):
        make_processor().process("r", prompt, SamplingParams(max_tokens=1))


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_priority_and_cache_salt_reach_the_sequence(make_processor, policy) -> None:
    """vLLM's rule: a nonzero priority needs the "priority" policy; an int, not a bool."""
    processor = make_processor(scheduling_policy=policy)
    prompt = {"prompt_token_ids": [3, 4], "cache_salt": "s"}
    seq = processor.process("r", prompt, SamplingParams(), 5.0, 0).completions[0].seq
    assert (seq.priority, seq.cache_salt, seq.arrival_time) == (0, "s", 5.0)
    with pytest.raises(TypeError, match="priority must be an int, got bool"):
        processor.process("r", [3], SamplingParams(), priority=True)
    with pytest.raises(ValueError, match=r"priority must be an int in the signed 64-bit range"):
        processor.process("r", [3], SamplingParams(), priority=2**63)
    if policy == "fcfs":
        with pytest.raises(ValueError, match=r"Got priority 2 .*\(--scheduling-policy priority\)"):
            processor.process("r", [3], SamplingParams(), priority=2)
    else:
        assert processor.process("r", [3], None, priority=2).completions[0].seq.priority == 2


def test_prompt_of_max_model_len_is_accepted(make_processor) -> None:
    """Guards the "long" case above: the limit itself is allowed."""
    request = make_processor().process("r", [3] * MAX_MODEL_LEN, SamplingParams(max_tokens=1))
    assert len(request.prompt_token_ids) == MAX_MODEL_LEN


@pytest.mark.parametrize(
    "prompt_len, n, max_tokens, fits",
    [
        (5, 4, 160, True),  # 4 x 160 = 640, the whole cache
        (5, 4, 161, False),
        (5, 2, None, True),  # None: up to 256 - 5 = 251 each; 2 x 251 = 502
        (5, 3, None, False),  # 3 x 251 = 753
        (250, 8, 1000, True),  # capped by the context: 8 x (256 - 250) = 48
    ],
)
def test_fan_out_bound_against_the_cache(make_processor, prompt_len, n, max_tokens, fits) -> None:
    """Formula: n x min(max_tokens, max_model_len - prompt) <= num_kv_blocks x block_size."""
    processor = make_processor()
    params = SamplingParams(n=n, max_tokens=max_tokens)
    if fits:
        processor.process("r", [3] * prompt_len, params)
        return
    max_new = min(MAX_MODEL_LEN - prompt_len, max_tokens or MAX_MODEL_LEN)
    message = rf"n={n} completions of up to {max_new} .* \(640 tokens\)"
    with pytest.raises(ValueError, match=message):
        processor.process("r", [3] * prompt_len, params)


def test_seeded_completion_k_draws_from_seed_plus_k(make_processor) -> None:
    """Reference: torch.Generator().manual_seed(seed + k) for completion k."""
    request = make_processor().process("r", [3, 4], SamplingParams(n=3, seed=7))
    draws = [torch.rand(4, generator=g) for g in request.generators]
    for k, draw in enumerate(draws):
        torch.testing.assert_close(
            draw, torch.rand(4, generator=torch.Generator().manual_seed(7 + k))
        )
    unseeded = make_processor().process("u", [3, 4], SamplingParams(n=3))
    assert unseeded.generators == [None, None, None]


def test_params_are_cloned_and_the_callers_are_unchanged(make_processor) -> None:
    """The generation config's extra EOS id (7) joins the request's stop ids, not the caller's."""
    seen = []
    processor = make_processor(
        generation_config={"eos_token_id": [2, 7]}, validate_params=seen.append
    )
    params = SamplingParams(stop_token_ids=[9])
    request = processor.process("r", [3, 4], params)
    assert request.params is not params and seen == [request.params]
    assert request.params.stop_token_ids == [7, 9]
    assert request.params.all_stop_token_ids == {2, 7, 9}
    assert params.stop_token_ids == [9] and params.all_stop_token_ids == {9}


@pytest.mark.parametrize(
    "params, error, match",
    [
        ({"n": 9}, ValueError, "max_n=8"),
        ({"logprobs": 6}, ValueError, "max_logprobs=5"),
        ({"stop_token_ids": [VOCAB]}, ValueError, "stop_token_ids"),
    ],
)
def test_params_are_verified_against_the_engine(make_processor, params, error, match) -> None:
    with pytest.raises(error, match=match):
        make_processor().process("r", [3], SamplingParams(max_tokens=1, **params))


def test_params_of_another_type_and_validate_params_errors_are_raised(make_processor) -> None:
    with pytest.raises(
        TypeError, match="sampling params must be SamplingParams, got <class 'dict'>"
    ):
        make_processor().process("r", [3], {"temperature": 0})

    def reject(params: SamplingParams) -> None:
        raise ValueError("rejected by a logits processor")

    with pytest.raises(ValueError, match="rejected by a logits processor"):
        make_processor(validate_params=reject).process("r", [3], SamplingParams())


def test_none_params_are_the_defaults(make_processor) -> None:
    assert make_processor().process("r", [3], None).params.max_tokens == SamplingParams().max_tokens


@pytest.mark.parametrize("prompt_logprobs, skip", [(None, False), (0, True)])
def test_prompt_logprobs_skip_the_prefix_cache(make_processor, prompt_logprobs, skip) -> None:
    """Cached prompt tokens would have no logits to take their logprobs from."""
    params = SamplingParams(prompt_logprobs=prompt_logprobs)
    request = make_processor().process("r", [3, 4], params)
    assert request.completions[0].seq.skip_prefix_cache is skip


def test_fan_out_beyond_the_cache_and_max_n_are_rejected(tiny_model_path, spread_prompts) -> None:
    """n x max_tokens must fit in the whole cache (40 blocks x 16 = 640 tokens); n <= max_n."""
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=40, max_n=8)
    prompt = {"prompt_token_ids": spread_prompts[1]}
    with pytest.raises(ValueError, match="more than the KV cache holds"):
        engine.add_request("wide", prompt, SamplingParams(n=3, max_tokens=None))
    with pytest.raises(ValueError, match="max_n=8"):
        engine.add_request("many", prompt, SamplingParams(n=9, max_tokens=1))
    engine.add_request("fits", prompt, SamplingParams(n=8, max_tokens=80))
    assert len(run_all(engine).outputs["fits"].outputs) == 8


@pytest.mark.parametrize("field", ["stop", "bad_words"])
def test_text_fields_without_a_tokenizer_are_refused(make_processor, field: str) -> None:
    """skip_tokenizer_init=True: no text to search for stop strings, no way to tokenize bad
    words; silently ignoring them would change the answer."""
    with pytest.raises(ValueError, match=f"{field} needs the tokenizer"):
        make_processor().process("r", [3], SamplingParams(**{field: ["x"]}))
    make_processor(ByteTokenizer()).process("r", [3], SamplingParams(**{field: ["x"]}))


def test_truncate_prompt_tokens_keeps_the_last_ones(make_processor) -> None:
    """vLLM's truncate_prompt_tokens: the prompt's last N ids; -1 keeps up to max_model_len,
    so an over-long prompt is accepted."""
    processor = make_processor()
    request = processor.process("r", [3, 4, 5, 6], SamplingParams(truncate_prompt_tokens=2))
    assert request.prompt_token_ids == [5, 6]
    long = list(range(3, 3 + MAX_MODEL_LEN + 5))
    request = processor.process("l", long, SamplingParams(max_tokens=1, truncate_prompt_tokens=-1))
    assert request.prompt_token_ids == long[-MAX_MODEL_LEN:]
