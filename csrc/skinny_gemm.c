/* fp32 matmul for the few rows of a decode step: y [M, N] = x [M, K] @ w [N, K]^T (+ b).
 *
 * With few input rows the product is bound by reading w; ATen's MKL sgemv reads it at about
 * 11 GB/s on the 2-core development machine, this loop at 25-30 GB/s. With more rows (up to
 * a few hundred, a decode batch) MKL's GEMM is still far from its peak there, while tiles of
 * 4 x rows by 4 w rows keep 16 accumulators in registers, each loaded vector feeding four
 * FMAs: 1.1-2x faster than MKL on AVX-512. With AVX2's 16 registers the tile spills, so
 * pagedllm/_custom_ops.py uses this kernel for more than 4 rows only on AVX-512 CPUs.
 */
#include "ops.h"
#include "prefetch.h"
#include "vec.h"

#define ROW_TILE 4

/* out[m] = x[m, :] . w_row for m < rows (rows <= ROW_TILE): one weight row streamed once
 * (prefetch_ahead of it with prefetch). */
CPU_DISPATCH
static void dot_tile(const float *x, const float *w_row, float *out, int64_t rows, int64_t K,
                     int prefetch) {
  vec16 acc[ROW_TILE] = {0};
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    if (prefetch) prefetch_ahead(w_row + k, 64);
    vec16 w = load16(w_row + k);
    for (int64_t m = 0; m < rows; m++) acc[m] += w * load16(x + m * K + k);
  }
  for (int64_t m = 0; m < rows; m++) {
    float s = hsum16(acc[m]);
    for (int64_t j = k; j < K; j++) s += w_row[j] * x[m * K + j];
    out[m] = s;
  }
}

/* out[4 i + j] = x[i, :] . w[j, :] for the 4 x rows and 4 w rows given (one stretch of
 * memory, prefetch_ahead of it with prefetch); K % 16 == 0. */
CPU_DISPATCH
static void tile_4x4(const float *x, const float *w, float *out, int64_t K, int prefetch) {
  vec16 acc[16] = {0};
  for (int64_t k = 0; k < K; k += 16) {
    if (prefetch) prefetch_ahead(w + 4 * k, 4 * 64);
    vec16 xv[4], wv[4];
    for (int i = 0; i < 4; i++) xv[i] = load16(x + i * K + k);
    for (int j = 0; j < 4; j++) wv[j] = load16(w + j * K + k);
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 4; j++) acc[4 * i + j] += xv[i] * wv[j];
  }
  store16(out, transpose_sum16(acc));
}

/* Weight rows [n0, n0 + cols) against every x row. Up to ROW_TILE x rows the product is
 * bound by memory and one weight row at a time streams fastest; past it, 4 x 4 tiles. */
static void weight_rows(const float *x, const float *w, const float *b, float *y, int64_t M,
                        int64_t N, int64_t K, int64_t n0, int64_t cols) {
  float out[16];
  int64_t m0 = 0;
  if (cols == 4 && K % 16 == 0 && M > ROW_TILE) {
    for (; m0 + 4 <= M; m0 += 4) {
      tile_4x4(x + m0 * K, w + n0 * K, out, K, m0 == 0);
      for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
          y[(m0 + i) * N + n0 + j] = b ? out[4 * i + j] + b[n0 + j] : out[4 * i + j];
    }
  }
  for (int64_t n = n0; n < n0 + cols; n++) {
    for (int64_t m = m0; m < M; m += ROW_TILE) {
      int64_t rows = M - m < ROW_TILE ? M - m : ROW_TILE;
      dot_tile(x + m * K, w + n * K, out, rows, K, m == 0);
      for (int64_t i = 0; i < rows; i++) y[(m + i) * N + n] = b ? out[i] + b[n] : out[i];
    }
  }
}

void skinny_gemm(const float *x, const float *w, const float *b, float *y, int64_t M, int64_t N,
          int64_t K, int num_threads) {
  const int64_t tiles = (N + 3) / 4;
#pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t t = 0; t < tiles; t++)
    weight_rows(x, w, b, y, M, N, K, 4 * t, N - 4 * t < 4 ? N - 4 * t : 4);
}
