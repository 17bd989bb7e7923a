"""launch_memory.plan: a capture's buffers packed by lifetime. Reference: the recorded
launches run on their own buffers (eager), bit for bit."""

import pytest
import torch

from pagedllm import _cpu_kernels
from pagedllm.executor import launch_memory

needs_kernels = pytest.mark.skipif(not _cpu_kernels.available(), reason="no pagedllm._C")


def _chain(x: torch.Tensor, weight: torch.Tensor, steps: int) -> tuple[list, list, torch.Tensor]:
    """steps RMSNorms, each on the last one's output: (launches, outputs, last output)."""
    outputs = [x]
    with _cpu_kernels.record_launches() as launches:
        for _ in range(steps):
            outputs.append(_cpu_kernels.rms_norm(outputs[-1], weight, 1e-6))
    return launches, outputs[1:], outputs[-1]


@needs_kernels
def test_a_chain_needs_two_buffers_and_replays_the_same_bits() -> None:
    x, weight = torch.randn(4, 64), torch.randn(64)
    launches, outputs, eager = _chain(x, weight, steps=10)
    planned, arena, output = launch_memory.plan(launches, outputs, eager)
    # each output lives from its launch to the next one's: two of 1 KB at a time
    assert arena.numel() <= 2 * 1024
    _cpu_kernels.replay_launches(planned)
    assert torch.equal(output, eager)
    x.copy_(torch.randn(4, 64))  # the input is not a buffer: replay reads its new values
    _cpu_kernels.replay_launches(planned)
    assert torch.equal(output, _chain(x, weight, steps=10)[2])


@needs_kernels
def test_buffers_live_at_once_do_not_share_bytes() -> None:
    """fused_add_rms_norm's two outputs, both read by a later launch, get disjoint bytes;
    arguments that are no buffer's address (sizes, the eps, the weight) stay as they were."""
    x, residual, weight = torch.randn(3, 32), torch.randn(3, 32), torch.randn(32)
    with _cpu_kernels.record_launches() as launches:
        out, res = _cpu_kernels.fused_add_rms_norm(x, residual, weight, 1e-6)
        final, _ = _cpu_kernels.fused_add_rms_norm(out, res, weight, 1e-6)
    eager = final.clone()
    allocations = [out, res, final, _]
    planned, arena, output = launch_memory.plan(launches, allocations, final)
    first, second = (args for _, args in planned)
    out_at, res_at = second[2], second[3]
    assert first[:2] == (out_at, res_at) and abs(out_at - res_at) >= 3 * 32 * 4
    assert first[2:] == launches[0][1][2:]  # x, residual, weight, sizes, eps
    assert arena.data_ptr() <= min(out_at, res_at) < arena.data_ptr() + arena.numel()
    final.zero_()
    _cpu_kernels.replay_launches(planned)
    assert torch.equal(output, eager)


@needs_kernels
def test_an_output_capture_did_not_allocate_stays_where_it_is() -> None:
    x, weight = torch.randn(2, 16), torch.randn(16)
    launches, outputs, _ = _chain(x, weight, steps=2)
    planned, _, output = launch_memory.plan(launches, outputs, x)
    assert output is x and len(planned) == 2
