"""Each format's layer tensors read back into codes, scales and zeros, against the packers
of tests/quantized_checkpoints.py (written from the formats' definitions)."""

import pytest
import torch

from pagedllm.checkpoint_quant import parse_quantization_config
from pagedllm.model_loader.checkpoint_formats import is_quantized_layer, read_layer, unpack
from pagedllm.model_loader.group_blocks import GroupQuantized
from tests import quantized_checkpoints as qc


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_unpack_inverts_the_packers(bits: int) -> None:
    codes = torch.randint(0, 1 << bits, (64, 40), dtype=torch.uint8)
    assert torch.equal(unpack(qc.pack_rows(codes, bits), bits, dim=0), codes)
    assert torch.equal(unpack(qc.pack_columns(codes.t(), bits), bits, dim=1), codes.t())


def read(config: dict, tensors: dict) -> GroupQuantized | torch.Tensor:
    quant = parse_quantization_config(config)
    named = {f"layer.{k}": v for k, v in tensors.items()}
    assert is_quantized_layer(quant, "layer", named.__getitem__, named.__contains__)
    return read_layer(quant, "layer", named.__getitem__, named.__contains__)


def test_awq_columns_come_back_in_order() -> None:
    w = torch.randn(16, 64)
    codes, scale, zero = qc.group_quantize(w, 4, 32, False)
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    layer = read(
        {"quant_method": "awq", "bits": 4, "group_size": 32},
        {
            "qweight": qc.pack_columns(codes.t(), 4, order),
            "qzeros": qc.pack_columns(zero.t(), 4, order),
            "scales": scale.t(),
        },
    )
    assert torch.equal(layer.codes, codes) and torch.equal(layer.zero, zero)


def test_gptq_act_order_is_dequantized_through_g_idx() -> None:
    w = torch.randn(16, 64)
    g_idx = (torch.arange(64) // 32)[torch.randperm(64)]
    codes, scale, zero = qc.group_quantize(w, 4, 32, True, g_idx)
    layer = read(
        {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True},
        {
            "qweight": qc.pack_rows(codes.t(), 4),
            "qzeros": qc.pack_columns((zero - 1).t(), 4),
            "scales": scale.t(),
            "g_idx": g_idx.to(torch.int32),
        },
    )
    assert torch.equal(layer, qc.dequantize(codes, scale, zero, g_idx))


def test_fp8_scales_per_block_with_partial_blocks() -> None:
    """Blocks of 32 x 32 over 40 x 48: the last row and column of blocks are partial."""
    weight = torch.randn(40, 48).to(torch.float8_e4m3fn)
    scales = torch.rand(2, 2) + 0.5
    layer = read(
        {"quant_method": "fp8", "weight_block_size": [32, 32]},
        {"weight": weight, "weight_scale_inv": scales},
    )
    want = weight.float().clone()
    for i in range(2):
        for j in range(2):
            want[i * 32 : (i + 1) * 32, j * 32 : (j + 1) * 32] *= scales[i, j]
    assert torch.equal(layer, want)
    with pytest.raises(ValueError, match=r"scales of shape \(1, 2\) for 40 x 48"):
        read(
            {"quant_method": "fp8", "weight_block_size": [32, 32]},
            {"weight": weight, "weight_scale_inv": scales[:1]},
        )


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_gptq_v1_zeros_of_zero_borrow_from_the_next_field(bits: int) -> None:
    """GPTQModel subtracts one from the whole word: a zero of 0 takes one off the zero above
    it in the word, which adding one to the whole word gives back."""
    w = torch.randn(16, 64)
    codes, scale, zero = qc.group_quantize(w, bits, 32, False)
    zero[::2] = 0  # every other row's zeros underflow
    qzeros = qc.pack_columns(zero.t(), bits)
    layer = read(
        {"quant_method": "gptq", "bits": bits, "group_size": 32, "sym": False},
        {
            "qweight": qc.pack_rows(codes.t(), bits),
            "qzeros": qc.v1_zeros(qzeros, bits),
            "scales": scale.t(),
        },
    )
    assert torch.equal(layer.zero, zero)


def test_gptq_dynamic_overrides_a_layers_bits() -> None:
    quant = parse_quantization_config(
        {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": 32,
            "dynamic": {r"+:.*down_proj": {"bits": 8}, r"-:.*o_proj": {}},
        }
    )
    w = torch.randn(16, 64)
    codes, scale, zero = qc.group_quantize(w, 8, 32, True)
    named = {
        "mlp.down_proj.qweight": qc.pack_rows(codes.t(), 8),
        "mlp.down_proj.qzeros": qc.v1_zeros(qc.pack_columns(zero.t(), 8), 8),
        "mlp.down_proj.scales": scale.t(),
    }
    layer = read_layer(quant, "mlp.down_proj", named.__getitem__, named.__contains__)
    assert layer.bits == 8 and torch.equal(layer.codes, codes)
    assert quant.scheme("mlp.up_proj").bits == 4


def test_older_compressed_tensors_zero_points_are_stored_unpacked() -> None:
    """Before their packing, asymmetric zero points were int8 [N, G], signed."""
    codes = torch.randint(0, 16, (8, 64), dtype=torch.uint8)
    signed_zero = torch.randint(-8, 8, (8, 2), dtype=torch.int8)
    scale = torch.rand(8, 2) + 0.1
    config = {
        "quant_method": "compressed-tensors",
        "config_groups": {
            "g": {
                "targets": ["Linear"],
                "format": "pack-quantized",
                "weights": {
                    "num_bits": 4,
                    "strategy": "group",
                    "group_size": 32,
                    "symmetric": False,
                },
            }
        },
    }
    layer = read(
        config,
        {
            "weight_packed": qc.pack_columns(codes, 4),
            "weight_scale": scale,
            "weight_shape": torch.tensor([8, 64]),
            "weight_zero_point": signed_zero,
        },
    )
    assert torch.equal(layer.zero, signed_zero.to(torch.int32) + 8)


def test_fp8_ue8m0_scales_stored_as_bytes() -> None:
    weight = torch.randn(32, 32).to(torch.float8_e4m3fn)
    exponents = torch.tensor([[120]], dtype=torch.uint8)  # 2^(120 - 127)
    layer = read(
        {"quant_method": "fp8", "weight_block_size": [32, 32], "scale_fmt": "ue8m0"},
        {"weight": weight, "weight_scale_inv": exponents},
    )
    assert torch.equal(layer, weight.float() * 2.0**-7)
