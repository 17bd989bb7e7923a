"""The server's streamed and plain answers to the same greedy request are the same tokens and
logprobs, bit for bit, on the default model as shipped (its Q4_1 blocks): the second of the
two hits the prefix cache, and the request may share steps with the other one's. Reference:
each order's first answer. (The engine's side, on every way to run the model:
tests/test_batch_invariance.py.)"""

from collections.abc import Iterator

import openai
import pytest

from tests.entrypoints.openai.remote_server import MODEL_NAME, remote_server
from tests.test_batch_invariance import PROMPT


@pytest.fixture(scope="module")
def shipped() -> Iterator[openai.OpenAI]:
    """A server on the default model's GGUF blocks (the shared test server dequantizes)."""
    with remote_server("--quantization", "gguf", "--dtype", "auto") as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _plain(client: openai.OpenAI, prompt: str) -> tuple[str, list, list]:
    choice = client.completions.create(**_request(prompt)).choices[0]
    return choice.text, choice.logprobs.token_logprobs, choice.logprobs.top_logprobs


def _streamed(client: openai.OpenAI, prompt: str) -> tuple[str, list, list]:
    text, token_logprobs, top_logprobs = "", [], []
    for chunk in client.completions.create(**_request(prompt), stream=True):
        for choice in chunk.choices:
            text += choice.text
            if choice.logprobs is not None:
                token_logprobs += choice.logprobs.token_logprobs
                top_logprobs += choice.logprobs.top_logprobs
    return text, token_logprobs, top_logprobs


def _request(prompt: str) -> dict:
    return dict(
        model=MODEL_NAME,
        prompt=prompt,
        max_tokens=16,
        temperature=0,
        logprobs=5,
        extra_body={"ignore_eos": True},
    )


@pytest.mark.parametrize("streamed_first", [False, True])
def test_streamed_and_plain_answers_are_the_same_bits(
    shipped: openai.OpenAI, streamed_first: bool
) -> None:
    prompt = PROMPT + (" Be brief." if streamed_first else " Be thorough.")
    first, second = (_streamed, _plain) if streamed_first else (_plain, _streamed)
    reference = first(shipped, prompt)
    assert len(reference[1]) == 16
    assert second(shipped, prompt) == reference
