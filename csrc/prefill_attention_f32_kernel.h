/* Causal attention of one sequence's prefill chunk in float32 for one instruction set: a
 * guarded header, included once by each of prefill_attention_f32_avx512.c, _avx2.c and
 * _portable.c after its target pragma, with VEC_LANES (the register width in floats: 4, 8 or
 * 16) and ISA(name) (name with the build's suffix) defined first. It defines
 * ISA(prefill_attention_f32_run), which prefill_attention_f32.c picks at run time.
 *
 * Queries q [n, H, D] float32 at positions seq_len - n .. seq_len - 1 attend to the keys and
 * values of positions 0 .. their own in the paged cache [num_blocks, block_size, KV, D]
 * (float32 or bf16, written there first). Each row follows attention_row.h's arithmetic, so
 * its output is the bits the same build of decode attention gives its query as one sequence
 * of ctx + i + 1 tokens, whatever chunk it comes in and whatever rows are beside it.
 *
 * Each kv head's keys are first copied out of their blocks transposed, VEC_LANES tokens at a
 * time ([tokens / VEC_LANES][D][VEC_LANES], the elements in the order the lane chains take
 * them), its values as they are ([tokens][Dv], Dv: D rounded up to whole vectors), both zero
 * past seq_len and widened to float32. Then each task, TILE_QUERIES query rows of one kv head
 * (its query heads of a row, then the next row's), partition by partition: the scores of each
 * block of VEC_LANES keys as lane chains across the block (one load of a key vector and
 * TILE_QUERIES broadcast query elements for TILE_QUERIES FMAs), summed in transpose_sumn's
 * tree; each query's softmax; its weighted values (one load of a value row for all the
 * tile's queries); then the partitions merged. */
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

/* Keys of kv head h, tokens [0, lc) (lc: seq_len rounded up to VEC_LANES), into packed
 * [lc / VEC_LANES][D][VEC_LANES], rows in key_element order; tokens past seq_len are zero. */
static void pack_keys(const prefill_attention_f32_args *a, float *packed, int64_t lc,
                      int64_t h) {
  const int64_t D = a->D, step = widened_head(D) ? WIDEN_ELEMENTS : VEC_LANES;
  for (int64_t t0 = 0; t0 < lc; t0 += VEC_LANES) {
    int64_t rows[VEC_LANES];
    for (int64_t i = 0; i < VEC_LANES; i++)
      rows[i] = t0 + i < a->seq_len ? cache_row(a, t0 + i, h) : -1;
    float *block = packed + t0 * D;
    int64_t d = 0;
    for (; d + step <= D; d += step) pack_key_vectors(a, rows, block, d, widened_head(D));
    for (; d < D; d++)
      for (int64_t i = 0; i < VEC_LANES; i++)
        block[d * VEC_LANES + i] =
            rows[i] < 0 ? 0.0f : load1_as(a->k_cache, rows[i] + d, a->kv_bf16);
  }
}

/* Values of kv head h, tokens [0, lc), into packed [lc][Dv] float32, zero past seq_len and
 * past D. */
static void pack_values(const prefill_attention_f32_args *a, float *packed, int64_t lc,
                        int64_t Dv, int64_t h) {
  const int64_t D = a->D;
  for (int64_t t = 0; t < lc; t++) {
    const int64_t row = t < a->seq_len ? cache_row(a, t, h) : -1;
    int64_t d = 0;
    for (; row >= 0 && d + VEC_LANES <= D; d += VEC_LANES)
      storen(packed + t * Dv + d, loadn_as(a->v_cache, row + d, a->kv_bf16));
    for (; d < Dv; d++)
      packed[t * Dv + d] = row < 0 || d >= D ? 0.0f : load1_as(a->v_cache, row + d, a->kv_bf16);
  }
}

/* A task's TILE_QUERIES query rows of one kv head: where each is read (q [D]) and written
 * (out, NULL for the copies of the last one that fill a short tile) and how many keys it sees
 * (len, non-decreasing along the tile). */
typedef struct {
  const float *q[TILE_QUERIES];
  float *out[TILE_QUERIES];
  int64_t len[TILE_QUERIES];
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

/* Each query's scores over its n[q] keys of the partition whose packed keys start at keys,
 * into scores [TILE_QUERIES][PARTITION_TOKENS]. */
INLINE void score_partition(const float *keys, const Tile *t, const int64_t *n, float scale,
                            float *scores, const int64_t D, const int widened,
                            const int kv_bf16) {
  for (int64_t t0 = 0; t0 < n[TILE_QUERIES - 1]; t0 += VEC_LANES) {
    vecn sums[TILE_QUERIES];
    block_scores(keys + t0 * D, t, sums, D, widened, kv_bf16);
    for (int q = 0; q < TILE_QUERIES; q++)
      if (t0 < n[q]) store_scores(scores + q * PARTITION_TOKENS + t0, sums[q], n[q] - t0, scale);
  }
}

/* Where a query's output for one partition goes, and the factor that finishes it. */
typedef struct {
  float *out[TILE_QUERIES];
  float factor[TILE_QUERIES];
} Outputs;

/* The first of the tile's queries that sees key t (n: their keys, non-decreasing). */
INLINE int first_seeing(const int64_t *n, int64_t t) {
  int q = 0;
  while (n[q] <= t) q++;
  return q;
}

/* Output columns [c0, c0 + vecs vectors) of each query: per element an FMA chain from zero
 * over its n[q] keys in order of weight (p, [TILE_QUERIES][PARTITION_TOKENS]) x value (packed
 * rows of Dv), times its factor, into its out (elements below D; vecs: a constant). */
INLINE void value_columns(const float *values, int64_t Dv, const float *p, const int64_t *n,
                          const Outputs *o, int64_t c0, const int vecs, const int64_t D) {
  vecn acc[TILE_QUERIES][VALUE_VECS];
  for (int q = 0; q < TILE_QUERIES; q++)
    for (int c = 0; c < vecs; c++) acc[q][c] = splatn(0.0f);
  for (int64_t t = 0; t < n[TILE_QUERIES - 1]; t++) {
    vecn v[VALUE_VECS];
    for (int c = 0; c < vecs; c++) v[c] = loadn(values + t * Dv + c0 + c * VEC_LANES);
    const int first = t < n[0] ? 0 : first_seeing(n, t); /* rows before it end sooner */
    for (int q = 0; q < TILE_QUERIES; q++) {
      if (q < first) continue;
      const vecn w = broadcastn(p + q * PARTITION_TOKENS + t);
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

/* value_columns over all Dv columns, VALUE_VECS vectors at a time. */
INLINE void value_partition(const float *values, int64_t Dv, const float *p, const int64_t *n,
                            const Outputs *o, const int64_t D) {
  int64_t c0 = 0;
  for (; c0 + VALUE_VECS * VEC_LANES <= Dv; c0 += VALUE_VECS * VEC_LANES)
    value_columns(values, Dv, p, n, o, c0, VALUE_VECS, D);
  for (; c0 < Dv; c0 += VEC_LANES) value_columns(values, Dv, p, n, o, c0, 1, D);
}

/* The floats of one thread's scratch: a task's scores and partition outputs. */
INLINE int64_t task_scratch_floats(int64_t D, int64_t parts) {
  return TILE_QUERIES * (PARTITION_TOKENS + parts * D);
}

/* One task: the tile t, reading its kv head's packed keys and values. scratch:
 * task_scratch_floats(D, parts) floats, states: TILE_QUERIES * parts (parts: of the longest
 * query of the chunk). kv_bf16: a->kv_bf16 as a constant. */
INLINE void attend_tile(const prefill_attention_f32_args *a, const float *keys,
                        const float *values, int64_t Dv, const Tile *t, int64_t parts,
                        float *scratch, SoftmaxState *states, const int64_t D,
                        const int widened, const int kv_bf16) {
  float *scores = scratch, *part_out = scores + TILE_QUERIES * PARTITION_TOKENS;
  for (int64_t part = 0; part < partitions(t->len[TILE_QUERIES - 1]); part++) {
    const int64_t start = part * PARTITION_TOKENS;
    int64_t n[TILE_QUERIES];
    for (int q = 0; q < TILE_QUERIES; q++) {
      const int64_t left = t->len[q] - start;
      n[q] = left < 0 ? 0 : left < PARTITION_TOKENS ? left : PARTITION_TOKENS;
    }
    score_partition(keys + start * D, t, n, a->scale, scores, D, widened, kv_bf16);
    Outputs o;
    for (int q = 0; q < TILE_QUERIES; q++) {
      const int whole = partitions(t->len[q]) == 1;
      o.out[q] = n[q] == 0 || t->out[q] == NULL ? NULL
                 : whole                       ? t->out[q]
                                               : part_out + (q * parts + part) * D;
      if (n[q] == 0) continue;
      const SoftmaxState s = softmax_scores(scores + q * PARTITION_TOKENS, n[q]);
      o.factor[q] = finish_head(&s, whole ? NULL : &states[q * parts + part]);
    }
    value_partition(values + start * Dv, Dv, scores, n, &o, D);
  }
  for (int q = 0; q < TILE_QUERIES; q++)
    if (t->out[q] != NULL && partitions(t->len[q]) > 1)
      merge_head(t->out[q], part_out + q * parts * D, states + q * parts, partitions(t->len[q]),
                 D, 1, D);
}

/* attend_tile for a widened head with the cache's element order a constant, which folds the
 * offsets of the query elements (widened_element) into their loads: 1.2x faster on AVX2. */
INLINE void attend_widened(const prefill_attention_f32_args *a, const float *keys,
                           const float *values, int64_t Dv, const Tile *t, int64_t parts,
                           float *scratch, SoftmaxState *states, const int64_t D) {
  if (a->kv_bf16)
    attend_tile(a, keys, values, Dv, t, parts, scratch, states, D, 1, 1);
  else
    attend_tile(a, keys, values, Dv, t, parts, scratch, states, D, 1, 0);
}

/* attend_tile with the common head sizes as constants, whose loops the compiler unrolls. A
 * head that is not widened takes its elements in order, whatever the cache. */
static void attend(const prefill_attention_f32_args *a, const float *keys, const float *values,
                   int64_t Dv, const Tile *t, int64_t parts, float *scratch,
                   SoftmaxState *states) {
  if (a->D == 64 && widened_head(64))
    attend_widened(a, keys, values, Dv, t, parts, scratch, states, 64);
  else if (a->D == 128 && widened_head(128))
    attend_widened(a, keys, values, Dv, t, parts, scratch, states, 128);
  else if (widened_head(a->D))
    attend_widened(a, keys, values, Dv, t, parts, scratch, states, a->D);
  else
    attend_tile(a, keys, values, Dv, t, parts, scratch, states, a->D, 0, 0);
}

int ISA(prefill_attention_f32_run)(const prefill_attention_f32_args *a) {
  const int64_t KV = a->KV, D = a->D, Dv = (D + VEC_LANES - 1) / VEC_LANES * VEC_LANES;
  const int64_t tiles = (a->n * (a->H / KV) + TILE_QUERIES - 1) / TILE_QUERIES;
  const int64_t lc = (a->seq_len + VEC_LANES - 1) / VEC_LANES * VEC_LANES;
  const int64_t parts = partitions(a->seq_len), per_thread = task_scratch_floats(D, parts);
  float *keys = malloc((size_t)(KV * lc * (D + Dv)) * sizeof(float));
  float *scratch = malloc((size_t)(a->num_threads * per_thread) * sizeof(float));
  SoftmaxState *states =
      malloc((size_t)(a->num_threads * TILE_QUERIES * parts) * sizeof(SoftmaxState));
  if (keys == NULL || scratch == NULL || states == NULL) {
    free(keys);
    free(scratch);
    free(states);
    return -1;
  }
  float *values = keys + KV * lc * D;
#pragma omp parallel num_threads(a->num_threads)
  {
#pragma omp for schedule(static)
    for (int64_t job = 0; job < 2 * KV; job++) {
      if (job < KV)
        pack_keys(a, keys + job * lc * D, lc, job);
      else
        pack_values(a, values + (job - KV) * lc * Dv, lc, Dv, job - KV);
    }
    const int thread = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tiles * KV; task++) {
      /* the longest rows first */
      const int64_t tile = tiles - 1 - task / KV, kvh = task % KV;
      const Tile t = tile_at(a, kvh, tile * TILE_QUERIES);
      attend(a, keys + kvh * lc * D, values + kvh * lc * Dv, Dv, &t, parts,
             scratch + thread * per_thread, states + thread * TILE_QUERIES * parts);
    }
  }
  free(keys);
  free(scratch);
  free(states);
  return 0;
}

#endif
