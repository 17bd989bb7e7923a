"""Draft verification (pagedllm/spec_decode/rejection_sampler.py) with the Sampler's tokens
at each verified position. Reference: the definition of speculative rejection sampling
with a one-hot draft q = onehot(x) and target p (after temperature and top-k): x is
accepted with probability p(x); on rejection the token follows max(p - q, 0) normalised;
after an acceptance the next position's token follows its own p. Greedy rows: the argmax
tokens exactly."""

import torch

from pagedllm.sample.metadata import SamplingMetadata, SamplingRow
from pagedllm.sample.sampler import Sampler
from pagedllm.sampling_params import SamplingParams
from pagedllm.spec_decode.rejection_sampler import accepted_tokens

V = 6
LOGITS = torch.tensor(
    [
        [2.0, 1.5, 0.3, 1.0, -1.0, 0.0],  # position 0: the last known token's logits
        [0.1, 0.2, 2.5, -0.5, 1.2, 0.9],  # position 1: the draft's
    ]
)
DRAFT = 1
TRIALS = 20_000


def target_probs(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """p: softmax(logits / T) over the top_k largest logits, 0 elsewhere."""
    scaled = logits / temperature
    kept = scaled.topk(top_k).indices
    masked = torch.full_like(scaled, float("-inf"))
    masked[kept] = scaled[kept]
    return masked.softmax(-1)


def verify_many(params: SamplingParams, trials: int) -> list[list[int]]:
    """Each trial's appended tokens: a batch of trials x (last token, draft) rows."""
    logits = LOGITS.repeat(trials, 1)
    rows = [SamplingRow(params, [], []) for _ in range(2 * trials)]
    sampled = Sampler(V)(logits, SamplingMetadata.build(rows, V, "cpu")).sampled_token_ids
    pairs = sampled.view(trials, 2).tolist()
    return [accepted_tokens(pair, [DRAFT]) for pair in pairs]


def assert_frequencies(tokens: list[int], p: torch.Tensor) -> None:
    """Each token's share within 4.5 standard errors of p's (a chi-square-free test with
    ~1e-5 false alarms per token)."""
    n = len(tokens)
    counts = torch.bincount(torch.tensor(tokens), minlength=V).double() / n
    tolerance = 4.5 * (p.double() * (1 - p.double()) / n).sqrt() + 1e-9
    assert ((counts - p.double()).abs() <= tolerance).all(), (counts, p)


def test_random_rows_follow_the_target_distribution() -> None:
    torch.manual_seed(0)
    p0 = target_probs(LOGITS[0], 0.8, 4)
    p1 = target_probs(LOGITS[1], 0.8, 4)
    results = verify_many(SamplingParams(temperature=0.8, top_k=4), TRIALS)
    first = [r[0] for r in results]
    assert_frequencies(first, p0)  # every emitted first token: p
    accepted = [r for r in results if len(r) == 2]
    assert all(r[0] == DRAFT for r in accepted)
    rate, expected = len(accepted) / TRIALS, p0[DRAFT].item()
    assert abs(rate - expected) < 4.5 * (expected * (1 - expected) / TRIALS) ** 0.5
    residual = p0.clone()
    residual[DRAFT] = 0
    assert_frequencies([r[0] for r in results if len(r) == 1], residual / residual.sum())
    assert_frequencies([r[1] for r in accepted], p1)  # the bonus token after an acceptance


def test_greedy_rows_accept_exactly_the_argmax() -> None:
    greedy = SamplingParams(temperature=0)
    logits = LOGITS.clone()
    rows = [SamplingRow(greedy, [], []) for _ in range(2)]
    sampled = Sampler(V)(logits, SamplingMetadata.build(rows, V, "cpu")).sampled_token_ids
    argmax = LOGITS.argmax(-1).tolist()
    assert sampled.tolist() == argmax
    assert accepted_tokens(argmax, [argmax[0]]) == argmax  # accepted, then the bonus token
    assert accepted_tokens(argmax, [argmax[0] + 1]) == argmax[:1]  # the target's token instead


def test_accepted_tokens_stop_at_the_first_mismatch() -> None:
    assert accepted_tokens([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]
    assert accepted_tokens([5, 6, 9, 8], [5, 6, 7]) == [5, 6, 9]
    assert accepted_tokens([4, 6, 7, 8], [5, 6, 7]) == [4]
    assert accepted_tokens([3], []) == [3]
