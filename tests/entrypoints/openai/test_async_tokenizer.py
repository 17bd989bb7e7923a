"""AsyncTokenizer (pagedllm/entrypoints/openai/async_tokenizer.py) on the default model's
tokenizer. Reference: the same tokenizer called directly; many concurrent calls (each pool
thread has its own copy) give the same answers."""

import asyncio

import pytest
from transformers import PreTrainedTokenizerBase

from pagedllm.config import ModelConfig
from pagedllm.engine.tokenizer import get_tokenizer
from pagedllm.entrypoints.openai.async_tokenizer import AsyncTokenizer

TEXTS = ["Hello world", "The capital of France is", "1, 2, 3, 4", "ünïcödé ✓", "a" * 5000]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return get_tokenizer(ModelConfig.create(None, "auto", None, "cpu"))


def test_matches_the_tokenizer_under_concurrency(tokenizer: PreTrainedTokenizerBase) -> None:
    async def main() -> None:
        tok = AsyncTokenizer(tokenizer, num_threads=3)
        try:
            texts = TEXTS * 8
            encoded = await asyncio.gather(*(tok.encode(t) for t in texts))
            assert encoded == [tokenizer.encode(t) for t in texts]
            decoded = await asyncio.gather(*(tok.decode(ids) for ids in encoded))
            assert decoded == [tokenizer.decode(ids) for ids in encoded]
            assert await tok.encode("Hi", add_special_tokens=False) == tokenizer.encode(
                "Hi", add_special_tokens=False
            )
        finally:
            tok.shutdown()

    asyncio.run(main())


def test_chat_template_matches(tokenizer: PreTrainedTokenizerBase) -> None:
    conversation = [{"role": "user", "content": "What is 2 + 2?"}]
    expected = tokenizer.apply_chat_template(
        conversation, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)

    async def main() -> tuple[str, list[int]]:
        tok = AsyncTokenizer(tokenizer)
        try:
            return await tok.apply_chat_template(
                conversation, None, {"add_generation_prompt": True}
            )
        finally:
            tok.shutdown()

    assert asyncio.run(main()) == (text, list(expected))
