/* Decode attention straight from the paged KV cache.
 *
 * Each query head scores every cached key of its sequence in place (found through the block
 * table, never copied into a padded batch), takes a softmax and sums the values. The torch
 * reference (attention_backends/torch_sdpa.py) gathers all keys into a [B, max_seq_len]
 * copy first, which dominated large decode steps. Keys and values are read as whole token
 * rows [KV, D], in order, sixteen tokens at a time for all heads of a task.
 */
#include <omp.h>
#include <stdlib.h>

#include "ops.h"
#include "vec.h"

/* One sequence's keys or values in the cache: token t's row [KV, D] through its block. */
typedef struct {
  const float *cache;
  const int32_t *block_table;
  int64_t block_size, row_size;
} PagedRows;

/* Pointers to the rows of tokens t0 .. t0 + n - 1 (one division per call, not per token). */
INLINE void token_rows(const PagedRows *r, int64_t t0, int64_t n, const float **rows) {
  int64_t block = t0 / r->block_size, offset = t0 % r->block_size;
  const float *base = r->cache + (int64_t)r->block_table[block] * r->block_size * r->row_size;
  for (int64_t i = 0; i < n; i++) {
    rows[i] = base + offset * r->row_size;
    if (++offset == r->block_size && i + 1 < n) {
      offset = 0;
      base = r->cache + (int64_t)r->block_table[++block] * r->block_size * r->row_size;
    }
  }
}

/* Asks for the rows of tokens t0 .. t0 + n - 1 ahead of use: each block is a separate
 * stretch of memory that the hardware prefetcher would only find after a few misses. */
INLINE void prefetch_rows(const PagedRows *r, int64_t t0, int64_t n) {
  const float *rows[16];
  token_rows(r, t0, n, rows);
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < r->row_size; j += 16) __builtin_prefetch(rows[i] + j, 0, 1);
}

/* The work of one task: query heads [h0, h1) of one sequence, which read kv heads h / G. */
typedef struct {
  const float *q;
  float *out;
  PagedRows keys, values;
  int64_t seq_len, h0, h1, G, D;
  float scale;
} HeadRange;

#define VEC_MAX 16 /* head sizes up to 256 keep their output row in registers */

/* A head's running softmax over the chunks seen so far: max score and sum of e^(s - max). */
typedef struct {
  float max, sum;
} RunningSoftmax;

/* Scores of one chunk, scale * q . k_i for the n <= 16 key rows; lanes >= n are -FLT_MAX. */
INLINE vec16 score_chunk(const float *q, const float *const *rows, int64_t n, int64_t kv_offset,
                         float scale, const int64_t D) {
  vec16 partial[16] = {0};
  for (int64_t i = 0; i < n; i++) partial[i] = dot_lanes(q, rows[i] + kv_offset, D);
  return select16(lanes_below(n), transpose_sum16(partial) * scale, splat16(-__FLT_MAX__));
}

/* out = out * correction + sum_i p[i] v_i over n value rows. */
INLINE void accumulate_values(const float *p, const float *const *rows, int64_t n,
                              int64_t kv_offset, float correction, float *out,
                              const int64_t D) {
  if (D % 16 != 0 || D > 16 * VEC_MAX) {
    for (int64_t d = 0; d < D; d++) out[d] *= correction;
    for (int64_t i = 0; i < n; i++)
      for (int64_t d = 0; d < D; d++) out[d] += p[i] * rows[i][kv_offset + d];
    return;
  }
  vec16 acc[VEC_MAX];
  for (int64_t j = 0; j < D / 16; j++) acc[j] = load16(out + 16 * j) * correction;
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < D / 16; j++) acc[j] += p[i] * load16(rows[i] + kv_offset + 16 * j);
  for (int64_t j = 0; j < D / 16; j++) store16(out + 16 * j, acc[j]);
}

/* One chunk of n key and value rows for head h: the online softmax update (running max,
 * rescaled sum and output), so keys and values are read in one pass. */
INLINE void attend_chunk(const HeadRange *w, int64_t h, const float *const *keys,
                         const float *const *values, int64_t n, RunningSoftmax *state,
                         const int64_t D) {
  const int64_t kv_offset = h / w->G * D;
  vec16 scores = score_chunk(w->q + h * D, keys, n, kv_offset, w->scale, D);
  const float chunk_max = hmax16(scores);
  const float max = chunk_max > state->max ? chunk_max : state->max;
  const float correction = exp16(splat16(state->max - max))[0];
  vec16 p = select16(lanes_below(n), exp16(scores - max), splat16(0.0f));
  float probs[16];
  store16(probs, p);
  state->sum = state->sum * correction + hsum16(p);
  state->max = max;
  accumulate_values(probs, values, n, kv_offset, correction, w->out + h * D, D);
}

/* D is a parameter so that the common head sizes, passed as constants, get loops the
 * compiler unrolls. state: [h1 - h0] scratch. */
INLINE void attend_heads(const HeadRange *w, RunningSoftmax *state, const int64_t D) {
  const int64_t L = w->seq_len, heads = w->h1 - w->h0;
  for (int64_t h = 0; h < heads; h++) state[h] = (RunningSoftmax){-__FLT_MAX__, 0.0f};
  memset(w->out + w->h0 * D, 0, (size_t)(heads * D) * sizeof(float));
  for (int64_t t0 = 0; t0 < L; t0 += 16) {
    int64_t n = L - t0 < 16 ? L - t0 : 16;
    const float *keys[16], *values[16];
    token_rows(&w->keys, t0, n, keys);
    token_rows(&w->values, t0, n, values);
    if (t0 + 16 < L) {
      int64_t next = L - t0 - 16 < 16 ? L - t0 - 16 : 16;
      prefetch_rows(&w->keys, t0 + 16, next);
      prefetch_rows(&w->values, t0 + 16, next);
    }
    for (int64_t h = w->h0; h < w->h1; h++)
      attend_chunk(w, h, keys, values, n, &state[h - w->h0], D);
  }
  for (int64_t h = w->h0; h < w->h1; h++) {
    float inv = 1.0f / state[h - w->h0].sum;
    for (int64_t d = 0; d < D; d++) w->out[h * D + d] *= inv;
  }
}

CPU_DISPATCH
static void attend(const HeadRange *w, RunningSoftmax *state) {
  if (w->D == 64)
    attend_heads(w, state, 64);
  else if (w->D == 128)
    attend_heads(w, state, 128);
  else
    attend_heads(w, state, w->D);
}

int paged_decode_attention(float *out, const float *q, const float *k_cache,
                            const float *v_cache, const int32_t *block_tables,
                            const int32_t *seq_lens, int64_t B, int64_t H, int64_t KV,
                            int64_t D, int64_t block_size, int64_t max_blocks, float scale,
                            int num_threads) {
  const int64_t G = H / KV;
  /* A task is a whole sequence (its key and value rows stream in order) when there are
   * enough sequences to keep every thread busy, else one kv head's query heads. */
  const int64_t kv_per_task = B >= 2 * num_threads ? KV : 1;
  const int64_t tasks_per_seq = KV / kv_per_task;
  RunningSoftmax *scratch = malloc((size_t)(num_threads * H) * sizeof(RunningSoftmax));
  if (scratch == NULL) return -1;
#pragma omp parallel num_threads(num_threads)
  {
    RunningSoftmax *state = scratch + omp_get_thread_num() * H;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * tasks_per_seq; task++) {
      const int64_t b = task / tasks_per_seq, kv0 = task % tasks_per_seq * kv_per_task;
      const int32_t *table = block_tables + b * max_blocks;
      const HeadRange w = {q + b * H * D,
                           out + b * H * D,
                           {k_cache, table, block_size, KV * D},
                           {v_cache, table, block_size, KV * D},
                           seq_lens[b],
                           kv0 * G,
                           (kv0 + kv_per_task) * G,
                           G,
                           D,
                           scale};
      attend(&w, state);
    }
  }
  free(scratch);
  return 0;
}

void reshape_and_cache(const float *key, const float *value, float *k_cache, float *v_cache,
                       const int64_t *slot_mapping, int64_t num_tokens, int64_t key_stride,
                       int64_t value_stride, int64_t row_size) {
  const size_t bytes = (size_t)row_size * sizeof(float);
  for (int64_t t = 0; t < num_tokens; t++) {
    memcpy(k_cache + slot_mapping[t] * row_size, key + t * key_stride, bytes);
    memcpy(v_cache + slot_mapping[t] * row_size, value + t * value_stride, bytes);
  }
}
