"""Structured outputs end to end through LLM on the default model. References: jsonschema
(every JSON answer parses and validates), Python's `re` (regex and Lark answers match the
language they define), the choices themselves, and the same free requests run without the
constrained ones (their tokens must not change).

One module-wide batch runs every constraint greedy and with 20 seeds at temperature 1.0,
with a token budget small enough that prompts are prefilled in chunks (only the rows that
sample get a bitmask); a preempted request resumes its grammar where it was."""

import json
import re

import jsonschema
import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.outputs import CompletionOutput
from pagedllm.sampling_params import StructuredOutputsParams


def obj(properties: dict) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


# Small and bounded (string lengths, array sizes, integer ranges), so every answer ends
# well within MAX_TOKENS: a "length" finish would be a bug, not a long answer.
PERSON = obj(
    {
        "name": {"type": "string", "minLength": 1, "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 2},
        "home": obj({"country": {"enum": ["FR", "UK", "US"]}}),
    }
)
REGEX = r"[0-9]{3}-[a-z]{2,5}"
CHOICES = ["Paris", "London", "Berlin", "Rome"]
LARK = """start: pair | "(" pair ")"
pair: NUM OP NUM
OP: "+" | "-" | "*"
NUM: /[1-9][0-9]?/
"""
LARK_LANGUAGE = r"[1-9][0-9]?[-+*][1-9][0-9]?|\([1-9][0-9]?[-+*][1-9][0-9]?\)"
MAX_TOKENS = 64
NUM_SEEDS = 20

CASES = {
    "json": (
        "Describe a person as JSON with name, age, pets and home.",
        StructuredOutputsParams(json=PERSON),
    ),
    "regex": ("Give me a code like 123-abc.", StructuredOutputsParams(regex=REGEX)),
    "choice": ("What is the capital of France?", StructuredOutputsParams(choice=CHOICES)),
    "grammar": ("Write a small sum, like 3+4.", StructuredOutputsParams(grammar=LARK)),
}


def conversation(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


def constrained(so: StructuredOutputsParams, seed: int | None = None, **kw) -> SamplingParams:
    """Greedy without a seed, temperature 1.0 with one."""
    kw = {"temperature": 0.0 if seed is None else 1.0, "max_tokens": MAX_TOKENS, **kw}
    return SamplingParams(seed=seed, structured_outputs=so, **kw)


def check_answer(kind: str, text: str) -> None:
    """The answer is in the constraint's language (jsonschema, re, the choices)."""
    if kind == "json":
        jsonschema.validate(json.loads(text), PERSON)
    elif kind == "regex":
        assert re.fullmatch(REGEX, text), text
    elif kind == "choice":
        assert text in CHOICES
    else:
        assert re.fullmatch(LARK_LANGUAGE, text), text


@pytest.fixture(scope="module")
def llm() -> LLM:
    """Float32 (batch-invariant texts); a 128-token step budget, so prompts are chunked."""
    return LLM(
        num_kv_blocks=256,
        max_model_len=512,
        max_num_batched_tokens=128,
        quantization="none",
        dtype="float32",
    )


@pytest.fixture(scope="module")
def batch(llm: LLM) -> dict[str, list[CompletionOutput]]:
    """kind -> its greedy answer then NUM_SEEDS sampled ones; "json_n4" -> the 4 answers of
    one seeded request with n=4. One batch for all."""
    conversations, params, kinds = [], [], []
    for kind, (question, so) in CASES.items():
        for seed in [None, *range(NUM_SEEDS)]:
            conversations.append(conversation(question))
            params.append(constrained(so, seed))
            kinds.append(kind)
    conversations.append(conversation(CASES["json"][0]))
    params.append(constrained(CASES["json"][1], seed=100, n=4))
    kinds.append("json_n4")
    outputs = llm.chat(conversations, params, use_tqdm=False)
    answers: dict[str, list[CompletionOutput]] = {}
    for kind, output in zip(kinds, outputs, strict=True):
        answers.setdefault(kind, []).extend(output.outputs)
    return answers


@pytest.mark.parametrize("kind", CASES)
def test_every_answer_follows_its_constraint_and_ends_with_stop(batch, kind: str) -> None:
    answers = batch[kind]
    assert len(answers) == 1 + NUM_SEEDS
    for answer in answers:
        assert answer.finish_reason == "stop", answer.text
        check_answer(kind, answer.text)
    assert len({a.text for a in answers}) > 1, "20 seeds at temperature 1 all said the same"


def test_n4_completions_each_follow_the_schema(batch) -> None:
    """Each of the n completions advances its own matcher after the fork."""
    answers = batch["json_n4"]
    assert sorted(a.index for a in answers) == [0, 1, 2, 3]
    for answer in answers:
        assert answer.finish_reason == "stop"
        check_answer("json", answer.text)


def test_free_requests_are_untouched_by_constrained_neighbours(llm: LLM) -> None:
    """Reference: the same free requests (greedy and seeded) run alone. The neighbours,
    each constraint greedy and seeded, stop at the same length (JSON may not finish)."""
    free_params = [
        SamplingParams(temperature=0, max_tokens=24),
        SamplingParams(temperature=1.0, seed=7, max_tokens=24),
    ]
    free = [conversation(CASES["json"][0]), conversation("Tell me about cats.")]
    alone = llm.chat(free, free_params, use_tqdm=False)
    kinds = [kind for kind in CASES for _ in range(2)]
    neighbours = [
        constrained(CASES[k][1], seed, max_tokens=24) for k, seed in zip(kinds, [None, 1] * 4)
    ]
    questions = [conversation(CASES[k][0]) for k in kinds]
    mixed = llm.chat(free + questions, free_params + neighbours, use_tqdm=False)
    for reference, output in zip(alone, mixed[:2], strict=True):
        assert output.outputs[0].token_ids == reference.outputs[0].token_ids
    for kind, output in zip(kinds, mixed[2:], strict=True):
        answer = output.outputs[0]
        assert answer.finish_reason == "stop" or kind == "json"
        if answer.finish_reason == "stop":
            check_answer(kind, answer.text)


def test_max_tokens_still_wins_with_length(llm: LLM, batch) -> None:
    """Reference: the greedy answer of the module's batch, which this one starts."""
    question, so = CASES["json"]
    (short,) = llm.chat(conversation(question), constrained(so, max_tokens=6), use_tqdm=False)
    assert short.outputs[0].finish_reason == "length"
    assert short.outputs[0].token_ids == batch["json"][0].token_ids[:6]


def test_a_preempted_request_resumes_its_grammar(llm: LLM, batch) -> None:
    """Preempted after 12 tokens, the sequence is recomputed from its prompt and outputs;
    its matcher follows the outputs, so the answer goes on as if nothing happened.
    Reference: the greedy answer of the module's batch."""
    engine = llm.llm_engine
    question, so = CASES["json"]
    prompt = llm.get_tokenizer().apply_chat_template(
        conversation(question), add_generation_prompt=True, tokenize=True, return_dict=False
    )
    engine.add_request("preempted", {"prompt_token_ids": list(prompt)}, constrained(so))
    seq = engine.requests["preempted"].completions[0].seq
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
        if seq.num_output_tokens == 12 and seq.num_preemptions == 0:
            engine.scheduler.running.remove(seq)
            engine.scheduler._preempt(seq)
    assert seq.num_preemptions == 1
    assert outputs[-1].outputs[0].token_ids == batch["json"][0].token_ids


def test_logprobs_are_over_the_allowed_tokens(llm: LLM) -> None:
    """Raw logprobs come after the bitmask (vLLM's order): a greedy constrained token is
    the top-ranked one among what the logprobs cover, though the model alone would prefer
    free text."""
    (output,) = llm.chat(
        conversation(CASES["choice"][0]), constrained(CASES["choice"][1], logprobs=2)
    )
    answer = output.outputs[0]
    assert answer.text in CHOICES
    for token, logprobs in zip(answer.token_ids, answer.logprobs, strict=True):
        assert logprobs[token].rank == 1


def test_a_bad_constraint_is_a_value_error_naming_it(llm: LLM) -> None:
    bad = SamplingParams(structured_outputs=StructuredOutputsParams(regex="[0-9"))
    with pytest.raises(ValueError, match="structured_outputs has an unsupported or invalid regex"):
        llm.generate("a", bad, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
