"""AsyncTokenizer: the server's tokenization and chat templates, off the event loop.

Tokenizing a 10 MB prompt takes seconds; on the event loop it would stall every other
client. Each call runs in a small thread pool instead (the Rust tokenizer releases the GIL
while it works). HF fast tokenizers are not safe to share between threads (a call sets
truncation and padding state), so each pool thread uses its own copy; the engine thread's
tokenizer stays the engine's alone. `sync` is one more copy, for the event loop's own
cheap calls (decoding one token of a logprobs list).
"""

import asyncio
import copy
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from transformers import PreTrainedTokenizerBase

from pagedllm.classifier_config import ClassifierConfig
from pagedllm.scoring import cross_encoder_prompt

T = TypeVar("T")

NUM_TOKENIZER_THREADS = 2


class AsyncTokenizer:
    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, num_threads: int = NUM_TOKENIZER_THREADS
    ) -> None:
        self._template = tokenizer
        self.sync = copy.deepcopy(tokenizer)
        self._copy_lock = threading.Lock()
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix="pagedllm-tokenizer")

    def _own_tokenizer(self) -> PreTrainedTokenizerBase:
        tokenizer = getattr(self._local, "tokenizer", None)
        if tokenizer is None:
            with self._copy_lock:
                tokenizer = self._local.tokenizer = copy.deepcopy(self._template)
        return tokenizer

    async def _run(self, call: Callable[[PreTrainedTokenizerBase], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: call(self._own_tokenizer()))

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return await self._run(lambda t: t.encode(text, add_special_tokens=add_special_tokens))

    async def token_strs(self, token_ids: list[int]) -> list[str]:
        """Each id's token as the vocabulary spells it (convert_ids_to_tokens)."""
        return await self._run(lambda t: t.convert_ids_to_tokens(token_ids))

    async def decode(self, token_ids: list[int]) -> str:
        return await self._run(lambda t: t.decode(token_ids))

    async def apply_chat_template(
        self, conversation: list[dict], chat_template: str | None, template_kwargs: dict
    ) -> tuple[str, list[int]]:
        """(the rendered text, its token ids), tokenized as transformers' own
        `apply_chat_template(tokenize=True)` does: the template places special tokens."""

        def render(t: PreTrainedTokenizerBase) -> tuple[str, list[int]]:
            text = t.apply_chat_template(
                conversation, chat_template=chat_template, tokenize=False, **template_kwargs
            )
            return text, t.encode(text, add_special_tokens=False)

        return await self._run(render)

    async def cross_encoder_prompt(
        self,
        config: ClassifierConfig,
        text_1: str,
        text_2: str,
        score_template: str | None,
        max_length: int | None = None,
    ) -> tuple[str, list[int]]:
        """A cross-encoder's pair as one prompt: pagedllm/scoring.py's cross_encoder_prompt."""
        return await self._run(
            lambda t: cross_encoder_prompt(
                t, config, text_1, text_2, score_template, max_length=max_length
            )
        )

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
