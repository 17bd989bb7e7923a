"""Group-quantized weights as GGUF blocks, read back by gguf-py's own dequantize: Q4_0 and
Q8_0 hold fp16-scaled weights exactly, Q4_1 to the fp16 rounding of its m."""

import pytest
import torch
from gguf.quants import dequantize as gguf_dequantize

from pagedllm.model_loader.group_blocks import GroupQuantized, Q, native_block_type


def random_layer(bits: int, group: int, symmetric: bool, n: int = 6, k: int = 128):
    gen = torch.Generator().manual_seed(bits * 1000 + group)
    codes = torch.randint(0, 1 << bits, (n, k), generator=gen, dtype=torch.uint8)
    groups = -(-k // group)
    scale = (torch.rand(n, groups, generator=gen) * 0.02 + 1e-3).to(torch.float16)
    if symmetric:
        zero = torch.full((n, groups), 1 << (bits - 1), dtype=torch.int32)
    else:
        zero = torch.randint(0, 1 << bits, (n, groups), generator=gen, dtype=torch.int32)
    return GroupQuantized(codes, scale, zero, bits, group)


@pytest.mark.parametrize(
    ("bits", "symmetric", "qtype"), [(4, True, Q.Q4_0), (8, True, Q.Q8_0), (4, False, Q.Q4_1)]
)
@pytest.mark.parametrize("group", [32, 64, 128, 96])
def test_blocks_dequantize_to_the_layer(bits: int, symmetric: bool, qtype: Q, group: int) -> None:
    layer = random_layer(bits, group, symmetric)
    assert layer.block_type() == qtype
    blocks = layer.to_blocks(qtype)
    got = torch.from_numpy(gguf_dequantize(blocks.numpy(), qtype))
    want = layer.dequantize(torch.float64)
    if qtype == Q.Q4_1:  # m = -z * s rounded to fp16
        bound = (layer.zero.double() * layer.scale.double()).abs().max() * 2.0**-11
        assert (got.double() - want).abs().max() <= bound
    else:
        assert torch.equal(got.double(), want)


def test_a_short_last_group() -> None:
    """GPTQ's groups of 64 over 96 columns: the last group holds 32."""
    layer = random_layer(4, 64, True, k=96)
    got = torch.from_numpy(gguf_dequantize(layer.to_blocks(Q.Q4_0).numpy(), Q.Q4_0))
    assert torch.equal(got.double(), layer.dequantize(torch.float64))


@pytest.mark.parametrize(
    ("bits", "symmetric", "group", "columns", "qtype"),
    [
        (4, True, 128, 4096, Q.Q4_0),
        (4, False, 64, 4096, Q.Q4_1),
        (8, True, 4096, 4096, Q.Q8_0),
        (8, False, 128, 4096, None),  # no 8-bit type with a minimum
        (2, True, 128, 4096, None),
        (4, True, 16, 4096, None),  # groups smaller than a block
        (4, True, 96, 4080, None),  # rows not of whole blocks
    ],
)
def test_native_block_type(bits, symmetric, group, columns, qtype) -> None:
    assert native_block_type(bits, symmetric, group, columns) == qtype


def test_scales_of_the_wrong_shape_are_an_error() -> None:
    with pytest.raises(ValueError, match=r"scale of shape \(6, 3\) for 6 x 128 weights"):
        GroupQuantized(
            torch.zeros(6, 128, dtype=torch.uint8),
            torch.ones(6, 3),
            torch.zeros(6, 3, dtype=torch.int32),
            4,
            32,
        )
