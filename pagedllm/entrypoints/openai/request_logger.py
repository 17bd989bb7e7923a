"""vLLM's --enable-log-requests: one INFO line per request the server submits (its id,
prompt, prompt token ids and parameters), the prompt and ids cut to --max-log-len, and one
when a request is aborted because its client went away (or cancelled it). The id is the
one the client sees (the response's `id`, with `-N` for the Nth prompt of a batch). Off
by default, as in vLLM: prompts can hold what operators should not keep in logs."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import TypeVar

from pagedllm.logger import init_logger
from pagedllm.outputs import PoolingRequestOutput, RequestOutput

logger = init_logger("pagedllm.requests")

T = TypeVar("T", RequestOutput, PoolingRequestOutput)


class RequestLogger:
    def __init__(self, max_log_len: int | None = None) -> None:
        """`max_log_len`: at most this many characters of the prompt and this many of its
        token ids (None: all of them)."""
        self.max_log_len = max_log_len

    def log(
        self, request_id: str, prompt: dict, params: object, lora_request: object = None
    ) -> None:
        """vLLM's "Received request" line: the prompt, the params, the prompt's ids and the
        LoRA adapter it runs with (None: the base model)."""
        text = prompt.get("prompt")
        ids = prompt.get("prompt_token_ids")
        if self.max_log_len is not None:
            text = None if text is None else text[: self.max_log_len]
            ids = None if ids is None else ids[: self.max_log_len]
        logger.info(
            "Received request %s: prompt: %r, params: %r, prompt_token_ids: %s, lora_request: %s",
            request_id,
            text,
            params,
            ids,
            lora_request,
        )

    async def watch(self, request_id: str, outputs: AsyncIterator[T]) -> AsyncIterator[T]:
        """`outputs` passed through; closed or cancelled before its last output (which
        aborts the request), it is logged as aborted, as vLLM logs it."""
        finished = False
        try:
            async with aclosing(outputs):
                async for output in outputs:
                    finished = output.finished
                    yield output
        except (GeneratorExit, asyncio.CancelledError):
            if not finished:
                logger.info("Aborted request %s.", request_id)
            raise
