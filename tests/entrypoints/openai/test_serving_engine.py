"""OpenAIServing (pagedllm/entrypoints/openai/serving_engine.py) over light fakes of the
engine, tokenizer and HTTP request. References: vLLM's context-length rule (prompt +
max_tokens <= max_model_len; no max_tokens means the room left) and its error codes,
OpenAI's 404 model_not_found, and HTTP's 4xx-before-200 contract for rejected requests."""

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest

from pagedllm.config import CacheConfig
from pagedllm.engine.stats import EngineStats
from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.metrics import ServerMetrics
from pagedllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from pagedllm.entrypoints.openai.serving_engine import OpenAIServing
from pagedllm.entrypoints.openai.serving_models import OpenAIServingModels
from pagedllm.outputs import CompletionOutput, RequestOutput
from pagedllm.sampling_params import RequestOutputKind

MAX_MODEL_LEN, VOCAB_SIZE = 100, 50
NAMES = ["first", "alias"]


class FakeTokenizer:
    """The AsyncTokenizer calls OpenAIServing makes; the chat template is a fake."""

    sync = None

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.calls = fail, []

    async def apply_chat_template(
        self, conversation: list[dict], chat_template: str | None, template_kwargs: dict
    ) -> tuple[str, list[int]]:
        self.calls.append((conversation, chat_template, template_kwargs))
        if self.fail:
            raise RuntimeError("Conversation roles must alternate user/assistant")
        return "text", [1, 2, 3]


def make_serving(tokenizer: FakeTokenizer | None = None) -> OpenAIServing:
    model_config = SimpleNamespace(
        max_model_len=MAX_MODEL_LEN,
        vocab_size=VOCAB_SIZE,
        sampling_defaults={},
        max_tokens_cap=None,
    )
    engine = SimpleNamespace(config=SimpleNamespace(model_config=model_config))
    stats = EngineStats(0, 0, 0, 0.0, 1, 1, 0, 0, 0, 0)
    metrics = ServerMetrics(lambda: [stats], NAMES[0], MAX_MODEL_LEN, CacheConfig())
    models = OpenAIServingModels(engine, NAMES)
    return OpenAIServing(engine, tokenizer or FakeTokenizer(), models, metrics, "TEMPLATE")


def test_check_model_answers_with_the_served_name_or_404() -> None:
    serving = make_serving()
    assert serving.check_model(None) == ("first", None)
    assert [serving.check_model(name) for name in NAMES] == [(name, None) for name in NAMES]
    with pytest.raises(OpenAIError) as info:
        serving.check_model("gpt-9")
    error = info.value
    assert (error.status_code, error.param, error.code) == (404, "model", "model_not_found")
    assert "gpt-9" in error.message


@pytest.mark.parametrize(
    "requested, prompt_len, expected",
    [
        (None, 30, 70),  # the room left
        (None, 99, 1),
        (70, 30, 70),  # exactly fills the context
        (1, 99, 1),
        (0, 30, 0),  # < 1 is SamplingParams' to reject, with its own message
        (-3, 30, -3),
    ],
)
def test_max_tokens_context_rule(requested: int | None, prompt_len: int, expected: int) -> None:
    assert make_serving().max_tokens(requested, prompt_len, "prompt") == expected


@pytest.mark.parametrize(
    "requested, prompt_len, param, code, words",
    [
        (71, 30, "max_tokens", "context_length_exceeded", "requested 101 tokens (30 in the"),
        (2, 99, "max_tokens", "context_length_exceeded", "maximum context length is 100"),
        (None, 100, "messages", "context_length_exceeded", "the messages has 100 tokens"),
        (5, 150, "messages", "context_length_exceeded", "leaving no room"),
        (5, 0, "messages", None, "empty"),
    ],
)
def test_max_tokens_errors_name_param_and_code(
    requested: int | None, prompt_len: int, param: str, code: str | None, words: str
) -> None:
    with pytest.raises(OpenAIError) as info:
        make_serving().max_tokens(requested, prompt_len, "messages")
    error = info.value
    assert (error.status_code, error.param, error.code) == (400, param, code)
    assert words in error.message


def test_check_token_ids_against_the_vocabulary() -> None:
    serving = make_serving()
    assert serving.check_token_ids((0, VOCAB_SIZE - 1), "tokens") == [0, VOCAB_SIZE - 1]
    for bad in ([VOCAB_SIZE], [-1], [True]):
        with pytest.raises(OpenAIError) as info:
            serving.check_token_ids(bad, "tokens")
        assert (info.value.status_code, info.value.param) == (400, "tokens")
        assert "outside the vocabulary [0, 50)" in info.value.message


def test_apply_chat_template_passes_template_messages_and_options() -> None:
    """vLLM's template options: tools, add_generation_prompt, continue_final_message and
    chat_template_kwargs reach the template; the last two flags exclude each other."""
    tokenizer = FakeTokenizer()
    serving = make_serving(tokenizer)
    tools = [{"type": "function", "function": {"name": "f"}}]
    request = ChatCompletionRequest(
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        add_generation_prompt=False,
        continue_final_message=True,
        chat_template_kwargs={"enable_thinking": False},
        tools=tools,
        tool_choice="none",  # no generic-format system prompt: the messages as they are
    )
    assert asyncio.run(serving.apply_chat_template(request)) == ("text", [1, 2, 3])
    options = {"enable_thinking": False, "tools": tools, "add_generation_prompt": False}
    options["continue_final_message"] = True
    assert tokenizer.calls == [([{"role": "user", "content": "Hi"}], "TEMPLATE", options)]
    both = request.model_copy(update={"add_generation_prompt": True})
    with pytest.raises(OpenAIError, match="needs add_generation_prompt=false") as info:
        asyncio.run(serving.apply_chat_template(both))
    assert info.value.param == "continue_final_message"


def test_a_failing_chat_template_is_the_messages_400() -> None:
    serving = make_serving(FakeTokenizer(fail=True))
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "a"}])
    with pytest.raises(OpenAIError) as info:
        asyncio.run(serving.apply_chat_template(request))
    assert (info.value.status_code, info.value.param) == (400, "messages")
    assert "must alternate" in info.value.message


def test_sampling_params_are_delta_and_range_errors_name_the_field() -> None:
    serving = make_serving()
    params = serving.sampling_params(CompletionRequest(prompt="a", top_k=3), 9, 2)
    assert (params.max_tokens, params.logprobs, params.top_k) == (9, 2, 3)
    assert params.output_kind is RequestOutputKind.DELTA
    with pytest.raises(OpenAIError) as info:
        serving.sampling_params(CompletionRequest(prompt="a", top_p=1.5), 9, None)
    assert (info.value.status_code, info.value.param) == (400, "top_p")
    assert "(0, 1]" in info.value.message


class FakeRequest:
    """A starlette Request's receive(): blocks, or says the client has gone."""

    def __init__(self, disconnected: bool = False) -> None:
        self.disconnected = disconnected

    async def receive(self) -> dict:
        if self.disconnected:
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()
        return {}


def delta(index: int, text: str, finished: bool = False) -> RequestOutput:
    reason = "length" if finished else None
    return RequestOutput(
        "r", "p", [1], None, [CompletionOutput(index, text, [7], None, None, reason)], finished
    )


async def scripted(
    items: list[object], closed: list[bool], delay: float = 0.0
) -> AsyncIterator[object]:
    """Yields `items`, raising the ones that are exceptions; records that it was closed."""
    try:
        await asyncio.sleep(delay)
        for item in items:
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        closed.append(True)


async def drain(stream: AsyncIterator[object]) -> list[object]:
    return [item async for item in stream]


def test_prime_returns_every_item_after_the_first_arrived() -> None:
    closed = []

    async def main() -> list[object]:
        primed = await make_serving().prime(scripted(["a", "b", "c"], closed), FakeRequest())
        return await drain(primed)

    assert asyncio.run(main()) == ["a", "b", "c"]
    assert closed == [True]


def test_prime_turns_an_engine_rejection_into_a_4xx_and_closes_the_stream() -> None:
    """The engine's ValueError naming a field arrives before any output: 400, not a 200
    stream."""
    closed = []
    error = ValueError("n must be at most max_n=4, got 5")
    with pytest.raises(OpenAIError) as info:
        asyncio.run(make_serving().prime(scripted([error], closed), FakeRequest()))
    assert (info.value.status_code, info.value.param) == (400, "n")
    assert closed == [True]


def test_prime_gives_499_when_the_client_leaves_before_the_first_item() -> None:
    closed = []
    stream = scripted(["late"], closed, delay=10.0)
    with pytest.raises(OpenAIError) as info:
        asyncio.run(make_serving().prime(stream, FakeRequest(disconnected=True)))
    assert info.value.status_code == 499
    assert closed == [True]


def test_collect_accumulates_deltas_per_prompt() -> None:
    """Reference: the concatenation of each prompt's DELTA texts."""
    items = [
        (1, delta(0, "x")),
        (0, delta(0, "He")),
        (0, delta(0, "llo", True)),
        (1, delta(0, "y", True)),
    ]
    closed = []
    totals = asyncio.run(make_serving().collect(scripted(items, closed), 2))
    assert [t.outputs[0].text for t in totals] == ["Hello", "xy"]
    assert [t.outputs[0].token_ids for t in totals] == [[7, 7], [7, 7]]
    assert all(t.finished for t in totals) and closed == [True]


def test_collect_turns_an_engine_error_into_its_http_error() -> None:
    items = [(0, delta(0, "a")), RuntimeError("the sampler broke")]
    with pytest.raises(OpenAIError) as info:
        asyncio.run(make_serving().collect(scripted(items, []), 1))
    assert info.value.status_code == 500 and "sampler broke" in info.value.message


@pytest.mark.parametrize("running", [set(), {"cmpl-abc"}, {"cmpl-abc-0"}])
def test_a_client_request_id_in_flight_gets_a_suffix(running: set[str]) -> None:
    """vLLM's `cmpl-<X-Request-Id>`; one a request in flight runs under (a retry, a batch's
    `-N` prompts) gets a random suffix, so neither request fails for the other."""
    serving = make_serving()
    serving.engine.has_request = running.__contains__
    raw = SimpleNamespace(headers={"X-Request-Id": "abc"})
    request_id = serving.request_id("cmpl", raw)
    if not running:
        assert request_id == "cmpl-abc"
    else:
        assert request_id.startswith("cmpl-abc-") and request_id not in running | {"cmpl-abc"}
    assert serving.request_id("cmpl", SimpleNamespace(headers={})).startswith("cmpl-")
