"""Fixtures shared by the whole suite: a fixed seed, per-rank layer construction, tiny random
checkpoints, and transformers' greedy generations on them (the engine's reference)."""

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

if not torch.cuda.is_available():
    # Triton decorates its library (and pagedllm's kernels) for its interpreter only if this
    # is set when triton is first imported, which torch._dynamo (under transformers' models,
    # imported below) does: set it first, so the Triton tests run their kernels on CPU
    # tensors. Nothing else here runs Triton.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import transformers
from torch import nn

from pagedllm import _cpu_kernels, _triton_ops
from pagedllm.distributed.parallel_state import override_tensor_parallel
from pagedllm.outputs import CompletionOutput
from tests.hf_reference import hf_generate
from tests.models.tiny_models import save_tiny_model, tiny_configs


@pytest.fixture(params=["pagedllm._C", "torch"])
def cpu_kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test twice: with pagedllm._C's CPU kernels, and with the torch code they
    replace (the fallback without the extension, and the path on other devices). Layers
    built inside the test see the switch: Attention then selects the torch backend."""
    if request.param == "torch":
        monkeypatch.setattr(_cpu_kernels, "_C", None)
    return request.param


@pytest.fixture
def triton_device() -> torch.device:
    """Where the Triton kernels' tests run: a CUDA GPU, else CPU tensors under Triton's
    interpreter (TRITON_INTERPRET, set above); skipped without triton."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if not _triton_ops.interpreting():
        pytest.fail("no GPU, and TRITON_INTERPRET was off when triton was first imported")
    return torch.device("cpu")


BUILDS = ["avx512", "avx2", "portable"]
"""The builds of the kernels built once per instruction set, best first."""


def _on_build(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, builds: tuple, *kernels: str
) -> str:
    """Makes every call to each _cpu_kernels.<kernel> name build request.param (skipped where
    the CPU cannot run it)."""
    isa = request.param
    if isa not in builds:
        pytest.skip(f"{kernels[0]} has no {isa} build for this CPU")
    for kernel in kernels:
        partial = functools.partial(getattr(_cpu_kernels, kernel), isa=isa)
        monkeypatch.setattr(_cpu_kernels, kernel, partial)
    return isa


@pytest.fixture(params=BUILDS)
def prefill_f32_isa(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test on each build of the float32 prefill attention kernel this CPU runs."""
    builds = _cpu_kernels.prefill_attention_f32_isas()
    return _on_build(request, monkeypatch, builds, "prefill_attention_f32")


@pytest.fixture(params=BUILDS)
def attention_isa(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test on each build of the decode attention kernel this CPU runs."""
    builds = _cpu_kernels.paged_attention_isas()
    return _on_build(request, monkeypatch, builds, "paged_decode_attention")


@pytest.fixture(params=BUILDS)
def attention_row_isa(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test on each build of the attention kernels this CPU runs, decode and prefill
    both on it (a row's bits are the same between the kernels of one build)."""
    kernels = ("paged_decode_attention", "prefill_attention_f32")
    return _on_build(request, monkeypatch, _cpu_kernels.paged_attention_isas(), *kernels)


@pytest.fixture(params=["avx512_bf16", *BUILDS])
def skinny_gemm_isa(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test on each build of the skinny_gemm kernel this CPU runs (float32 and bf16;
    avx512_bf16 multiplies bf16 by AVX-512 BF16 dot products), prepack_linear_weight packing
    weights in the order that build reads."""
    builds = _cpu_kernels.skinny_gemm_isas()
    kernels = "skinny_gemm", "skinny_gemm_bf16", "skinny_gemm_reads_packed"
    return _on_build(request, monkeypatch, builds, *kernels)


@pytest.fixture(autouse=True)
def _seed() -> None:
    """Every test sees the same random tensors, whatever ran before it."""
    torch.manual_seed(0)


@pytest.fixture
def build_per_rank() -> Callable[[Callable[[], nn.Module], int], list[nn.Module]]:
    """`build_per_rank(factory, tp_size)` -> [rank 0's layer, ..., rank tp_size-1's layer].

    Each layer is built under `override_tensor_parallel`, so no process group is needed.
    Outside the override the process is rank 0 of 1 again and collectives are the
    identity, so a built layer's forward returns that rank's local (unreduced) result.
    """

    def build(factory: Callable[[], nn.Module], tp_size: int) -> list[nn.Module]:
        layers = []
        for rank in range(tp_size):
            with override_tensor_parallel(rank, tp_size):
                layers.append(factory())
        return layers

    return build


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], str]:
    """name -> folder of a saved tiny random checkpoint, written once per session."""
    paths: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in paths:
            folder = tmp_path_factory.mktemp(name)
            save_tiny_model(tiny_configs()[name], str(folder))
            paths[name] = str(folder)
        return paths[name]

    return get


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]  # log_softmax of the raw logits at each generated token

    def assert_matches(self, completion: CompletionOutput) -> None:
        """Same greedy tokens, and each token's logprob (asked with logprobs=0) within 1e-4."""
        assert completion.token_ids == self.token_ids
        logprobs = [lp[t].logprob for lp, t in zip(completion.logprobs, completion.token_ids)]
        assert logprobs == pytest.approx(self.logprobs, abs=1e-4)


HfGreedy = Callable[[str, list[list[int]], int], list[Generation]]


@pytest.fixture(scope="session")
def hf_model(tiny_model_path: Callable[[str], str]) -> Callable[[str], nn.Module]:
    """name -> transformers' float32 model of that tiny checkpoint, loaded once per session."""
    models: dict[str, nn.Module] = {}

    def get(name: str) -> nn.Module:
        if name not in models:
            models[name] = transformers.AutoModelForCausalLM.from_pretrained(
                tiny_model_path(name), dtype=torch.float32
            ).eval()
        return models[name]

    return get


@pytest.fixture(scope="session")
def hf_greedy(hf_model: Callable[[str], nn.Module]) -> HfGreedy:
    """(tiny model name, prompts, max_new_tokens) -> transformers' `generate(do_sample=False)`
    run prompt by prompt in float32, never stopping at EOS. Cached for the session."""
    cache: dict[tuple, Generation] = {}

    def generate(name: str, prompt: list[int], max_new_tokens: int) -> Generation:
        out = hf_generate(hf_model(name), prompt, max_new_tokens, output_logits=True)
        tokens = out.sequences[0, len(prompt) :].tolist()
        assert len(tokens) == max_new_tokens
        logprobs = [lg[0].log_softmax(-1)[t].item() for lg, t in zip(out.logits, tokens)]
        return Generation(tokens, logprobs)

    def get(name: str, prompts: list[list[int]], max_new_tokens: int) -> list[Generation]:
        keys = [(name, tuple(p), max_new_tokens) for p in prompts]
        for key, prompt in zip(keys, prompts):
            if key not in cache:
                cache[key] = generate(name, prompt, max_new_tokens)
        return [cache[key] for key in keys]

    return get


@pytest.fixture(scope="session")
def spread_prompts() -> list[list[int]]:
    """8 random prompts for the tiny models (vocab 320), lengths spread over 1..200."""
    gen = torch.Generator().manual_seed(1)
    lengths = [1, 5, 23, 47, 88, 130, 171, 200]
    return [torch.randint(3, 320, (n,), generator=gen).tolist() for n in lengths]
