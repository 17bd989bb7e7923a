/* Causal attention of one sequence's prefill chunk in float32 for one instruction set: a
 * guarded header, included once by each of prefill_attention_f32_avx512.c, _avx2.c and
 * _portable.c after its target pragma, with VEC_LANES (the register width in floats: 4, 8 or
 * 16) and ISA(name) (name with the build's suffix) defined first. It defines
 * ISA(prefill_attention_f32_run), which prefill_attention_f32.c picks at run time.
 *
 * Queries q [n, H, D] float32 at positions seq_len - n .. seq_len - 1 attend to the keys and
 * values of positions 0 .. their own (under a sliding window only the last sliding_window of
 * them) in the paged cache [num_blocks, block_size, KV, D] (float32 or bf16, written there
 * first). Each row follows attention_row.h's arithmetic, so its output is the bits the same
 * build of decode attention gives its query as one sequence of ctx + i + 1 tokens, whatever
 * chunk it comes in and whatever rows are beside it.
 *
 * Each kv head's keys are first copied out of their blocks transposed, VEC_LANES tokens at a
 * time ([tokens / VEC_LANES][D][VEC_LANES], the elements in the order the lane chains take
 * them), its values as they are ([tokens][Dv], Dv: D rounded up to whole vectors), both zero
 * past seq_len and widened to float32, from the block of VEC_LANES tokens that holds the
 * first key any row sees. Then each task, TILE_QUERIES query rows of one kv head (its query
 * heads of a row, then the next row's), partition by partition (each query's from its first
 * visible key, so under a sliding window the tile's queries' partitions start up to
 * TILE_QUERIES - 1 keys apart): the scores of each block of VEC_LANES keys as lane chains
 * across the block (one load of a key vector and TILE_QUERIES broadcast query elements for
 * TILE_QUERIES FMAs), summed in transpose_sumn's tree, a query's scores outside its partition
 * left unread; each query's cap (cap_scores) and softmax; its weighted values (one load of a
 * value row for all the tile's queries that see it); then the partitions merged. */
#ifndef PAGEDLLM_PREFILL_ATTENTION_F32_KERNEL_H
#define PAGEDLLM_PREFILL_ATTENTION_F32_KERNEL_H

#if !defined(VEC_LANES) || !defined(ISA)
#error "define VEC_LANES and ISA(name) before including prefill_attention_f32_kernel.h"
#endif

#include <omp.h>
#include <stdlib.h>

#include "prefill_attention_f32.h"
#include "vecn.h"
#include "attention_row.h"

/* Queries per task, and value vectors per pass over a partition's values. The registers hold
 * TILE_QUERIES x (2 chains and the sum of the lane before) for the scores, TILE_QUERIES x
 * VALUE_VECS accumulators and VALUE_VECS values for the output (32 vector registers on
 * AVX-512, 16 elsewhere). The fastest of 2-8 queries by 1-4 value vectors on the default
 * model's shapes (9 heads, 3 kv heads, D 64; chunks of 16-512 tokens after 0-1,000 cached,
 * one thread): AVX-512 4 x 4, AVX2 6 x 2 (spilling a little, 1.1x faster than 4 x 2), 4-lane
 * 4 x 2. `pagedllm bench latency --input-len 512` times prefill (time to first token). */
#if VEC_LANES == 16
#define TILE_QUERIES 4
#define VALUE_VECS 4
#elif VEC_LANES == 8
#define TILE_QUERIES 6
#define VALUE_VECS 2
#else
#define TILE_QUERIES 4
#define VALUE_VECS 2
#endif

/* The cache row of token t of kv head h (elements, not bytes). */
INLINE int64_t cache_row(const prefill_attention_f32_args *a, int64_t t, int64_t h) {
  const int64_t slot = (int64_t)a->block_table[t / a->block_size] * a->block_size +
                       t % a->block_size;
  return (slot * a->KV + h) * a->D;
}

/* Row p of a packed key block holds this element of its tokens: widened_element order for a
 * widened head, element order for any other (the order of its lane chains). */
INLINE int64_t key_element(int64_t p, int widened, int kv_bf16) {
  return widened ? widened_element(p, kv_bf16) : p;
}

/* key_element(VEC_LANES * j + l) for a lane l < VEC_LANES: the element of vector j that lane
 * l's chain takes, written so that l scales and j only adds (a constant offset of the load). */
INLINE int64_t chain_element(int64_t j, int64_t l, int widened, int kv_bf16) {
  if (widened && kv_bf16) return WIDEN_ELEMENTS * (j / 2) + j % 2 + 2 * l;
  return VEC_LANES * j + l;
}

/* The VEC_LANES x VEC_LANES block of the keys rows[] (NULL: a token past seq_len, zeros) from
 * their element d0, transposed into packed rows d0 .. d0 + VEC_LANES - 1 (lo) and, for a
 * widened head, d0 + VEC_LANES .. (hi). */
static void pack_key_vectors(const prefill_attention_f32_args *a, const int64_t *rows,
                             float *block, int64_t d0, int widened) {
  vecn lo[VEC_LANES], hi[VEC_LANES];
  for (int64_t i = 0; i < VEC_LANES; i++) {
    lo[i] = hi[i] = splatn(0.0f);
    if (rows[i] < 0) continue;
    if (widened)
      widen2n_as(element_at(a->k_cache, rows[i] + d0, a->kv_bf16), a->kv_bf16, &lo[i], &hi[i]);
    else
      lo[i] = loadn_as(a->k_cache, rows[i] + d0, a->kv_bf16);
  }
  transposen(lo);
  for (int64_t j = 0; j < VEC_LANES; j++) storen(block + (d0 + j) * VEC_LANES, lo[j]);
  if (!widened) return;
  transposen(hi);
  for (int64_t j = 0; j < VEC_LANES; j++)
    storen(block + (d0 + VEC_LANES + j) * VEC_LANES, hi[j]);
}

/* Keys of kv head h, tokens [first, lc) (both multiples of VEC_LANES; lc: seq_len rounded
 * up), into packed [(lc - first) / VEC_LANES][D][VEC_LANES], rows in key_element order;
 * tokens past seq_len are zero. */
static void pack_keys(const prefill_attention_f32_args *a, float *packed, int64_t first,
                      int64_t lc, int64_t h) {
  const int64_t D = a->D, step = widened_head(D) ? WIDEN_ELEMENTS : VEC_LANES;
  for (int64_t t0 = first; t0 < lc; t0 += VEC_LANES) {
    int64_t rows[VEC_LANES];
    for (int64_t i = 0; i < VEC_LANES; i++)
      rows[i] = t0 + i < a->seq_len ? cache_row(a, t0 + i, h) : -1;
    float *block = packed + (t0 - first) * D;
    int64_t d = 0;
    for (; d + step <= D; d += step) pack_key_vectors(a, rows, block, d, widened_head(D));
    for (; d < D; d++)
      for (int64_t i = 0; i < VEC_LANES; i++)
        block[d * VEC_LANES + i] =
            rows[i] < 0 ? 0.0f : load1_as(a->k_cache, rows[i] + d, a->kv_bf16);
  }
}

/* Values of kv head h, tokens [first, lc), into packed [lc - first][Dv] float32, zero past
 * seq_len and past D. */
static void pack_values(const prefill_attention_f32_args *a, float *packed, int64_t first,
                        int64_t lc, int64_t Dv, int64_t h) {
  const int64_t D = a->D;
  for (int64_t t = first; t < lc; t++) {
    const int64_t row = t < a->seq_len ? cache_row(a, t, h) : -1;
    float *p = packed + (t - first) * Dv;
    int64_t d = 0;
    for (; row >= 0 && d + VEC_LANES <= D; d += VEC_LANES)
      storen(p + d, loadn_as(a->v_cache, row + d, a->kv_bf16));
    for (; d < Dv; d++)
      p[d] = row < 0 || d >= D ? 0.0f : load1_as(a->v_cache, row + d, a->kv_bf16);
  }
}

/* One kv head's packed keys and values, from token `first` (a multiple of VEC_LANES) on. */
typedef struct {
  const float *keys, *values;
  int64_t first, Dv;
} Packed;

/* A task's TILE_QUERIES query rows of one kv head: where each is read (q [D]) and written
 * (out, NULL for the copies of the last one that fill a short tile) and which keys it sees,
 * first .. len - 1 (window_start; both non-decreasing along the tile, and at most
 * TILE_QUERIES - 1 apart). */
typedef struct {
  const float *q[TILE_QUERIES];
  float *out[TILE_QUERIES];
  int64_t len[TILE_QUERIES], first[TILE_QUERIES];
} Tile;

/* The tile of kv head kvh's queries q0 .. (query r * G + g: row r's query head kvh * G + g). */
static Tile tile_at(const prefill_attention_f32_args *a, int64_t kvh, int64_t q0) {
  const int64_t G = a->H / a->KV, queries = a->n * G, ctx = a->seq_len - a->n;
  Tile t;
  for (int q = 0; q < TILE_QUERIES; q++) {
    const int64_t i = q0 + q < queries ? q0 + q : queries - 1;
    const int64_t row = ((i / G) * a->H + kvh * G + i % G) * a->D;
    t.q[q] = a->q + row;
    t.out[q] = q0 + q < queries ? a->out + row : NULL;
    t.len[q] = ctx + i / G + 1;
    t.first[q] = window_start(t.len[q], a->sliding_window);
  }
  return t;
}

/* x[q]: lane l's sum (attention_row.h) of each of the block's VEC_LANES keys against query q:
 * its chains across the block, packed row VEC_LANES * j + l of vector j, against the
 * element of the query that row holds. */
INLINE void lane_chains(const float *block, const Tile *t, int l, vecn x[TILE_QUERIES],
                        const int64_t D, const int widened, const int kv_bf16) {
  const int64_t J = D / VEC_LANES;
  vecn even[TILE_QUERIES], odd[TILE_QUERIES];
  for (int q = 0; q < TILE_QUERIES; q++) even[q] = odd[q] = splatn(0.0f);
  for (int64_t j = 0; j < J; j++) {
    const vecn k = loadn(block + (VEC_LANES * j + l) * VEC_LANES);
    const int64_t e = chain_element(j, l, widened, kv_bf16);
    for (int q = 0; q < TILE_QUERIES; q++) {
      const vecn x_e = broadcastn(t->q[q] + e);
      if (widened && j % 2)
        odd[q] = fman(x_e, k, odd[q]);
      else
        even[q] = fman(x_e, k, even[q]);
    }
  }
  for (int64_t e = VEC_LANES * J; !widened && l == 0 && e < D; e++) {
    const vecn k = loadn(block + e * VEC_LANES);
    for (int q = 0; q < TILE_QUERIES; q++) even[q] = fman(broadcastn(t->q[q] + e), k, even[q]);
  }
  for (int q = 0; q < TILE_QUERIES; q++) x[q] = widened ? even[q] + odd[q] : even[q];
}

/* sums[q]: lane i the unscaled score of the block's key i against query q: the lane sums
 * added in transpose_sumn's tree, lane l + lane l + VEC_LANES / 2 (as each pair of lanes is
 * computed), then l + VEC_LANES / 4, ... (a loop over the pairs: unrolled, its chains
 * outgrew the registers). */
INLINE void block_scores(const float *block, const Tile *t, vecn sums[TILE_QUERIES],
                         const int64_t D, const int widened, const int kv_bf16) {
  vecn half[VEC_LANES / 2][TILE_QUERIES];
#pragma GCC unroll 1
  for (int l = 0; l < VEC_LANES / 2; l++) {
    vecn hi[TILE_QUERIES];
    lane_chains(block, t, l, half[l], D, widened, kv_bf16);
    lane_chains(block, t, l + VEC_LANES / 2, hi, D, widened, kv_bf16);
    for (int q = 0; q < TILE_QUERIES; q++) half[l][q] = half[l][q] + hi[q];
  }
  for (int step = VEC_LANES / 4; step >= 1; step /= 2)
    for (int l = 0; l < step; l++)
      for (int q = 0; q < TILE_QUERIES; q++) half[l][q] = half[l][q] + half[l + step][q];
  for (int q = 0; q < TILE_QUERIES; q++) sums[q] = half[0][q];
}

/* The floats of a query's scores in a task: a partition's keys from the block of VEC_LANES
 * that holds the tile's first one (up to TILE_QUERIES - 1 keys before the query's own first),
 * and a vector of padding past them; rounded up to 64 bytes, so that every query's scores
 * share one alignment. */
#define SCORE_STRIDE ((PARTITION_TOKENS + 2 * VEC_LANES + TILE_QUERIES + 15) / 16 * 16)

/* The keys of partition `part` of each of the tile's queries, [begin[q], end[q]) counted from
 * the returned base (a multiple of VEC_LANES: the block that holds query 0's first one);
 * begin and end are non-decreasing along the tile. */
INLINE int64_t partition_keys(const Tile *t, int64_t part, int64_t *begin, int64_t *end) {
  const int64_t base = (t->first[0] + part * PARTITION_TOKENS) / VEC_LANES * VEC_LANES;
  for (int q = 0; q < TILE_QUERIES; q++) {
    const int64_t start = t->first[q] + part * PARTITION_TOKENS, left = t->len[q] - start;
    begin[q] = start - base;
    end[q] = begin[q] + (left < 0 ? 0 : left < PARTITION_TOKENS ? left : PARTITION_TOKENS);
  }
  return base;
}

/* Each query's scores over keys [0, end[q]) from the partition's base, whose packed keys start
 * at keys, into scores [TILE_QUERIES][SCORE_STRIDE] (the ones before its begin are not its). */
INLINE void score_partition(const float *keys, const Tile *t, const int64_t *end, float scale,
                            float *scores, const int64_t D, const int widened,
                            const int kv_bf16) {
  for (int64_t t0 = 0; t0 < end[TILE_QUERIES - 1]; t0 += VEC_LANES) {
    vecn sums[TILE_QUERIES];
    block_scores(keys + t0 * D, t, sums, D, widened, kv_bf16);
    for (int q = 0; q < TILE_QUERIES; q++)
      if (t0 < end[q]) store_scores(scores + q * SCORE_STRIDE + t0, sums[q], end[q] - t0, scale);
  }
}

/* Where a query's output for one partition goes, and the factor that finishes it. */
typedef struct {
  float *out[TILE_QUERIES];
  float factor[TILE_QUERIES];
} Outputs;

/* The first of the tile's queries whose x[q] > t (x non-decreasing, x[TILE_QUERIES - 1] > t). */
INLINE int first_above(const int64_t *x, int64_t t) {
  int q = 0;
  while (x[q] <= t) q++;
  return q;
}

/* Output columns [c0, c0 + vecs vectors) of each query: per element an FMA chain from zero
 * over its keys [begin[q], end[q]) in order of weight (p, [TILE_QUERIES][SCORE_STRIDE]) x
 * value (packed rows of Dv from the partition's base), times its factor, into its out
 * (elements below D). vecs and staggered are constants; staggered: whether the queries begin
 * past the partition's base (a sliding window), which the loop then checks too. */
INLINE void value_columns(const float *values, int64_t Dv, const float *p,
                          const int64_t *begin, const int64_t *end, const Outputs *o,
                          int64_t c0, const int vecs, const int64_t D, const int staggered) {
  vecn acc[TILE_QUERIES][VALUE_VECS];
  for (int q = 0; q < TILE_QUERIES; q++)
    for (int c = 0; c < vecs; c++) acc[q][c] = splatn(0.0f);
  for (int64_t t = staggered ? begin[0] : 0; t < end[TILE_QUERIES - 1]; t++) {
    vecn v[VALUE_VECS];
    for (int c = 0; c < vecs; c++) v[c] = loadn(values + t * Dv + c0 + c * VEC_LANES);
    const int first = t < end[0] ? 0 : first_above(end, t); /* rows before it end sooner */
    const int last = /* rows from it begin later */
        !staggered || t >= begin[TILE_QUERIES - 1] ? TILE_QUERIES : first_above(begin, t);
    for (int q = 0; q < TILE_QUERIES; q++) {
      if (q < first || q >= last) continue;
      const vecn w = broadcastn(p + q * SCORE_STRIDE + t);
      for (int c = 0; c < vecs; c++) acc[q][c] = fman(w, v[c], acc[q][c]);
    }
  }
  for (int q = 0; q < TILE_QUERIES; q++) {
    for (int c = 0; c < vecs && o->out[q] != NULL; c++) {
      const int64_t d = c0 + c * VEC_LANES;
      const vecn r = acc[q][c] * o->factor[q];
      if (d + VEC_LANES <= D)
        storen(o->out[q] + d, r);
      else
        for (int64_t i = 0; d + i < D; i++) o->out[q][d + i] = r[i];
    }
  }
}

/* value_columns over all Dv columns, VALUE_VECS vectors at a time (staggered: a constant). */
INLINE void value_columns_all(const float *values, int64_t Dv, const float *p,
                              const int64_t *begin, const int64_t *end, const Outputs *o,
                              const int64_t D, const int staggered) {
  int64_t c0 = 0;
  for (; c0 + VALUE_VECS * VEC_LANES <= Dv; c0 += VALUE_VECS * VEC_LANES)
    value_columns(values, Dv, p, begin, end, o, c0, VALUE_VECS, D, staggered);
  for (; c0 < Dv; c0 += VEC_LANES)
    value_columns(values, Dv, p, begin, end, o, c0, 1, D, staggered);
}

/* value_columns_all, staggered where a query begins past the partition's base. */
INLINE void value_partition(const float *values, int64_t Dv, const float *p,
                            const int64_t *begin, const int64_t *end, const Outputs *o,
                            const int64_t D) {
  if (begin[TILE_QUERIES - 1] > 0)
    value_columns_all(values, Dv, p, begin, end, o, D, 1);
  else
    value_columns_all(values, Dv, p, begin, end, o, D, 0);
}

/* The floats of one thread's scratch: a task's scores and partition outputs. */
INLINE int64_t task_scratch_floats(int64_t D, int64_t parts) {
  return TILE_QUERIES * (SCORE_STRIDE + parts * D);
}

/* The partitions of the keys query q of the tile sees. */
INLINE int64_t query_partitions(const Tile *t, int q) {
  return partitions(t->len[q] - t->first[q]);
}

/* Each query's weights of one partition (keys [begin[q], end[q]) of scores) from its scores:
 * capped (cap_scores), their softmax, and where its output goes and the factor that finishes
 * it (parts: the scratch's partitions per query). */
INLINE Outputs partition_weights(const prefill_attention_f32_args *a, const Tile *t,
                                 int64_t part, const int64_t *begin, const int64_t *end,
                                 float *scores, float *part_out, SoftmaxState *states,
                                 int64_t parts, const int64_t D) {
  Outputs o;
  for (int q = 0; q < TILE_QUERIES; q++) {
    const int64_t n = end[q] - begin[q];
    const int whole = query_partitions(t, q) == 1;
    o.out[q] = n == 0 || t->out[q] == NULL ? NULL
               : whole                     ? t->out[q]
                                           : part_out + (q * parts + part) * D;
    if (n == 0) continue;
    float *s = scores + q * SCORE_STRIDE + begin[q];
    storen(s + n, splatn(-__FLT_MAX__)); /* the padding to whole vectors from begin[q] */
    if (a->soft_cap > 0) cap_scores(s, n, a->soft_cap);
    const SoftmaxState state = softmax_scores(s, n);
    o.factor[q] = finish_head(&state, whole ? NULL : &states[q * parts + part]);
  }
  return o;
}

/* One task: the tile t, reading its kv head's packed keys and values. scratch:
 * task_scratch_floats(D, parts) floats, states: TILE_QUERIES * parts (parts: of the longest
 * query of the chunk). kv_bf16: a->kv_bf16 as a constant. */
INLINE void attend_tile(const prefill_attention_f32_args *a, const Packed *kv, const Tile *t,
                        int64_t parts, float *scratch, SoftmaxState *states, const int64_t D,
                        const int widened, const int kv_bf16) {
  float *scores = scratch, *part_out = scores + TILE_QUERIES * SCORE_STRIDE;
  for (int64_t part = 0; part < query_partitions(t, TILE_QUERIES - 1); part++) {
    int64_t begin[TILE_QUERIES], end[TILE_QUERIES];
    const int64_t base = partition_keys(t, part, begin, end) - kv->first;
    score_partition(kv->keys + base * D, t, end, a->scale, scores, D, widened, kv_bf16);
    const Outputs o =
        partition_weights(a, t, part, begin, end, scores, part_out, states, parts, D);
    value_partition(kv->values + base * kv->Dv, kv->Dv, scores, begin, end, &o, D);
  }
  for (int q = 0; q < TILE_QUERIES; q++)
    if (t->out[q] != NULL && query_partitions(t, q) > 1)
      merge_head(t->out[q], part_out + q * parts * D, states + q * parts, query_partitions(t, q),
                 D, 1, D);
}

/* attend_tile for a widened head with the cache's element order a constant, which folds the
 * offsets of the query elements (widened_element) into their loads: 1.2x faster on AVX2. */
INLINE void attend_widened(const prefill_attention_f32_args *a, const Packed *kv, const Tile *t,
                           int64_t parts, float *scratch, SoftmaxState *states, const int64_t D) {
  if (a->kv_bf16)
    attend_tile(a, kv, t, parts, scratch, states, D, 1, 1);
  else
    attend_tile(a, kv, t, parts, scratch, states, D, 1, 0);
}

/* attend_tile with the common head sizes as constants, whose loops the compiler unrolls. A
 * head that is not widened takes its elements in order, whatever the cache. */
static void attend(const prefill_attention_f32_args *a, const Packed *kv, const Tile *t,
                   int64_t parts, float *scratch, SoftmaxState *states) {
  if (a->D == 64 && widened_head(64))
    attend_widened(a, kv, t, parts, scratch, states, 64);
  else if (a->D == 128 && widened_head(128))
    attend_widened(a, kv, t, parts, scratch, states, 128);
  else if (widened_head(a->D))
    attend_widened(a, kv, t, parts, scratch, states, a->D);
  else
    attend_tile(a, kv, t, parts, scratch, states, a->D, 0, 0);
}

/* Tasks: each tile of each kv head, after every kv head's keys and values are packed from the
 * block of the first key the chunk's first row sees (window_start: under a sliding window no
 * earlier block is read). */
int ISA(prefill_attention_f32_run)(const prefill_attention_f32_args *a) {
  const int64_t KV = a->KV, D = a->D, Dv = (D + VEC_LANES - 1) / VEC_LANES * VEC_LANES;
  const int64_t tiles = (a->n * (a->H / KV) + TILE_QUERIES - 1) / TILE_QUERIES;
  const int64_t lc = (a->seq_len + VEC_LANES - 1) / VEC_LANES * VEC_LANES;
  const int64_t first =
      window_start(a->seq_len - a->n + 1, a->sliding_window) / VEC_LANES * VEC_LANES;
  const int64_t tokens = lc - first;
  const int64_t parts = partitions(visible_keys(a->seq_len, a->sliding_window));
  const int64_t per_thread = task_scratch_floats(D, parts);
  float *keys = malloc((size_t)(KV * tokens * (D + Dv)) * sizeof(float));
  float *scratch = malloc((size_t)(a->num_threads * per_thread) * sizeof(float));
  SoftmaxState *states =
      malloc((size_t)(a->num_threads * TILE_QUERIES * parts) * sizeof(SoftmaxState));
  if (keys == NULL || scratch == NULL || states == NULL) {
    free(keys);
    free(scratch);
    free(states);
    return -1;
  }
  float *values = keys + KV * tokens * D;
#pragma omp parallel num_threads(a->num_threads)
  {
#pragma omp for schedule(static)
    for (int64_t job = 0; job < 2 * KV; job++) {
      if (job < KV)
        pack_keys(a, keys + job * tokens * D, first, lc, job);
      else
        pack_values(a, values + (job - KV) * tokens * Dv, first, lc, Dv, job - KV);
    }
    const int thread = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tiles * KV; task++) {
      /* the longest rows first */
      const int64_t tile = tiles - 1 - task / KV, kvh = task % KV;
      const Tile t = tile_at(a, kvh, tile * TILE_QUERIES);
      const Packed kv = {keys + kvh * tokens * D, values + kvh * tokens * Dv, first, Dv};
      attend(a, &kv, &t, parts, scratch + thread * per_thread,
             states + thread * TILE_QUERIES * parts);
    }
  }
  free(keys);
  free(scratch);
  free(states);
  return 0;
}

#endif
