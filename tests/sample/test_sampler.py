"""Sampler against transformers' logits processors (RepetitionPenalty, Temperature, MinP,
TopK, TopP, chained in vLLM's order), numpy formulas for frequency/presence, the definitions
of the masks and logprobs, and chi-square tests of the sampled distribution."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from pagedllm.sample import sampler as sampler_module
from pagedllm.sample.logits_processors import BatchUpdate, LogitsProcessor, process_dict_updates
from pagedllm.sample.metadata import SamplingMetadata, SamplingRow
from pagedllm.sample.sampler import Sampler
from pagedllm.sampling_params import SamplingParams
from tests.devices import needs_cuda
from tests.sample.sampler_rows import V, row, sample


def reference_logits(logits: torch.Tensor, r: SamplingRow) -> torch.Tensor:
    """transformers' processors in vLLM's order; frequency/presence by numpy formula."""
    p, x = r.params, logits[None].clone()
    ids = torch.tensor([r.prompt_token_ids + r.output_token_ids])
    x = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(ids, x)
    counts = torch.tensor(np.bincount(r.output_token_ids, minlength=V), dtype=torch.float32)
    x = x - p.frequency_penalty * counts - p.presence_penalty * (counts > 0)
    if p.temperature < 1e-5:
        return x[0]
    x = TemperatureLogitsWarper(p.temperature)(ids, x)
    x = MinPLogitsWarper(p.min_p)(ids, x) if p.min_p > 0 else x
    x = TopKLogitsWarper(p.top_k)(ids, x) if p.top_k > 0 else x
    x = TopPLogitsWarper(p.top_p)(ids, x) if p.top_p < 1 else x
    return x[0]


def mixed_rows() -> list[SamplingRow]:
    return [
        row([1, 2], [3], temperature=0, logprobs=-1),
        row([1, 2], [2, 5], temperature=0, repetition_penalty=1.3, logprobs=-1),
        row([4], [7], temperature=0.7, top_k=5, seed=11, logprobs=-1),
        row([4], [], temperature=1.3, top_p=0.8, logprobs=-1),
        row([0, 6], [6, 8], min_p=0.1, repetition_penalty=0.8, logprobs=-1),
        row([9], [1], top_k=4, top_p=0.9, min_p=0.05, temperature=0.9, seed=3, logprobs=-1),
        row([3], [3, 3, 10], presence_penalty=0.5, frequency_penalty=0.3, logprobs=-1),
    ]


def full_vocab(logprobs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """LogprobsTensors with n = whole vocab -> [B, V] in token order."""
    return torch.empty(ids.shape[0], V).scatter_(1, ids[:, 1:], logprobs[:, 1:])


def test_processed_logits_equal_transformers_chain_on_mixed_batch() -> None:
    logits = torch.randn(7, V) * 3
    rows = mixed_rows()
    out = sample(Sampler(V, logprobs_mode="processed_logits"), logits, rows)
    processed = full_vocab(out.logprobs.logprobs, out.logprobs.logprob_token_ids)
    for i, r in enumerate(rows):
        torch.testing.assert_close(processed[i], reference_logits(logits[i], r))
        assert torch.isfinite(processed[i, out.sampled_token_ids[i]])
    assert out.sampled_token_ids[:2].tolist() == processed[:2].argmax(-1).tolist()


def test_greedy_rows_are_the_argmax_whatever_the_seed() -> None:
    logits = torch.randn(7, V) * 3
    rows = mixed_rows()
    expected = [int(reference_logits(logits[i], rows[i]).argmax()) for i in (0, 1)]
    for seed in range(3):
        torch.manual_seed(seed)
        out = sample(Sampler(V), logits, mixed_rows())
        assert out.sampled_token_ids[:2].tolist() == expected


def test_seeded_row_gives_the_same_tokens_alone_and_in_a_batch() -> None:
    """A seeded request's tokens over 12 steps do not depend on the other rows (20 of
    them: the seeded row is past the first ROW_CHUNK)."""
    logits = torch.randn(12, 21, V)

    def run(batch: bool) -> list[int]:
        sampler, seeded, tokens = Sampler(V), row([1], [], top_k=8, seed=1234), []
        for step in range(12):
            others = [row([2], [5]), row([3], [], temperature=0)] * 10 if batch else []
            batch_logits = logits[step, 20 - len(others) :]  # the seeded row's logits last
            out = sample(sampler, batch_logits, others + [seeded])
            seeded.output_token_ids.append(int(out.sampled_token_ids[-1]))
            tokens.append(seeded.output_token_ids[-1])
        return tokens

    torch.manual_seed(0)
    alone = run(batch=False)
    torch.manual_seed(1)
    assert run(batch=True) == alone
    assert len(set(alone)) > 1


def test_raw_logprobs_are_the_models_log_softmax() -> None:
    logits = torch.randn(7, V) * 3
    out = sample(Sampler(V), logits, mixed_rows())
    raw = full_vocab(out.logprobs.logprobs, out.logprobs.logprob_token_ids)
    torch.testing.assert_close(raw, torch.log_softmax(logits, dim=-1))
    chosen = raw.gather(1, out.sampled_token_ids[:, None])
    torch.testing.assert_close(out.logprobs.logprobs[:, :1], chosen)
    ranks = (raw >= chosen).sum(-1)
    assert torch.equal(out.logprobs.selected_token_ranks, ranks)


@pytest.mark.parametrize("mode", ["raw_logits", "processed_logprobs"])
def test_other_logprobs_modes(mode: str) -> None:
    logits = torch.randn(3, V)
    rows = [row([1], [], temperature=0, logprobs=2), row([1], [], top_k=3), row([2], [])]
    out = sample(Sampler(V, logprobs_mode=mode), logits, rows)
    assert out.logprobs.logprobs.shape == (3, 3)
    if mode == "raw_logits":
        expected = logits.topk(2).values
    else:
        processed = torch.stack([reference_logits(logits[i], r) for i, r in enumerate(rows)])
        expected = torch.log_softmax(processed, dim=-1).topk(2).values
    torch.testing.assert_close(out.logprobs.logprobs[:, 1:], expected)


def test_no_logprobs_asked_gives_none_and_invalid_mode_raises() -> None:
    out = sample(Sampler(V), torch.randn(2, V), [row([1], []), row([1], [], temperature=0)])
    assert out.logprobs is None and out.sampled_token_ids.dtype == torch.int64
    with pytest.raises(ValueError, match="logprobs_mode"):
        Sampler(V, logprobs_mode="logits")


def test_allowed_bad_words_min_tokens_and_logit_bias_by_their_definitions() -> None:
    """Greedy rows: the argmax of the logits with each rule applied by hand."""
    logits = torch.randn(4, V)
    allowed = row([1], [], temperature=0, allowed_token_ids=[3, 9])
    bad = row([1], [5, 6], temperature=0)
    bad.params.bad_words = ["w"]
    bad.params.bad_words_token_ids = [[6, 7], [int(logits[1].argmax())]]
    eos = int(logits[2].argmax())
    short = row([1], [4], temperature=0, min_tokens=3)
    short.params.update_from_generation_config({}, model_eos_token_id=eos)
    biased = row([1], [], temperature=0, logit_bias={11: 100.0})
    out = sample(Sampler(V), logits, [allowed, bad, short, biased])
    expected = logits.clone()
    expected[0, [i for i in range(V) if i not in (3, 9)]] = float("-inf")
    expected[1, [7, int(logits[1].argmax())]] = float("-inf")
    expected[2, eos] = float("-inf")
    expected[3, 11] += 100.0
    assert out.sampled_token_ids.tolist() == expected.argmax(-1).tolist()
    short.output_token_ids.extend([4, 4])
    assert sample(Sampler(V), logits[2:3], [short]).sampled_token_ids.tolist() == [eos]


class ForceToken(LogitsProcessor):
    """Custom argmax-changing processor: rows with extra_args["force"] emit that token."""

    def __init__(self, vocab_size: int, device: torch.device, is_pin_memory: bool = False) -> None:
        super().__init__(vocab_size, device, is_pin_memory)
        self.force: dict[int, int] = {}
        self.batch_sizes: list[int] = []

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        state = lambda p, _prompt, _out: (p.extra_args or {}).get("force")  # noqa: E731
        process_dict_updates(self.force, batch_update, state)
        self.batch_sizes.append(batch_update.batch_size)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, token in self.force.items():
            logits[index] = float("-inf")
            logits[index, token] = 0.0
        return logits


def test_custom_processor_sees_the_batch_each_step() -> None:
    sampler = Sampler(V, logits_processors=[ForceToken])
    forced = [row([1], [], extra_args={"force": 5}), row([1], []), row([1], [], temperature=0)]
    forced[2].params.extra_args = {"force": 17}
    assert sample(sampler, torch.randn(3, V), forced).sampled_token_ids[[0, 2]].tolist() == [5, 17]
    out = sample(sampler, torch.randn(1, V), [row([1], [], temperature=0)])
    custom = sampler.logitsprocs.all[-1]
    assert custom.force == {} and custom.batch_sizes == [3, 1]
    assert out.sampled_token_ids.shape == (1,)


class RecordUpdates(ForceToken):
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        self.updates = [*getattr(self, "updates", []), batch_update]


def test_processors_get_none_while_the_rows_stay_the_same() -> None:
    """The same rows (their output lists) in the same order: None; any change: the whole
    batch again, with the rows of the longer batch before removed."""
    sampler = Sampler(V, logits_processors=[RecordUpdates])
    a, b, c = row([1], []), row([2], [3]), row([4], [])
    for rows in ([a, b, c], [a, b, c], [a, b], [b, a], [b, a]):
        a.output_token_ids.append(7)  # outputs grow in place from step to step
        sample(sampler, torch.randn(len(rows), V), rows)
    updates = sampler.logitsprocs.all[-1].updates
    assert [u is None for u in updates] == [False, True, False, False, True]
    assert [i for i, *_ in updates[2].added] == [0, 1] and list(updates[2].removed) == [2]
    assert updates[3].added[0][3] is b.output_token_ids and not updates[3].removed


def test_after_an_update_that_raised_the_next_is_whole_and_removes_the_old_rows() -> None:
    sampler = Sampler(V, logits_processors=[RecordUpdates])
    recorder = sampler.logitsprocs.all[-1]
    a, b, c = row([1], []), row([2], []), row([3], [])
    sampler._refresh_logitsprocs(SimpleNamespace(rows=[a, b, c]))
    recorder.update_state = lambda update: 1 / 0  # a processor failing on this batch
    with pytest.raises(ZeroDivisionError):
        sampler._refresh_logitsprocs(SimpleNamespace(rows=[a, b]))
    del recorder.update_state
    sampler._refresh_logitsprocs(SimpleNamespace(rows=[a, b]))
    assert [i for i, *_ in recorder.updates[-1].added] == [0, 1]
    assert list(recorder.updates[-1].removed) == [2]


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic over cells with expected >= 5 (the rest pooled); the p-value
    from the chi-square survival function Q(dof / 2, stat / 2) (torch.special.gammaincc)."""
    expected = probs.double() * counts.sum()
    small = expected < 5
    obs = torch.cat([counts[~small].double(), counts[small].double().sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = torch.tensor(int(keep.sum()) - 1, dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, stat / 2))


def test_chi_square_p_value_rejects_a_wrong_distribution() -> None:
    probs = torch.tensor([0.5, 0.3, 0.2])
    good = torch.tensor([5020.0, 2990.0, 1990.0])
    assert chi_square_p_value(good, probs) > 0.1
    assert chi_square_p_value(torch.tensor([5300.0, 2900.0, 1800.0]), probs) < 1e-3


@pytest.mark.parametrize(
    "kw",
    [
        {"temperature": 0.6},
        {"temperature": 1.4, "top_k": 5},
        {"top_p": 0.7},
        {"min_p": 0.15, "temperature": 0.8},
        {"top_k": 6, "top_p": 0.85, "seed": 7},
    ],
)
def test_sampled_frequencies_match_the_filtered_distribution(kw: dict) -> None:
    """20000 draws of one row (repeated; seeded rows each with their own generator) against
    softmax(transformers chain); tokens filtered out are never drawn."""
    logits = torch.randn(V) * 1.5
    draws = 20000 if "seed" not in kw else 4000
    seeds = [kw["seed"] + i if "seed" in kw else None for i in range(draws)]
    rows = [row([0], [], **{**kw, "seed": seed}) for seed in seeds]
    out = sample(Sampler(V), logits.expand(draws, V), rows)
    counts = torch.bincount(out.sampled_token_ids, minlength=V).float()
    probs = torch.softmax(reference_logits(logits, rows[0]), dim=-1)
    assert counts[probs == 0].sum() == 0
    assert chi_square_p_value(counts, probs) > 1e-3


def test_plain_greedy_bf16_logits_give_the_float32_argmax_and_bias_stays_float32() -> None:
    """A plain greedy batch takes the argmax of bf16 logits as they come (no float32 copy):
    the same tokens as after .float(), ties to the first index; a logit_bias row still goes
    through float32, where a bias of 1/512 separates a tie that bf16 rounding would keep.
    One sampler throughout: its float32 buffer grows and is reused at other batch sizes."""
    sampler = Sampler(V)
    tied = torch.full((1, V), 100.0).bfloat16()  # bf16 spacing at 100 is 0.5
    biased_row = row([1], [], temperature=0, logit_bias={7: 1 / 512})
    assert sample(sampler, tied, [biased_row]).sampled_token_ids.tolist() == [7]
    logits = (torch.randn(5, V) * 4).bfloat16()
    logits[1] = 2.0  # all tied
    plain = [row([1], [2], temperature=0) for _ in range(5)]
    unbiased = [row([1], [2], temperature=0, logit_bias={3: 0.0}) for _ in range(5)]
    for rows in (plain, unbiased):
        out = sample(sampler, logits, rows)
        assert out.sampled_token_ids.tolist() == logits.float().argmax(-1).tolist()
    assert sample(sampler, tied, [biased_row]).sampled_token_ids.tolist() == [7]


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_the_sync_free_path_equals_the_host_path(mode: str) -> None:
    """The path the sampler takes off the CPU (rows that cannot sample found on the device,
    top-k/top-p by sorting, one to_host), run on CPU tensors: the same tokens, logprobs and
    errors as the CPU's own path, for every kind of row and one that cannot sample."""
    logits = torch.randn(8, V)
    logits[7] = float("-inf")
    outputs = []
    for sync_free in (False, True):
        rows = [*mixed_rows(), row([2], [], temperature=0, logprobs=-1)]
        sampler = Sampler(V, logprobs_mode=mode)
        sampler.sync_free = sync_free
        torch.manual_seed(5)
        outputs.append(sample(sampler, logits, rows))
    host, sync_free = outputs
    assert sync_free.sampled_token_ids.tolist() == host.sampled_token_ids.tolist()
    for ours, theirs in zip(sync_free.logprobs, host.logprobs, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0, equal_nan=True)
    assert list(sync_free.errors) == list(host.errors) == [7]
    assert str(sync_free.errors[7]) == str(host.errors[7])


def test_launch_keeps_the_sampled_ids_and_waits_for_the_host_copies_in_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sampler.launch on the sync-free path: the sampled ids at once (where the next step's
    placeholders read them), the host copies waited for only in result(), once; the output
    is forward's."""
    waits = []

    class Copies:
        def __init__(self, tensors: list[torch.Tensor]) -> None:
            self.tensors = tensors

        def wait(self) -> list[torch.Tensor]:
            waits.append(len(self.tensors))
            return self.tensors

    monkeypatch.setattr(sampler_module, "copy_to_host", Copies)
    logits = torch.randn(8, V)
    logits[7] = float("-inf")
    rows = [*mixed_rows(), row([2], [], temperature=0, logprobs=-1)]
    sampler = Sampler(V)
    sampler.sync_free = True
    torch.manual_seed(5)
    pending = sampler.launch(logits.clone(), SamplingMetadata.build(rows, V, "cpu"))
    assert not waits
    output = pending.result()
    assert waits == [5] and pending.result() is output
    assert pending.sampled_on_device.tolist() == output.sampled_token_ids.tolist()
    assert list(output.errors) == [7]
    torch.manual_seed(5)  # the same rows again, their generators new
    rows = [*mixed_rows(), row([2], [], temperature=0, logprobs=-1)]
    assert (
        sample(sampler, logits, rows).sampled_token_ids.tolist()
        == output.sampled_token_ids.tolist()
    )


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_cuda)])
def test_a_gpu_sampler_returns_host_tensors_equal_to_the_cpus(device: str) -> None:
    """Greedy rows with penalties, top-k/top-p (ignored by greedy rows) and logprobs, and
    a row that cannot sample: the same tokens and errors as on the CPU, logprobs within
    float32 noise, every result already on the host."""
    logits = torch.randn(4, V)
    logits[3] = float("-inf")
    kw = {"temperature": 0, "logprobs": 3, "top_k": 4, "repetition_penalty": 1.5}
    rows = [row([1, 2], [3], **kw) for _ in range(4)]
    gpu = Sampler(V, device)
    out = gpu(logits.to(device), SamplingMetadata.build(rows, V, device))
    expected = sample(Sampler(V), logits, rows)
    assert out.sampled_token_ids.device.type == out.logprobs.logprobs.device.type == "cpu"
    assert out.sampled_token_ids.tolist() == expected.sampled_token_ids.tolist()
    assert list(out.errors) == list(expected.errors) == [3]
    torch.testing.assert_close(out.logprobs.logprobs, expected.logprobs.logprobs, equal_nan=True)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_cuda)])
def test_a_gpu_samplers_step_never_waits_for_the_device(device: str) -> None:
    """A step's sampling, from the metadata's copies to the launch of the copies back,
    under torch.cuda.set_sync_debug_mode("error"): no op waits for the device (an .item(),
    a pageable copy, a size read back as torch.unique's), so that async scheduling overlaps
    it with the next forward. Every kind of row, seeded ones among them, with the penalties
    over pending tokens in 32 rows (torch.isin's sorting path from about 16)."""
    rows = []
    for i in range(32):
        params = SamplingParams(
            temperature=0.8 if i % 2 else 0, top_k=5, top_p=0.9, min_p=0.05, seed=i,
            repetition_penalty=1.2, frequency_penalty=0.3, presence_penalty=0.2, logprobs=3,
        )  # fmt: skip
        generator = torch.Generator(device).manual_seed(i)
        prompt = [(i + k) % V for k in range(20)]
        rows.append(SamplingRow(params, prompt, [i % V, (i + 3) % V], generator))
    logits = torch.randn(32, V, device=device)
    pending_tokens = (torch.arange(32, device=device), torch.randint(0, V, (32,), device=device))
    sampler = Sampler(V, device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        metadata = SamplingMetadata.build(rows, V, device)
        metadata.pending_tokens = pending_tokens
        pending = sampler.launch(logits, metadata)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    output = pending.result()
    assert output.sampled_token_ids.shape == (32,) and not output.errors
