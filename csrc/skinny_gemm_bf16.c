/* bfloat16 matmul for the few rows of a decode step: y [M, N] = x [M, K] @ w [N, K]^T (+ b),
 * bf16 in and out, float32 products and sums.
 *
 * At decode sizes the product is bound by reading w, and stock torch's bf16 matmul reads it
 * slowly (oneDNN uses AMX tiles only from about 16 rows; below, half the float32 speed on
 * the development machine). Here x is widened to float32 once; tiles of 4 x rows by 4 weight
 * rows keep 16 accumulators in registers, each weight vector widened (a shift) once and fed
 * to four FMAs. Every y element is one dot product summed in the same order whatever M is
 * and whichever tile computes it, so a row's result does not depend on the rows batched
 * with it.
 */
#include <stdlib.h>

#include "bf16.h"
#include "ops.h"
#include "prefetch.h"

#define TILE 4

/* out[TILE * i + j] = x[i, :] . w[j, :] for i < xr x rows (float32) and j < wr weight rows
 * (bfloat16), rows K apart; with prefetch, prefetch_ahead of the bytes read (the wr rows
 * are one stretch of memory, read at wr * 32 bytes per step). Each output has one
 * accumulator over steps of 16 along K, summed across its lanes by one fixed tree
 * (transpose_sum16's lane j is hsum16 of vector j), then the K % 16 tail in order: the same
 * arithmetic for an output whatever xr and wr are, so tiles of any shape give its bits. xr,
 * wr: constants at each call. */
INLINE void dot_tile(const float *x, const uint16_t *w, float *out, const int xr, const int wr,
                     int64_t K, int prefetch) {
  vec16 acc[TILE * TILE] = {0};
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    if (prefetch) prefetch_ahead(w + wr * k, wr * 32);
    vec16 wv[TILE];
    for (int j = 0; j < wr; j++) wv[j] = load16_bf16(w + j * K + k);
    for (int i = 0; i < xr; i++) {
      const vec16 xv = load16(x + i * K + k);
      for (int j = 0; j < wr; j++) acc[TILE * i + j] += xv * wv[j];
    }
  }
  store16(out, transpose_sum16(acc));
  for (int i = 0; i < xr; i++)
    for (int j = 0; j < wr; j++)
      for (int64_t t = k; t < K; t++) out[TILE * i + j] += x[i * K + t] * bf16_to_float(w[j * K + t]);
}

/* dot_tile for xr < 5 x rows and wr = TILE or 1 weight rows, as constants. */
INLINE void dot_tile_any(const float *x, const uint16_t *w, float *out, int xr, int wr,
                         int64_t K, int prefetch) {
#define CASE(r, c) \
  case r: dot_tile(x, w, out, r, c, K, prefetch); return;
  if (wr == TILE) {
    switch (xr) {
      CASE(1, TILE) CASE(2, TILE) CASE(3, TILE) default: dot_tile(x, w, out, 4, TILE, K, prefetch);
    }
    return;
  }
  switch (xr) { CASE(1, 1) CASE(2, 1) CASE(3, 1) default: dot_tile(x, w, out, 4, 1, K, prefetch); }
#undef CASE
}

/* y[:, n0:n1] (+ bias): TILE weight rows at a time against TILE x rows at a time (a tail of
 * weight rows one by one), prefetching on the first pass over each weight tile. */
CPU_DISPATCH
static void weight_rows_bf16(const float *x, const uint16_t *w, const uint16_t *b, uint16_t *y,
                             int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1) {
  float out[TILE * TILE];
  for (int64_t n = n0; n < n1;) {
    const int wr = n1 - n >= TILE ? TILE : 1;
    for (int64_t m = 0; m < M; m += TILE) {
      const int xr = M - m < TILE ? (int)(M - m) : TILE;
      dot_tile_any(x + m * K, w + n * K, out, xr, wr, K, m == 0);
      for (int i = 0; i < xr; i++)
        for (int j = 0; j < wr; j++) {
          const float bias = b ? bf16_to_float(b[n + j]) : 0.0f;
          y[(m + i) * N + n + j] = float_to_bf16(out[TILE * i + j] + bias);
        }
    }
    n += wr;
  }
}

CPU_DISPATCH
static void widen_bf16(float *out, const uint16_t *x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) store16(out + i, load16_bf16(x + i));
  for (; i < n; i++) out[i] = bf16_to_float(x[i]);
}

int skinny_gemm_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *b, uint16_t *y,
                     int64_t M, int64_t N, int64_t K, int num_threads) {
  float *xf = malloc((size_t)(M * K) * sizeof(float));
  if (xf == NULL) return -1;
  widen_bf16(xf, x, M * K);
  /* 8 weight rows per task: few tasks per thread at decode sizes, each a long stream. */
  const int64_t tasks = (N + 7) / 8;
#pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t t = 0; t < tasks; t++)
    weight_rows_bf16(xf, w, b, y, M, N, K, 8 * t, 8 * t + 8 < N ? 8 * t + 8 : N);
  free(xf);
  return 0;
}
