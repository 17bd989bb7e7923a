"""Reference: transformers 5.24 (ROPE_INIT_FUNCTIONS, LlamaRotaryEmbedding, apply_rotary_pos_emb
of Llama; GPT-J's for the interleaved style)."""

import contextlib
import gc
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from transformers import Glm4Config, LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.glm4.modeling_glm4 import Glm4RotaryEmbedding
from transformers.models.glm4.modeling_glm4 import apply_rotary_pos_emb as glm4_apply_rotary
from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb as gptj_apply_rotary
from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from pagedllm import _cpu_kernels
from pagedllm.forward_context import AttentionMetadata, set_forward_context
from pagedllm.layers.layernorm import RMSNorm
from pagedllm.layers.rotary_embedding import get_nope, get_rope, use_max_model_len

NUM_HEADS, NUM_KV_HEADS, NUM_TOKENS = 4, 2, 48


@dataclass(frozen=True)
class Case:
    head_size: int
    rotary_dim: int
    max_position: int
    base: float
    rope_scaling: dict | None
    num_cached: int  # positions our cache must cover without growing


LLAMA3_70B = {  # DeepSeek-R1-Distill-Llama-70B
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
YARN_QWEN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
YARN_DEEPSEEK = {
    "rope_type": "yarn",
    "factor": 40.0,
    "original_max_position_embeddings": 1024,
    "mscale": 0.707,
    "mscale_all_dim": 1.0,
    "beta_fast": 32,
    "beta_slow": 1,
}
CASES = {
    "default": Case(64, 64, 2048, 10000.0, None, 2048),
    "default-partial": Case(64, 32, 2048, 10000.0, {"rope_type": "default"}, 2048),
    "linear-2": Case(64, 64, 2048, 10000.0, {"rope_type": "linear", "factor": 2.0}, 4096),
    "dynamic-2": Case(64, 64, 2048, 10000.0, {"rope_type": "dynamic", "factor": 2.0}, 4096),
    "llama3-70b": Case(128, 128, 131072, 500000.0, LLAMA3_70B, 131072),
    "yarn-qwen": Case(128, 128, 32768, 1e6, YARN_QWEN, 131072),
    "yarn-mscale-partial": Case(64, 32, 40960, 10000.0, YARN_DEEPSEEK, 40960),
}


def _rope(case: Case, is_neox_style: bool = True):
    return get_rope(
        case.head_size,
        case.rotary_dim,
        case.max_position,
        case.base,
        case.rope_scaling,
        is_neox_style,
    )


def _hf_config(case: Case) -> LlamaConfig:
    """HF's rope functions see the head only through its rotary dim, so head_dim = rotary_dim."""
    params = {"rope_type": "default", **(case.rope_scaling or {}), "rope_theta": case.base}
    return LlamaConfig(
        hidden_size=2 * case.rotary_dim,
        num_attention_heads=2,
        head_dim=case.rotary_dim,
        max_position_embeddings=case.max_position,
        rope_parameters=params,
    )


def _positions(num_positions: int) -> torch.Tensor:
    """Random, unsorted, with repeats, and with the last position (which sets HF's dynamic base)."""
    positions = torch.randint(0, num_positions, (NUM_TOKENS,))
    positions[5] = num_positions - 1
    positions[10:14] = positions[0]
    return positions


def _qk(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-contiguous q, k split from one qkv projection, as a model passes them."""
    q_size, kv_size = NUM_HEADS * case.head_size, NUM_KV_HEADS * case.head_size
    qkv = torch.randn(NUM_TOKENS, q_size + 2 * kv_size)
    q, k, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
    return q, k


def _hf_rotate(
    case: Case, positions: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """Llama's apply_rotary_pos_emb on the first rotary_dim channels; the rest pass through."""
    heads = x.reshape(NUM_TOKENS, -1, case.head_size).transpose(0, 1)[None]  # [1, H, T, D]
    rot, rest = heads[..., : case.rotary_dim], heads[..., case.rotary_dim :]
    rot, _ = apply_rotary_pos_emb(rot, rot, cos, sin)
    return torch.cat((rot, rest), dim=-1)[0].transpose(0, 1).reshape(NUM_TOKENS, -1)


@pytest.mark.parametrize("name", CASES)
def test_inv_freq_and_scaling_match_transformers_rope_init_functions(name: str) -> None:
    case = CASES[name]
    config = _hf_config(case)
    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "default":
        inv_freq, scaling = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        seq_len = case.num_cached if rope_type == "dynamic" else None
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)
    rope = _rope(case)
    torch.testing.assert_close(rope.inv_freq, inv_freq, rtol=0, atol=0)
    assert rope.attention_scaling == pytest.approx(scaling, rel=1e-12)
    assert rope.cos_sin_cache.shape == (case.num_cached, case.rotary_dim)
    assert rope.cos_sin_cache.dtype == torch.float32


@pytest.mark.parametrize("name", CASES)
def test_rotation_matches_transformers_llama(name: str, cpu_kernels: str) -> None:
    case = CASES[name]
    torch.manual_seed(0)
    positions = _positions(case.num_cached)
    q, k = _qk(case)
    cos, sin = LlamaRotaryEmbedding(_hf_config(case))(q, positions[None])
    q_out, k_out = _rope(case)(positions, q, k)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    assert (q_out - _hf_rotate(case, positions, q, cos, sin)).abs().max() <= 1e-5
    assert (k_out - _hf_rotate(case, positions, k, cos, sin)).abs().max() <= 1e-5


def _step_reaching(num_positions: int) -> AttentionMetadata:
    """The forward context of a one-sequence step of NUM_TOKENS tokens ending at position
    num_positions - 1; only its host-side lengths matter to RoPE."""
    return AttentionMetadata(
        slot_mapping=torch.zeros(NUM_TOKENS, dtype=torch.int64),
        query_start_loc=torch.tensor([0, NUM_TOKENS], dtype=torch.int32),
        seq_lens=torch.tensor([num_positions], dtype=torch.int32),
        block_tables=torch.zeros(1, 1, dtype=torch.int32),
        query_lens_cpu=[NUM_TOKENS],
        seq_lens_cpu=[num_positions],
    )


def test_positions_beyond_cache_grow_it_transformers_llama() -> None:
    """The runner's forward context says the step reaches position 299: the cache grows from
    its host-side lengths, never reading the positions tensor (a host sync on accelerators)."""
    case = Case(64, 64, 64, 4321.0, None, 64)
    rope = _rope(case)
    assert rope.cos_sin_cache.shape[0] == 64
    torch.manual_seed(1)
    positions = _positions(300)
    q, k = _qk(case)
    cos, sin = LlamaRotaryEmbedding(_hf_config(case))(q, positions[None])
    with set_forward_context(_step_reaching(300)):
        q_out, k_out = rope(positions, q, k)
    assert rope.cos_sin_cache.shape[0] >= 300
    assert (q_out - _hf_rotate(case, positions, q, cos, sin)).abs().max() <= 1e-5
    assert (k_out - _hf_rotate(case, positions, k, cos, sin)).abs().max() <= 1e-5


class _HostReadFails(torch.Tensor):
    """Positions whose values cannot be read on the host (a device sync on accelerators)."""

    @classmethod
    def __torch_function__(
        cls, func: Callable, types: tuple, args: tuple = (), kwargs: dict | None = None
    ) -> object:
        if getattr(func, "__name__", "") in {"max", "item", "tolist", "__int__", "__index__"}:
            raise AssertionError(f"RoPE read the positions on the host: {func.__name__}")
        return super().__torch_function__(func, types, args, kwargs or {})


def test_forward_never_reads_positions_on_the_host(cpu_kernels: str) -> None:
    """Reference: the rotation of plain positions, inside a step and outside one."""
    case = CASES["default"]
    positions = _positions(case.num_cached)
    q, k = _qk(case)
    expected = _rope(case)(positions, q, k)
    for context in (_step_reaching(case.num_cached), None):
        with set_forward_context(context) if context else contextlib.nullcontext():
            out = _rope(case)(positions.as_subclass(_HostReadFails), q, k)
        for actual, want in zip(out, expected, strict=True):
            assert torch.equal(actual, want)


def test_positions_beyond_cache_outside_a_step_raise(cpu_kernels: str) -> None:
    """Without a forward context the cache covers max_position and no more: a position past
    it is an error (ValueError from the kernel's index check, IndexError from torch), never a
    read outside the cache."""
    rope = get_rope(64, 64, 64, 1234.0)
    q, k = _qk(Case(64, 64, 64, 1234.0, None, 64))
    positions = torch.full((NUM_TOKENS,), 64)
    with pytest.raises((ValueError, IndexError)):
        rope(positions, q, k)
    assert rope.cos_sin_cache.shape[0] == 64


def test_interleaved_style_matches_transformers_gptj(cpu_kernels: str) -> None:
    case = Case(64, 32, 512, 10000.0, None, 512)
    torch.manual_seed(2)
    positions = _positions(case.num_cached)
    q, k = _qk(case)
    q_out, _ = _rope(case, is_neox_style=False)(positions, q, k)
    sin, cos = create_sinusoidal_positions(case.num_cached, case.rotary_dim)[positions].chunk(2, -1)
    heads = q.reshape(NUM_TOKENS, NUM_HEADS, case.head_size)
    rot = gptj_apply_rotary(heads[None, ..., : case.rotary_dim], sin[None], cos[None])[0]
    expected = torch.cat((rot, heads[..., case.rotary_dim :]), dim=-1).reshape(NUM_TOKENS, -1)
    assert (q_out - expected).abs().max() <= 1e-5


def test_interleaved_partial_rotation_matches_transformers_glm4(cpu_kernels: str) -> None:
    """GLM-4 rotates adjacent channel pairs of the first half of each head (its default
    partial_rotary_factor 0.5): transformers' Glm4RotaryEmbedding and apply_rotary_pos_emb."""
    config = Glm4Config(
        hidden_size=256,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        head_dim=64,
        max_position_embeddings=512,
    )
    params = config.rope_parameters
    rotary = int(64 * params["partial_rotary_factor"])
    case = Case(64, rotary, 512, params["rope_theta"], None, 512)
    assert case.rotary_dim == 32
    torch.manual_seed(3)
    positions = _positions(case.num_cached)
    q, k = _qk(case)
    q_out, k_out = _rope(case, is_neox_style=False)(positions, q, k)
    cos, sin = Glm4RotaryEmbedding(config)(q, positions[None])
    q_ref, k_ref = glm4_apply_rotary(
        q.reshape(1, NUM_TOKENS, NUM_HEADS, -1),
        k.reshape(1, NUM_TOKENS, NUM_KV_HEADS, -1),
        cos,
        sin,
        unsqueeze_dim=2,
    )
    torch.testing.assert_close(q_out, q_ref.reshape(NUM_TOKENS, -1), atol=1e-5, rtol=0)
    torch.testing.assert_close(k_out, k_ref.reshape(NUM_TOKENS, -1), atol=1e-5, rtol=0)


def test_bfloat16_inputs_are_rotated_in_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reference: the float32 rotation rounded once to bfloat16, both by the torch path (the
    float32 kernel of pagedllm._C may differ in the last bit, which can flip a rounding)."""
    monkeypatch.setattr(_cpu_kernels, "_C", None)
    case = CASES["llama3-70b"]
    torch.manual_seed(3)
    positions = _positions(case.num_cached)
    q, k = (x.to(torch.bfloat16) for x in _qk(case))
    rope = _rope(case)
    q_out, k_out = rope(positions, q, k)
    q_ref, k_ref = rope(positions, q.float(), k.float())
    assert q_out.dtype == k_out.dtype == torch.bfloat16
    assert torch.equal(q_out, q_ref.to(torch.bfloat16))
    assert torch.equal(k_out, k_ref.to(torch.bfloat16))


def test_cache_stays_float32_after_module_cast() -> None:
    case = Case(64, 64, 256, 7777.0, {"rope_type": "linear", "factor": 2.0}, 512)
    rope = _rope(case)
    positions = _positions(case.num_cached)
    q, k = _qk(case)
    expected = rope(positions, q, k)
    rope.to(torch.bfloat16)
    for out, ref in zip(rope(positions, q, k), expected, strict=True):
        assert torch.equal(out, ref)
    assert rope.cos_sin_cache.dtype == torch.float32


def test_built_on_meta_device_then_run_on_cpu() -> None:
    """Shape checks build models on the meta device; a later real forward rebuilds the cache."""
    case = Case(128, 128, 1024, 8888.0, None, 1024)
    with torch.device("meta"):
        rope = _rope(case)
        q_meta, k_meta = (torch.empty_like(x) for x in _qk(case))
        q_out, _ = rope(torch.zeros(NUM_TOKENS, dtype=torch.long), q_meta, k_meta)
    assert rope.cos_sin_cache.is_meta and q_out.is_meta and q_out.shape == q_meta.shape
    positions = _positions(case.num_cached)
    q, k = _qk(case)
    q_out, _ = rope(positions, q, k)
    cos, sin = LlamaRotaryEmbedding(_hf_config(case))(q, positions[None])
    assert (q_out - _hf_rotate(case, positions, q, cos, sin)).abs().max() <= 1e-5


def test_transformers_4x_type_key_and_rope_theta_ignored() -> None:
    old = get_rope(64, 64, 512, 10000.0, {"type": "linear", "factor": 2.0})
    new = get_rope(64, 64, 512, 10000.0, {"rope_type": "linear", "factor": 2.0, "rope_theta": 1.0})
    assert torch.equal(old.inv_freq, new.inv_freq)
    assert torch.equal(old.inv_freq, get_rope(64, 64, 512, 10000.0).inv_freq / 2.0)


def test_layers_with_equal_settings_share_one_instance() -> None:
    a = get_rope(64, 64, 512, 10000.0, {"rope_type": "dynamic", "factor": 2.0})
    b = get_rope(64, 64, 512, 10000.0, {"rope_type": "dynamic", "factor": 2.0})
    c = get_rope(64, 64, 512, 10000.0, {"rope_type": "dynamic", "factor": 3.0})
    assert a is b and a is not c
    assert "cos_sin_cache" not in a.state_dict()


def test_unknown_rope_type_lists_supported_ones() -> None:
    with pytest.raises(ValueError, match=r"not supported.*default.*dynamic.*linear.*llama3.*yarn"):
        get_rope(64, 64, 512, 10000.0, {"rope_type": "mrope"})


LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0, 1.05, 1.2, 1.5, 2.0, 3.0],
    "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0],
    "original_max_position_embeddings": 256,
    "partial_rotary_factor": 0.75,
}


@pytest.mark.parametrize("max_model_len", [200, 256, 257, 1024])
@pytest.mark.parametrize("type_name", ["longrope", "su"])
def test_longrope_takes_one_set_of_factors_by_max_model_len(
    max_model_len: int, type_name: str
) -> None:
    """vLLM's rule: the long factors for every position once the engine serves past the
    original length, else the short ones. Reference: transformers' longrope frequencies and
    attention factor for a sequence of that length (Phi-3's config: head 16, 3/4 rotated,
    max_position_embeddings 1024)."""
    from transformers import Phi3Config

    config = Phi3Config(
        hidden_size=64,
        num_attention_heads=4,
        max_position_embeddings=1024,
        original_max_position_embeddings=256,
        rope_parameters={**LONGROPE, "rope_theta": 10000.0},
    )
    inv_freq, factor = ROPE_INIT_FUNCTIONS["longrope"](config, "cpu", seq_len=max_model_len)
    with use_max_model_len(max_model_len):
        rope = get_rope(16, 12, 1024, 10000.0, {**LONGROPE, "rope_type": type_name})
    assert torch.equal(rope.inv_freq, inv_freq)
    assert rope.attention_scaling == pytest.approx(factor, rel=1e-12)
    assert factor > 1.0


def test_longrope_builds_on_the_meta_device() -> None:
    """As `pagedllm inspect` builds a model: the frequencies are computed on the CPU."""
    with torch.device("meta"):
        rope = get_rope(16, 12, 1024, 10000.0, LONGROPE)
    assert rope.cos_sin_cache.is_meta and not rope.inv_freq.is_meta


def test_longrope_without_its_factors_is_refused() -> None:
    with pytest.raises(ValueError, match="long_factor must list rotary_dim / 2 = 8 numbers"):
        get_rope(16, 16, 1024, 10000.0, {**LONGROPE, "long_factor": [1.0]})


def test_missing_factor_is_named() -> None:
    with pytest.raises(ValueError, match="factor"):
        get_rope(64, 64, 512, 10000.0, {"rope_type": "linear"})


@pytest.mark.parametrize("rotary_dim", [0, 33, 128])
def test_rotary_dim_must_be_even_and_fit_the_head(rotary_dim: int) -> None:
    with pytest.raises(ValueError, match="rotary_dim"):
        get_rope(64, rotary_dim, 512, 10000.0)


def test_an_embedding_goes_with_the_last_layer_holding_it() -> None:
    """The shared instance (and its cos/sin cache, on a GPU device memory) is not kept past
    the models that use it: an engine dropped frees it."""
    rope = get_rope(64, 64, 4096, 4321.0)
    ref = weakref.ref(rope)
    assert get_rope(64, 64, 4096, 4321.0) is rope
    del rope
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nope_gives_q_and_k_back_contiguous(cpu_kernels: str, dtype: torch.dtype) -> None:
    """A NoPE layer's embedding (get_nope): q and k, strided views of a fused qkv
    projection, come back bit for bit, contiguous; with q/k norms, each head normed as
    RMSNorm norms it."""
    head_size = 16
    qkv = torch.randn(NUM_TOKENS, (NUM_HEADS + 2 * NUM_KV_HEADS) * head_size).to(dtype)
    q, k, _ = qkv.split([NUM_HEADS * head_size] + [NUM_KV_HEADS * head_size] * 2, dim=-1)
    rope, positions = get_nope(head_size, 64), _positions(64)
    q_out, k_out = rope(positions, q, k)
    assert torch.equal(q_out, q) and torch.equal(k_out, k)
    assert q_out.is_contiguous() and k_out.is_contiguous()
    norms = (RMSNorm(head_size, eps=1e-6), RMSNorm(head_size, eps=1e-6))
    with torch.no_grad():
        for norm in norms:
            norm.weight.copy_(torch.rand(head_size) + 0.5)
    normed = rope(positions, q.float(), k.float(), norms)
    for out, x, norm in zip(normed, (q, k), norms, strict=True):
        expected = norm(x.float().reshape(-1, head_size)).reshape(x.shape)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
