/* The kernels of pagedllm._C; csrc/module.c binds them to Python. All tensors are
 * contiguous float32 (block tables and lengths int32) on the CPU. */
#ifndef PAGEDLLM_OPS_H
#define PAGEDLLM_OPS_H

#include <stdint.h>

/* y [M, N] = x [M, K] @ w [N, K]^T (+ b [N]); b may be NULL. */
void gemv(const float *x, const float *w, const float *b, float *y, int64_t M, int64_t N,
          int64_t K, int num_threads);

/* One new query token per sequence against its paged keys and values:
 * out, q [B, H, D]; k_cache, v_cache [num_blocks, block_size, KV, D];
 * block_tables [B, max_blocks]; seq_lens [B] (>= 1). Query head h reads kv head h / (H / KV).
 * Returns 0, or -1 when its scratch memory cannot be allocated. */
int paged_decode_attention(float *out, const float *q, const float *k_cache,
                            const float *v_cache, const int32_t *block_tables,
                            const int32_t *seq_lens, int64_t B, int64_t H, int64_t KV,
                            int64_t D, int64_t block_size, int64_t max_blocks, float scale,
                            int num_threads);

#endif
