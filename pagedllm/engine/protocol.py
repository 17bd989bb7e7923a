"""EngineClient: what the entry points (the OpenAI server) need of an engine, and no more:
its config and tokenizer, generate / encode / abort, the LoRA adapters it serves, its stats,
and whether it is alive."""

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol

from transformers import PreTrainedTokenizerBase

from pagedllm.config import EngineConfig
from pagedllm.engine.input_processor import PromptType
from pagedllm.engine.stats import EngineStats
from pagedllm.lora.request import LoRARequest
from pagedllm.outputs import PoolingRequestOutput, RequestOutput
from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import SamplingParams


class EngineClient(Protocol):
    stats: EngineStats  # the latest snapshot, for /metrics
    stats_per_engine: list[EngineStats]  # the same by data-parallel replica (`engine` label)
    dead: asyncio.Event  # set once the engine can serve no more
    dead_error: Exception | None

    @property
    def config(self) -> EngineConfig: ...

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase | None: ...

    @property
    def is_running(self) -> bool: ...

    def start(self) -> None:
        """Start serving, bound to the running event loop."""

    async def shutdown(self) -> None:
        """Stop serving; open requests end with an error."""

    def close(self) -> None:
        """Release the model's processes (tensor-parallel workers)."""

    def generate(
        self,
        prompt: PromptType,
        params: SamplingParams,
        request_id: str,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]: ...

    def encode(
        self, prompt: PromptType, params: PoolingParams, request_id: str
    ) -> AsyncIterator[PoolingRequestOutput]:
        """A pooling model's request: one output, when pooled."""

    def abort(self, request_id: str) -> None: ...

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        """Check and load the adapter; ValueError for one it cannot serve (or LoRA off)."""

    async def remove_lora(self, lora_int_id: int) -> bool: ...

    async def list_loras(self) -> set[int]: ...

    def has_request(self, request_id: str) -> bool:
        """Whether a request of this id is in flight."""
