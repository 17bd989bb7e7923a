"""A stand-in for vLLM's offline API, just what pagedllm/benchmarks/vllm_driver.py uses: `LLM`
with `generate` and `llm_engine` (`add_request`, `step`, `has_unfinished_requests`,
`model_config.dtype`), and `SamplingParams`. Put its folder on PYTHONPATH.

Every request gets the tokens 0, 1, 2, ... up to its max_tokens; the engine gives each running
request one token per `step`, which takes STEP_S. `LLM(...)` writes its keyword arguments and
$VLLM_CPU_KVCACHE_SPACE as JSON to the file $FAKE_VLLM_RECORD, and fails if $FAKE_VLLM_FAIL
is set.
"""

import json
import os
import time
from dataclasses import dataclass
from types import SimpleNamespace

from vllm.sampling_params import SamplingParams

__version__ = "0.0.fake"
STEP_S = 0.002


@dataclass
class CompletionOutput:
    token_ids: list[int]


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool


class LLMEngine:
    def __init__(self, dtype: str) -> None:
        self.model_config = SimpleNamespace(dtype=dtype)
        self._running: dict[str, tuple[list[int], SamplingParams, list[int]]] = {}

    def add_request(self, request_id: str, prompt: dict, params: SamplingParams) -> None:
        self._running[request_id] = (prompt["prompt_token_ids"], params, [])

    def has_unfinished_requests(self) -> bool:
        return bool(self._running)

    def step(self) -> list[RequestOutput]:
        time.sleep(STEP_S)
        outputs = []
        for request_id, (prompt, params, tokens) in list(self._running.items()):
            tokens.append(len(tokens))
            finished = len(tokens) == params.max_tokens
            if finished:
                del self._running[request_id]
            delta = CompletionOutput(tokens[-1:])
            outputs.append(RequestOutput(request_id, prompt, [delta], finished))
        return outputs


class LLM:
    def __init__(self, model: str, dtype: str, max_model_len: int, seed: int) -> None:
        record = {"model": model, "dtype": dtype, "max_model_len": max_model_len, "seed": seed}
        record["kv_cache_space"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
        with open(os.environ["FAKE_VLLM_RECORD"], "w") as f:
            json.dump(record, f)
        if os.environ.get("FAKE_VLLM_FAIL"):
            raise RuntimeError("the fake vLLM fails as asked")
        self.llm_engine = LLMEngine("torch.bfloat16" if dtype == "auto" else f"torch.{dtype}")

    def generate(
        self, prompts: list[dict], params: list[SamplingParams], use_tqdm: bool = True
    ) -> list[RequestOutput]:
        return [
            RequestOutput(
                str(i), p["prompt_token_ids"], [CompletionOutput(list(range(s.max_tokens)))], True
            )
            for i, (p, s) in enumerate(zip(prompts, params))
        ]
