/* Decode attention straight from the paged KV cache.
 *
 * Each query head scores every cached key of its sequence in place (found through the block
 * table, never copied into a padded batch), takes a softmax and sums the values. The torch
 * reference (attention_backends/torch_sdpa.py) gathers all keys into a [B, max_seq_len]
 * copy first, which dominated large decode steps. Keys and values are read as whole token
 * rows [KV, D], in order, sixteen tokens at a time for all heads of a task.
 *
 * Head sizes that are multiples of 32 (all common ones) take the grouped path: the query
 * heads of one kv head (up to HEAD_GROUP at a time) share each key and value row, widened
 * once, and the next chunk's rows are prefetched a token at a time rather than in one burst
 * (whose prefetches stalled on the line fill buffers). On the default model's shapes (9
 * heads, 3 kv heads, D 64, bf16 cache, 32 sequences of 400 tokens) that is 1.65x the
 * per-head path (0.97 vs 1.6 ms per layer). Other head sizes keep the per-head path.
 */
#include <omp.h>
#include <stdlib.h>
#include <unistd.h>

#include "bf16.h"
#include "ops.h"

#define VEC_MAX 16 /* head sizes up to 256 keep their output row in registers */
#define HEAD_GROUP 4 /* query heads of one kv head that share each widened key and value row */

/* A head's running softmax over the chunks seen so far: max score and sum of e^(s - max). */
typedef struct {
  float max, sum;
} RunningSoftmax;

/* Folds one chunk's scores (lanes >= n: -FLT_MAX) into state: probs[i] = e^(scores[i] - max)
 * for the new running max; returns the factor that rescales what was summed before. */
INLINE float softmax_update(vec16 scores, int64_t n, RunningSoftmax *state, float *probs) {
  const float chunk_max = hmax16(scores);
  const float max = chunk_max > state->max ? chunk_max : state->max;
  const float correction = exp16(splat16(state->max - max))[0];
  const vec16 p = select16(lanes_below(n), exp16(scores - max), splat16(0.0f));
  store16(probs, p);
  state->sum = state->sum * correction + hsum16(p);
  state->max = max;
  return correction;
}

/* Whether the next chunk's key and value rows are prefetched into L1 (else into L2): only
 * where L1 holds them beside the chunk being read (~24 KB for the default model) with room
 * to spare. Measured per layer, 256 sequences of ~300 tokens: on the AMX Xeon (48 KiB L1)
 * L1 was 7-10% faster than L2; on Zen 4 (32 KiB L1) L2 was 1.4-1.6x faster than L1, which
 * evicted rows before their use (BENCHMARKS.md, sessions 11 and 12). */
static int prefetch_into_l1(void) {
  static int known = -1; /* sysconf once; threads that race here all store the same value */
  int into_l1 = __atomic_load_n(&known, __ATOMIC_RELAXED);
  if (into_l1 < 0) {
    into_l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE) >= 48 * 1024;
    __atomic_store_n(&known, into_l1, __ATOMIC_RELAXED);
  }
  return into_l1;
}

/* KV_WIDEN32(p, lo, hi): 32 cache elements from p as two float32 vectors, in the lane order
 * KV_ELEMENT_OF gives (lane -> element of the 32). A float32 cache keeps its order; a bf16
 * cache is widened 32 at a time by two bit operations on 32-bit lanes (even elements are the
 * low halves, odd ones the high), so queries and outputs are put in that order instead. */
#define KV_T float
#define KV_LOAD16 load16
#define KV_LOAD1(p) (*(p))
#define KV_WIDEN32(p, lo, hi) (lo = load16(p), hi = load16((p) + 16))
#define KV_ELEMENT_OF(lane) (lane)
#define KV_NAME(name) name##_f32
#include "paged_attention_impl.h"
#undef KV_T
#undef KV_LOAD16
#undef KV_LOAD1
#undef KV_WIDEN32
#undef KV_ELEMENT_OF
#undef KV_NAME

INLINE void widen32_bf16(const uint16_t *p, vec16 *lo, vec16 *hi) {
  uvec16 u;
  memcpy(&u, p, sizeof u);
  *lo = (vec16)(u << 16);
  *hi = (vec16)(u & 0xffff0000u);
}

#define KV_T uint16_t
#define KV_LOAD16 load16_bf16
#define KV_LOAD1(p) bf16_to_float(*(p))
#define KV_WIDEN32(p, lo, hi) widen32_bf16(p, &(lo), &(hi))
#define KV_ELEMENT_OF(lane) ((lane) < 16 ? 2 * (lane) : 2 * ((lane) - 16) + 1)
#define KV_NAME(name) name##_bf16
#include "paged_attention_impl.h"

int paged_decode_attention(float *out, const float *q, const void *k_cache, const void *v_cache,
                           int kv_bf16, const int32_t *block_tables, const int32_t *seq_lens,
                           int64_t B, int64_t H, int64_t KV, int64_t D, int64_t block_size,
                           int64_t max_blocks, float scale, int num_threads) {
  if (kv_bf16)
    return run_bf16(out, q, k_cache, v_cache, block_tables, seq_lens, B, H, KV, D, block_size,
                    max_blocks, scale, num_threads);
  return run_f32(out, q, k_cache, v_cache, block_tables, seq_lens, B, H, KV, D, block_size,
                 max_blocks, scale, num_threads);
}

void reshape_and_cache(const void *key, const void *value, int kv_bf16, void *k_cache,
                       void *v_cache, int cache_bf16, const int64_t *slot_mapping,
                       int64_t num_tokens, int64_t key_stride, int64_t value_stride,
                       int64_t row_size) {
  const int64_t in = kv_bf16 ? 2 : 4, out = cache_bf16 ? 2 : 4; /* element bytes */
  for (int64_t t = 0; t < num_tokens; t++) {
    if (slot_mapping[t] < 0) continue; /* a padding token */
    const int64_t slot = slot_mapping[t] * row_size * out;
    convert((char *)k_cache + slot, cache_bf16, (const char *)key + t * key_stride * in, kv_bf16,
            row_size);
    convert((char *)v_cache + slot, cache_bf16, (const char *)value + t * value_stride * in,
            kv_bf16, row_size);
  }
}
