/* Decode attention straight from the paged KV cache.
 *
 * Each (sequence, kv head) pair is one task: its G = H / KV query heads score every cached
 * key in place (found through the block table, never copied into a padded batch), take a
 * softmax and sum the values. The torch reference (attention_backends/torch_sdpa.py) must
 * gather all keys into a [B, max_seq_len] copy first, which dominated large decode steps.
 */
#include <omp.h>
#include <stdlib.h>

#include "ops.h"
#include "vec.h"

/* p[i] = e^(p[i] - max) / sum for i < n. */
INLINE void softmax(float *p, int64_t n) {
  vec16 vmax = splat16(p[0]);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) vmax = max16(vmax, load16(p + i));
  float max = vmax[0];
  for (int j = 1; j < 16; j++) max = vmax[j] > max ? vmax[j] : max;
  for (; i < n; i++) max = p[i] > max ? p[i] : max;
  vec16 acc = {0};
  for (i = 0; i + 16 <= n; i += 16) {
    vec16 e = exp16(load16(p + i) - max);
    store16(p + i, e);
    acc += e;
  }
  float sum = hsum16(acc);
  if (i < n) {
    float tail[16] = {0};
    for (int64_t j = i; j < n; j++) tail[j - i] = p[j] - max;
    store16(tail, exp16(load16(tail)));
    for (int64_t j = i; j < n; j++) sum += p[j] = tail[j - i];
  }
  float inv = 1.0f / sum;
  for (int64_t j = 0; j < n; j++) p[j] *= inv;
}

typedef struct {
  const float *k_cache, *v_cache;
  const int32_t *block_table;
  int64_t KV, D, block_size, kv_head;
} PagedHead;

/* Walks a sequence's tokens in order: offset of the current token's vector for this kv head
 * in either cache, advanced block by block without a division per token. */
typedef struct {
  const PagedHead *h;
  int64_t block, in_block, offset;
} TokenCursor;

INLINE TokenCursor first_token(const PagedHead *h) {
  TokenCursor c = {h, 0, 0, ((int64_t)h->block_table[0] * h->block_size * h->KV + h->kv_head) * h->D};
  return c;
}

/* Moves to the next token; call only while one remains (reads the next block's id). */
INLINE void next_token(TokenCursor *c, int64_t remaining) {
  const PagedHead *h = c->h;
  if (++c->in_block < h->block_size) {
    c->offset += h->KV * h->D;
  } else if (remaining > 0) {
    c->block++;
    c->in_block = 0;
    c->offset = ((int64_t)h->block_table[c->block] * h->block_size * h->KV + h->kv_head) * h->D;
  }
}

/* scores[t] = scale * q . k_t for t < seq_len, sixteen keys per transpose_sum16. */
INLINE void score_keys(const float *q, const PagedHead *h, int64_t seq_len, float scale,
                       float *scores) {
  TokenCursor c = first_token(h);
  for (int64_t t0 = 0; t0 < seq_len; t0 += 16) {
    int64_t n = seq_len - t0 < 16 ? seq_len - t0 : 16;
    vec16 partial[16] = {0};
    for (int64_t i = 0; i < n; i++) {
      partial[i] = dot_lanes(q, h->k_cache + c.offset, h->D);
      next_token(&c, seq_len - (t0 + i + 1));
    }
    float chunk[16];
    store16(chunk, transpose_sum16(partial) * scale);
    memcpy(scores + t0, chunk, (size_t)n * sizeof(float));
  }
}

/* out = sum_t p[t] v_t, 64 lanes at a time held in registers. */
INLINE void sum_values(const float *p, const PagedHead *h, int64_t seq_len, float *out) {
  const int64_t D = h->D;
  for (int64_t d0 = 0; d0 < D; d0 += 64) {
    TokenCursor c = first_token(h);
    if (d0 + 64 > D) {
      memset(out + d0, 0, (size_t)(D - d0) * sizeof(float));
      for (int64_t t = 0; t < seq_len; t++) {
        for (int64_t d = d0; d < D; d++) out[d] += p[t] * h->v_cache[c.offset + d];
        next_token(&c, seq_len - t - 1);
      }
      break;
    }
    vec16 acc[4] = {0};
    for (int64_t t = 0; t < seq_len; t++) {
      const float *v = h->v_cache + c.offset + d0;
      for (int j = 0; j < 4; j++) acc[j] += p[t] * load16(v + 16 * j);
      next_token(&c, seq_len - t - 1);
    }
    for (int j = 0; j < 4; j++) store16(out + d0 + 16 * j, acc[j]);
  }
}

/* q, out [G, D]: the G query heads that read one kv head; scores [seq_len] scratch. */
CPU_DISPATCH
static void attend(const float *q, float *out, const PagedHead *h, int64_t seq_len, int64_t G,
                   float scale, float *scores) {
  for (int64_t g = 0; g < G; g++) {
    score_keys(q + g * h->D, h, seq_len, scale, scores);
    softmax(scores, seq_len);
    sum_values(scores, h, seq_len, out + g * h->D);
  }
}

int paged_decode_attention(float *out, const float *q, const float *k_cache,
                            const float *v_cache, const int32_t *block_tables,
                            const int32_t *seq_lens, int64_t B, int64_t H, int64_t KV,
                            int64_t D, int64_t block_size, int64_t max_blocks, float scale,
                            int num_threads) {
  const int64_t G = H / KV;
  int64_t max_len = 0;
  for (int64_t b = 0; b < B; b++) max_len = seq_lens[b] > max_len ? seq_lens[b] : max_len;
  float *scratch = malloc((size_t)(num_threads * max_len) * sizeof(float));
  if (scratch == NULL) return -1;
  /* A sequence's kv heads share its blocks: with enough sequences to keep every thread busy,
   * one thread takes all of them in a row, while the blocks are in its cache. */
  const int64_t heads_per_task = B >= 4 * num_threads ? KV : 1;
#pragma omp parallel num_threads(num_threads)
  {
    float *scores = scratch + omp_get_thread_num() * max_len;
#pragma omp for collapse(2) schedule(dynamic, heads_per_task)
    for (int64_t b = 0; b < B; b++) {
      for (int64_t kvh = 0; kvh < KV; kvh++) {
        const PagedHead h = {k_cache, v_cache, block_tables + b * max_blocks, KV, D, block_size,
                             kvh};
        int64_t first = (b * H + kvh * G) * D;
        attend(q + first, out + first, &h, seq_lens[b], G, scale, scores);
      }
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
