"""The checked boundary to pagedllm._C: every kernel called wrongly (dtype, device, layout,
shape, swapped arguments, out-of-range indices) raises ValueError naming the argument, and
the process lives on. Reference: the argument contracts in csrc/ops.h."""

import pathlib
import re
from collections.abc import Callable

import pytest
import torch

import pagedllm
from pagedllm import _cpu_kernels
from pagedllm._cpu_kernels import rowwise
from pagedllm._cpu_kernels.boundary import KERNELS
from pagedllm._cpu_kernels.flags import RotaryStyle

NUM_BLOCKS, BLOCK_SIZE, KV, HEADS, D, B = 6, 4, 2, 4, 8, 2


def _attention(**override: object) -> torch.Tensor:
    args = {
        "query": torch.randn(B, HEADS, D),
        "k_cache": torch.randn(NUM_BLOCKS, BLOCK_SIZE, KV, D),
        "v_cache": torch.randn(NUM_BLOCKS, BLOCK_SIZE, KV, D),
        "block_tables": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        "seq_lens": torch.tensor([5, 8], dtype=torch.int32),
        "scale": 0.5,
    }
    return _cpu_kernels.paged_decode_attention(**{**args, **override})


def _cache_write(**override: object) -> None:
    args = {
        "key": torch.randn(3, KV, D),
        "value": torch.randn(3, KV, D),
        "k_cache": torch.zeros(NUM_BLOCKS, BLOCK_SIZE, KV, D),
        "v_cache": torch.zeros(NUM_BLOCKS, BLOCK_SIZE, KV, D),
        "slot_mapping": torch.tensor([0, 5, 23]),
    }
    _cpu_kernels.reshape_and_cache(**{**args, **override})


def _rotary(**override: object) -> tuple[torch.Tensor, torch.Tensor]:
    args = {
        "positions": torch.tensor([0, 7, 3]),
        "query": torch.randn(3, HEADS * D),
        "key": torch.randn(3, KV * D),
        "head_size": D,
        "cos_sin_cache": torch.randn(8, D),
        "is_neox_style": True,
    }
    return _cpu_kernels.rotary_embedding(**{**args, **override})


def _rms_norm(**override: object) -> torch.Tensor:
    args = {"x": torch.randn(3, 16), "weight": torch.randn(16), "eps": 1e-6}
    return _cpu_kernels.rms_norm(**{**args, **override})


def _fused_norm(**override: object) -> tuple[torch.Tensor, torch.Tensor]:
    args = {"x": torch.randn(3, 16), "residual": torch.randn(3, 16), "weight": torch.randn(16)}
    return _cpu_kernels.fused_add_rms_norm(**{**args, **override}, eps=1e-6)


def _layer_norm(**override: object) -> torch.Tensor:
    args = {"x": torch.randn(3, 16), "weight": torch.randn(16), "bias": torch.randn(16)}
    return _cpu_kernels.layer_norm(**{**args, **override}, eps=1e-5)


def _fused_layer_norm(**override: object) -> tuple[torch.Tensor, torch.Tensor]:
    args = {"x": torch.randn(3, 16), "residual": torch.randn(3, 16), "weight": torch.randn(16)}
    args["bias"] = torch.randn(16)
    return _cpu_kernels.fused_add_layer_norm(**{**args, **override}, eps=1e-5)


def _gemm(**override: object) -> torch.Tensor:
    args = {"x": torch.randn(2, 16), "weight": torch.randn(5, 16), "bias": torch.randn(5)}
    return _cpu_kernels.skinny_gemm(**{**args, **override})


def _bf16(*shape: int) -> torch.Tensor:
    return torch.randn(shape).to(torch.bfloat16)


def _gemm_bf16(**override: object) -> torch.Tensor:
    args = {"x": _bf16(2, 16), "weight": _bf16(5, 16), "bias": _bf16(5)}
    return _cpu_kernels.skinny_gemm_bf16(**{**args, **override})


def _amx(**override: object) -> torch.Tensor:
    args = {
        "x": _bf16(2, 32),
        "packed": _cpu_kernels.amx_pack_bf16(_bf16(16, 32)),
        "bias": _bf16(16),
    }
    return _cpu_kernels.amx_gemm_bf16(**{**args, **override})


def _prefill_f32(**override: object) -> torch.Tensor:
    args = {
        "query": torch.randn(3, HEADS, 32),
        "k_cache": torch.zeros(NUM_BLOCKS, BLOCK_SIZE, KV, 32),
        "v_cache": torch.zeros(NUM_BLOCKS, BLOCK_SIZE, KV, 32),
        "block_table": torch.tensor([4, 1], dtype=torch.int32),
        "seq_len": 5,
        "scale": 0.5,
    }
    return _cpu_kernels.prefill_attention_f32(**{**args, **override})


def _silu(**override: object) -> torch.Tensor:
    return _cpu_kernels.silu_and_mul(**{"x": torch.randn(3, 10), **override})


def _gelu(**override: object) -> torch.Tensor:
    return _cpu_kernels.gelu_and_mul(**{"x": torch.randn(3, 10), "approximate": "tanh", **override})


CACHE = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, KV, D)
TABLES = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)

BAD_CALLS: dict[str, tuple[Callable[[], object], str]] = {
    "attention k_cache float64": (
        lambda: _attention(k_cache=CACHE.double()),
        r"paged_decode_attention: k_cache must be a contiguous float32 CPU tensor of shape "
        r"\[num_blocks, block_size, num_kv_heads, head_dim\], got float64",
    ),
    "attention query on meta": (
        lambda: _attention(query=torch.empty(B, HEADS, D, device="meta")),
        "query must be .* got float32 meta tensor",
    ),
    "attention v_cache strided": (
        lambda: _attention(v_cache=CACHE.transpose(0, 1).contiguous().transpose(0, 1)),
        r"v_cache must be a contiguous .* got .* \(strides",
    ),
    "attention query 2-D": (lambda: _attention(query=torch.randn(B, HEADS * D)), "query must"),
    "attention block_tables int64": (lambda: _attention(block_tables=TABLES.long()), "block_tab"),
    "attention seq_lens too short": (
        lambda: _attention(seq_lens=torch.tensor([5], dtype=torch.int32)),
        r"seq_lens must .* = \[2\]",
    ),
    "attention caches swapped with tables": (
        lambda: _attention(k_cache=TABLES, block_tables=CACHE),
        "k_cache must .* got int32",
    ),
    "attention query as a list": (lambda: _attention(query=[[1.0]]), "query must .* got list"),
    "attention heads not grouped": (
        lambda: _attention(query=torch.randn(B, 3, D)),
        "num_kv_heads 2 must divide num_heads 3",
    ),
    "attention head_dim differs": (lambda: _attention(query=torch.randn(B, 4, 16)), "head_dim"),
    "attention block id out of range": (
        lambda: _attention(block_tables=torch.tensor([[0, 1], [2, 6]], dtype=torch.int32)),
        r"block_tables\[1, 1\] = 6 is outside \[0, 6\)",
    ),
    "attention empty sequence": (
        lambda: _attention(seq_lens=torch.tensor([0, 8], dtype=torch.int32)),
        r"seq_lens\[0\] = 0 is outside \[1, 8\]",
    ),
    "attention sequence past its table": (
        lambda: _attention(seq_lens=torch.tensor([5, 9], dtype=torch.int32)),
        r"seq_lens\[1\] = 9 is outside \[1, 8\]",
    ),
    "skinny_gemm unknown isa": (
        lambda: _gemm(isa="avx10"),
        r"skinny_gemm: isa 'avx10' is not one of this CPU's \(.*'portable'\)",
    ),
    "skinny_gemm_bf16 unknown isa": (
        lambda: _gemm_bf16(isa="sve"),
        r"skinny_gemm_bf16: isa 'sve' is not one of this CPU's \(.*'portable'\)",
    ),
    "attention unknown isa": (
        lambda: _attention(isa="neon"),
        r"paged_decode_attention: isa 'neon' is not one of this CPU's \(.*'portable'\)",
    ),
    "cache write slot_mapping int32": (
        lambda: _cache_write(slot_mapping=torch.tensor([0, 1, 2], dtype=torch.int32)),
        "slot_mapping must be a contiguous int64",
    ),
    "cache write slot past the cache": (
        lambda: _cache_write(slot_mapping=torch.tensor([0, 24, 1])),
        r"reshape_and_cache: slot_mapping\[1\] = 24 is outside \[-1, 24\)",
    ),
    "cache write negative slot": (
        lambda: _cache_write(slot_mapping=torch.tensor([-2, 2, 1])),
        r"slot_mapping\[0\] = -2 is outside \[-1, 24\)",
    ),
    "argmax x 1-D": (lambda: _cpu_kernels.argmax(torch.randn(5)), r"x must .* \[rows, n\]"),
    "argmax x float16": (
        lambda: _cpu_kernels.argmax(torch.randn(2, 5).half()),
        "x must be a contiguous float32",
    ),
    "argmax no columns": (
        lambda: _cpu_kernels.argmax(torch.randn(2, 0)),
        "at least one column",
    ),
    "convert to float16": (
        lambda: _cpu_kernels.convert(torch.randn(3), torch.float16),
        "dtype must be float32 or bfloat16",
    ),
    "convert a strided x": (
        lambda: _cpu_kernels.convert(torch.randn(4, 3).t(), torch.bfloat16),
        "x must be a contiguous",
    ),
    "cache write key and cache swapped": (
        lambda: _cache_write(key=CACHE, k_cache=torch.randn(3, KV, D)),
        "key must",
    ),
    "cache write value of other shape": (
        lambda: _cache_write(value=torch.randn(3, KV, 2 * D)),
        r"value must .* = \[3, 2, 8\]",
    ),
    "cache write head sizes differ": (
        lambda: _cache_write(
            k_cache=torch.zeros(6, 4, KV, 2 * D), v_cache=torch.zeros(6, 4, KV, 16)
        ),
        "k_cache has 2 kv heads of size 16, key has 2 of size 8",
    ),
    "cache write key with strided heads": (
        lambda: _cache_write(key=torch.randn(3, D, KV).transpose(1, 2)),
        "key must be a row-dense",
    ),
    "rotary positions int32": (
        lambda: _rotary(positions=torch.tensor([0, 1, 2], dtype=torch.int32)),
        "positions must be a contiguous int64",
    ),
    "rotary position past the cache": (
        lambda: _rotary(positions=torch.tensor([0, 8, 1])),
        r"rotary_embedding: positions\[1\] = 8 is outside \[0, 8\)",
    ),
    "rotary query transposed": (
        lambda: _rotary(query=torch.randn(HEADS * D, 3).t()),
        "query must be a row-dense",
    ),
    "rotary positions and query swapped": (
        lambda: _rotary(positions=torch.randn(3, HEADS * D), query=torch.tensor([0, 7, 3])),
        "positions must",
    ),
    "rotary token counts differ": (lambda: _rotary(key=torch.randn(2, KV * D)), "2 and 3 tokens"),
    "rotary_dim past the head": (lambda: _rotary(head_size=4), r"rotary_dim 8 must be even"),
    "rotary cache 1-D": (lambda: _rotary(cos_sin_cache=torch.randn(64)), "cos_sin_cache must"),
    "rms_norm weight of other size": (lambda: _rms_norm(weight=torch.randn(15)), r"= \[16\]"),
    "rms_norm x float64": (lambda: _rms_norm(x=torch.randn(3, 16).double()), "x must"),
    "rms_norm x 0-D": (lambda: _rms_norm(x=torch.tensor(1.0)), r"x must .* \[\.\.\., n\]"),
    "rms_norm x and weight swapped": (
        lambda: _rms_norm(x=torch.randn(16), weight=torch.randn(3, 16)),
        "weight must",
    ),
    "fused norm residual of other shape": (
        lambda: _fused_norm(residual=torch.randn(2, 16)),
        r"residual must .* = \[3, 16\]",
    ),
    "fused norm residual transposed": (
        lambda: _fused_norm(residual=torch.randn(16, 3).t()),
        "residual must be a contiguous",
    ),
    "gemm K differs": (lambda: _gemm(weight=torch.randn(5, 15)), "weight .* has K = 15"),
    "gemm bias of other size": (lambda: _gemm(bias=torch.randn(4)), r"bias must .* = \[5\]"),
    "gemm weight and bias swapped": (
        lambda: _gemm(weight=torch.randn(5), bias=torch.randn(5, 16)),
        "weight must",
    ),
    "gemm x on meta": (lambda: _gemm(x=torch.empty(2, 16, device="meta")), "x must"),
    "gemm_bf16 weight float32": (
        lambda: _gemm_bf16(weight=torch.randn(5, 16)),
        "skinny_gemm_bf16: weight must be a contiguous bfloat16",
    ),
    "gemm_bf16 K differs": (lambda: _gemm_bf16(weight=_bf16(5, 15)), "weight .* has K = 15"),
    "gemm_bf16 bias of other size": (lambda: _gemm_bf16(bias=_bf16(4)), r"bias must .* = \[5\]"),
    "attention v_cache dtype differs from k_cache's": (
        lambda: _attention(k_cache=CACHE.bfloat16()),
        "v_cache must be a contiguous bfloat16",
    ),
    "attention query bfloat16": (
        lambda: _attention(query=_bf16(B, HEADS, D)),
        "query must be a contiguous float32",
    ),
    "cache write value dtype differs from key's": (
        lambda: _cache_write(key=_bf16(3, KV, D)),
        "value must be a row-dense bfloat16",
    ),
    "rms_norm weight float32 with bfloat16 x": (
        lambda: _rms_norm(x=_bf16(3, 16)),
        "rms_norm: weight must be a contiguous bfloat16",
    ),
    "fused norm residual float32 with bfloat16 x": (
        lambda: _fused_norm(x=_bf16(3, 16), weight=_bf16(16)),
        "fused_add_rms_norm: residual must be a contiguous bfloat16",
    ),
    "rotary key float32 with a bfloat16 query": (
        lambda: _rotary(query=_bf16(3, HEADS * D)),
        "rotary_embedding: key must be a row-dense bfloat16",
    ),
    "rotary cache bfloat16": (
        lambda: _rotary(query=_bf16(3, HEADS * D), key=_bf16(3, KV * D), cos_sin_cache=_bf16(8, D)),
        "cos_sin_cache must be a contiguous float32",
    ),
    "amx pack float32": (
        lambda: _cpu_kernels.amx_pack_bf16(torch.randn(16, 32)),
        "amx_pack_bf16: weight must be a contiguous bfloat16",
    ),
    "amx pack N not whole tiles": (
        lambda: _cpu_kernels.amx_pack_bf16(_bf16(24, 32)),
        r"\[24, 32\] needs N % 16 == 0 and K % 32 == 0",
    ),
    "amx pack K not whole tiles": (lambda: _cpu_kernels.amx_pack_bf16(_bf16(16, 48)), "K % 32"),
    "amx weight not packed": (
        lambda: _amx(packed=_bf16(16, 32)),
        r"packed must .* of shape \[N / 16, K / 32, 16, 32\], got .* \[16, 32\]",
    ),
    "amx packed not tiles": (
        lambda: _amx(packed=_bf16(1, 1, 16, 16)),
        r"packed weight \(1, 1, 16, 16\) is not \[N / 16, K / 32, 16, 32\]",
    ),
    "amx K differs": (lambda: _amx(x=_bf16(2, 64)), "packed weight has K = 32, x .* has K = 64"),
    "amx x float32": (lambda: _amx(x=torch.randn(2, 32)), "x must be a contiguous bfloat16"),
    "amx bias of other size": (lambda: _amx(bias=_bf16(8)), r"bias must .* = \[16\]"),
    "prefill block_table 2-D": (
        lambda: _prefill_f32(block_table=TABLES),
        r"block_table must .* \[max_blocks\]",
    ),
    "prefill float32 query bf16": (
        lambda: _prefill_f32(query=_bf16(3, HEADS, 32)),
        "prefill_attention_f32: query must be a contiguous float32",
    ),
    "prefill float32 caches of two dtypes": (
        lambda: _prefill_f32(v_cache=torch.zeros(NUM_BLOCKS, BLOCK_SIZE, KV, 32).bfloat16()),
        "v_cache must be a contiguous float32 .* like k_cache",
    ),
    "prefill float32 head_dim 0": (
        lambda: _prefill_f32(
            query=torch.randn(3, HEADS, 0),
            k_cache=torch.zeros(NUM_BLOCKS, BLOCK_SIZE, KV, 0),
            v_cache=torch.zeros(NUM_BLOCKS, BLOCK_SIZE, KV, 0),
        ),
        "head_dim 0 must be positive",
    ),
    "attention negative sliding_window": (
        lambda: _attention(sliding_window=-1),
        r"paged_decode_attention: sliding_window -1 must be >= 0 \(0: none\)",
    ),
    "attention soft cap NaN": (
        lambda: _attention(logits_soft_cap=float("nan")),
        r"logits_soft_cap nan must be >= 0",
    ),
    "prefill float32 negative soft cap": (
        lambda: _prefill_f32(logits_soft_cap=-30.0),
        r"prefill_attention_f32: logits_soft_cap -30.0 must be >= 0",
    ),
    "prefill float32 isa of another kernel": (
        lambda: _prefill_f32(isa="amx"),
        r"prefill_attention_f32: isa 'amx' is not one of this CPU's",
    ),
    "silu odd width": (lambda: _silu(x=torch.randn(3, 9)), "last dim must be even"),
    "silu x strided": (lambda: _silu(x=torch.randn(10, 3).t()), "x must be a contiguous"),
    "layer_norm bias of other size": (
        lambda: _layer_norm(bias=torch.randn(15)),
        r"layer_norm: bias must .* \[n\], n = x's last dim = \[16\]",
    ),
    "layer_norm x strided": (lambda: _layer_norm(x=torch.randn(16, 3).t()), "x must be a contig"),
    "layer_norm bias bfloat16 with float32 x": (
        lambda: _layer_norm(bias=_bf16(16)),
        "layer_norm: bias must be a contiguous float32",
    ),
    "fused layer norm residual of other shape": (
        lambda: _fused_layer_norm(residual=torch.randn(2, 16)),
        r"fused_add_layer_norm: residual must .* = \[3, 16\]",
    ),
    "gelu strided": (
        lambda: _cpu_kernels.gelu(torch.randn(10, 3).t()),
        "gelu: x must be a contiguous",
    ),
    "gelu another form of its own": (
        lambda: _cpu_kernels.gelu(torch.randn(3), "erf"),
        r"gelu: approximate must be one of \['none', 'tanh'\], got 'erf'",
    ),
    "gelu odd width": (lambda: _gelu(x=torch.randn(3, 9)), "gelu_and_mul: .* must be even"),
    "gelu another form": (
        lambda: _gelu(approximate="erf"),
        r"gelu_and_mul: approximate must be one of \['none', 'tanh'\], got 'erf'",
    ),
}


@pytest.mark.parametrize("case", BAD_CALLS)
def test_a_wrong_call_raises_value_error_naming_the_argument(case: str) -> None:
    call, message = BAD_CALLS[case]
    with pytest.raises(ValueError, match=message):
        call()


def test_the_valid_calls_above_run() -> None:
    """The cases differ from these calls by the one argument they break."""
    assert _attention().shape == (B, HEADS, D)
    assert _attention(isa="portable").shape == (B, HEADS, D)
    _cache_write()
    assert [t.shape for t in _rotary()] == [(3, HEADS * D), (3, KV * D)]
    assert _rms_norm().shape == (3, 16)
    assert [t.shape for t in _fused_norm()] == [(3, 16), (3, 16)]
    assert _layer_norm().shape == (3, 16)
    assert [t.shape for t in _fused_layer_norm()] == [(3, 16), (3, 16)]
    assert _layer_norm(x=_bf16(3, 16), weight=_bf16(16), bias=_bf16(16)).dtype == torch.bfloat16
    assert _cpu_kernels.gelu(_bf16(3, 10), "tanh").dtype == torch.bfloat16
    assert _gemm().shape == (2, 5)
    assert _gemm(isa="portable").shape == (2, 5)
    assert _gemm_bf16().shape == (2, 5)
    assert _gemm_bf16(isa="portable").shape == (2, 5)
    bf16_cache = CACHE.bfloat16()
    assert _attention(k_cache=bf16_cache, v_cache=bf16_cache).shape == (B, HEADS, D)
    _cache_write(k_cache=bf16_cache.clone(), v_cache=bf16_cache.clone())
    assert _silu().shape == (3, 5)
    if _cpu_kernels.amx_available():
        assert _amx().shape == (2, 16)
    for isa in (None, *_cpu_kernels.prefill_attention_f32_isas()):
        assert _prefill_f32(isa=isa).shape == (3, HEADS, 32)
    bf16_cache_32 = _bf16(NUM_BLOCKS, BLOCK_SIZE, KV, 32)
    assert _prefill_f32(k_cache=bf16_cache_32, v_cache=bf16_cache_32).shape == (3, HEADS, 32)
    assert _silu(x=_bf16(3, 10)).dtype == torch.bfloat16
    assert _gelu().shape == _gelu(approximate="none").shape == (3, 5)
    assert _gelu(x=_bf16(3, 10)).dtype == torch.bfloat16
    assert _cpu_kernels.convert(_bf16(3, 10), torch.float32).dtype == torch.float32
    assert _cpu_kernels.argmax(torch.randn(2, 5)).dtype == torch.int64
    assert _rms_norm(x=_bf16(3, 16), weight=_bf16(16)).dtype == torch.bfloat16
    bf16_norm = _fused_norm(x=_bf16(3, 16), residual=_bf16(3, 16), weight=_bf16(16))
    assert [t.dtype for t in bf16_norm] == [torch.bfloat16] * 2
    bf16_rope = _rotary(query=_bf16(3, HEADS * D), key=_bf16(3, KV * D))
    assert [t.dtype for t in bf16_rope] == [torch.bfloat16] * 2


@pytest.mark.parametrize(
    "builds",
    [
        _cpu_kernels.paged_attention_isas,
        _cpu_kernels.skinny_gemm_isas,
        _cpu_kernels.prefill_attention_f32_isas,
    ],
)
def test_builds_are_the_supported_ones_best_first(builds: Callable[[], tuple[str, ...]]) -> None:
    """The portable build runs everywhere; an x86-64 CPU with AVX-512 runs AVX2 too, one with
    AVX-512 BF16 (skinny_gemm's avx512_bf16 build) AVX-512 too, as torch's probe says."""
    isas = builds()
    order = ("avx512_bf16", "avx512", "avx2", "portable")
    assert isas[-1] == "portable"
    assert list(isas) == [name for name in order if name in isas]
    if "avx512" in isas:
        assert "avx2" in isas
    if "avx512_bf16" in isas:
        assert "avx512" in isas and torch.cpu._is_avx512_bf16_supported()


def test_a_padding_slot_is_not_written() -> None:
    """slot_mapping -1 (a padded row of a captured decode step) skips that row; the others
    land in their slots."""
    key, value = torch.randn(3, KV, D), torch.randn(3, KV, D)
    k_cache, v_cache = (
        torch.zeros(NUM_BLOCKS, BLOCK_SIZE, KV, D),
        torch.zeros(NUM_BLOCKS, BLOCK_SIZE, KV, D),
    )
    slots = torch.tensor([5, -1, 23])
    _cache_write(key=key, value=value, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots)
    for cache, rows in ((k_cache, key), (v_cache, value)):
        flat = cache.view(-1, KV, D)
        assert torch.equal(flat[[5, 23]], rows[[0, 2]])
        assert flat.count_nonzero() == 2 * KV * D


def test_recorded_launches_replay_the_same_kernels_on_the_same_memory() -> None:
    """record_launches lists the launches of its block (which still run); replaying them
    reruns the kernels on the memory they pointed at, reading its new contents."""
    x, weight = torch.randn(3, 16), torch.randn(16)
    with _cpu_kernels.record_launches() as launches:
        out = _cpu_kernels.rms_norm(x, weight, 1e-6)
    assert len(launches) == 1 and torch.equal(out, _cpu_kernels.rms_norm(x, weight, 1e-6))
    x.copy_(torch.randn(3, 16))
    _cpu_kernels.replay_launches(launches)
    assert torch.equal(out, _cpu_kernels.rms_norm(x, weight, 1e-6))
    _rms_norm()
    assert len(launches) == 1  # nothing is recorded after the block
    with pytest.raises(RuntimeError, match="already active"):
        with _cpu_kernels.record_launches(), _cpu_kernels.record_launches():
            pass


PREFILL_INDEX_ERRORS = {
    "more queries than positions": (dict(seq_len=2), r"1 <= queries \(3\) <= seq_len \(2\)"),
    "past the table": (dict(seq_len=9), r"seq_len \(9\) <= max_blocks x block_size \(8\)"),
    "block id out of range": (
        dict(block_table=torch.tensor([4, 6], dtype=torch.int32)),
        r"block_table\[1\] = 6 is outside \[0, 6\)",
    ),
}


@pytest.mark.parametrize("case", PREFILL_INDEX_ERRORS)
def test_prefill_indices_are_checked_before_any_read(case: str) -> None:
    """Checked by the binding before the kernel runs."""
    override, message = PREFILL_INDEX_ERRORS[case]
    with pytest.raises(ValueError, match=message):
        _prefill_f32(**override)


@pytest.mark.skipif(_cpu_kernels.amx_available(), reason="this CPU has AMX tiles")
def test_amx_kernels_without_amx_are_a_runtime_error() -> None:
    with pytest.raises(RuntimeError, match="no AMX bf16 tiles"):
        _amx()


READER = {torch.float32: "avx2", torch.bfloat16: "avx512_bf16"}
"""The one build of skinny_gemm that reads packed weights of each dtype."""


@pytest.mark.parametrize("dtype", list(READER))
def test_one_build_reads_packed_weights_of_each_dtype(dtype: torch.dtype) -> None:
    """skinny_gemm_reads_packed per build, and for the best (None); a build this CPU does
    not run is a ValueError."""
    isas = _cpu_kernels.skinny_gemm_isas()
    for isa in isas:
        assert _cpu_kernels.skinny_gemm_reads_packed(dtype, isa) == (isa == READER[dtype])
    assert _cpu_kernels.skinny_gemm_reads_packed(dtype) == (isas[:1] == (READER[dtype],))
    with pytest.raises(ValueError, match="isa 'neon' is not one of this CPU's"):
        _cpu_kernels.skinny_gemm_reads_packed(dtype, "neon")


@pytest.mark.skipif(not _cpu_kernels.available(), reason="needs pagedllm._C")
@pytest.mark.parametrize("dtype", list(READER))
def test_a_packed_weight_goes_to_the_build_that_reads_it_only(dtype: torch.dtype) -> None:
    """Other builds (named, and the best where it is another), and packed shapes that are
    not skinny_pack's, raise ValueError."""
    packed = _cpu_kernels.skinny_pack(torch.randn(16, 64).to(dtype))
    x = torch.randn(2, 64).to(dtype)
    gemm = _cpu_kernels.skinny_gemm_bf16 if dtype is torch.bfloat16 else _cpu_kernels.skinny_gemm
    builds = _cpu_kernels.skinny_gemm_isas()
    reads = builds[0] == READER[dtype]
    for isa in [b for b in builds if b != READER[dtype]] + [None] * (not reads):
        build = isa or builds[0]
        with pytest.raises(ValueError, match=f"build '{build}' does not read packed weights"):
            gemm(x, packed, None, isa=isa)
    with pytest.raises(ValueError, match=r"packed weight \(.*\) is not \[N / "):
        gemm(x, packed.view(*packed.shape[:-2], -1, 8), None)
    wrong_k = r"packed weight has K = 64, x \[M, K\] has K = 32"  # after the build's check
    with pytest.raises(ValueError, match=wrong_k if reads else "does not read packed"):
        gemm(x[:, :32].contiguous(), packed, None)


WRONG_SCALARS: dict[str, tuple[Callable[[], object], str]] = {
    "attention scale a str": (
        lambda: _attention(scale="0.5"),
        "paged_decode_attention: scale must be a float, got str",
    ),
    "prefill seq_len a float": (
        lambda: _prefill_f32(seq_len=5.0),
        "prefill_attention_f32: seq_len must be an int, got float",
    ),
    "a binding given too few arguments": (
        lambda: _cpu_kernels._C.rms_norm(0, 0),
        r"rms_norm takes 10 arguments \(out:p x:p weight:p dtype:i eps:f",
    ),
    "a flag of plain int": (
        lambda: rowwise.SILU_AND_MUL.launch(torch.empty(3, 5), torch.randn(3, 10), 0, 3, 5, 1),
        "silu_and_mul: dtype must be a FloatType, got 0",
    ),
    "a flag of another enum": (
        lambda: rowwise.SILU_AND_MUL.launch(
            torch.empty(3, 5), torch.randn(3, 10), RotaryStyle.GPTJ, 3, 5, 1
        ),
        "silu_and_mul: dtype must be a FloatType",
    ),
}


@pytest.mark.skipif(not _cpu_kernels.available(), reason="needs pagedllm._C")
@pytest.mark.parametrize("case", WRONG_SCALARS)
def test_a_wrong_scalar_or_flag_is_a_type_error_naming_it(case: str) -> None:
    """An int, float or flag argument of another type: TypeError naming it (from the
    declaration for flags, from the binding for ints and floats), nothing run."""
    call, message = WRONG_SCALARS[case]
    with pytest.raises(TypeError, match=message):
        call()


@pytest.mark.skipif(not _cpu_kernels.available(), reason="needs pagedllm._C")
def test_the_declarations_match_the_bindings() -> None:
    """Reference: pagedllm._C's own signatures() and flags(). A binding or flag that differs
    in any name, kind, order or value is listed (the package refuses to load on any)."""
    signatures, flags = _cpu_kernels._C.signatures(), _cpu_kernels._C.flags()
    assert _cpu_kernels.mismatches(signatures, flags) == []
    assert set(signatures) == set(KERNELS)
    swapped = signatures["rms_norm"].replace("rows:i n:i", "n:i rows:i")
    assert _cpu_kernels.mismatches({**signatures, "rms_norm": swapped}, flags) == [
        f"binding rms_norm: C ({swapped}), Python ({signatures['rms_norm']})"
    ]
    missing = {k: v for k, v in signatures.items() if k != "argmax"}
    assert _cpu_kernels.mismatches(missing, {**flags, "ROTARY_NEOX": 2}) == [
        f"binding argmax: C (None), Python ({KERNELS['argmax'].signature})",
        "flag ROTARY_NEOX: C 2, Python 1",
    ]


@pytest.mark.skipif(not _cpu_kernels.available(), reason="needs pagedllm._C")
def test_a_launch_records_exactly_the_pointers_its_binding_declares() -> None:
    """Reference: the kinds in pagedllm._C's signatures() (p: a data pointer). A recorded
    launch carries them: the tensors' data pointers, 0 for a missing bias."""
    signatures = _cpu_kernels._C.signatures()
    for name, kernel in KERNELS.items():
        kinds = [arg.rsplit(":", 1)[1] for arg in signatures[name].split()]
        assert kernel.pointers == tuple(i for i, kind in enumerate(kinds) if kind == "p"), name
    x, weight = torch.randn(3, 16), torch.randn(5, 16)
    with _cpu_kernels.record_launches() as launches:
        out = _cpu_kernels.rms_norm(x, weight[0], 1e-6)
        y = _cpu_kernels.skinny_gemm(x, weight, None)
    norm, gemm = launches
    assert [norm.args[i] for i in norm.pointers] == [t.data_ptr() for t in (out, x, weight[0])]
    assert [gemm.args[i] for i in gemm.pointers] == [
        x.data_ptr(),
        weight.data_ptr(),
        0,
        y.data_ptr(),
    ]
    assert norm.pointers == KERNELS["rms_norm"].pointers == (0, 1, 2)


def test_only_the_boundary_imports_the_extension() -> None:
    """Every pagedllm._C call goes through _cpu_kernels: no other module imports it."""
    root = pathlib.Path(pagedllm.__file__).parent
    imports_c = re.compile(
        r"^\s*(from pagedllm import _C\b|import pagedllm\._C|from pagedllm\._C)", re.M
    )
    importers = [p.relative_to(root) for p in root.rglob("*.py") if imports_c.search(p.read_text())]
    assert importers == [pathlib.Path("_cpu_kernels/__init__.py")]


@pytest.mark.skipif(not _cpu_kernels.available(), reason="needs pagedllm._C")
def test_the_binding_names_a_build_that_does_not_read_packed_weights() -> None:
    """Called past the boundary (which raises first), the binding still refuses a packed
    weight for a build that does not read it, naming the build, before the kernel runs."""
    x, w = _bf16(2, 64), _bf16(16, 64)
    y = torch.empty(2, 16, dtype=torch.bfloat16)
    portable = [name for name, _ in _cpu_kernels._C.skinny_gemm_isas()].index("portable")
    for gemm in (_cpu_kernels._C.skinny_gemm, _cpu_kernels._C.skinny_gemm_bf16):
        with pytest.raises(ValueError, match="build 'portable' does not read packed weights"):
            gemm(x.data_ptr(), w.data_ptr(), 0, y.data_ptr(), 2, 16, 64, 1, portable, 1)
