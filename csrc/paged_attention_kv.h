/* Decode attention for one KV-cache element type, included by paged_attention_kernel.h once
 * per type with KV_T (the element), KV_LOADN / KV_LOAD1 (VEC_LANES elements / one as
 * float32), KV_BF16 (1 for a bf16 cache) and KV_NAME(name) (the type's suffix on every name)
 * defined. Queries, scores and outputs are float32, in attention_row.h's arithmetic. Keys and
 * values are read a chunk of VEC_LANES tokens at a time: a chunk's scores are one vector. */

/* The lane sums of a . b over n elements, a head that is not widened: one FMA chain from zero
 * over whole vectors, the elements past them continuing lane 0's. */
INLINE vecn KV_NAME(dot_lanes)(const float *a, const KV_T *b, int64_t n) {
  vecn acc = splatn(0.0f);
  int64_t i = 0;
  for (; i + VEC_LANES <= n; i += VEC_LANES) acc = fman(loadn(a + i), KV_LOADN(b + i), acc);
  for (; i < n; i++) acc[0] = fma1(a[i], KV_LOAD1(b + i), acc[0]);
  return acc;
}

/* One sequence's keys or values in the cache from token `start` on: token t's row [KV, D]
 * (t counted from start) through its block. */
typedef struct {
  const KV_T *cache;
  const int32_t *block_table;
  int64_t block_size, row_size, start;
} KV_NAME(PagedRows);

/* Pointers to the rows of tokens t0 .. t0 + n - 1 (one division per call, not per token). */
INLINE void KV_NAME(token_rows)(const KV_NAME(PagedRows) *r, int64_t t0, int64_t n,
                                 const KV_T **rows) {
  int64_t block = (r->start + t0) / r->block_size, offset = (r->start + t0) % r->block_size;
  const KV_T *base = r->cache + (int64_t)r->block_table[block] * r->block_size * r->row_size;
  for (int64_t i = 0; i < n; i++) {
    rows[i] = base + offset * r->row_size;
    if (++offset == r->block_size && i + 1 < n) {
      offset = 0;
      base = r->cache + (int64_t)r->block_table[++block] * r->block_size * r->row_size;
    }
  }
}

/* The n elements from row, into L1 (prefetcht0) where into_l1 (prefetch_into_l1()), else
 * into L2 (prefetcht1). */
INLINE void KV_NAME(prefetch_row)(const KV_T *row, int64_t n, int into_l1) {
  for (int64_t j = 0; j < n; j += 64 / sizeof(KV_T)) {
    if (into_l1)
      __builtin_prefetch(row + j, 0, 3);
    else
      __builtin_prefetch(row + j, 0, 2);
  }
}

/* The work of one task: query heads [h0, h1) of one sequence, which read kv heads h / G, the
 * elements [row_offset, row_offset + row_span) of each key and value row (a task of one kv
 * head prefetches only its third of the default model's rows: 1.3-1.9x faster at 1-2
 * sequences than with whole rows), over its num_tokens tokens from keys.start (the whole
 * sequence, or one partition of it: then saved is its slot's softmax states, see
 * finish_head, and out its slot's outputs). */
typedef struct {
  const float *q;
  float *out;
  KV_NAME(PagedRows) keys, values;
  int64_t num_tokens, h0, h1, G, D, row_offset, row_span;
  float scale;
  int prefetch_l1;
  SoftmaxState *saved;
} KV_NAME(HeadRange);

/* Rows of a chunk and of the one after it, [chunk % 2][token]: a chunk's pass prefetches the
 * next chunk's rows a row at a time as it reads its own. */
typedef const KV_T *KV_NAME(ChunkRows)[2][VEC_LANES];

/* The rows of the chunk at t0 into rows[t0 / VEC_LANES % 2] (read as the next chunk's, but for
 * the first), and the next chunk's into the other half; returns how many it has. */
INLINE int64_t KV_NAME(chunk_rows)(const KV_NAME(PagedRows) *r, int64_t t0, int64_t L,
                                   KV_NAME(ChunkRows) rows) {
  const int64_t left = L - t0 - VEC_LANES, chunk = t0 / VEC_LANES % 2;
  const int64_t next_n = left < 0 ? 0 : left < VEC_LANES ? left : VEC_LANES;
  if (t0 == 0) KV_NAME(token_rows)(r, 0, L < VEC_LANES ? L : VEC_LANES, rows[0]);
  if (next_n > 0) KV_NAME(token_rows)(r, t0 + VEC_LANES, next_n, rows[chunk ^ 1]);
  return next_n;
}

/* The prefetches of the next chunk's row i, if it has one. */
INLINE void KV_NAME(prefetch_next)(const KV_NAME(HeadRange) *w, const KV_T *const *next,
                                   int64_t next_n, int64_t i) {
  if (i < next_n) KV_NAME(prefetch_row)(next[i] + w->row_offset, w->row_span, w->prefetch_l1);
}

/* Scores of one chunk of n key rows for head h (any D): scores[0, VEC_LANES). */
INLINE void KV_NAME(score_head)(const KV_NAME(HeadRange) *w, int64_t h, const KV_T *const *keys,
                                int64_t n, float *scores, const KV_T *const *next,
                                int64_t next_n, const int64_t D) {
  vecn partial[VEC_LANES];
  for (int64_t i = 0; i < n; i++) {
    KV_NAME(prefetch_next)(w, next, next_n, i);
    partial[i] = KV_NAME(dot_lanes)(w->q + h * D, keys[i] + h / w->G * D, D);
  }
  chunk_scores(scores, partial, n, w->scale);
}

/* out [D] += sum_i p[i] v_i over n value rows from kv_offset (any D). */
INLINE void KV_NAME(accumulate_head)(const KV_NAME(HeadRange) *w, const float *p,
                                     const KV_T *const *rows, int64_t n, int64_t kv_offset,
                                     float *out, const KV_T *const *next, int64_t next_n,
                                     const int64_t D) {
  if (D % VEC_LANES != 0 || D > MAX_HEAD_SIZE) {
    for (int64_t i = 0; i < n; i++) {
      KV_NAME(prefetch_next)(w, next, next_n, i);
      for (int64_t d = 0; d < D; d++)
        out[d] = fma1(p[i], KV_LOAD1(rows[i] + kv_offset + d), out[d]);
    }
    return;
  }
  vecn acc[VEC_MAX];
  for (int64_t j = 0; j < D / VEC_LANES; j++) acc[j] = loadn(out + VEC_LANES * j);
  for (int64_t i = 0; i < n; i++) {
    KV_NAME(prefetch_next)(w, next, next_n, i);
    for (int64_t j = 0; j < D / VEC_LANES; j++)
      acc[j] = fman(splatn(p[i]), KV_LOADN(rows[i] + kv_offset + VEC_LANES * j), acc[j]);
  }
  for (int64_t j = 0; j < D / VEC_LANES; j++) storen(out + VEC_LANES * j, acc[j]);
}

/* A row of D cache elements (D % WIDEN_ELEMENTS == 0) as D / VEC_LANES float32 vectors in
 * widened_element order. */
INLINE void KV_NAME(widen_row)(const KV_T *row, vecn *out, const int64_t D) {
  for (int64_t j = 0; j < D / WIDEN_ELEMENTS; j++)
    widen2n_as(row + WIDEN_ELEMENTS * j, KV_BF16, &out[2 * j], &out[2 * j + 1]);
}

/* Scores of one chunk of n key rows for the gn query heads [h, h + gn) of kv head kvh (gn <=
 * HEAD_GROUP, a constant at each call; D % WIDEN_ELEMENTS == 0): each key row is widened once
 * for all of them. qp: their queries, [gn, D] in widened_element order; scores: theirs,
 * VEC_LANES each, score_stride apart. A head's arithmetic does not depend on gn or on the
 * other heads, so the split of heads into tasks and groups never changes its result. */
INLINE void KV_NAME(score_group)(const KV_NAME(HeadRange) *w, int64_t kvh, const int gn,
                                 const float *qp, const KV_T *const *keys, int64_t n,
                                 float *scores, int64_t score_stride, const KV_T *const *next,
                                 int64_t next_n, const int64_t D) {
  vecn partial[HEAD_GROUP][VEC_LANES];
  for (int64_t i = 0; i < n; i++) {
    KV_NAME(prefetch_next)(w, next, next_n, i);
    vecn k[VEC_MAX];
    KV_NAME(widen_row)(keys[i] + kvh * D, k, D);
    for (int g = 0; g < gn; g++) {
      const float *q = qp + g * D;
      vecn a = splatn(0.0f), b = splatn(0.0f);
      for (int64_t j = 0; j < D / VEC_LANES; j += 2) {
        a = fman(k[j], loadn(q + VEC_LANES * j), a);
        b = fman(k[j + 1], loadn(q + VEC_LANES * j + VEC_LANES), b);
      }
      partial[g][i] = a + b;
    }
  }
  for (int g = 0; g < gn; g++) chunk_scores(scores + g * score_stride, partial[g], n, w->scale);
}

/* score_group with gn as a constant. */
INLINE void KV_NAME(score_group_any)(const KV_NAME(HeadRange) *w, int64_t kvh, int gn,
                                     const float *qp, const KV_T *const *keys, int64_t n,
                                     float *scores, int64_t score_stride,
                                     const KV_T *const *next, int64_t next_n, const int64_t D) {
#define CASE(c)                                                                          \
  case c:                                                                                \
    KV_NAME(score_group)(w, kvh, c, qp, keys, n, scores, score_stride, next, next_n, D); \
    return;
  switch (gn) { CASE(1) CASE(2) CASE(3) default: CASE(HEAD_GROUP) }
#undef CASE
}

/* acc [D] (widened_element order; D % WIDEN_ELEMENTS == 0) += sum_i p[i] v_i over the chunk's
 * n value rows from kv_offset. */
INLINE void KV_NAME(accumulate_widened)(const KV_NAME(HeadRange) *w, const float *p,
                                        const KV_T *const *rows, int64_t n, int64_t kv_offset,
                                        float *acc, const KV_T *const *next, int64_t next_n,
                                        const int64_t D) {
  vecn out[VEC_MAX];
  for (int64_t j = 0; j < D / VEC_LANES; j++) out[j] = loadn(acc + VEC_LANES * j);
  for (int64_t i = 0; i < n; i++) {
    KV_NAME(prefetch_next)(w, next, next_n, i);
    const vecn pi = broadcastn(&p[i]);
    for (int64_t j = 0; j < D / WIDEN_ELEMENTS; j++) {
      vecn lo, hi;
      widen2n_as(rows[i] + kv_offset + WIDEN_ELEMENTS * j, KV_BF16, &lo, &hi);
      out[2 * j] = fman(pi, lo, out[2 * j]);
      out[2 * j + 1] = fman(pi, hi, out[2 * j + 1]);
    }
  }
  for (int64_t j = 0; j < D / VEC_LANES; j++) storen(acc + VEC_LANES * j, out[j]);
}

/* The task's heads in three passes, as vLLM's CPU decode attention: every head's scores over
 * the keys, their softmax, then the values weighted by it (the output is scaled once, not
 * rescaled per chunk as by an online softmax: 1.2-1.4x faster on Zen 3). `widened` (a
 * constant: D % WIDEN_ELEMENTS == 0 and D <= MAX_HEAD_SIZE) reads each key row once for up
 * to HEAD_GROUP query heads of its kv head and keeps rows in registers, in
 * widened_element order. scratch: attend_scratch_floats(h1 - h0, D) floats; state: [h1 - h0]. */
INLINE void KV_NAME(attend_heads)(const KV_NAME(HeadRange) *w, SoftmaxState *state,
                                  float *scratch, const int64_t D, const int widened) {
  const int64_t L = w->num_tokens, heads = w->h1 - w->h0, stride = PARTITION_TOKENS;
  float *qp = scratch, *acc = qp + heads * D, *scores = acc + heads * D;
  for (int64_t h = 0; h < heads; h++)
    for (int64_t e = 0; e < D; e++)
      qp[h * D + e] = w->q[(w->h0 + h) * D + (widened ? widened_element(e, KV_BF16) : e)];
  memset(acc, 0, (size_t)(heads * D) * sizeof(float));
  KV_NAME(ChunkRows) rows;
  for (int64_t t0 = 0; t0 < L; t0 += VEC_LANES) {
    const int64_t next_n = KV_NAME(chunk_rows)(&w->keys, t0, L, rows);
    const int64_t n = L - t0 < VEC_LANES ? L - t0 : VEC_LANES, chunk = t0 / VEC_LANES % 2;
    for (int64_t h = w->h0; h < w->h1;) {
      const int64_t i = h - w->h0, first = h == w->h0 ? next_n : 0;
      if (!widened) {
        KV_NAME(score_head)(w, h++, rows[chunk], n, scores + i * stride + t0, rows[chunk ^ 1],
                            first, D);
        continue;
      }
      const int64_t kvh = h / w->G, left = (kvh + 1) * w->G - h;
      const int64_t gn = left < HEAD_GROUP ? left : HEAD_GROUP;
      KV_NAME(score_group_any)(w, kvh, (int)gn, qp + i * D, rows[chunk], n,
                               scores + i * stride + t0, stride, rows[chunk ^ 1], first, D);
      h += gn;
    }
  }
  for (int64_t h = 0; h < heads; h++) state[h] = softmax_scores(scores + h * stride, L);
  for (int64_t t0 = 0; t0 < L; t0 += VEC_LANES) {
    const int64_t next_n = KV_NAME(chunk_rows)(&w->values, t0, L, rows);
    const int64_t n = L - t0 < VEC_LANES ? L - t0 : VEC_LANES, chunk = t0 / VEC_LANES % 2;
    for (int64_t h = 0; h < heads; h++) {
      const int64_t off = (w->h0 + h) / w->G * D, first = h == 0 ? next_n : 0;
      const float *p = scores + h * stride + t0;
      if (widened)
        KV_NAME(accumulate_widened)(w, p, rows[chunk], n, off, acc + h * D, rows[chunk ^ 1],
                                    first, D);
      else
        KV_NAME(accumulate_head)(w, p, rows[chunk], n, off, acc + h * D, rows[chunk ^ 1],
                                 first, D);
    }
  }
  for (int64_t h = 0; h < heads; h++) {
    const float inv = finish_head(&state[h], w->saved ? &w->saved[w->h0 + h] : NULL);
    for (int64_t e = 0; e < D; e++)
      w->out[(w->h0 + h) * D + (widened ? widened_element(e, KV_BF16) : e)] = acc[h * D + e] * inv;
  }
}

/* attend_heads with the common head sizes as constants, whose loops the compiler unrolls. */
static void KV_NAME(attend)(const KV_NAME(HeadRange) *w, SoftmaxState *state, float *scratch) {
  if (w->D == 64)
    KV_NAME(attend_heads)(w, state, scratch, 64, 1);
  else if (w->D == 128)
    KV_NAME(attend_heads)(w, state, scratch, 128, 1);
  else if (w->D % WIDEN_ELEMENTS == 0 && w->D <= MAX_HEAD_SIZE)
    KV_NAME(attend_heads)(w, state, scratch, w->D, 1);
  else
    KV_NAME(attend_heads)(w, state, scratch, w->D, 0);
}

/* Tasks: each partition of each sequence (partitions()), for kv_per_task kv heads at a time;
 * then the heads of split sequences merged. */
static int KV_NAME(run)(const paged_attention_args *a) {
  const KV_T *k_cache = a->k_cache, *v_cache = a->v_cache;
  const int64_t B = a->B, H = a->H, KV = a->KV, D = a->D;
  const int num_threads = a->num_threads;
  const int64_t G = H / KV;
  /* A task covers all kv heads (its key and value rows stream in order) when there are
   * enough sequences to keep every thread busy, else one kv head's query heads. */
  const int64_t kv_per_task = B >= 2 * num_threads ? KV : 1;
  const int64_t tasks_per_seq = KV / kv_per_task;
  Partitions p;
  SoftmaxState *states = malloc((size_t)(num_threads * H) * sizeof(SoftmaxState));
  float *scratch = malloc((size_t)(num_threads * attend_scratch_floats(H, D)) * sizeof(float));
  if (states == NULL || scratch == NULL || plan_partitions(&p, a, tasks_per_seq) < 0) {
    free(states);
    free(scratch);
    return -1;
  }
#pragma omp parallel num_threads(num_threads)
  {
    SoftmaxState *state = states + omp_get_thread_num() * H;
    float *thread_scratch = scratch + omp_get_thread_num() * attend_scratch_floats(H, D);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < p.first_task[B]; task++) {
      const int64_t b = task_sequence(p.first_task, B, task), local = task - p.first_task[b];
      const int64_t part = local / tasks_per_seq, kv0 = local % tasks_per_seq * kv_per_task;
      const int64_t start = part * PARTITION_TOKENS, slot = p.first_slot[b] + part;
      const int64_t left = a->seq_lens[b] - start;
      const int split = p.first_slot[b + 1] > p.first_slot[b];
      const int32_t *table = a->block_tables + b * a->max_blocks;
      const KV_NAME(HeadRange) w = {a->q + b * H * D,
                                    split ? p.partial_out + slot * H * D : a->out + b * H * D,
                                    {k_cache, table, a->block_size, KV * D, start},
                                    {v_cache, table, a->block_size, KV * D, start},
                                    left < PARTITION_TOKENS ? left : PARTITION_TOKENS,
                                    kv0 * G,
                                    (kv0 + kv_per_task) * G,
                                    G,
                                    D,
                                    kv0 * D,
                                    kv_per_task * D,
                                    a->scale,
                                    a->into_l1,
                                    split ? p.partial_state + slot * H : NULL};
      KV_NAME(attend)(&w, state, thread_scratch);
    }
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * H; bh++) {
      const int64_t b = bh / H, h = bh % H, parts = p.first_slot[b + 1] - p.first_slot[b];
      if (parts > 0)
        merge_head(a->out + bh * D, p.partial_out + p.first_slot[b] * H * D + h * D,
                   p.partial_state + p.first_slot[b] * H + h, parts, H * D, H, D);
    }
  }
  free_partitions(&p);
  free(states);
  free(scratch);
  return 0;
}
