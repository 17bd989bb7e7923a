"""ModelRunner (pagedllm/executor/model_runner.py): one step's chunks -> logits -> sampler.
Reference: transformers' float32 logits of the same tiny checkpoint at each sequence's last new
token (and at every new token for prompt logprobs); the argmax for greedy rows."""

import contextlib
from collections.abc import Callable, Sequence

import pytest
import torch

from pagedllm import _cpu_kernels, device_copy
from pagedllm.batch_invariant import is_batch_invariant
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.executor.batch import SeqChunk
from pagedllm.executor.kv_cache import attention_layers
from pagedllm.executor.model_runner import ModelRunner, StepInput
from pagedllm.sample import sampler as sampler_module
from pagedllm.sample.metadata import SamplingMetadata, SamplingRow
from pagedllm.sampling_params import SamplingParams
from tests.devices import needs_cuda
from tests.host_reads import NoHostReads

LLAMA = "llama-gqa-llama3"
PROMPTS = [[5, 9, 14, 3, 77, 21, 8], list(range(30, 50))]  # blocks [0] and [1, 2] of 16


@pytest.fixture
def runner(tiny_model_path: Callable[[str], str]) -> ModelRunner:
    args = EngineArgs(tiny_model_path(LLAMA), dtype="float32", device="cpu", max_model_len=256)
    runner = ModelRunner(args.create_engine_config())
    runner.init_kv_cache(num_blocks=6)
    return runner


def prefill(sample_indices: list[int], prompt_logprob_indices: Sequence[int] = ()) -> StepInput:
    chunks = [SeqChunk(PROMPTS[0], 0, [0]), SeqChunk(PROMPTS[1], 0, [1, 2])]
    return StepInput(chunks, [], sample_indices, list(prompt_logprob_indices))


def hf_logits(hf_model: Callable[[str], torch.nn.Module], prompt: list[int]) -> torch.Tensor:
    """[len(prompt), V]"""
    with torch.no_grad():
        return hf_model(LLAMA)(torch.tensor([prompt])).logits[0]


def test_forward_logits_match_transformers(runner, hf_model) -> None:
    """Sampler rows at each sequence's last token (sequence 1 twice, as when it forks n=2),
    prompt logits at every token of sequence 1."""
    logits, prompt_logits = runner.forward(prefill([0, 1, 1], [1]))
    ref = [hf_logits(hf_model, p) for p in PROMPTS]
    torch.testing.assert_close(
        logits, torch.stack([ref[0][-1], ref[1][-1], ref[1][-1]]), atol=1e-4, rtol=0
    )
    assert list(prompt_logits) == [1]
    torch.testing.assert_close(prompt_logits[1], ref[1], atol=1e-4, rtol=0)


def test_decode_step_reads_the_cache_the_prefill_wrote(runner, hf_model) -> None:
    runner.forward(prefill([0, 1]))
    step = StepInput([SeqChunk([42], len(PROMPTS[1]), [1, 2])], [], [0], [])
    logits, _ = runner.forward(step)
    torch.testing.assert_close(
        logits[0], hf_logits(hf_model, PROMPTS[1] + [42])[-1], atol=1e-4, rtol=0
    )


@pytest.mark.parametrize("sample_indices", [[0, 1], [1, 1], [1], [1, 0]])
def test_decode_step_samples_the_rows_asked_for(runner, hf_model, sample_indices) -> None:
    """One token per sequence: all rows in order (returned as computed), a fork of the second
    with the first not sampled (as a prompt chunk that ends before its prompt does), one row,
    rows out of order."""
    runner.forward(prefill([0, 1]))
    chunks = [SeqChunk([42], len(PROMPTS[0]), [0]), SeqChunk([43], len(PROMPTS[1]), [1, 2])]
    logits, _ = runner.forward(StepInput(chunks, [], sample_indices, []))
    ref = [hf_logits(hf_model, p + [t])[-1] for p, t in zip(PROMPTS, (42, 43))]
    expected = torch.stack([ref[i] for i in sample_indices])
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)


def test_execute_samples_greedy_rows_as_the_argmax(runner, hf_model) -> None:
    greedy = SamplingParams(temperature=0)
    rows = [SamplingRow(greedy, p, []) for p in PROMPTS]
    out = runner.execute(prefill([0, 1]), rows)
    expected = [hf_logits(hf_model, p)[-1].argmax().item() for p in PROMPTS]
    assert out.sampler_output.sampled_token_ids.tolist() == expected
    assert out.prompt_logits == {}


def test_execute_without_chunks_runs_nothing(runner, monkeypatch) -> None:
    monkeypatch.setattr(runner, "forward", lambda step: pytest.fail("forward ran"))
    out = runner.execute(StepInput([], [], [], []), [])
    assert (out.sampler_output, out.prompt_logits) == (None, {})


def test_execute_without_rows_returns_only_prompt_logits(runner) -> None:
    """A step that only prefills (chunked prefill) samples nothing."""
    out = runner.execute(prefill([], [0]), [])
    assert out.sampler_output is None
    assert list(out.prompt_logits) == [0] and out.prompt_logits[0].shape == (7, 320)


def test_blocks_to_copy_are_copied_before_the_forward(runner) -> None:
    """Copy on write: block 4's K and V in every layer become block 3's."""
    runner.kv_cache[:, :, 3] = torch.randn_like(runner.kv_cache[:, :, 3])
    source = runner.kv_cache[:, :, 3].clone()
    runner.forward(StepInput([SeqChunk([5], 0, [0])], [(3, 4)], [0], []))
    torch.testing.assert_close(runner.kv_cache[:, :, 4], source, rtol=0, atol=0)


def test_the_runner_sets_batch_invariant_mode_from_its_config(tiny_model_path) -> None:
    """The switch is process-wide (pagedllm/batch_invariant.py): each runner sets it."""
    for enabled in (True, False):
        args = EngineArgs(
            tiny_model_path(LLAMA), dtype="float32", device="cpu", batch_invariant=enabled
        )
        ModelRunner(args.create_engine_config())
        assert is_batch_invariant() is enabled


def test_a_step_on_the_torch_paths_reads_nothing_on_the_host_before_its_one_copy(
    tiny_model_path: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step as it runs on CUDA (kernels off: the torch paths; the sampler's sync-free
    path), on CPU tensors under NoHostReads: a prefill with a copied block, then a mixed step
    of a decode and a prefill chunk with top-k/top-p, penalties and logprobs, then decodes
    of which one reads its token from the step before's samples (async scheduling), its
    penalties counting that token on the device. Nothing is read on the host before the
    sampler's single copy_to_host, called once a step, but by SamplingMetadata.build, whose
    tensors are made on the host from the rows' lists; the tokens are those of the
    sampler's host path."""
    monkeypatch.setattr(_cpu_kernels, "_C", None)
    args = EngineArgs(tiny_model_path(LLAMA), dtype="float32", device="cpu", max_model_len=256)
    runner = ModelRunner(args.create_engine_config())
    runner.init_kv_cache(num_blocks=6)
    mode, copies = NoHostReads(), []

    def copy_to_host(tensors: list[torch.Tensor]) -> device_copy.HostCopies:
        copies.append(len(tensors))
        mode.allow()
        return device_copy.copy_to_host(tensors)

    monkeypatch.setattr(sampler_module, "copy_to_host", copy_to_host)
    build = SamplingMetadata.build

    def build_on_host(*args: object) -> SamplingMetadata:
        mode.allowed = True
        try:
            return build(*args)
        finally:
            mode.allowed = False

    monkeypatch.setattr(SamplingMetadata, "build", build_on_host)
    params = SamplingParams(temperature=0.8, top_k=5, top_p=0.9, repetition_penalty=1.2, seed=1)
    placeholder = SeqChunk([0], 8, [0])  # async scheduling: the last step's row 1 token
    steps = [
        prefill([0, 1]),
        StepInput([SeqChunk([3], 7, [0]), SeqChunk(PROMPTS[0][:4], 0, [3])], [(0, 4)], [0, 1], []),
        StepInput([SeqChunk([5], 4, [3]), placeholder], [], [0, 1], [], placeholder_rows=[(1, 1)]),
    ]
    for step in steps:
        tokens, last_sampled = [], runner.last_sampled
        for sync_free in (True, False):
            rows = [
                SamplingRow(SamplingParams(temperature=0, logprobs=2), PROMPTS[0], []),
                SamplingRow(params, PROMPTS[1], [4], torch.Generator().manual_seed(1)),
            ]
            runner.sampler.sync_free, mode.allowed = sync_free, False
            runner.last_sampled = last_sampled
            with mode if sync_free else contextlib.nullcontext():
                tokens.append(runner.execute(step, rows).sampler_output.sampled_token_ids.tolist())
        assert tokens[0] == tokens[1]
    assert copies == [5, 5, 5]  # the ids, which rows sampled, the three logprobs tensors


@pytest.mark.parametrize("sample", [True, False])
def test_the_profile_run_runs_the_largest_step_on_a_cache_it_drops(
    tiny_model_path: Callable[[str], str], hf_model, monkeypatch, sample: bool
) -> None:
    """max_num_batched_tokens tokens over max_num_seqs sequences, sampled with every costly
    feature (or followed, on a tensor-parallel peer); after it the runner holds no cache and
    its first real step is transformers'."""
    args = EngineArgs(
        tiny_model_path(LLAMA),
        dtype="float32",
        device="cpu",
        max_model_len=256,
        max_num_seqs=3,
        max_num_batched_tokens=50,
    )
    runner = ModelRunner(args.create_engine_config())
    executed: list[tuple[StepInput, list[SamplingRow]]] = []
    execute = runner.execute
    monkeypatch.setattr(runner, "execute", lambda s, r: executed.append((s, r)) or execute(s, r))
    followed: list[StepInput] = []
    follow = runner.follow
    monkeypatch.setattr(runner, "follow", lambda s: followed.append(s) or follow(s))
    cache_bytes = runner.profile_run(sample)
    steps = [s for s, _ in executed] if sample else followed
    assert len(steps) == 1 and not (followed if sample else executed)
    assert [len(c.token_ids) for c in steps[0].chunks] == [17, 17, 16]
    assert steps[0].sample_indices == [0, 1, 2]
    if sample:
        assert executed[0][1][0].params.top_p == 0.9
    blocks = 2 + 2 + 1  # of 16 tokens
    assert cache_bytes == blocks * 16 * runner.kv_cache_bytes_per_token
    assert runner.kv_cache is None and runner.last_sampled is None
    assert all(layer.kv_cache is None for layer in attention_layers(runner.model))
    runner.init_kv_cache(num_blocks=6)
    logits, _ = runner.forward(prefill([0, 1]))
    ref = [hf_logits(hf_model, p)[-1] for p in PROMPTS]
    torch.testing.assert_close(logits, torch.stack(ref), atol=1e-4, rtol=0)


def test_a_pooling_model_profiles_its_pooling(tiny_model_path: Callable[[str], str]) -> None:
    args = EngineArgs(
        tiny_model_path(LLAMA), dtype="float32", device="cpu", runner="pooling",
        max_model_len=64, max_num_batched_tokens=40,
    )  # fmt: skip
    runner = ModelRunner(args.create_engine_config())
    assert runner.profile_run() > 0 and runner.kv_cache is None


@needs_cuda
def test_on_cuda_the_kv_cache_gets_what_gpu_memory_utilization_leaves(
    tiny_model_path: Callable[[str], str], caplog
) -> None:
    """The profile's figures are logged; a share the GPU does not have free is refused."""
    free, total = torch.cuda.mem_get_info()
    args = EngineArgs(tiny_model_path(LLAMA), dtype="float32", device="cuda", max_model_len=256)
    runner = ModelRunner(args.create_engine_config())
    with caplog.at_level("INFO"):
        available = runner.available_kv_cache_bytes()
    assert 0 < available <= 0.9 * total
    assert "GiB for the KV cache of" in caplog.text
    too_much = min(1.0, free / total + 0.01)
    args = EngineArgs(
        tiny_model_path(LLAMA), device="cuda", gpu_memory_utilization=too_much, max_model_len=64
    )
    with pytest.raises(ValueError, match="lower gpu_memory_utilization"):
        ModelRunner(args.create_engine_config())
