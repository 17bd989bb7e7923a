"""The torch reference backend against dense causal attention, with every pagedllm._C
function made to fail: the test oracle never runs a kernel."""

import pytest

from pagedllm import _cpu_kernels
from pagedllm.layers.attention_backends.torch_sdpa import TorchSdpaBackend
from tests.layers.paged_attention_steps import (
    HEAD_CONFIGS,
    make_attention,
    make_seqs,
    step_and_check,
)


class _NoKernels:
    """Stands in for pagedllm._C: any function looked up on it fails the test."""

    def __getattr__(self, name: str) -> None:
        raise AssertionError(f"the torch reference backend called pagedllm._C.{name}")


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("num_heads,num_kv_heads", HEAD_CONFIGS)
def test_reference_never_calls_the_extension(
    num_heads: int, num_kv_heads: int, block_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mixed prefill/decode steps, then decodes only, all float32 on the CPU, where the
    kernels would apply; reference: dense attention (step_and_check)."""
    monkeypatch.setattr(_cpu_kernels, "_C", _NoKernels())
    attn = make_attention(num_heads, num_kv_heads, block_size)
    attn.backend = TorchSdpaBackend()
    fresh, chunked, dec = make_seqs([10, 22, 8], attn, block_size, seed=3)
    step_and_check(attn, [chunked, dec], [13, 6], block_size)
    step_and_check(attn, [fresh, chunked, dec], [9, 8, 1], block_size)
    step_and_check(attn, [fresh, chunked, dec], [1, 1, 1], block_size)


def test_the_stand_in_does_fail_when_a_kernel_is_reached(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above would pass vacuously if the stand-in let calls through."""
    monkeypatch.setattr(_cpu_kernels, "_C", _NoKernels())
    attn = make_attention(4, 2, 4)
    (seq,) = make_seqs([3], attn, 4, seed=1)
    assert attn.backend.name == "CPU_ATTN"
    with pytest.raises(AssertionError, match="called pagedllm._C"):
        step_and_check(attn, [seq], [3], 4)
