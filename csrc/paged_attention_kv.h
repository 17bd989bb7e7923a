/* Decode attention for one KV-cache element type, included by paged_attention_kernel.h once
 * per type with KV_T (the element), KV_LOADN / KV_LOAD1 (VEC_LANES elements / one as
 * float32), KV_WIDEN2N and KV_ELEMENT_OF (below) and KV_NAME(name) (the type's suffix on every
 * name) defined. Queries, scores and outputs are float32. Keys and values are read a chunk of
 * VEC_LANES tokens at a time: a chunk's scores are one vector. */

/* A vector whose lanes sum to sum_i a[i] * b[i], i < n. */
INLINE vecn KV_NAME(dot_lanes)(const float *a, const KV_T *b, int64_t n) {
  vecn acc = {0};
  int64_t i = 0;
  for (; i + VEC_LANES <= n; i += VEC_LANES) acc += loadn(a + i) * KV_LOADN(b + i);
  for (; i < n; i++) acc[0] += a[i] * KV_LOAD1(b + i);
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

/* Asks for elements [offset, offset + span) of the rows of tokens t0 .. t0 + n - 1 ahead of
 * use: each block is a separate stretch of memory that the hardware prefetcher would only
 * find after a few misses. */
INLINE void KV_NAME(prefetch_rows)(const KV_NAME(PagedRows) *r, int64_t t0, int64_t n,
                                   int64_t offset, int64_t span, int into_l1) {
  const KV_T *rows[VEC_LANES];
  KV_NAME(token_rows)(r, t0, n, rows);
  for (int64_t i = 0; i < n; i++) KV_NAME(prefetch_row)(rows[i] + offset, span, into_l1);
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
  RunningSoftmax *saved;
} KV_NAME(HeadRange);

/* Scores of one chunk, scale * q . k_i for the n <= VEC_LANES key rows; lanes >= n are
 * -FLT_MAX. */
INLINE vecn KV_NAME(score_chunk)(const float *q, const KV_T *const *rows, int64_t n,
                                 int64_t kv_offset, float scale, const int64_t D) {
  vecn partial[VEC_LANES] = {0};
  for (int64_t i = 0; i < n; i++) partial[i] = KV_NAME(dot_lanes)(q, rows[i] + kv_offset, D);
  return selectn(lanes_below_n(n), transpose_sumn(partial) * scale, splatn(-__FLT_MAX__));
}

/* out = out * correction + sum_i p[i] v_i over n value rows. */
INLINE void KV_NAME(accumulate_values)(const float *p, const KV_T *const *rows, int64_t n,
                              int64_t kv_offset, float correction, float *out,
                              const int64_t D) {
  if (D % VEC_LANES != 0 || D > MAX_HEAD_SIZE) {
    for (int64_t d = 0; d < D; d++) out[d] *= correction;
    for (int64_t i = 0; i < n; i++)
      for (int64_t d = 0; d < D; d++) out[d] += p[i] * KV_LOAD1(rows[i] + kv_offset + d);
    return;
  }
  vecn acc[VEC_MAX];
  for (int64_t j = 0; j < D / VEC_LANES; j++) acc[j] = loadn(out + VEC_LANES * j) * correction;
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < D / VEC_LANES; j++)
      acc[j] += p[i] * KV_LOADN(rows[i] + kv_offset + VEC_LANES * j);
  for (int64_t j = 0; j < D / VEC_LANES; j++) storen(out + VEC_LANES * j, acc[j]);
}

/* One chunk of n key and value rows for head h: the online softmax update (running max,
 * rescaled sum and output), so keys and values are read in one pass. */
INLINE void KV_NAME(attend_chunk)(const KV_NAME(HeadRange) *w, int64_t h, const KV_T *const *keys,
                         const KV_T *const *values, int64_t n, RunningSoftmax *state,
                         const int64_t D) {
  const int64_t kv_offset = h / w->G * D;
  vecn scores = KV_NAME(score_chunk)(w->q + h * D, keys, n, kv_offset, w->scale, D);
  float probs[VEC_LANES];
  const float correction = softmax_update(scores, n, state, probs);
  KV_NAME(accumulate_values)(probs, values, n, kv_offset, correction, w->out + h * D, D);
}

/* The element of a row (D % WIDEN_ELEMENTS == 0) that lane position e of its widened vectors
 * holds. */
INLINE int64_t KV_NAME(lane_element)(int64_t e) {
  return e - e % WIDEN_ELEMENTS + KV_ELEMENT_OF(e % WIDEN_ELEMENTS);
}

/* A row of D cache elements (D % WIDEN_ELEMENTS == 0) as D / VEC_LANES float32 vectors in
 * KV_ELEMENT_OF order. */
INLINE void KV_NAME(widen_row)(const KV_T *row, vecn *out, const int64_t D) {
  for (int64_t j = 0; j < D / WIDEN_ELEMENTS; j++)
    KV_WIDEN2N(row + WIDEN_ELEMENTS * j, out[2 * j], out[2 * j + 1]);
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
  vecn partial[HEAD_GROUP][VEC_LANES];
  for (int64_t i = 0; i < n; i++) { /* next_n > 0 only when this chunk is full */
    if (i < next_n) {
      KV_NAME(prefetch_row)(next_keys[i] + w->row_offset, w->row_span, w->prefetch_l1);
      KV_NAME(prefetch_row)(next_values[i] + w->row_offset, w->row_span, w->prefetch_l1);
    }
    vecn k[VEC_MAX];
    KV_NAME(widen_row)(keys[i] + off, k, D);
    for (int g = 0; g < gn; g++) {
      const float *q = qp + g * D;
      vecn a = k[0] * loadn(q), b = k[1] * loadn(q + VEC_LANES);
      for (int64_t j = 2; j < D / VEC_LANES; j += 2) {
        a += k[j] * loadn(q + VEC_LANES * j);
        b += k[j + 1] * loadn(q + VEC_LANES * j + VEC_LANES);
      }
      partial[g][i] = a + b;
    }
  }
  for (int64_t i = n; i < VEC_LANES; i++) /* a last chunk's missing rows add nothing */
    for (int g = 0; g < gn; g++) partial[g][i] = splatn(0.0f);
  float probs[HEAD_GROUP][VEC_LANES];
  vecn out[HEAD_GROUP][VEC_MAX];
  for (int g = 0; g < gn; g++) {
    const vecn scores = selectn(lanes_below_n(n), transpose_sumn(partial[g]) * w->scale,
                                  splatn(-__FLT_MAX__));
    const float correction = softmax_update(scores, n, &state[g], probs[g]);
    for (int64_t j = 0; j < D / VEC_LANES; j++)
      out[g][j] = loadn(acc + g * D + VEC_LANES * j) * correction;
  }
  for (int64_t i = 0; i < n; i++) {
    vecn v[VEC_MAX];
    KV_NAME(widen_row)(values[i] + off, v, D);
    for (int g = 0; g < gn; g++) {
      const vecn p = splatn(probs[g][i]);
      for (int64_t j = 0; j < D / VEC_LANES; j++) out[g][j] += p * v[j];
    }
  }
  for (int g = 0; g < gn; g++)
    for (int64_t j = 0; j < D / VEC_LANES; j++) storen(acc + g * D + VEC_LANES * j, out[g][j]);
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

/* attend_heads for D % WIDEN_ELEMENTS == 0 (and D <= MAX_HEAD_SIZE): the heads of each kv
 * head in groups of up to HEAD_GROUP. scratch: 2 * (h1 - h0) * D floats. */
INLINE void KV_NAME(attend_grouped)(const KV_NAME(HeadRange) *w, RunningSoftmax *state,
                                    float *scratch, const int64_t D) {
  const int64_t L = w->num_tokens, heads = w->h1 - w->h0;
  float *qp = scratch, *acc = scratch + heads * D;
  for (int64_t h = 0; h < heads; h++) {
    state[h] = (RunningSoftmax){-__FLT_MAX__, 0.0f};
    for (int64_t e = 0; e < D; e++)
      qp[h * D + e] = w->q[(w->h0 + h) * D + KV_NAME(lane_element)(e)];
  }
  memset(acc, 0, (size_t)(heads * D) * sizeof(float));
  const KV_T *rows[2][2][VEC_LANES]; /* [chunk % 2][keys, values][token] */
  if (L > 0) {
    KV_NAME(token_rows)(&w->keys, 0, L < VEC_LANES ? L : VEC_LANES, rows[0][0]);
    KV_NAME(token_rows)(&w->values, 0, L < VEC_LANES ? L : VEC_LANES, rows[0][1]);
  }
  for (int64_t t0 = 0; t0 < L; t0 += VEC_LANES) {
    const int64_t chunk = t0 / VEC_LANES % 2, left = L - t0 - VEC_LANES;
    const KV_T *const *keys = rows[chunk][0], *const *values = rows[chunk][1];
    const KV_T **next_keys = rows[chunk ^ 1][0], **next_values = rows[chunk ^ 1][1];
    const int64_t n = L - t0 < VEC_LANES ? L - t0 : VEC_LANES;
    const int64_t next_n = left < 0 ? 0 : left < VEC_LANES ? left : VEC_LANES;
    if (next_n > 0) { /* prefetched a row at a time by the first group */
      KV_NAME(token_rows)(&w->keys, t0 + VEC_LANES, next_n, next_keys);
      KV_NAME(token_rows)(&w->values, t0 + VEC_LANES, next_n, next_values);
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
    const float inv = finish_head(&state[h], w->saved, w->h0 + h);
    for (int64_t e = 0; e < D; e++)
      w->out[(w->h0 + h) * D + KV_NAME(lane_element)(e)] = acc[h * D + e] * inv;
  }
}

/* D is a parameter so that the common head sizes, passed as constants, get loops the
 * compiler unrolls. state: [h1 - h0] scratch. */
INLINE void KV_NAME(attend_heads)(const KV_NAME(HeadRange) *w, RunningSoftmax *state,
                                  const int64_t D) {
  const int64_t L = w->num_tokens, heads = w->h1 - w->h0;
  for (int64_t h = 0; h < heads; h++) state[h] = (RunningSoftmax){-__FLT_MAX__, 0.0f};
  memset(w->out + w->h0 * D, 0, (size_t)(heads * D) * sizeof(float));
  for (int64_t t0 = 0; t0 < L; t0 += VEC_LANES) {
    int64_t n = L - t0 < VEC_LANES ? L - t0 : VEC_LANES;
    const KV_T *keys[VEC_LANES], *values[VEC_LANES];
    KV_NAME(token_rows)(&w->keys, t0, n, keys);
    KV_NAME(token_rows)(&w->values, t0, n, values);
    if (t0 + VEC_LANES < L) {
      int64_t next = L - t0 - VEC_LANES < VEC_LANES ? L - t0 - VEC_LANES : VEC_LANES;
      KV_NAME(prefetch_rows)(&w->keys, t0 + VEC_LANES, next, w->row_offset, w->row_span,
                             w->prefetch_l1);
      KV_NAME(prefetch_rows)(&w->values, t0 + VEC_LANES, next, w->row_offset, w->row_span,
                             w->prefetch_l1);
    }
    for (int64_t h = w->h0; h < w->h1; h++)
      KV_NAME(attend_chunk)(w, h, keys, values, n, &state[h - w->h0], D);
  }
  for (int64_t h = w->h0; h < w->h1; h++) {
    const float inv = finish_head(&state[h - w->h0], w->saved, h);
    for (int64_t d = 0; d < D; d++) w->out[h * D + d] *= inv;
  }
}

/* scratch: 2 * (h1 - h0) * D floats. */
static void KV_NAME(attend)(const KV_NAME(HeadRange) *w, RunningSoftmax *state, float *scratch) {
  if (w->D == 64)
    KV_NAME(attend_grouped)(w, state, scratch, 64);
  else if (w->D == 128)
    KV_NAME(attend_grouped)(w, state, scratch, 128);
  else if (w->D % WIDEN_ELEMENTS == 0 && w->D <= MAX_HEAD_SIZE)
    KV_NAME(attend_grouped)(w, state, scratch, w->D);
  else
    KV_NAME(attend_heads)(w, state, w->D);
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
  RunningSoftmax *states = malloc((size_t)(num_threads * H) * sizeof(RunningSoftmax));
  float *scratch = malloc((size_t)(num_threads * 2 * H * D) * sizeof(float));
  if (states == NULL || scratch == NULL || plan_partitions(&p, a, tasks_per_seq) < 0) {
    free(states);
    free(scratch);
    return -1;
  }
#pragma omp parallel num_threads(num_threads)
  {
    RunningSoftmax *state = states + omp_get_thread_num() * H;
    float *thread_scratch = scratch + omp_get_thread_num() * 2 * H * D;
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
