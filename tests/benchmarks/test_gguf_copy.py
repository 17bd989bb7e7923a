"""pagedllm/benchmarks/gguf_copy.py: a GGUF's weights converted to F32, F16 or Q8_0. Reference:
gguf.quants.quantize of gguf.quants.dequantize of each source tensor, llama.cpp's rules of which
tensors stay F32, and its LLAMA_FTYPE values of general.file_type."""

import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize, quantize

from pagedllm.benchmarks.gguf_copy import F16, F32, Q8_0, copy_type, gguf_copy_path, write_gguf_copy
from tests.benchmarks.conftest import write_mixed_gguf

# What each MIXED_TENSORS entry becomes in a copy of each type.
EXPECTED_TYPES = {
    F32: {"token_embd.weight": F32, "blk.0.attn_q.weight": F32, "blk.0.ffn_down.weight": F32},
    F16: {"token_embd.weight": F16, "blk.0.attn_q.weight": F16, "blk.0.ffn_down.weight": F16},
    Q8_0: {"token_embd.weight": Q8_0, "blk.0.attn_q.weight": Q8_0, "blk.0.ffn_down.weight": F32},
}
LLAMA_FTYPE = {F32: 0, F16: 1, Q8_0: 7}  # LLAMA_FTYPE_ALL_F32, _MOSTLY_F16, _MOSTLY_Q8_0


def test_copy_type_keeps_norms_routers_and_partial_blocks_f32() -> None:
    assert copy_type("blk.0.attn_norm.weight", (576,), Q8_0) == F32
    assert copy_type("blk.0.ffn_gate_inp.weight", (128, 2048), Q8_0) == F32
    assert copy_type("blk.0.ffn_down.weight", (576, 1536), Q8_0) == Q8_0
    assert copy_type("blk.0.ffn_down.weight", (4, 48), Q8_0) == F32
    assert copy_type("blk.0.ffn_down.weight", (4, 48), F16) == F16
    assert copy_type("blk.0.ffn_down_exps.weight", (8, 576, 1536), Q8_0) == Q8_0


@pytest.mark.parametrize("qtype", [F32, F16, Q8_0], ids=lambda t: t.name)
def test_write_gguf_copy_converts_weights_and_keeps_metadata(
    tmp_path: object, qtype: GGMLQuantizationType
) -> None:
    source, target = f"{tmp_path}/q.gguf", f"{tmp_path}/copy.gguf"
    write_mixed_gguf(source)
    reader = GGUFReader(source)
    write_gguf_copy(reader, target, qtype)
    out = GGUFReader(target)
    assert out.fields["general.file_type"].contents() == LLAMA_FTYPE[qtype]
    for key in ("llama.block_count", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
        assert out.fields[key].contents() == reader.fields[key].contents()
    assert [t.name for t in out.tensors] == [t.name for t in reader.tensors]
    expected = EXPECTED_TYPES[qtype] | {"blk.0.ffn_gate_inp.weight": F32, "output_norm.weight": F32}
    for old, new in zip(reader.tensors, out.tensors):
        assert new.tensor_type == expected[old.name], old.name
        assert new.shape.tolist() == old.shape.tolist()
        shape = tuple(reversed(old.shape.tolist()))
        weights = dequantize(old.data, old.tensor_type).reshape(shape)
        want = quantize(weights, new.tensor_type)
        np.testing.assert_array_equal(new.data.reshape(-1), want.reshape(-1).view(new.data.dtype))


def test_gguf_copy_path_caches_the_copy_and_rewrites_it_when_the_source_changes(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", f"{tmp_path}/cache")
    source = f"{tmp_path}/m.Q4_1.gguf"
    write_mixed_gguf(source)
    copy = gguf_copy_path(source, Q8_0)
    assert copy == f"{tmp_path}/cache/pagedllm/m.Q4_1.Q8_0.gguf"
    made = os.path.getmtime(copy)
    assert gguf_copy_path(source, Q8_0) == copy
    assert os.path.getmtime(copy) == made
    os.utime(source, (made + 10, made + 10))
    assert gguf_copy_path(source, Q8_0) == copy
    assert os.path.getmtime(copy) > made
    assert gguf_copy_path(source, F32) == f"{tmp_path}/cache/pagedllm/m.Q4_1.F32.gguf"


def test_gguf_copy_path_returns_a_source_already_in_the_type(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", f"{tmp_path}/cache")
    plain = f"{tmp_path}/m.F32.gguf"
    write_mixed_gguf(plain, quantized=False)
    assert gguf_copy_path(plain, F32) == plain
    q8 = gguf_copy_path(plain, Q8_0)
    assert q8 != plain and gguf_copy_path(q8, Q8_0) == q8
    assert not os.path.exists(f"{tmp_path}/cache/pagedllm/m.F32.Q8_0.Q8_0.gguf")


def test_gguf_copy_path_rejects_other_types(tmp_path: object) -> None:
    with pytest.raises(ValueError, match="GGUF copy type Q4_0 is not supported"):
        gguf_copy_path(f"{tmp_path}/m.gguf", GGMLQuantizationType.Q4_0)
