"""StepPlan: what the executor runs for one scheduled step, and whose tokens come back.

Each scheduled sequence contributes its chunk of new tokens; each one that produces a
token this step contributes sampler rows: one normally, n for a request's first token
(its n completions are sampled from the parent's logits, then fork). A row under a
structured-output constraint carries its completion's token bitmask, built for all such
rows at once; free rows, and constrained ones still in their reasoning part, add nothing.
A pooling request's chunks sample nothing: they are pooled (StepInput.pool_indices).
Under async scheduling a chunk whose last token the step in flight is still sampling
holds a 0 there, and StepInput.placeholder_rows says which of that step's sampled ids
the runner puts in its place on the device (`prev_rows`, from the engine); the rows of a
step whose sampling needs the step in flight's tokens on the host are built after that
step is processed (`sampling_rows`).
A chunk ending in d draft tokens (speculative decoding) has d + 1 sampler rows, the
logits at its last known token and at each draft, in order (StepInput.sample_offsets);
the output processor verifies the drafts with their tokens.
"""

from dataclasses import dataclass

from pagedllm.core.scheduler import ScheduledSequence, SchedulerOutput
from pagedllm.engine.pooling_request import PoolingRequest
from pagedllm.engine.request import Request
from pagedllm.executor.batch import SeqChunk
from pagedllm.executor.model_runner import StepInput
from pagedllm.lora.slot_planner import LoRASlotPlanner
from pagedllm.sample.metadata import SamplingRow
from pagedllm.sampling_params import SamplingParams
from pagedllm.structured_output import GrammarMatcher, StructuredOutputManager


@dataclass
class StepPlan:
    step_input: StepInput
    rows: list[SamplingRow]
    owners: list[tuple[int, int]]  # per sampler row: (batch index, completion index)


def plan_step(
    out: SchedulerOutput,
    requests: dict[str, Request | PoolingRequest],
    structured_output: StructuredOutputManager | None = None,
    prev_rows: dict[int, int] | None = None,
    with_rows: bool = True,
    lora_slots: LoRASlotPlanner | None = None,
) -> StepPlan:
    """`structured_output` builds the bitmasks of constrained rows (needed when any);
    `prev_rows`: the sampler row, in the step in flight, of each sequence it samples (by
    seq id; needed when a chunk reads a placeholder). `with_rows` False leaves the sampler
    rows to `sampling_rows`, once the step in flight's tokens are on the host. `lora_slots`
    puts the scheduled sequences' LoRA adapters in slots (None: LoRA off)."""
    chunks, sample_indices, prompt_indices, pool_indices = [], [], [], []
    slot_of, lora_loads = {}, {}
    if lora_slots is not None:
        slot_of, lora_loads = lora_slots.plan([s.seq.lora for s in out.scheduled if s.seq.lora])
    owners, placeholder_rows, sample_offsets = [], [], []
    for i, s in enumerate(out.scheduled):
        seq, start, drafts = s.seq, s.start, s.draft_token_ids
        new_token_ids = seq.token_ids[start : start + s.num_new_tokens - len(drafts)]
        if s.reads_placeholder:
            assert prev_rows is not None, "a placeholder needs the step in flight's rows"
            placeholder_rows.append((i, prev_rows[seq.seq_id]))
            new_token_ids.append(0)
            assert len(new_token_ids) == s.num_new_tokens, "one placeholder, at the end"
        new_token_ids += drafts
        slot = -1 if seq.lora is None else slot_of[seq.lora_key]
        key = (seq.request_id, seq.seq_id)
        chunks.append(SeqChunk(new_token_ids, start, seq.block_table, key, slot))
        request = requests[seq.request_id]
        if isinstance(request, PoolingRequest):
            pool_indices.append(i)
            continue
        if request.params.prompt_logprobs is not None and start < seq.num_prompt_tokens:
            prompt_indices.append(i)
        if s.produces_token:
            for k in _completion_indices(request, s):
                sample_indices += [i] * (len(drafts) + 1)
                owners += [(i, k)] * (len(drafts) + 1)
                sample_offsets += range(len(drafts), -1, -1)
    if not any(sample_offsets):
        sample_offsets = []
    step_input = StepInput(
        chunks,
        out.blocks_to_copy,
        sample_indices,
        prompt_indices,
        pool_indices,
        out.finished_req_ids,
        placeholder_rows,
        sample_offsets,
        {slot: key for key, slot in slot_of.items()},
        lora_loads,
    )
    rows = sampling_rows(out, owners, requests, structured_output) if with_rows else []
    return StepPlan(step_input, rows, owners)


# The row of a sequence that ended while its step was in flight (async scheduling): sampled
# like any other, its token dropped.
_DROPPED_ROW_PARAMS = SamplingParams(temperature=0)


def sampling_rows(
    out: SchedulerOutput,
    owners: list[tuple[int, int]],
    requests: dict[str, Request | PoolingRequest],
    structured_output: StructuredOutputManager | None = None,
) -> list[SamplingRow]:
    """The sampler rows of `owners` (batch index, completion index), constrained ones with
    their completion's bitmask."""
    rows, constrained = [], []
    for i, k in owners:
        seq = out.scheduled[i].seq
        request = requests.get(seq.request_id)
        if seq.is_finished or request is None:
            rows.append(SamplingRow(_DROPPED_ROW_PARAMS, [], []))
            continue
        if request.matchers and request.matchers[k].is_active:
            constrained.append((len(rows), request.matchers[k]))
        generator, key = request.generators[k], (request.request_id, k)
        prompt_ids, output_ids = seq.prompt_token_ids, seq.output_token_ids
        rows.append(SamplingRow(request.params, prompt_ids, output_ids, generator, key=key))
    if constrained:
        _add_token_bitmasks(rows, constrained, structured_output)
    return rows


def sampled_rows(plan: StepPlan, out: SchedulerOutput) -> dict[int, int]:
    """Each sampled sequence's row in the step's sampler output, by seq id: of a sequence
    sampling its request's n completions' first tokens, the first, its own (completion
    0's: it goes on as that completion, the others fork from it)."""
    rows: dict[int, int] = {}
    for row, (i, _) in enumerate(plan.owners):
        rows.setdefault(out.scheduled[i].seq.seq_id, row)
    return rows


def _add_token_bitmasks(
    rows: list[SamplingRow],
    constrained: list[tuple[int, GrammarMatcher]],
    structured_output: StructuredOutputManager | None,
) -> None:
    """Give each constrained row (row index, its matcher) its bitmask [W]."""
    assert structured_output is not None, "constrained rows need the StructuredOutputManager"
    bitmask = structured_output.grammar_bitmask([m for _, m in constrained])
    for (row, _), mask in zip(constrained, bitmask, strict=True):
        rows[row].token_bitmask = mask


def _completion_indices(request: Request, s: ScheduledSequence) -> list[int]:
    """Which completions the token `s` samples feeds: all n at the request's first token
    (the one right after the prompt, which the completions fork from), else its own.
    Under async scheduling the first may still be in flight when the second is planned."""
    if request.params.n == 1:
        return [0]
    seq = s.seq
    if s.start + s.num_new_tokens == seq.num_prompt_tokens:
        assert len(request.completions) == 1, "the completions fork at the first token"
        return list(range(request.params.n))
    return [next(c.index for c in request.completions if c.seq is seq)]
