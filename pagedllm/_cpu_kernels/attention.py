"""The paged KV cache's kernels: its writes (reshape_and_cache), decode attention
(paged_decode_attention) and a prefill chunk's attention (prefill_attention_f32)."""

import torch

from pagedllm._cpu_kernels.boundary import (
    Flag,
    Float,
    Int,
    Kernel,
    Output,
    Tensor,
    isa_index,
    isa_table,
    require,
    supported,
)
from pagedllm._cpu_kernels.flags import FLOAT_TYPE, FloatType

_F32, _I32, _I64 = torch.float32, torch.int32, torch.int64
_CACHE = "[num_blocks, block_size, num_kv_heads, head_dim]"
_K_CACHE = Tensor("k_cache", _CACHE, "cache")
_V_CACHE = Tensor("v_cache", _CACHE + " like k_cache", "cache")

PAGED_DECODE_ATTENTION = Kernel(
    "paged_decode_attention",
    Output("out"),
    Tensor("query", "[num_seqs, num_heads, head_dim]", _F32),
    _K_CACHE,
    _V_CACHE,
    Flag("cache_dtype", FloatType),
    Tensor("block_tables", "[num_seqs, max_blocks]", _I32),
    Tensor("seq_lens", "[num_seqs]", _I32),
    Int("B"),
    Int("H"),
    Int("KV"),
    Int("D"),
    Int("block_size"),
    Int("max_blocks"),
    Float("scale"),
    Int("sliding_window"),
    Float("logits_soft_cap"),
    Int("isa"),
    Int("num_threads"),
    Int("num_blocks"),
)
PREFILL_ATTENTION_F32 = Kernel(
    "prefill_attention_f32",
    Output("out"),
    Tensor("query", "[num_queries, num_heads, head_dim]", _F32),
    _K_CACHE,
    _V_CACHE,
    Flag("cache_dtype", FloatType),
    Tensor("block_table", "[max_blocks]", _I32),
    Int("n"),
    Int("seq_len"),
    Int("H"),
    Int("KV"),
    Int("D"),
    Int("block_size"),
    Float("scale"),
    Int("sliding_window"),
    Float("logits_soft_cap"),
    Int("isa"),
    Int("num_threads"),
    Int("max_blocks"),
    Int("num_blocks"),
)
RESHAPE_AND_CACHE = Kernel(
    "reshape_and_cache",
    Tensor("key", "[T, num_kv_heads, head_dim]", "kv", rows=True),
    Tensor("value", "[T, num_kv_heads, head_dim] like key", "kv", rows=True),
    Flag("kv_dtype", FloatType),
    _K_CACHE,
    _V_CACHE,
    Flag("cache_dtype", FloatType),
    Tensor("slot_mapping", "[T]", _I64),
    Int("num_tokens"),
    Int("key_stride"),
    Int("value_stride"),
    Int("row_size"),
    Int("num_slots"),
)

_ATTENTION_ISAS = isa_table("paged_attention_isas")
_PREFILL_F32_ISAS = isa_table("prefill_attention_f32_isas")


def paged_attention_isas() -> tuple[str, ...]:
    """The builds of paged_decode_attention this CPU runs, best first (empty without _C)."""
    return supported(_ATTENTION_ISAS)


def prefill_attention_f32_isas() -> tuple[str, ...]:
    """The builds of prefill_attention_f32 this CPU runs, best first (empty without _C)."""
    return supported(_PREFILL_F32_ISAS)


def _heads(op: str, h: int, kv: int, d: int, cache_d: int) -> None:
    """query [.., H, D] and k_cache [.., KV, D] agree: D the same, KV divides H."""
    require(op, cache_d == d, "k_cache head_dim {} differs from query's {}", cache_d, d)
    require(op, kv > 0 and h % kv == 0, "num_kv_heads {} must divide num_heads {}", kv, h)


def _options(op: str, sliding_window: int, logits_soft_cap: float) -> None:
    """The attention options are off (0) or positive."""
    require(op, sliding_window >= 0, "sliding_window {} must be >= 0 (0: none)", sliding_window)
    require(op, logits_soft_cap >= 0, "logits_soft_cap {} must be >= 0 (0: none)", logits_soft_cap)


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int = 0,
    logits_soft_cap: float = 0.0,
    isa: str | None = None,
) -> torch.Tensor:
    """query [B, H, D] float32, one new token per sequence; caches [num_blocks, block_size,
    KV, D], float32 or bfloat16; block_tables [B, max_blocks] and seq_lens [B], int32 ->
    float32 [B, H, D]. sliding_window > 0: a query sees (and the kernel reads) only its
    sequence's last that many keys; logits_soft_cap > 0: each score s becomes
    cap * tanh(s / cap). isa: one of paged_attention_isas(), or None for the best."""
    kernel = PAGED_DECODE_ATTENTION
    kernel.check(query, k_cache, v_cache, block_tables, seq_lens)
    kernel.check_shape("v_cache", v_cache, k_cache.shape)
    b, h, d = query.shape
    num_blocks, block_size, kv, cache_d = k_cache.shape
    kernel.check_shape("seq_lens", seq_lens, (b,))
    _heads(kernel.name, h, kv, d, cache_d)
    _options(kernel.name, sliding_window, logits_soft_cap)
    rows, max_blocks = block_tables.shape
    require(kernel.name, rows == b, "block_tables has {} rows for {} sequences", rows, b)
    index = isa_index(kernel.name, isa, _ATTENTION_ISAS)
    out = torch.empty_like(query)
    kernel.launch(
        out=out,
        query=query,
        k_cache=k_cache,
        v_cache=v_cache,
        cache_dtype=FLOAT_TYPE[k_cache.dtype],
        block_tables=block_tables,
        seq_lens=seq_lens,
        B=b,
        H=h,
        KV=kv,
        D=d,
        block_size=block_size,
        max_blocks=max_blocks,
        scale=scale,
        sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap,
        isa=index,
        num_threads=torch.get_num_threads(),
        num_blocks=num_blocks,
    )
    return out


def prefill_attention_f32(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    scale: float,
    sliding_window: int = 0,
    logits_soft_cap: float = 0.0,
    isa: str | None = None,
) -> torch.Tensor:
    """query [n, H, D] float32 at positions seq_len - n .. seq_len - 1 of one sequence;
    caches [num_blocks, block_size, KV, D] float32 or bfloat16; block_table [max_blocks]
    int32 -> float32 [n, H, D], causal (and within sliding_window, logits_soft_cap as
    paged_decode_attention's): row i the bits paged_decode_attention gives its query as a
    sequence of seq_len - n + i + 1 tokens with the same options on the same build. isa: one
    of prefill_attention_f32_isas(), or None for the best."""
    kernel = PREFILL_ATTENTION_F32
    kernel.check(query, k_cache, v_cache, block_table)
    kernel.check_shape("v_cache", v_cache, k_cache.shape)
    n, h, d = query.shape
    num_blocks, block_size, kv, cache_d = k_cache.shape
    _heads(kernel.name, h, kv, d, cache_d)
    require(kernel.name, d > 0, "head_dim {} must be positive", d)
    _options(kernel.name, sliding_window, logits_soft_cap)
    index = isa_index(kernel.name, isa, _PREFILL_F32_ISAS)
    out = torch.empty_like(query)
    kernel.launch(
        out=out,
        query=query,
        k_cache=k_cache,
        v_cache=v_cache,
        cache_dtype=FLOAT_TYPE[k_cache.dtype],
        block_table=block_table,
        n=n,
        seq_len=seq_len,
        H=h,
        KV=kv,
        D=d,
        block_size=block_size,
        scale=scale,
        sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap,
        isa=index,
        num_threads=torch.get_num_threads(),
        max_blocks=block_table.shape[0],
        num_blocks=num_blocks,
    )
    return out


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Stores key/value [T, KV, D] (rows may be strided) in the caches [num_blocks,
    block_size, KV, D] at slot_mapping [T] (-1: a padding token, skipped); each side float32
    or bfloat16 (converted)."""
    kernel = RESHAPE_AND_CACHE
    kernel.check(key, value, k_cache, v_cache, slot_mapping)
    kernel.check_shape("value", value, key.shape)
    kernel.check_shape("v_cache", v_cache, k_cache.shape)
    t, kv, d = key.shape
    num_blocks, block_size, cache_kv, cache_d = k_cache.shape
    require(
        kernel.name,
        (cache_kv, cache_d) == (kv, d),
        "k_cache has {} kv heads of size {}, key has {} of size {}",
        cache_kv,
        cache_d,
        kv,
        d,
    )
    kernel.check_shape("slot_mapping", slot_mapping, (t,))
    kernel.launch(
        key=key,
        value=value,
        kv_dtype=FLOAT_TYPE[key.dtype],
        k_cache=k_cache,
        v_cache=v_cache,
        cache_dtype=FLOAT_TYPE[k_cache.dtype],
        slot_mapping=slot_mapping,
        num_tokens=t,
        key_stride=key.stride(0),
        value_stride=value.stride(0),
        row_size=kv * d,
        num_slots=num_blocks * block_size,
    )
