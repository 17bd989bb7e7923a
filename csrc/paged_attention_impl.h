/* The body of csrc/paged_attention.c for one KV-cache element type, included once per type
 * with KV_T (the element), KV_LOAD16 / KV_LOAD1 (16 elements / one as float32) and KV_NAME(name)
 * (the type's suffix on every name) defined. Queries, scores and outputs are float32. */

/* A vector whose lanes sum to sum_i a[i] * b[i], i < n. */
INLINE vec16 KV_NAME(dot_lanes)(const float *a, const KV_T *b, int64_t n) {
  vec16 acc = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc += load16(a + i) * KV_LOAD16(b + i);
  for (; i < n; i++) acc[0] += a[i] * KV_LOAD1(b + i);
  return acc;
}

/* One sequence's keys or values in the cache: token t's row [KV, D] through its block. */
typedef struct {
  const KV_T *cache;
  const int32_t *block_table;
  int64_t block_size, row_size;
} KV_NAME(PagedRows);

/* Pointers to the rows of tokens t0 .. t0 + n - 1 (one division per call, not per token). */
INLINE void KV_NAME(token_rows)(const KV_NAME(PagedRows) *r, int64_t t0, int64_t n, const KV_T **rows) {
  int64_t block = t0 / r->block_size, offset = t0 % r->block_size;
  const KV_T *base = r->cache + (int64_t)r->block_table[block] * r->block_size * r->row_size;
  for (int64_t i = 0; i < n; i++) {
    rows[i] = base + offset * r->row_size;
    if (++offset == r->block_size && i + 1 < n) {
      offset = 0;
      base = r->cache + (int64_t)r->block_table[++block] * r->block_size * r->row_size;
    }
  }
}

/* Into L1 (prefetcht0) where into_l1 (prefetch_into_l1()), else into L2 (prefetcht1). */
INLINE void KV_NAME(prefetch_row)(const KV_T *row, int64_t row_size, int into_l1) {
  for (int64_t j = 0; j < row_size; j += 64 / sizeof(KV_T)) {
    if (into_l1)
      __builtin_prefetch(row + j, 0, 3);
    else
      __builtin_prefetch(row + j, 0, 2);
  }
}

/* Asks for the rows of tokens t0 .. t0 + n - 1 ahead of use: each block is a separate
 * stretch of memory that the hardware prefetcher would only find after a few misses. */
INLINE void KV_NAME(prefetch_rows)(const KV_NAME(PagedRows) *r, int64_t t0, int64_t n,
                                   int into_l1) {
  const KV_T *rows[16];
  KV_NAME(token_rows)(r, t0, n, rows);
  for (int64_t i = 0; i < n; i++) KV_NAME(prefetch_row)(rows[i], r->row_size, into_l1);
}

/* The work of one task: query heads [h0, h1) of one sequence, which read kv heads h / G. */
typedef struct {
  const float *q;
  float *out;
  KV_NAME(PagedRows) keys, values;
  int64_t seq_len, h0, h1, G, D;
  float scale;
  int prefetch_l1;
} KV_NAME(HeadRange);

/* Scores of one chunk, scale * q . k_i for the n <= 16 key rows; lanes >= n are -FLT_MAX. */
INLINE vec16 KV_NAME(score_chunk)(const float *q, const KV_T *const *rows, int64_t n, int64_t kv_offset,
                         float scale, const int64_t D) {
  vec16 partial[16] = {0};
  for (int64_t i = 0; i < n; i++) partial[i] = KV_NAME(dot_lanes)(q, rows[i] + kv_offset, D);
  return select16(lanes_below(n), transpose_sum16(partial) * scale, splat16(-__FLT_MAX__));
}

/* out = out * correction + sum_i p[i] v_i over n value rows. */
INLINE void KV_NAME(accumulate_values)(const float *p, const KV_T *const *rows, int64_t n,
                              int64_t kv_offset, float correction, float *out,
                              const int64_t D) {
  if (D % 16 != 0 || D > 16 * VEC_MAX) {
    for (int64_t d = 0; d < D; d++) out[d] *= correction;
    for (int64_t i = 0; i < n; i++)
      for (int64_t d = 0; d < D; d++) out[d] += p[i] * KV_LOAD1(rows[i] + kv_offset + d);
    return;
  }
  vec16 acc[VEC_MAX];
  for (int64_t j = 0; j < D / 16; j++) acc[j] = load16(out + 16 * j) * correction;
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < D / 16; j++) acc[j] += p[i] * KV_LOAD16(rows[i] + kv_offset + 16 * j);
  for (int64_t j = 0; j < D / 16; j++) store16(out + 16 * j, acc[j]);
}

/* One chunk of n key and value rows for head h: the online softmax update (running max,
 * rescaled sum and output), so keys and values are read in one pass. */
INLINE void KV_NAME(attend_chunk)(const KV_NAME(HeadRange) *w, int64_t h, const KV_T *const *keys,
                         const KV_T *const *values, int64_t n, RunningSoftmax *state,
                         const int64_t D) {
  const int64_t kv_offset = h / w->G * D;
  vec16 scores = KV_NAME(score_chunk)(w->q + h * D, keys, n, kv_offset, w->scale, D);
  float probs[16];
  const float correction = softmax_update(scores, n, state, probs);
  KV_NAME(accumulate_values)(probs, values, n, kv_offset, correction, w->out + h * D, D);
}

/* The element of a row (D % 32 == 0) that lane position e of its widened vectors holds. */
INLINE int64_t KV_NAME(lane_element)(int64_t e) { return e - e % 32 + KV_ELEMENT_OF(e % 32); }

/* A row of D cache elements (D % 32 == 0) as D / 16 float32 vectors in KV_ELEMENT_OF order. */
INLINE void KV_NAME(widen_row)(const KV_T *row, vec16 *out, const int64_t D) {
  for (int64_t j = 0; j < D / 32; j++) KV_WIDEN32(row + 32 * j, out[2 * j], out[2 * j + 1]);
}

/* One chunk of n rows for the gn query heads [h, h + gn) of kv head kvh (gn <= HEAD_GROUP, a
 * constant at each call): each key and value row is widened once for all of them. qp: their
 * queries, acc: their outputs so far, [gn, D] each in KV_ELEMENT_OF order; state: theirs. A
 * head's arithmetic does not depend on gn or on the other heads, so the split of heads into
 * tasks and groups never changes its result. */
INLINE void KV_NAME(attend_group)(const KV_NAME(HeadRange) *w, int64_t kvh, const int gn,
                                  const float *qp, float *acc, const KV_T *const *keys,
                                  const KV_T *const *values, int64_t n, RunningSoftmax *state,
                                  const KV_T *const *next_keys, const KV_T *const *next_values,
                                  int64_t next_n, const int64_t D) {
  const int64_t off = kvh * D;
  vec16 partial[HEAD_GROUP][16];
  for (int64_t i = 0; i < n; i++) { /* next_n > 0 only when this chunk is full */
    if (i < next_n) {
      KV_NAME(prefetch_row)(next_keys[i], w->keys.row_size, w->prefetch_l1);
      KV_NAME(prefetch_row)(next_values[i], w->values.row_size, w->prefetch_l1);
    }
    vec16 k[VEC_MAX];
    KV_NAME(widen_row)(keys[i] + off, k, D);
    for (int g = 0; g < gn; g++) {
      const float *q = qp + g * D;
      vec16 a = k[0] * load16(q), b = k[1] * load16(q + 16);
      for (int64_t j = 2; j < D / 16; j += 2) {
        a += k[j] * load16(q + 16 * j);
        b += k[j + 1] * load16(q + 16 * j + 16);
      }
      partial[g][i] = a + b;
    }
  }
  for (int64_t i = n; i < 16; i++) /* a last chunk's missing rows add nothing */
    for (int g = 0; g < gn; g++) partial[g][i] = splat16(0.0f);
  float probs[HEAD_GROUP][16];
  vec16 out[HEAD_GROUP][VEC_MAX];
  for (int g = 0; g < gn; g++) {
    const vec16 scores = select16(lanes_below(n), transpose_sum16(partial[g]) * w->scale,
                                  splat16(-__FLT_MAX__));
    const float correction = softmax_update(scores, n, &state[g], probs[g]);
    for (int64_t j = 0; j < D / 16; j++) out[g][j] = load16(acc + g * D + 16 * j) * correction;
  }
  for (int64_t i = 0; i < n; i++) {
    vec16 v[VEC_MAX];
    KV_NAME(widen_row)(values[i] + off, v, D);
    for (int g = 0; g < gn; g++) {
      const vec16 p = splat16(probs[g][i]);
      for (int64_t j = 0; j < D / 16; j++) out[g][j] += p * v[j];
    }
  }
  for (int g = 0; g < gn; g++)
    for (int64_t j = 0; j < D / 16; j++) store16(acc + g * D + 16 * j, out[g][j]);
}

/* attend_group with gn as a constant. */
INLINE void KV_NAME(attend_group_any)(const KV_NAME(HeadRange) *w, int64_t kvh, int gn,
                                      const float *qp, float *acc, const KV_T *const *keys,
                                      const KV_T *const *values, int64_t n,
                                      RunningSoftmax *state, const KV_T *const *next_keys,
                                      const KV_T *const *next_values, int64_t next_n,
                                      const int64_t D) {
#define CASE(c)                                                                              \
  case c:                                                                                    \
    KV_NAME(attend_group)(w, kvh, c, qp, acc, keys, values, n, state, next_keys, next_values, \
                          next_n, D);                                                        \
    return;
  switch (gn) { CASE(1) CASE(2) CASE(3) default: CASE(HEAD_GROUP) }
#undef CASE
}

/* attend_heads for D % 32 == 0 (and D <= 16 * VEC_MAX): the heads of each kv head in groups
 * of up to HEAD_GROUP. scratch: 2 * (h1 - h0) * D floats. */
INLINE void KV_NAME(attend_grouped)(const KV_NAME(HeadRange) *w, RunningSoftmax *state,
                                    float *scratch, const int64_t D) {
  const int64_t L = w->seq_len, heads = w->h1 - w->h0;
  float *qp = scratch, *acc = scratch + heads * D;
  for (int64_t h = 0; h < heads; h++) {
    state[h] = (RunningSoftmax){-__FLT_MAX__, 0.0f};
    for (int64_t e = 0; e < D; e++)
      qp[h * D + e] = w->q[(w->h0 + h) * D + KV_NAME(lane_element)(e)];
  }
  memset(acc, 0, (size_t)(heads * D) * sizeof(float));
  const KV_T *rows[2][2][16]; /* [chunk % 2][keys, values][token] */
  if (L > 0) {
    KV_NAME(token_rows)(&w->keys, 0, L < 16 ? L : 16, rows[0][0]);
    KV_NAME(token_rows)(&w->values, 0, L < 16 ? L : 16, rows[0][1]);
  }
  for (int64_t t0 = 0; t0 < L; t0 += 16) {
    const KV_T *const *keys = rows[t0 / 16 % 2][0], *const *values = rows[t0 / 16 % 2][1];
    const KV_T **next_keys = rows[t0 / 16 % 2 ^ 1][0], **next_values = rows[t0 / 16 % 2 ^ 1][1];
    const int64_t n = L - t0 < 16 ? L - t0 : 16;
    const int64_t next_n = L - t0 - 16 < 0 ? 0 : L - t0 - 16 < 16 ? L - t0 - 16 : 16;
    if (next_n > 0) { /* prefetched a row at a time by the first group */
      KV_NAME(token_rows)(&w->keys, t0 + 16, next_n, next_keys);
      KV_NAME(token_rows)(&w->values, t0 + 16, next_n, next_values);
    }
    for (int64_t h = w->h0; h < w->h1;) {
      const int64_t kvh = h / w->G, left = (kvh + 1) * w->G - h;
      const int gn = left < HEAD_GROUP ? (int)left : HEAD_GROUP;
      const int64_t i = h - w->h0;
      KV_NAME(attend_group_any)(w, kvh, gn, qp + i * D, acc + i * D, keys, values, n,
                                state + i, next_keys, next_values, h == w->h0 ? next_n : 0, D);
      h += gn;
    }
  }
  for (int64_t h = 0; h < heads; h++) {
    const float inv = 1.0f / state[h].sum;
    for (int64_t e = 0; e < D; e++)
      w->out[(w->h0 + h) * D + KV_NAME(lane_element)(e)] = acc[h * D + e] * inv;
  }
}

/* D is a parameter so that the common head sizes, passed as constants, get loops the
 * compiler unrolls. state: [h1 - h0] scratch. */
INLINE void KV_NAME(attend_heads)(const KV_NAME(HeadRange) *w, RunningSoftmax *state, const int64_t D) {
  const int64_t L = w->seq_len, heads = w->h1 - w->h0;
  for (int64_t h = 0; h < heads; h++) state[h] = (RunningSoftmax){-__FLT_MAX__, 0.0f};
  memset(w->out + w->h0 * D, 0, (size_t)(heads * D) * sizeof(float));
  for (int64_t t0 = 0; t0 < L; t0 += 16) {
    int64_t n = L - t0 < 16 ? L - t0 : 16;
    const KV_T *keys[16], *values[16];
    KV_NAME(token_rows)(&w->keys, t0, n, keys);
    KV_NAME(token_rows)(&w->values, t0, n, values);
    if (t0 + 16 < L) {
      int64_t next = L - t0 - 16 < 16 ? L - t0 - 16 : 16;
      KV_NAME(prefetch_rows)(&w->keys, t0 + 16, next, w->prefetch_l1);
      KV_NAME(prefetch_rows)(&w->values, t0 + 16, next, w->prefetch_l1);
    }
    for (int64_t h = w->h0; h < w->h1; h++)
      KV_NAME(attend_chunk)(w, h, keys, values, n, &state[h - w->h0], D);
  }
  for (int64_t h = w->h0; h < w->h1; h++) {
    float inv = 1.0f / state[h - w->h0].sum;
    for (int64_t d = 0; d < D; d++) w->out[h * D + d] *= inv;
  }
}

/* scratch: 2 * (h1 - h0) * D floats. */
CPU_DISPATCH
static void KV_NAME(attend)(const KV_NAME(HeadRange) *w, RunningSoftmax *state, float *scratch) {
  if (w->D == 64)
    KV_NAME(attend_grouped)(w, state, scratch, 64);
  else if (w->D == 128)
    KV_NAME(attend_grouped)(w, state, scratch, 128);
  else if (w->D % 32 == 0 && w->D <= 16 * VEC_MAX)
    KV_NAME(attend_grouped)(w, state, scratch, w->D);
  else
    KV_NAME(attend_heads)(w, state, w->D);
}

static int KV_NAME(run)(float *out, const float *q, const KV_T *k_cache, const KV_T *v_cache,
                   const int32_t *block_tables, const int32_t *seq_lens, int64_t B, int64_t H,
                   int64_t KV, int64_t D, int64_t block_size, int64_t max_blocks, float scale,
                   int num_threads) {
  const int64_t G = H / KV;
  /* A task is a whole sequence (its key and value rows stream in order) when there are
   * enough sequences to keep every thread busy, else one kv head's query heads. */
  const int64_t kv_per_task = B >= 2 * num_threads ? KV : 1;
  const int64_t tasks_per_seq = KV / kv_per_task;
  const int into_l1 = prefetch_into_l1();
  RunningSoftmax *states = malloc((size_t)(num_threads * H) * sizeof(RunningSoftmax));
  float *scratch = malloc((size_t)(num_threads * 2 * H * D) * sizeof(float));
  if (states == NULL || scratch == NULL) {
    free(states);
    free(scratch);
    return -1;
  }
#pragma omp parallel num_threads(num_threads)
  {
    RunningSoftmax *state = states + omp_get_thread_num() * H;
    float *thread_scratch = scratch + omp_get_thread_num() * 2 * H * D;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * tasks_per_seq; task++) {
      const int64_t b = task / tasks_per_seq, kv0 = task % tasks_per_seq * kv_per_task;
      const int32_t *table = block_tables + b * max_blocks;
      const KV_NAME(HeadRange) w = {q + b * H * D,
                               out + b * H * D,
                               {k_cache, table, block_size, KV * D},
                               {v_cache, table, block_size, KV * D},
                               seq_lens[b],
                               kv0 * G,
                               (kv0 + kv_per_task) * G,
                               G,
                               D,
                               scale,
                               into_l1};
      KV_NAME(attend)(&w, state, thread_scratch);
    }
  }
  free(states);
  free(scratch);
  return 0;
}
