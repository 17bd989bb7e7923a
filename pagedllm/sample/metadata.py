"""SamplingMetadata: the sampler's batched input for one step, built once from the rows.

Every optional feature is None (or empty) when no row uses it, so the Sampler skips it:
an all-greedy batch without penalties costs one argmax.
"""

from dataclasses import dataclass, field

import torch

from pagedllm.device_copy import tensor_to_device, to_device
from pagedllm.sample.ops.penalties import TokenCounts, get_token_counts
from pagedllm.sampling_params import SamplingParams, SamplingType

RowKey = tuple[str, int]  # (request id, completion index)


@dataclass
class SamplingRow:
    """One sequence that samples a token this step.

    `generator` is required for a seeded random request: the engine creates it once per
    request (`torch.Generator(device).manual_seed(seed)`) and passes the same one each step,
    so the request's tokens do not depend on the rest of the batch. `token_bitmask` [W]
    int32 is the tokens its structured-output grammar allows next (see
    ops/token_bitmask.py); None for an unconstrained row. `key` names the row across steps
    for a sampling rank that keeps its state (pipeline parallelism: executor/row_deltas.py).
    """

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    generator: torch.Generator | None = None
    token_bitmask: torch.Tensor | None = None
    key: RowKey | None = None


@dataclass
class SamplingMetadata:
    """Per-step tensors, B rows and V = vocab_size.

    temperature:        [B] float32, 1.0 on greedy rows (a safe divisor); None if all greedy.
    greedy_mask:        [B] bool; None unless greedy and random rows are mixed.
    top_k:              [B] int64, V where off; None if no row uses top-k.
    top_p:              [B] float32, 1.0 where off; None if no row uses top-p.
    generators:         row -> its generator, for seeded random rows.
    *_penalties:        [B] float32; None when no_penalties.
    seen_token_counts:  sparse counts of prompt + output tokens of the rows with a
                        repetition penalty; None if there are none.
    output_token_counts: sparse counts of output tokens of the rows with a frequency or
                        presence penalty; None if there are none.
    allowed_token_ids_mask: [B, V] bool, True where a token is NOT allowed; None if unused.
    bad_words_token_ids: row -> token id lists of its bad words (rows with bad words only).
    max_num_logprobs:   largest `logprobs` asked in the batch (-1 = whole vocab), or None.
    token_bitmask:      [C, W] int32, the grammar bitmasks of the C constrained rows;
                        None if no row is constrained.
    token_bitmask_rows: [C] int64, the rows those bitmasks belong to.
    pending_tokens:     (rows [P], tokens [P]) on the device: the token each of those rows'
                        sequences is still sampling in the step in flight (async
                        scheduling), not in its output list; the penalties count it. Set
                        by the model runner, which has them; None otherwise.
    argmax_only:        every row is greedy and nothing changes or reports its logits (no
                        mask, bad words, logit_bias, min_tokens, penalties or logprobs).
    """

    rows: list[SamplingRow]
    all_greedy: bool
    all_random: bool
    temperature: torch.Tensor | None
    greedy_mask: torch.Tensor | None
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    generators: dict[int, torch.Generator]
    no_penalties: bool
    presence_penalties: torch.Tensor | None = None
    frequency_penalties: torch.Tensor | None = None
    repetition_penalties: torch.Tensor | None = None
    seen_token_counts: TokenCounts | None = None
    output_token_counts: TokenCounts | None = None
    allowed_token_ids_mask: torch.Tensor | None = None
    bad_words_token_ids: dict[int, list[list[int]]] = field(default_factory=dict)
    max_num_logprobs: int | None = None
    token_bitmask: torch.Tensor | None = None
    token_bitmask_rows: torch.Tensor | None = None
    argmax_only: bool = False
    pending_tokens: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def output_token_ids(self) -> list[list[int]]:
        return [row.output_token_ids for row in self.rows]

    @classmethod
    def build(
        cls,
        rows: list[SamplingRow],
        vocab_size: int,
        device: torch.device | str,
        previous: "SamplingMetadata | None" = None,
    ) -> "SamplingMetadata":
        """`previous`: the step before's metadata, whose fields that depend on the rows'
        parameters alone are taken as they are when its rows had the same parameters and
        generators in the same order (a decode step of an unchanged batch)."""
        assert rows, "a sampling batch needs at least one row"
        device = torch.device(device)
        if previous is not None and _same_params(previous.rows, rows):
            fields = {name: getattr(previous, name) for name in _PARAMS_FIELDS}
        else:
            fields = _params_fields(rows, vocab_size, device)
        if not fields["no_penalties"]:
            fields.update(_penalty_fields(rows, vocab_size, device))
        return cls(rows=rows, **fields, **_token_bitmask_fields(rows, device))


# The fields that depend only on the rows' SamplingParams and generators, in their order.
_PARAMS_FIELDS = (
    "all_greedy",
    "all_random",
    "temperature",
    "greedy_mask",
    "top_k",
    "top_p",
    "generators",
    "no_penalties",
    "allowed_token_ids_mask",
    "bad_words_token_ids",
    "max_num_logprobs",
    "argmax_only",
)


def _same_params(before: list[SamplingRow], rows: list[SamplingRow]) -> bool:
    """Whether both lists' rows hold the same SamplingParams and generators, in order."""
    return len(before) == len(rows) and all(
        a.params is b.params and a.generator is b.generator
        for a, b in zip(before, rows, strict=True)
    )


def _params_fields(rows: list[SamplingRow], vocab_size: int, device: torch.device) -> dict:
    """The _PARAMS_FIELDS of `rows`."""
    params = [row.params for row in rows]
    sampling = _sampling_fields(rows, vocab_size, device)
    allowed_token_ids_mask = _allowed_token_ids_mask(params, vocab_size, device)
    bad_words_token_ids = _bad_words(params)
    max_num_logprobs = _max_num_logprobs(params)
    return dict(
        **sampling,
        allowed_token_ids_mask=allowed_token_ids_mask,
        bad_words_token_ids=bad_words_token_ids,
        max_num_logprobs=max_num_logprobs,
        argmax_only=sampling["all_greedy"]
        and sampling["no_penalties"]
        and allowed_token_ids_mask is None
        and not bad_words_token_ids
        and max_num_logprobs is None
        and not any(p.logit_bias or p.min_tokens for p in params),
    )


def _sampling_fields(rows: list[SamplingRow], vocab_size: int, device: torch.device) -> dict:
    """Temperature, greedy mask, top-k, top-p, generators and the batch-wide flags."""
    params = [row.params for row in rows]
    greedy = [p.sampling_type == SamplingType.GREEDY for p in params]
    all_greedy, all_random = all(greedy), not any(greedy)
    generators = {}
    for i, row in enumerate(rows):
        if row.params.sampling_type == SamplingType.RANDOM_SEED:
            assert row.generator is not None, f"row {i} has a seed but no generator"
            generators[i] = row.generator
    top_k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
    top_p = [p.top_p for p in params]
    temperature = [1.0 if g else p.temperature for g, p in zip(greedy, params, strict=True)]
    no_penalties = all(
        p.presence_penalty == 0 and p.frequency_penalty == 0 and p.repetition_penalty == 1
        for p in params
    )
    return dict(
        all_greedy=all_greedy,
        all_random=all_random,
        temperature=None if all_greedy else _floats(temperature, device),
        greedy_mask=None if all_greedy or all_random else to_device(greedy, torch.bool, device),
        top_k=None if all(k == vocab_size for k in top_k) else to_device(top_k, torch.long, device),
        top_p=None if all(p == 1.0 for p in top_p) else _floats(top_p, device),
        generators=generators,
        no_penalties=no_penalties,
    )


def _penalty_fields(rows: list[SamplingRow], vocab_size: int, device: torch.device) -> dict:
    """Penalty values [B] and sparse token counts of the rows each penalty applies to."""
    params = [row.params for row in rows]
    repeats = [p.repetition_penalty != 1 for p in params]
    shifts = [p.presence_penalty != 0 or p.frequency_penalty != 0 for p in params]
    seen = [
        r.prompt_token_ids + r.output_token_ids if on else []
        for r, on in zip(rows, repeats, strict=True)
    ]
    outputs = [r.output_token_ids if on else [] for r, on in zip(rows, shifts, strict=True)]
    return dict(
        presence_penalties=_floats([p.presence_penalty for p in params], device),
        frequency_penalties=_floats([p.frequency_penalty for p in params], device),
        repetition_penalties=_floats([p.repetition_penalty for p in params], device),
        seen_token_counts=get_token_counts(seen, vocab_size, device) if any(repeats) else None,
        output_token_counts=get_token_counts(outputs, vocab_size, device) if any(shifts) else None,
    )


def _allowed_token_ids_mask(
    params: list[SamplingParams], vocab_size: int, device: torch.device
) -> torch.Tensor | None:
    limited = [(i, p.allowed_token_ids) for i, p in enumerate(params) if p.allowed_token_ids]
    if not limited:
        return None
    mask = torch.zeros(len(params), vocab_size, dtype=torch.bool, device=device)
    mask[to_device([i for i, _ in limited], torch.long, device)] = True
    pairs = [(i, t) for i, allowed in limited for t in allowed]
    rows, tokens = to_device(pairs, torch.long, device).T
    mask[rows, tokens] = False
    return mask


def _token_bitmask_fields(rows: list[SamplingRow], device: torch.device) -> dict:
    constrained = [i for i, row in enumerate(rows) if row.token_bitmask is not None]
    if not constrained:
        return {}
    bitmask = torch.stack([rows[i].token_bitmask for i in constrained])
    return dict(
        token_bitmask=tensor_to_device(bitmask, device),
        token_bitmask_rows=to_device(constrained, torch.long, device),
    )


def _bad_words(params: list[SamplingParams]) -> dict[int, list[list[int]]]:
    bad_words = {}
    for i, p in enumerate(params):
        if p.bad_words:
            assert p.bad_words_token_ids is not None, "call update_from_tokenizer on add"
            bad_words[i] = p.bad_words_token_ids
    return bad_words


def _max_num_logprobs(params: list[SamplingParams]) -> int | None:
    asked = [p.logprobs for p in params if p.logprobs is not None]
    if not asked:
        return None
    return -1 if -1 in asked else max(asked)


def _floats(values: list[float], device: torch.device) -> torch.Tensor:
    return to_device(values, torch.float32, device)
