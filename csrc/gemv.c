/* A small-batch fp32 matmul for CPU decode steps.
 *
 * With few input rows the product is bound by reading w; ATen's MKL sgemv reads it at about
 * 11 GB/s on the 2-core development machine, this loop at 25-30 GB/s. Each weight row is
 * streamed once and dotted with up to ROW_TILE input rows while it sits in L1.
 */
#include "ops.h"
#include "vec.h"

#define ROW_TILE 4

/* out[m] = x[m, :] . w_row for m < rows (rows <= ROW_TILE). */
CPU_DISPATCH
static void dot_tile(const float *x, const float *w_row, float *out, int64_t rows, int64_t K) {
  vec16 acc[ROW_TILE] = {0};
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    vec16 w = load16(w_row + k);
    for (int64_t m = 0; m < rows; m++) acc[m] += w * load16(x + m * K + k);
  }
  for (int64_t m = 0; m < rows; m++) {
    float s = hsum16(acc[m]);
    for (int64_t j = k; j < K; j++) s += w_row[j] * x[m * K + j];
    out[m] = s;
  }
}

void gemv(const float *x, const float *w, const float *b, float *y, int64_t M, int64_t N,
          int64_t K, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t n = 0; n < N; n++) {
    float out[ROW_TILE];
    for (int64_t m0 = 0; m0 < M; m0 += ROW_TILE) {
      int64_t rows = M - m0 < ROW_TILE ? M - m0 : ROW_TILE;
      dot_tile(x + m0 * K, w + n * K, out, rows, K);
      for (int64_t m = 0; m < rows; m++) y[(m0 + m) * N + n] = b ? out[m] + b[n] : out[m];
    }
  }
}
