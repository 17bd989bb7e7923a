"""Driving an LLMEngine step by step on the tiny random checkpoints (tests/models/tiny_models.py):
shared by the engine tests that need a whole engine."""

from dataclasses import dataclass, field

from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.outputs import RequestOutput
from pagedllm.sampling_params import SamplingParams

MAX_TOKENS = 32
LLAMA = "llama-gqa-llama3"


def make_engine(path: str, **kwargs: object) -> LLMEngine:
    args = dict(skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=256)
    return LLMEngine.from_engine_args(EngineArgs(path, **{**args, **kwargs}))


def greedy(max_tokens: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)


@dataclass
class Run:
    outputs: dict[str, RequestOutput] = field(default_factory=dict)
    history: dict[str, list[RequestOutput]] = field(default_factory=dict)
    first_token_step: dict[str, int] = field(default_factory=dict)
    num_steps: int = 0


def step_once(engine: LLMEngine, run: Run) -> None:
    """One step; records every output, the finished ones and the step of each request's
    first token, and checks the block manager against the sequences that hold blocks."""
    run.num_steps += 1
    for out in engine.step():
        run.history.setdefault(out.request_id, []).append(out)
        if any(c.token_ids for c in out.outputs):
            run.first_token_step.setdefault(out.request_id, run.num_steps)
        if out.finished:
            run.outputs[out.request_id] = out
    engine.block_manager.check_invariants(engine.scheduler.running)


def run_all(engine: LLMEngine, run: Run | None = None) -> Run:
    run = run or Run()
    while engine.has_unfinished_requests():
        step_once(engine, run)
    assert_all_blocks_free(engine)
    return run


def assert_all_blocks_free(engine: LLMEngine) -> None:
    assert engine.block_manager.num_free_blocks == engine.num_blocks
    engine.block_manager.check_invariants([])


def add_prompts(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[str]:
    ids = [f"r{i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, {"prompt_token_ids": prompt}, params)
    return ids


def assert_matches_reference(run: Run, ids: list[str], reference: list) -> None:
    for rid, ref in zip(ids, reference, strict=True):
        ref.assert_matches(run.outputs[rid].outputs[0])


def greedy_tokens(run: Run, ids: list[str]) -> list[list[int]]:
    return [run.outputs[rid].outputs[0].token_ids for rid in ids]
