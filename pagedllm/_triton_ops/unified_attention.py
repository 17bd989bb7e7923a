"""Unified paged attention as Triton kernels: one launch for a whole mixed batch.

The design is vLLM's triton_unified_attention. A batch holds decodes (one new token) and
prefill chunks (several, possibly after cached context) side by side in query [T, H, D];
sequence i's new tokens are rows query_start_loc[i] .. query_start_loc[i + 1] - 1 and sit at
positions seq_lens[i] - q_len .. seq_lens[i] - 1. Each program takes BLOCK_Q consecutive
new tokens of one sequence and the G = H / KV query heads of one kv head, BLOCK_M =
BLOCK_Q * G rows (padded to a power of two), so GQA reads each key once for its G heads.
It walks the sequence's keys in tiles of TILE_SIZE tokens straight out of the paged cache
(each token's block from block_tables), causal and optionally within a sliding window,
with an online softmax accumulated in float32. Gemma 2's logit soft-capping, where asked,
maps each score s to c * tanh(s / c) before the mask (USE_SOFTCAP, a constexpr: off, the
kernel has no trace of it).

Long decodes split the context (flash-decoding, split-K): NUM_SEGMENTS programs per
sequence and kv head each take a share of the tiles and write an unnormalized partial
(accumulator, running max, exp-sum); `_reduce_segments_kernel` merges them. The split
changes where the work runs and the order of a row's sums, never what is computed;
`default_num_kv_splits` picks it. Unsplit, a row's arithmetic is the same whatever its
batch: the tiles of keys are fixed, and the tiles a row does not see (past its position, in
a longer chunk) add exactly nothing; so batch-invariant mode never splits.

The launch reads only host ints (shapes, max_query_len, max_seq_len), so it never waits
on the device. A CUDA graph may replay it for other lengths of the same shapes: every
length is read on the device.

float32 inputs multiply in IEEE precision rather than TF32 (DOT_FP32). Under Triton's
interpreter (CPU tensors) the tiles are widened to float32 first, as its tl.dot multiplies
bfloat16 tiles wrongly; in batch-invariant mode there each product is also summed along K
by the kernel itself (DOT_BY_ROW): the interpreter's tl.dot runs numpy's matmul, whose
OpenBLAS kernels round a row differently by its place in the tile on some CPUs (rows 6-11
of 16 in the Haswell sgemm), where a GPU's MMA gives a row the same bits wherever it sits.
"""

import torch
import triton
import triton.language as tl

from pagedllm._triton_ops import interpreting
from pagedllm.batch_invariant import is_batch_invariant

TILE_SIZE = 32
DOT_NATIVE, DOT_FP32, DOT_BY_ROW = 0, 1, 2
"""How _dot multiplies its tiles: tl.dot in the inputs' dtype, tl.dot widened to float32 in
IEEE precision, or (Triton's interpreter, batch-invariant mode) products summed along K by
the kernel."""


def _dot_mode(dtype: torch.dtype) -> int:
    if interpreting():
        return DOT_BY_ROW if is_batch_invariant() else DOT_FP32
    return DOT_FP32 if dtype == torch.float32 else DOT_NATIVE


MIN_BLOCK_M = 16  # tl.dot's smallest M on GPUs
SPLIT_SEGMENTS = 16
SPLIT_MIN_SEQ_LEN = 512
SPLIT_MAX_PROGRAMS = 128  # about one program per SM of a large GPU


@triton.jit
def _find_seq_idx(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr):
    """The sequence whose query blocks hold q_block: sequence i's blocks start at
    query_start_loc[i] // BLOCK_Q + i (a grid of T // BLOCK_Q + num_seqs blocks covers
    every sequence's cdiv(q_len, BLOCK_Q), some left empty)."""
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _softcap(scores, cap):
    """cap * tanh(scores / cap), tanh from exp (tl has no tanh on every Triton): tanh |y| =
    (1 - e) / (1 + e) with e = exp(-2 |y|) in (0, 1], which neither overflows nor divides
    inf by inf at any |y|."""
    y = scores / cap
    e = tl.exp(-2.0 * tl.abs(y))
    magnitude = (1.0 - e) / (1.0 + e)
    return cap * tl.where(y < 0, -magnitude, magnitude)


@triton.jit
def _dot(a, b, DOT: tl.constexpr):
    """a [M, K] @ b [K, N] in float32 (DOT: DOT_NATIVE, DOT_FP32 or DOT_BY_ROW)."""
    if DOT == 2:  # DOT_BY_ROW
        product = tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    elif DOT == 1:  # DOT_FP32
        product = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        product = tl.dot(a, b)
    return product


# The batch's size and its block tables' width change from step to step: specialized (Triton
# compiles a kernel per int argument equal to 1 or divisible by 16), a run would compile
# variants mid-step, which a benchmark times.
@triton.jit(do_not_specialize=["num_seqs", "stride_block_table"])
def _attention_kernel(
    out_ptr,  # [T, H, D], when NUM_SEGMENTS == 1
    segm_out_ptr,  # [T, H, NUM_SEGMENTS, HEAD_PADDED] float32, when NUM_SEGMENTS > 1
    segm_max_ptr,  # [T, H, NUM_SEGMENTS] float32
    segm_sum_ptr,  # [T, H, NUM_SEGMENTS] float32
    query_ptr,  # [T, H, D]
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, KV, D]
    v_cache_ptr,  # same shape and strides
    block_tables_ptr,  # [B, max_blocks] int32
    seq_lens_ptr,  # [B] int32
    query_start_loc_ptr,  # [B + 1] int32
    scale,
    softcap,  # c of c * tanh(s / c), read when USE_SOFTCAP
    num_seqs,
    stride_q_token,
    stride_q_head,
    stride_o_token,
    stride_o_head,
    stride_cache_block,
    stride_cache_slot,
    stride_cache_head,
    stride_block_table,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per kv head
    HEAD_SIZE: tl.constexpr,
    HEAD_PADDED: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr,  # 0: none
    USE_SOFTCAP: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
    DOT: tl.constexpr,
):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)

    seq = _find_seq_idx(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    first_q = (q_block - (q_start // BLOCK_Q + seq)) * BLOCK_Q
    if first_q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len

    rows = tl.arange(0, BLOCK_M)
    lanes = tl.arange(0, HEAD_PADDED)
    q_pos = first_q + rows // GROUP  # within this sequence's new tokens
    head = kv_head * GROUP + rows % GROUP
    row_valid = (rows < BLOCK_Q * GROUP) & (q_pos < q_len)
    lane_valid = lanes < HEAD_SIZE
    token = (q_start + q_pos).to(tl.int64)
    query = tl.load(
        query_ptr
        + token[:, None] * stride_q_token
        + head[:, None] * stride_q_head
        + lanes[None, :],
        mask=row_valid[:, None] & lane_valid[None, :],
        other=0.0,
    )
    key_pos = context_len + q_pos  # each row's own token: it sees keys 0 .. key_pos

    kv_end = tl.minimum(seq_len, context_len + first_q + BLOCK_Q)
    kv_begin = 0
    if SLIDING_WINDOW > 0:
        kv_begin = tl.maximum(context_len + first_q - SLIDING_WINDOW + 1, 0)
    tile_begin = kv_begin // TILE
    tile_end = tl.cdiv(kv_end, TILE)
    if NUM_SEGMENTS > 1:
        per_segment = tl.cdiv(tile_end - tile_begin, NUM_SEGMENTS)
        tile_begin = tile_begin + segment * per_segment
        tile_end = tl.minimum(tile_begin + per_segment, tile_end)

    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PADDED], tl.float32)
    for tile in range(tile_begin, tile_end):
        kv_pos = tile * TILE + tl.arange(0, TILE)
        kv_valid = kv_pos < kv_end
        block = tl.load(
            block_tables_ptr + seq * stride_block_table + kv_pos // BLOCK_SIZE,
            mask=kv_valid,
            other=0,
        ).to(tl.int64)
        slot = (
            block * stride_cache_block
            + (kv_pos % BLOCK_SIZE) * stride_cache_slot
            + kv_head * stride_cache_head
        )
        key = tl.load(
            k_cache_ptr + slot[None, :] + lanes[:, None],
            mask=lane_valid[:, None] & kv_valid[None, :],
            other=0.0,
        )  # [HEAD_PADDED, TILE]
        value = tl.load(
            v_cache_ptr + slot[:, None] + lanes[None, :],
            mask=kv_valid[:, None] & lane_valid[None, :],
            other=0.0,
        )  # [TILE, HEAD_PADDED]
        scores = scale * _dot(query, key.to(query.dtype), DOT)
        if USE_SOFTCAP:
            scores = _softcap(scores, softcap)
        seen = kv_valid[None, :] & (kv_pos[None, :] <= key_pos[:, None])
        if SLIDING_WINDOW > 0:
            seen = seen & (key_pos[:, None] - kv_pos[None, :] < SLIDING_WINDOW)
        scores = tl.where(seen, scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        # A row that has seen nothing yet keeps max -inf; subtract 0 there, not -inf.
        shift = tl.where(new_max > float("-inf"), new_max, 0.0)
        probs = tl.exp(scores - shift[:, None])
        rescale = tl.exp(row_max - shift)
        row_sum = row_sum * rescale + tl.sum(probs, axis=1)
        acc = acc * rescale[:, None] + _dot(probs.to(query.dtype), value.to(query.dtype), DOT)
        row_max = new_max

    if NUM_SEGMENTS == 1:
        out = acc / tl.where(row_sum > 0, row_sum, 1.0)[:, None]
        tl.store(
            out_ptr
            + token[:, None] * stride_o_token
            + head[:, None] * stride_o_head
            + lanes[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_valid[:, None] & lane_valid[None, :],
        )
    else:
        partial = (token * NUM_HEADS + head) * NUM_SEGMENTS + segment
        tl.store(
            segm_out_ptr + partial[:, None] * HEAD_PADDED + lanes[None, :],
            acc,
            mask=row_valid[:, None],
        )
        tl.store(segm_max_ptr + partial, row_max, mask=row_valid)
        tl.store(segm_sum_ptr + partial, row_sum, mask=row_valid)


@triton.jit
def _reduce_segments_kernel(
    out_ptr,
    segm_out_ptr,
    segm_max_ptr,
    segm_sum_ptr,
    stride_o_token,
    stride_o_head,
    NUM_HEADS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PADDED: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
):
    """One (token, head): the segments' partials rescaled to their common max and summed."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    segments = tl.arange(0, NUM_SEGMENTS)
    lanes = tl.arange(0, HEAD_PADDED)
    partial = (token * NUM_HEADS + head) * NUM_SEGMENTS + segments
    seg_max = tl.load(segm_max_ptr + partial)  # -inf for a segment that saw no key
    weight = tl.exp(seg_max - tl.max(seg_max, axis=0))
    total = tl.sum(tl.load(segm_sum_ptr + partial) * weight, axis=0)
    acc = tl.load(segm_out_ptr + partial[:, None] * HEAD_PADDED + lanes[None, :])
    out = tl.sum(acc * weight[:, None], axis=0) / total
    tl.store(
        out_ptr + token * stride_o_token + head * stride_o_head + lanes,
        out.to(out_ptr.dtype.element_ty),
        mask=lanes < HEAD_SIZE,
    )


def default_num_kv_splits(
    max_query_len: int, max_seq_len: int, num_seqs: int, num_kv_heads: int
) -> int:
    """Split the context only where the plain grid leaves a large GPU idle: decodes alone,
    too few (sequence, kv head) programs to fill it, and contexts long enough to share.
    Never in batch-invariant mode: the split would make a row's sums depend on its batch."""
    if (
        is_batch_invariant()
        or max_query_len > 1
        or num_seqs * num_kv_heads >= SPLIT_MAX_PROGRAMS
        or max_seq_len < SPLIT_MIN_SEQ_LEN
    ):
        return 1
    return SPLIT_SEGMENTS


def unified_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    sliding_window: int = 0,
    num_kv_splits: int | None = None,
    logits_soft_cap: float = 0.0,
) -> torch.Tensor:
    """query [T, H, D] -> [T, H, D]: each sequence's new queries attend causally over its
    seq_len cached tokens (the last q_len of which are the new ones), within the last
    `sliding_window` positions if it is > 0, each score s = q.k * scale capped to
    c * tanh(s / c) if logits_soft_cap c is > 0. Caches [num_blocks, block_size, KV, D];
    query_start_loc [B + 1], seq_lens [B], block_tables [B, max_blocks], all int32.
    max_query_len and max_seq_len (host ints) only shape the launch. num_kv_splits: how
    many segments each sequence's context is split into (a power of two; None: chosen by
    default_num_kv_splits; 1: no split)."""
    num_tokens, num_heads, head_size = query.shape
    block_size, num_kv_heads = k_cache.shape[1:3]
    num_seqs = seq_lens.shape[0]
    _check(query, k_cache, v_cache, num_kv_heads)
    out = torch.empty_like(query)
    if num_tokens == 0:
        return out
    if num_kv_splits is None:
        num_kv_splits = default_num_kv_splits(max_query_len, max_seq_len, num_seqs, num_kv_heads)
    if num_kv_splits < 1 or num_kv_splits & (num_kv_splits - 1):
        raise ValueError(f"num_kv_splits {num_kv_splits} must be a power of two >= 1")
    group = num_heads // num_kv_heads
    block_m = max(MIN_BLOCK_M, triton.next_power_of_2(group))
    block_q = block_m // group
    head_padded = max(16, triton.next_power_of_2(head_size))
    partials = _partials(num_tokens, num_heads, num_kv_splits, head_padded, query.device)
    grid = (num_tokens // block_q + num_seqs, num_kv_heads, num_kv_splits)
    _attention_kernel[grid](
        out,
        *partials,
        query,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        scale,
        logits_soft_cap,
        num_seqs,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        NUM_HEADS=num_heads,
        GROUP=group,
        HEAD_SIZE=head_size,
        HEAD_PADDED=head_padded,
        BLOCK_SIZE=block_size,
        TILE=TILE_SIZE,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        SLIDING_WINDOW=sliding_window,
        USE_SOFTCAP=logits_soft_cap > 0,
        NUM_SEGMENTS=num_kv_splits,
        DOT=_dot_mode(query.dtype),
    )
    if num_kv_splits > 1:
        _reduce_segments_kernel[(num_tokens, num_heads)](
            out,
            *partials,
            out.stride(0),
            out.stride(1),
            NUM_HEADS=num_heads,
            HEAD_SIZE=head_size,
            HEAD_PADDED=head_padded,
            NUM_SEGMENTS=num_kv_splits,
        )
    return out


def _partials(
    num_tokens: int, num_heads: int, segments: int, head_padded: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The split's float32 partials (accumulators, maxima, exp-sums); 1-element stand-ins
    when the context is not split, as the kernel then never touches them."""
    rows = num_tokens * num_heads * segments if segments > 1 else 1
    return (
        torch.empty(
            rows * (head_padded if segments > 1 else 1), dtype=torch.float32, device=device
        ),
        torch.empty(rows, dtype=torch.float32, device=device),
        torch.empty(rows, dtype=torch.float32, device=device),
    )


def _check(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, num_kv_heads: int
) -> None:
    if query.stride(2) != 1:
        raise ValueError("query [T, H, D] must be dense in D")
    if query.shape[1] % num_kv_heads:
        raise ValueError(f"{query.shape[1]} query heads are not a multiple of {num_kv_heads}")
    if k_cache.stride(3) != 1 or k_cache.stride() != v_cache.stride():
        raise ValueError("the caches must share strides and be dense in D")
