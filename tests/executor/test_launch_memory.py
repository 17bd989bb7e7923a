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
    first, second = (launch.args for launch in planned)
    out_at, res_at = second[2], second[3]
    assert first[:2] == (out_at, res_at) and abs(out_at - res_at) >= 3 * 32 * 4
    assert first[2:] == launches[0].args[2:]  # x, residual, weight, the flag, eps, sizes
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


@needs_kernels
def test_only_declared_pointers_move() -> None:
    """An int argument whose value happens to lie in a buffer (here rms_norm's group_stride
    set to an output's address) is not a pointer and keeps its value; the declared pointers
    into buffers move into the arena."""
    x, weight = torch.randn(2, 16), torch.randn(16)
    launches, outputs, eager = _chain(x, weight, steps=2)
    stride_at = [arg.name for arg in _cpu_kernels.rowwise.RMS_NORM.args].index("group_stride")
    address = outputs[0].data_ptr() + 4
    args = list(launches[1].args)
    args[stride_at] = address
    planned, arena, _ = launch_memory.plan(
        [launches[0], launches[1]._replace(args=tuple(args))], outputs, eager
    )
    assert planned[1].args[stride_at] == address
    assert planned[1].pointers == launches[1].pointers
    for launch in planned:
        out = launch.args[launch.pointers[0]]
        assert arena.data_ptr() <= out < arena.data_ptr() + arena.numel()
