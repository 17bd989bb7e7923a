"""SamplingParams against vLLM's defaults, ranges and messages (vllm/sampling_params.py)."""

import pytest

from pagedllm.sampling_params import (
    ReasoningTokens,
    RequestOutputKind,
    SamplingParams,
    SamplingType,
    StructuredOutputsParams,
)


def test_defaults_are_vllms() -> None:
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.max_tokens, p.min_tokens, p.logprobs, p.prompt_logprobs) == (16, 0, None, None)
    assert (p.stop, p.stop_token_ids, p.seed, p.logit_bias) == ([], [], None, None)
    assert p.detokenize and p.skip_special_tokens and p.spaces_between_special_tokens
    assert not p.ignore_eos and not p.include_stop_str_in_output
    assert p.output_kind is RequestOutputKind.CUMULATIVE
    assert p.sampling_type == SamplingType.RANDOM


def test_normalisation() -> None:
    """stop -> list, stop_token_ids -> list, top_k -1 -> 0, logit_bias clamped to +-100."""
    p = SamplingParams(stop="\n", stop_token_ids=(3, 4), top_k=-1, logit_bias={"5": 300, 6: -1})
    assert p.stop == ["\n"] and p.stop_token_ids == [3, 4] and p.top_k == 0
    assert p.logit_bias == {5: 100.0, 6: -1.0}
    assert SamplingParams(max_tokens=None).max_tokens is None


def test_greedy_turns_off_filters_that_cannot_change_an_argmax() -> None:
    p = SamplingParams(temperature=0.0, top_p=0.5, top_k=3, min_p=0.2)
    assert p.sampling_type == SamplingType.GREEDY
    assert (p.top_p, p.top_k, p.min_p) == (1.0, 0, 0.0)
    assert SamplingParams(seed=3).sampling_type == SamplingType.RANDOM_SEED


def test_vllms_conversions() -> None:
    """A positive temperature below 0.01 is raised to it (only 0 is greedy), seed -1 is
    no seed, and logprobs booleans are the ints they equal."""
    low = SamplingParams(temperature=1e-6)
    assert (low.temperature, low.sampling_type) == (0.01, SamplingType.RANDOM)
    assert SamplingParams(temperature=0.5).temperature == 0.5
    assert SamplingParams(seed=-1).seed is None
    both = SamplingParams(logprobs=True, prompt_logprobs=False)
    assert (both.logprobs, both.prompt_logprobs) == (1, 0)


@pytest.mark.parametrize(
    ("kwargs", "allowed"),
    [
        ({"n": 0}, "at least 1"),
        ({"presence_penalty": 2.5}, "[-2, 2]"),
        ({"frequency_penalty": -2.1}, "[-2, 2]"),
        ({"repetition_penalty": 0.0}, "> 0"),
        ({"temperature": -0.1}, ">= 0"),
        ({"temperature": float("nan")}, "finite"),
        ({"top_p": 0.0}, "(0, 1]"),
        ({"top_p": 1.5}, "(0, 1]"),
        ({"top_k": -2}, "at least 1"),
        ({"min_p": 1.2}, "[0, 1]"),
        ({"max_tokens": 0}, "at least 1"),
        ({"min_tokens": -1}, ">= 0"),
        ({"min_tokens": 5, "max_tokens": 4}, "max_tokens=4"),
        ({"logprobs": -2}, "-1"),
        ({"prompt_logprobs": -3}, "-1"),
        ({"stop": ["ok", ""]}, "empty"),
        ({"bad_words": [" "]}, "empty"),
        ({"allowed_token_ids": []}, "non-empty"),
        ({"temperature": 1e39}, "float32"),
        ({"repetition_penalty": 1e39}, "float32"),
        ({"seed": 2**64}, "64-bit"),
        ({"seed": -(2**63) - 1}, "64-bit"),
        ({"n": 2**63}, "64-bit"),
        ({"top_k": 2**64}, "64-bit"),
        ({"stop": ["x"], "detokenize": False}, "detokenize=False"),
        ({"truncate_prompt_tokens": 0}, ">= 1, or -1"),
        ({"truncate_prompt_tokens": -2}, ">= 1, or -1"),
    ],
)
def test_out_of_range_raises_value_error_naming_field_value_and_range(
    kwargs: dict, allowed: str
) -> None:
    name, value = list(kwargs.items())[0]
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs)
    message = str(info.value)
    assert name in message and allowed in message
    assert repr(value) in message or str(value) in message


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n": 1.5},
        {"n": True},
        {"temperature": "0.5"},
        {"top_k": 2.0},
        {"seed": "1"},
        {"stop": 3},
        {"stop_token_ids": "12"},
        {"logit_bias": [1, 2]},
        {"logit_bias": {"x": 1.0}},
        {"ignore_eos": 1},
        {"output_kind": "delta"},
    ],
)
def test_wrong_types_raise_type_error_naming_field(kwargs: dict) -> None:
    name = list(kwargs)[0]
    with pytest.raises(TypeError, match=name):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"stop_token_ids": [10]}, "stop_token_ids"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"allowed_token_ids": [0, 12]}, "allowed_token_ids"),
        ({"logprobs": 6}, "logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"reasoning_tokens": ReasoningTokens([3], False, start_token_id=10)}, "reasoning_tokens"),
    ],
)
def test_verify_checks_vocab_and_logprobs_cap(kwargs: dict, field: str) -> None:
    """Reference: vLLM's processor checks, token ids in [0, vocab), logprobs <= cap."""
    params = SamplingParams(**kwargs)
    with pytest.raises(ValueError, match=field):
        params.verify(vocab_size=10, max_logprobs=5)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"logit_bias": {5: 1e39}}, "logit_bias[5] must be a finite number within float32"),
        ({"stop_token_ids": [2**70]}, "stop_token_ids[0] must be an int in the signed 64-bit"),
        ({"stop": ["ok", "\ud800"]}, "stop is not valid Unicode: lone surrogate"),
        ({"bad_words": ["x\udfff"]}, "bad_words is not valid Unicode: lone surrogate"),
    ],
)
def test_values_inside_containers_are_checked(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs)
    assert words in str(info.value)


def test_edges_of_the_ranges_are_accepted() -> None:
    """Reference: the signed 64-bit range (vLLM's seed check) and float32's largest value."""
    assert SamplingParams(seed=2**63 - 1).seed == 2**63 - 1
    assert SamplingParams(seed=-(2**63)).seed == -(2**63)
    assert SamplingParams(temperature=3.4e38).temperature == 3.4e38


def test_verify_caps_n_at_max_n() -> None:
    """OpenAI's cap of 128 by default; the engine passes its max_n."""
    SamplingParams(n=128).verify(10, 5)
    with pytest.raises(ValueError, match="max_n=128"):
        SamplingParams(n=129).verify(10, 5)
    with pytest.raises(ValueError, match="max_n=4"):
        SamplingParams(n=5).verify(10, 5, max_n=4)


def test_verify_accepts_valid_and_uncapped() -> None:
    SamplingParams(stop_token_ids=[9], logit_bias={0: 1}, logprobs=5).verify(10, 5)
    SamplingParams(logprobs=-1, prompt_logprobs=-1).verify(10, -1)


class WordTokenizer:
    """Greedy longest match over a tiny vocabulary where " bad" is its own token."""

    vocab = {"bad": 1, " bad": 2, "word": 3, " word": 4, " ": 5, "ugly": 7}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            piece = max((t for t in self.vocab if text.startswith(t, i)), key=len)
            ids.append(self.vocab[piece])
            i += len(piece)
        return ids


def test_update_from_tokenizer_adds_the_leading_space_variant_as_vllm() -> None:
    """vLLM rule: keep the spaced variant if its first token differs and lengths match."""
    params = SamplingParams(bad_words=["bad word", " ugly"])
    params.update_from_tokenizer(WordTokenizer())
    assert params.bad_words_token_ids == [[1, 4], [2, 4], [7]]
    with pytest.raises(ValueError, match="bad_words"):
        params.verify(vocab_size=5, max_logprobs=0)


def test_update_from_generation_config_records_eos() -> None:
    params = SamplingParams(stop_token_ids=[4])
    params.update_from_generation_config({"eos_token_id": [2, 3]}, model_eos_token_id=2)
    assert params.all_stop_token_ids == {2, 3, 4}
    assert params.stop_token_ids == [3, 4]
    ignoring = SamplingParams(ignore_eos=True)
    ignoring.update_from_generation_config({"eos_token_id": 3}, model_eos_token_id=2)
    assert ignoring.all_stop_token_ids == {2, 3} and ignoring.stop_token_ids == []


def test_clone_is_deep_and_buffer_length() -> None:
    params = SamplingParams(stop=["abc", "de"], extra_args={"k": [1]})
    copy = params.clone()
    copy.extra_args["k"].append(2)
    assert params.extra_args == {"k": [1]} and copy == SamplingParams(
        stop=["abc", "de"], extra_args={"k": [1, 2]}
    )
    assert params.output_text_buffer_length == 2
    assert (
        SamplingParams(stop="abc", include_stop_str_in_output=True).output_text_buffer_length == 0
    )


@pytest.mark.parametrize(
    "kwargs, kind",
    [
        ({"json": {"type": "object"}}, "json"),
        ({"json": '{"type": "integer"}'}, "json"),
        ({"regex": "[a-z]+"}, "regex"),
        ({"choice": ["yes", "no"]}, "choice"),
        ({"grammar": 'start: "a"'}, "grammar"),
        ({"json_object": True}, "json_object"),
        ({"json_object": True, "whitespace_pattern": " ?"}, "json_object"),
    ],
)
def test_structured_outputs_one_kind(kwargs: dict, kind: str) -> None:
    params = SamplingParams(structured_outputs=StructuredOutputsParams(**kwargs))
    assert params.structured_outputs.kind == kind
    assert params.clone().structured_outputs == params.structured_outputs


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"json": {"type": "object"}, "regex": "a"}, r"exactly one of .* got \['json', 'regex'\]"),
        ({"choice": ["a"], "grammar": "start: x"}, r"got \['choice', 'grammar'\]"),
        ({}, r"structured_outputs must be exactly one of .* got \[\]"),
        ({"json": '{"type": '}, "structured_outputs.json is not valid JSON"),
        ({"json": "[1, 2]"}, "structured_outputs.json must be a JSON object"),
        ({"regex": ""}, "structured_outputs.regex must be a non-empty str"),
        ({"choice": []}, "structured_outputs.choice must be a non-empty list"),
        ({"regex": "a", "whitespace_pattern": " "}, "whitespace_pattern must be None with regex"),
        ({"grammar": "start: \ud800"}, "structured_outputs.grammar is not valid Unicode"),
        ({"json": {"enum": ["\ud800"]}}, "structured_outputs.json is not valid Unicode"),
    ],
)
def test_structured_outputs_bad_shapes_name_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StructuredOutputsParams(**kwargs)


def test_structured_outputs_types() -> None:
    with pytest.raises(TypeError, match="structured_outputs must be a StructuredOutputsParams"):
        SamplingParams(structured_outputs={"regex": "a"})
    with pytest.raises(TypeError, match="structured_outputs.json must be a dict or a str"):
        StructuredOutputsParams(json=3)
    with pytest.raises(TypeError, match="structured_outputs.json is not JSON-serializable"):
        StructuredOutputsParams(json={"const": object()})


def test_reasoning_tokens_shapes_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"reasoning_tokens.end_token_ids must be a non-empty"):
        ReasoningTokens([])
    with pytest.raises(TypeError, match="reasoning_tokens.end_token_ids must be a list of ints"):
        ReasoningTokens(5)
    with pytest.raises(TypeError, match="reasoning_tokens.in_reasoning must be a bool"):
        ReasoningTokens([5], in_reasoning="yes")
    with pytest.raises(TypeError, match="reasoning_tokens must be a ReasoningTokens or None"):
        SamplingParams(reasoning_tokens=[5])


def test_vllms_backend_options_are_accepted_and_structural_tag_refused() -> None:
    """disable_fallback, disable_any_whitespace and disable_additional_properties ask for
    what llguidance already does here; structural_tag is not implemented."""
    params = StructuredOutputsParams(
        json={"type": "object"},
        disable_fallback=True,
        disable_any_whitespace=True,
        disable_additional_properties=True,
    )
    assert params.kind == "json"
    with pytest.raises(ValueError, match="structural_tag is not supported"):
        StructuredOutputsParams(structural_tag='{"structures": []}')
    with pytest.raises(ValueError, match="disable_fallback must be a bool"):
        StructuredOutputsParams(regex="a", disable_fallback="yes")
