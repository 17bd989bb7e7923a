"""OutputProcessor (pagedllm/engine/output_processor.py): a step's sampled tokens -> completions
and RequestOutputs. Reference: vLLM v1's contract: a request's n completions fork at its first
token on the parent's KV blocks, a stop ends a sequence and frees its blocks, finished requests
are forgotten, and a failure of one request (sampling, prompt logprobs, stop check) ends that
request alone with RequestOutput.error while the batch goes on."""

import pytest
import torch

from pagedllm.config import SchedulerConfig
from pagedllm.core.block_manager import BlockManager
from pagedllm.core.scheduler import Scheduler, SchedulerOutput
from pagedllm.core.sequence import Sequence, new_seq_id
from pagedllm.engine import output_processor
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.engine.output_processor import OutputProcessor
from pagedllm.engine.request import Completion, Request
from pagedllm.executor.model_runner import StepOutput
from pagedllm.sample.sampler import SamplerOutput
from pagedllm.sampling_params import SamplingParams
from tests.engine.engine_helpers import (
    LLAMA,
    add_prompts,
    greedy,
    greedy_tokens,
    make_engine,
    run_all,
)
from tests.reference_cycles import left_for_the_cyclic_collector

EOS = 2


def start(
    processor: OutputProcessor, prompts: dict[str, list[int]], **params: object
) -> SchedulerOutput:
    """Add one request per prompt and run their prefill: the next step samples their first
    token."""
    for rid, prompt in prompts.items():
        request = Request(rid, None, prompt, SamplingParams(**params))
        seq = Sequence(new_seq_id(), prompt, 4, request.params, rid)
        request.completions.append(Completion(0, seq, None))
        processor.requests[rid] = request
        processor.scheduler.add_seq(seq)
    out = processor.scheduler.schedule()
    processor.scheduler.update_after_step(out.scheduled)
    return out


def sampled(tokens: list[int], errors: dict[int, Exception] | None = None) -> StepOutput:
    return StepOutput(SamplerOutput(torch.tensor(tokens), None, errors or {}), {})


@pytest.fixture
def processor() -> OutputProcessor:
    scheduler = Scheduler(SchedulerConfig(8, 64, True), BlockManager(12, 4))
    return OutputProcessor(scheduler, None, EOS, max_model_len=64)


def test_first_token_forks_n_completions_on_the_parents_blocks(processor) -> None:
    out = start(processor, {"r": [5, 6, 7, 8, 9, 10]}, n=3, max_tokens=4)
    outputs = processor.process(out, sampled([10, 11, 12]), [(0, 0), (0, 1), (0, 2)])
    request = processor.requests["r"]
    seqs = [c.seq for c in request.completions]
    assert [s.output_token_ids for s in seqs] == [[10], [11], [12]]
    assert [s.token_ids[:6] for s in seqs] == [[5, 6, 7, 8, 9, 10]] * 3
    assert seqs[1].block_table == seqs[2].block_table == seqs[0].block_table
    assert processor.scheduler.running == seqs
    processor.scheduler.block_manager.check_invariants(seqs)
    assert [o.token_ids for o in outputs[0].outputs] == [[10], [11], [12]]
    assert (processor.num_prompt_tokens, processor.num_generation_tokens) == (6, 3)


def test_stopped_requests_are_finished_freed_and_forgotten(processor) -> None:
    """EOS ends "a"; max_tokens=1 ends "b"; both free their blocks."""
    out = start(processor, {"a": [5, 6, 7], "b": [8, 9]}, max_tokens=1)
    outputs = processor.process(out, sampled([EOS, 30]), [(0, 0), (1, 0)])
    reasons = {o.request_id: (o.finished, o.outputs[0].finish_reason) for o in outputs}
    assert reasons == {"a": (True, "stop"), "b": (True, "length")}
    assert processor.requests == {} and processor.scheduler.running == []
    blocks = processor.scheduler.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks


def test_a_row_that_could_not_sample_fails_only_its_request(processor) -> None:
    """Row 0 of n=2 request "a" fails: its row 1 is skipped; "b" gets its token."""
    prompts = {"a": [5, 6, 7], "b": [8, 9]}
    out = start(processor, prompts, n=2, max_tokens=4)
    error = ValueError("no token can be sampled")
    result = sampled([0, 11, 20, 21], {0: error})
    outputs = processor.process(out, result, [(0, 0), (0, 1), (1, 0), (1, 1)])
    failed = next(o for o in outputs if o.request_id == "a")
    assert failed.finished and failed.error is error
    assert [(c.token_ids, c.finish_reason) for c in failed.outputs] == [([], "error")]
    assert "a" not in processor.requests
    assert [c.seq.output_token_ids for c in processor.requests["b"].completions] == [[20], [21]]
    processor.scheduler.block_manager.check_invariants(processor.scheduler.running)


def test_a_failing_prompt_logprobs_chunk_fails_only_its_request(processor, monkeypatch) -> None:
    def append(request: Request, logits: torch.Tensor, *args: object) -> None:
        if request.request_id == "bad":
            raise RuntimeError("prompt logprobs exploded")
        request.prompt_logprobs = [None] * logits.shape[0]

    monkeypatch.setattr(output_processor, "append_prompt_logprobs", append)
    out = start(processor, {"bad": [5, 6, 7], "good": [8, 9]}, prompt_logprobs=0)
    result = StepOutput(None, {0: torch.zeros(3, 8), 1: torch.zeros(2, 8)})
    outputs = {o.request_id: o for o in processor.process(out, result, [])}
    assert "prompt logprobs exploded" in str(outputs["bad"].error) and outputs["bad"].finished
    assert outputs["good"].error is None and not outputs["good"].finished
    assert list(processor.requests) == ["good"]


def test_request_that_cannot_sample_fails_alone(tiny_model_path, spread_prompts) -> None:
    """Its only allowed token is banned by min_tokens: it ends with an error at its first
    token; the others' tokens equal a run without it, and every block is freed."""
    path, prompts = tiny_model_path(LLAMA), spread_prompts[1:4]
    alone = make_engine(path, num_kv_blocks=60)
    alone_ids = add_prompts(alone, prompts, greedy(6))
    expected = greedy_tokens(run_all(alone), alone_ids)
    engine = make_engine(path, num_kv_blocks=60)
    ids = add_prompts(engine, prompts, greedy(6))
    doomed = SamplingParams(allowed_token_ids=[5], stop_token_ids=[5], min_tokens=2)
    engine.add_request("doomed", {"prompt_token_ids": prompts[0]}, doomed)
    run = run_all(engine)
    failed = run.outputs["doomed"]
    assert failed.finished and "no token can be sampled" in str(failed.error)
    assert failed.outputs[0].finish_reason == "error" and failed.outputs[0].token_ids == []
    assert greedy_tokens(run, ids) == expected
    assert all(run.outputs[rid].error is None for rid in ids)


def test_an_engine_that_failed_a_request_is_freed_without_the_cyclic_collector(
    tiny_model_path,
) -> None:
    """The failed request's error, raised in the output processor, is kept without the
    frames it went through (they hold the processor, and through it the whole engine)."""

    def build_and_use() -> LLMEngine:
        engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=16)
        doomed = SamplingParams(allowed_token_ids=[5], stop_token_ids=[5], min_tokens=2)
        engine.add_request("doomed", {"prompt_token_ids": [5, 6]}, doomed)
        assert "no token can be sampled" in str(run_all(engine).outputs["doomed"].error)
        return engine

    assert left_for_the_cyclic_collector(build_and_use) == []


def test_stop_check_that_raises_fails_only_its_request(
    tiny_model_path, spread_prompts, monkeypatch, caplog
) -> None:
    """A failure in one request's output processing (here its stop check) ends it alone;
    its traceback is logged at debug level."""
    real_check_stop = output_processor.check_stop

    def check_stop(seq, params, *args):  # noqa: ANN001, ANN202
        if (params.extra_args or {}).get("boom") and len(seq.output_token_ids) == 3:
            raise RuntimeError("stop check exploded")
        return real_check_stop(seq, params, *args)

    monkeypatch.setattr(output_processor, "check_stop", check_stop)
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=60)
    ids = add_prompts(engine, spread_prompts[1:3], greedy(8))
    boom = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, extra_args={"boom": 1})
    engine.add_request("boom", {"prompt_token_ids": spread_prompts[3]}, boom)
    with caplog.at_level("DEBUG", logger="pagedllm.engine.output_processor"):
        run = run_all(engine)
    assert "stop check exploded" in str(run.outputs["boom"].error)
    assert "request boom failed at:" in caplog.text and "in check_stop" in caplog.text
    assert len(run.outputs["boom"].outputs[0].token_ids) == 3
    assert [len(t) for t in greedy_tokens(run, ids)] == [8, 8]
