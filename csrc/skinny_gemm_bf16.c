/* bfloat16 matmul for the few rows of a decode step: y [M, N] = x [M, K] @ w [N, K]^T (+ b),
 * bf16 in and out, float32 products and sums.
 *
 * At decode sizes the product is bound by reading w, and stock torch's bf16 matmul reads it
 * slowly (oneDNN uses AMX tiles only from about 16 rows; below, half the float32 speed on
 * the development machine). Here x is widened to float32 once, each weight row is streamed
 * once per ROW_TILE rows of x and widened (a shift) as it is read. Every y element is one
 * dot product summed in the same order whatever M is, so a row's result does not depend on
 * the rows batched with it.
 */
#include <stdlib.h>

#include "bf16.h"
#include "ops.h"

#define ROW_TILE 4

/* out[m] = x[m, :] . w_row for m < rows: one weight row read once for `rows` rows of x. Two
 * accumulators per row (even and odd 16-lane chunks) halve the chain of dependent FMAs that
 * bounds a single row; every row count sums in this same order. */
INLINE void dot_rows(const float *x, const uint16_t *w_row, float *out, const int rows,
                     int64_t K) {
  vec16 even[ROW_TILE] = {0}, odd[ROW_TILE] = {0};
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const vec16 w0 = load16_bf16(w_row + k), w1 = load16_bf16(w_row + k + 16);
    for (int m = 0; m < rows; m++) {
      even[m] += w0 * load16(x + m * K + k);
      odd[m] += w1 * load16(x + m * K + k + 16);
    }
  }
  if (k + 16 <= K) {
    const vec16 w0 = load16_bf16(w_row + k);
    for (int m = 0; m < rows; m++) even[m] += w0 * load16(x + m * K + k);
    k += 16;
  }
  for (int m = 0; m < rows; m++) {
    float s = hsum16(even[m] + odd[m]);
    for (int64_t j = k; j < K; j++) s += bf16_to_float(w_row[j]) * x[m * K + j];
    out[m] = s;
  }
}

CPU_DISPATCH
static void weight_rows_bf16(const float *x, const uint16_t *w, const uint16_t *b, uint16_t *y,
                             int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1) {
  float out[ROW_TILE];
  for (int64_t n = n0; n < n1; n++) {
    const float bias = b ? bf16_to_float(b[n]) : 0.0f;
    for (int64_t m = 0; m < M; m += ROW_TILE) {
      const int rows = M - m < ROW_TILE ? (int)(M - m) : ROW_TILE;
      switch (rows) { /* constant trip counts, so the accumulators stay in registers */
        case 1: dot_rows(x + m * K, w + n * K, out, 1, K); break;
        case 2: dot_rows(x + m * K, w + n * K, out, 2, K); break;
        case 3: dot_rows(x + m * K, w + n * K, out, 3, K); break;
        default: dot_rows(x + m * K, w + n * K, out, 4, K);
      }
      for (int i = 0; i < rows; i++) y[(m + i) * N + n] = float_to_bf16(out[i] + bias);
    }
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
