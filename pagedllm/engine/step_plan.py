"""StepPlan: what the executor runs for one scheduled step, and whose tokens come back.

Each scheduled sequence contributes its chunk of new tokens; each one that produces a
token this step contributes sampler rows: one normally, n for a request's first token
(its n completions are sampled from the parent's logits, then fork).
"""

from dataclasses import dataclass

from pagedllm.core.scheduler import SchedulerOutput
from pagedllm.core.sequence import Sequence
from pagedllm.engine.request import Request
from pagedllm.executor.batch import SeqChunk
from pagedllm.executor.model_runner import StepInput
from pagedllm.sample.metadata import SamplingRow


@dataclass
class StepPlan:
    step_input: StepInput
    rows: list[SamplingRow]
    owners: list[tuple[int, int]]  # per sampler row: (batch index, completion index)


def plan_step(out: SchedulerOutput, requests: dict[str, Request]) -> StepPlan:
    chunks, sample_indices, prompt_indices = [], [], []
    rows, owners = [], []
    for i, s in enumerate(out.scheduled):
        seq, start = s.seq, s.seq.num_computed_tokens
        chunks.append(
            SeqChunk(seq.token_ids[start : start + s.num_new_tokens], start, seq.block_table)
        )
        request = requests[seq.request_id]
        if request.params.prompt_logprobs is not None and start < seq.num_prompt_tokens:
            prompt_indices.append(i)
        if not s.produces_token:
            continue
        prompt_ids, output_ids = seq.token_ids[: seq.num_prompt_tokens], seq.output_token_ids
        for k in _completion_indices(request, seq):
            rows.append(SamplingRow(request.params, prompt_ids, output_ids, request.generators[k]))
            sample_indices.append(i)
            owners.append((i, k))
    step_input = StepInput(chunks, out.blocks_to_copy, sample_indices, prompt_indices)
    return StepPlan(step_input, rows, owners)


def _completion_indices(request: Request, seq: Sequence) -> list[int]:
    """Which completions this sequence's token feeds: all n at the first token."""
    if len(request.completions) < request.params.n:
        return list(range(request.params.n))
    return [next(c.index for c in request.completions if c.seq is seq)]
