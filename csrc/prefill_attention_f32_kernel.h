/* Causal attention of one sequence's prefill chunk in float32 for one instruction set:
 * included by prefill_attention_f32_avx512.c, _avx2.c and _portable.c after their target
 * pragma, with VEC_LANES and ISA(name) defined; prefill_attention_f32.c picks one at run time.
 *
 * Queries q [n, H, D] float32 at positions seq_len - n .. seq_len - 1 attend to the keys and
 * values of positions 0 .. their own in the paged cache [num_blocks, block_size, KV, D]
 * (float32 or bf16, written there first). Each kv head's keys are first copied out of their
 * blocks transposed, VEC_LANES tokens at a time ([tokens / VEC_LANES][D][VEC_LANES]), its
 * values as they are ([tokens][D]), both zero past seq_len and widened to float32. Then each
 * task, TASK_ROWS query rows of one head, in tiles of TILE_ROWS rows:
 *   S = q k^T (each tile of TILE_ROWS rows x 2 vectors of keys as outer products: per element
 *   of D, two key loads and TILE_ROWS broadcasts for 2 * TILE_ROWS FMAs, the GEMM
 *   micro-kernel), the causal mask and an exact softmax (all scores at hand, no running
 *   rescale), then O = P v the same way (2 vectors of D per tile) and out = O / sum.
 * Each score and each output is one FMA chain in order (over D, over the keys), and a row's
 * masked keys add exact zeros: a row's result depends on its own query and the sequence's
 * keys and values only, not on the chunk it came in or on the rows beside it.
 */
#include <omp.h>
#include <stdlib.h>

#include "prefill_attention_f32.h"
#include "vecn.h"

#define TILE_ROWS 6 /* query rows of a micro-tile: 12 accumulators + 2 loads + 1 broadcast */
#define TASK_ROWS (2 * TILE_ROWS)
#define TILE_COLS (2 * VEC_LANES) /* keys, or output columns, of a micro-tile */

/* The cache row of token t of kv head h (elements, not bytes). */
INLINE int64_t cache_row(const prefill_attention_f32_args *a, int64_t t, int64_t h) {
  const int64_t slot = (int64_t)a->block_table[t / a->block_size] * a->block_size +
                       t % a->block_size;
  return (slot * a->KV + h) * a->D;
}

/* Keys of kv head h, tokens [0, lc) (lc: seq_len rounded up to TILE_COLS), into packed
 * [lc / VEC_LANES][D][VEC_LANES]: each VEC_LANES x VEC_LANES block of tokens x elements
 * transposed in registers; tokens past seq_len are zero. */
static void pack_keys(const prefill_attention_f32_args *a, float *packed, int64_t lc,
                      int64_t h) {
  const int64_t D = a->D;
  for (int64_t t0 = 0; t0 < lc; t0 += VEC_LANES) {
    int64_t rows[VEC_LANES];
    for (int64_t i = 0; i < VEC_LANES; i++)
      rows[i] = t0 + i < a->seq_len ? cache_row(a, t0 + i, h) : -1;
    for (int64_t d0 = 0; d0 < D; d0 += VEC_LANES) {
      vecn v[VEC_LANES];
      for (int64_t i = 0; i < VEC_LANES; i++)
        v[i] = rows[i] < 0 ? splatn(0.0f) : loadn_as(a->k_cache, rows[i] + d0, a->kv_bf16);
      transposen(v);
      for (int64_t j = 0; j < VEC_LANES; j++) storen(packed + t0 * D + (d0 + j) * VEC_LANES, v[j]);
    }
  }
}

/* Values of kv head h, tokens [0, lc), into packed [lc][D] float32, zero past seq_len. */
static void pack_values(const prefill_attention_f32_args *a, float *packed, int64_t lc,
                        int64_t h) {
  const int64_t D = a->D;
  for (int64_t t = 0; t < lc; t++) {
    const int64_t row = t < a->seq_len ? cache_row(a, t, h) : -1;
    for (int64_t d = 0; d < D; d += VEC_LANES)
      storen(packed + t * D + d,
             row < 0 ? splatn(0.0f) : loadn_as(a->v_cache, row + d, a->kv_bf16));
  }
}

/* s [TILE_ROWS, ls] = q [TILE_ROWS, D] k^T over keys [0, kc) (kc % TILE_COLS == 0). */
INLINE void score_tile(const float *q, const float *keys, int64_t kc, float *s, int64_t ls,
                       const int64_t D) {
  for (int64_t t0 = 0; t0 < kc; t0 += TILE_COLS) {
    const float *k0 = keys + t0 * D, *k1 = k0 + VEC_LANES * D;
    vecn acc[TILE_ROWS][2];
    for (int r = 0; r < TILE_ROWS; r++) acc[r][0] = acc[r][1] = splatn(0.0f);
    for (int64_t d = 0; d < D; d++) {
      const vecn a0 = loadn(k0 + d * VEC_LANES), a1 = loadn(k1 + d * VEC_LANES);
      for (int r = 0; r < TILE_ROWS; r++) {
        const vecn x = broadcastn(q + r * D + d);
        acc[r][0] += x * a0;
        acc[r][1] += x * a1;
      }
    }
    for (int r = 0; r < TILE_ROWS; r++) {
      storen(s + r * ls + t0, acc[r][0]);
      storen(s + r * ls + t0 + VEC_LANES, acc[r][1]);
    }
  }
}

/* o [TILE_ROWS, vecs vectors from column d0] = p [TILE_ROWS, kc] (rows ls apart) @ values
 * [kc, D] (vecs: 1 or 2, a constant). */
INLINE void value_columns(const float *p, int64_t ls, const float *values, int64_t kc, float *o,
                          int64_t d0, const int vecs, const int64_t D) {
  vecn acc[TILE_ROWS][2];
  for (int r = 0; r < TILE_ROWS; r++) acc[r][0] = acc[r][1] = splatn(0.0f);
  for (int64_t t = 0; t < kc; t++) {
    const vecn v0 = loadn(values + t * D + d0);
    const vecn v1 = vecs > 1 ? loadn(values + t * D + d0 + VEC_LANES) : v0;
    for (int r = 0; r < TILE_ROWS; r++) {
      const vecn x = broadcastn(p + r * ls + t);
      acc[r][0] += x * v0;
      if (vecs > 1) acc[r][1] += x * v1;
    }
  }
  for (int r = 0; r < TILE_ROWS; r++)
    for (int j = 0; j < vecs; j++) storen(o + r * D + d0 + j * VEC_LANES, acc[r][j]);
}

/* o [TILE_ROWS, D] = p [TILE_ROWS, kc] (rows ls apart) @ values [kc, D]: two vectors of
 * columns at a time, and one where D leaves one (D % VEC_LANES == 0). */
INLINE void value_tile(const float *p, int64_t ls, const float *values, int64_t kc, float *o,
                       const int64_t D) {
  int64_t d0 = 0;
  for (; d0 + TILE_COLS <= D; d0 += TILE_COLS) value_columns(p, ls, values, kc, o, d0, 2, D);
  if (d0 < D) value_columns(p, ls, values, kc, o, d0, 1, D);
}

/* A row of scores s -> p = e^(s * scale - max) over its `visible` keys, zero from there up to
 * kc, in place; returns 1 / their sum. */
INLINE float softmax_row(float *s, int64_t visible, int64_t kc, float scale) {
  vecn vmax = splatn(-__FLT_MAX__);
  for (int64_t t = 0; t < visible; t += VEC_LANES)
    vmax = maxn(vmax, selectn(lanes_below_n(visible - t), loadn(s + t) * scale,
                              splatn(-__FLT_MAX__)));
  const vecn m = splatn(hmaxn(vmax));
  vecn sum = splatn(0.0f);
  for (int64_t t = 0; t < kc; t += VEC_LANES) {
    vecn e = splatn(0.0f);
    if (t < visible) e = selectn(lanes_below_n(visible - t), expn(loadn(s + t) * scale - m), e);
    sum += e;
    storen(s + t, e);
  }
  return 1.0f / hsumn(sum);
}

/* The scratch floats of one thread: a task's queries, scores and outputs. */
INLINE int64_t task_scratch_floats(int64_t ls, int64_t D) { return TASK_ROWS * (ls + 2 * D); }

/* One task: query rows [r0, r0 + TASK_ROWS) (clipped to n) of head h, reading the packed keys
 * and values of its kv head. */
INLINE void attend_rows(const prefill_attention_f32_args *a, const float *keys,
                        const float *values, int64_t r0, int64_t h, int64_t ls, float *scratch,
                        const int64_t D) {
  const int64_t n = a->n, rows = n - r0 < TASK_ROWS ? n - r0 : TASK_ROWS;
  const int64_t ctx = a->seq_len - n;
  float *q = scratch, *s = q + TASK_ROWS * D, *o = s + TASK_ROWS * ls;
  for (int64_t i = 0; i < TASK_ROWS; i++) /* zero past the chunk's end */
    if (i < rows)
      memcpy(q + i * D, a->q + ((r0 + i) * a->H + h) * D, (size_t)D * sizeof(float));
    else
      memset(q + i * D, 0, (size_t)D * sizeof(float));
  float inv[TASK_ROWS];
  for (int64_t i0 = 0; i0 < rows; i0 += TILE_ROWS) {
    /* the keys the tile's last row sees, rounded up to whole tiles of keys */
    const int64_t last = i0 + TILE_ROWS < rows ? i0 + TILE_ROWS : rows;
    const int64_t kc = (ctx + r0 + last + TILE_COLS - 1) / TILE_COLS * TILE_COLS;
    score_tile(q + i0 * D, keys, kc, s + i0 * ls, ls, D);
    for (int64_t i = i0; i < i0 + TILE_ROWS; i++) /* rows past the chunk: any key will do */
      inv[i] = softmax_row(s + i * ls, i < rows ? ctx + r0 + i + 1 : 1, kc, a->scale);
    value_tile(s + i0 * ls, ls, values, kc, o + i0 * D, D);
  }
  for (int64_t i = 0; i < rows; i++)
    for (int64_t d = 0; d < D; d += VEC_LANES)
      storen(a->out + ((r0 + i) * a->H + h) * D + d, loadn(o + i * D + d) * inv[i]);
}

/* attend_rows with the common head sizes as constants, whose loops the compiler unrolls. */
static void attend(const prefill_attention_f32_args *a, const float *keys, const float *values,
                   int64_t r0, int64_t h, int64_t ls, float *scratch) {
  if (a->D == 64)
    attend_rows(a, keys, values, r0, h, ls, scratch, 64);
  else if (a->D == 128)
    attend_rows(a, keys, values, r0, h, ls, scratch, 128);
  else
    attend_rows(a, keys, values, r0, h, ls, scratch, a->D);
}

int ISA(prefill_attention_f32_run)(const prefill_attention_f32_args *a) {
  const int64_t KV = a->KV, D = a->D, G = a->H / KV;
  const int64_t blocks = (a->n + TASK_ROWS - 1) / TASK_ROWS;
  const int64_t ls = (a->seq_len + TILE_COLS - 1) / TILE_COLS * TILE_COLS;
  const int64_t per_head = ls * D, per_thread = task_scratch_floats(ls, D);
  float *packed = malloc((size_t)(2 * KV * per_head) * sizeof(float));
  float *scratch = malloc((size_t)(a->num_threads * per_thread) * sizeof(float));
  if (packed == NULL || scratch == NULL) {
    free(packed);
    free(scratch);
    return -1;
  }
#pragma omp parallel num_threads(a->num_threads)
  {
#pragma omp for schedule(static)
    for (int64_t job = 0; job < 2 * KV; job++) {
      if (job < KV)
        pack_keys(a, packed + job * per_head, ls, job);
      else
        pack_values(a, packed + job * per_head, ls, job - KV);
    }
    float *mine = scratch + omp_get_thread_num() * per_thread;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < blocks * a->H; task++) {
      /* the longest rows first */
      const int64_t r0 = (blocks - 1 - task / a->H) * TASK_ROWS, h = task % a->H;
      attend(a, packed + (h / G) * per_head, packed + (KV + h / G) * per_head, r0, h, ls, mine);
    }
  }
  free(packed);
  free(scratch);
  return 0;
}
