/* skinny_gemm and skinny_gemm_bf16 for one instruction set: included by skinny_gemm_avx512.c,
 * _avx2.c and _portable.c after their target pragma, with VEC_LANES (the register width in
 * floats) and ISA(name) (the instruction set's suffix) defined. skinny_gemm.c picks one at run
 * time.
 *
 * Tiles of up to 4 x rows by TILE_COLS = VEC_LANES / 4 weight rows keep their
 * VEC_LANES accumulators in registers (16 on AVX-512 and on AVX2: half of AVX-512's 32
 * registers, all of AVX2's 16 with the loaded vectors beside them), each loaded weight vector
 * feeding four FMAs, and one transpose_sumn gives the tile's VEC_LANES results.
 *
 * Weights, bias and y are float32 or bfloat16 (`bf16`, a constant at each call, as in
 * vecn.h's loadn_as); x is float32 either way (bfloat16 x is widened once first), the
 * products and sums float32, a bfloat16 y rounded as torch rounds. The avx512_bf16 build
 * (SKINNY_DPBF16) multiplies bf16 x and weights as they are, by dot products
 * (skinny_gemm_dpbf16.h), where K is a multiple of DP_STEP. Builds that define SKINNY_PANEL
 * (AVX2) multiply float32 on transposed panels instead (skinny_gemm_panel.h).
 *
 * Which tiles sum an output depends on N, K, its column and the weight's dtype, never on M
 * or on x: every row count gives a row the same bits (batch invariance).
 */
#include <omp.h>
#include <stdlib.h>

#include "ops.h"
#include "prefetch.h"
#include "vecn.h"

#define ROW_TILE 4
#define TILE_COLS (VEC_LANES / 4)

/* out[m] = x[m, :] . w_row for m < rows (rows <= ROW_TILE): one weight row streamed once
 * (prefetch_ahead of it with prefetch). For weight rows outside whole tiles, or K not a
 * multiple of VEC_LANES. */
INLINE void dot_tile(const float *x, const void *w_row, float *out, int64_t rows, int64_t K,
                     int prefetch, const int bf16) {
  vecn acc[ROW_TILE] = {0};
  int64_t k = 0;
  for (; k + VEC_LANES <= K; k += VEC_LANES) {
    if (prefetch) prefetch_ahead(element_at(w_row, k, bf16), VEC_LANES * element_size(bf16));
    vecn w = loadn_as(w_row, k, bf16);
    for (int64_t m = 0; m < rows; m++) acc[m] += w * loadn(x + m * K + k);
  }
  for (int64_t m = 0; m < rows; m++) {
    float s = hsumn(acc[m]);
    for (int64_t j = k; j < K; j++) s += load1_as(w_row, j, bf16) * x[m * K + j];
    out[m] = s;
  }
}

/* out[TILE_COLS * i + j] = x[i, :] . w[j, :] for the rows <= ROW_TILE x rows (a constant at
 * each call) and TILE_COLS w rows given (one stretch of memory, prefetch_ahead of it with
 * prefetch); K % VEC_LANES == 0. Each output is summed in the same order whatever rows is,
 * so a row's results do not depend on the batch around it (captured decode steps, run with
 * padding rows, equal eager ones bit for bit), and in the order dot_tile sums it. */
INLINE void tile(const float *x, const void *w, float *out, const int rows, int64_t K,
                 int prefetch, const int bf16) {
  vecn acc[VEC_LANES] = {0};
  for (int64_t k = 0; k < K; k += VEC_LANES) {
    if (prefetch)
      prefetch_ahead(element_at(w, TILE_COLS * k, bf16),
                     TILE_COLS * VEC_LANES * element_size(bf16));
    vecn wv[TILE_COLS];
    for (int j = 0; j < TILE_COLS; j++) wv[j] = loadn_as(w, j * K + k, bf16);
    for (int i = 0; i < rows; i++) {
      const vecn xv = loadn(x + i * K + k);
      for (int j = 0; j < TILE_COLS; j++) acc[TILE_COLS * i + j] += xv * wv[j];
    }
  }
  storen(out, transpose_sumn(acc));
}

/* tile with rows as a constant. */
INLINE void tile_any(const float *x, const void *w, float *out, int64_t rows, int64_t K,
                     int prefetch, const int bf16) {
  switch (rows) {
    case 1: tile(x, w, out, 1, K, prefetch, bf16); return;
    case 2: tile(x, w, out, 2, K, prefetch, bf16); return;
    case 3: tile(x, w, out, 3, K, prefetch, bf16); return;
    default: tile(x, w, out, ROW_TILE, K, prefetch, bf16);
  }
}

#ifdef SKINNY_DPBF16
#include "skinny_gemm_dpbf16.h"
#endif

/* y[m + i, n + j] = sums[TILE_COLS * i + j] (+ b[n + j]) for i < rows, j < TILE_COLS: a
 * tile's results, rounded as store1_as rounds, in one vector conversion and a store of
 * TILE_COLS values per row. */
INLINE void store_tile(void *y, int64_t N, int64_t m, int64_t n, vecn sums, int64_t rows,
                       const void *b, const int bf16) {
  if (b) {
    float bias[VEC_LANES];
    for (int j = 0; j < VEC_LANES; j++) bias[j] = load1_as(b, n + j % TILE_COLS, bf16);
    sums += loadn(bias);
  }
  if (bf16) {
    const bf16xn h = to_bf16n(sums);
    for (int64_t i = 0; i < rows; i++)
      memcpy(element_at(y, (m + i) * N + n, 1), (const uint16_t *)&h + TILE_COLS * i,
             TILE_COLS * sizeof(uint16_t));
  } else {
    for (int64_t i = 0; i < rows; i++)
      memcpy(element_at(y, (m + i) * N + n, 0), (const float *)&sums + TILE_COLS * i,
             TILE_COLS * sizeof(float));
  }
}

/* Weight rows [n0, n0 + cols) against every x row: tiles of up to ROW_TILE x rows by
 * TILE_COLS weight rows, else (the last cols < TILE_COLS rows of w, or K not a multiple of
 * VEC_LANES) one weight row at a time. dp: bf16 x and weights on dot-product tiles (x is
 * float32 otherwise); packed: w in skinny_pack's order (dp, whole tiles only). */
INLINE void weight_rows(const void *x, const void *w, const void *b, void *y, int64_t M,
                        int64_t N, int64_t K, int64_t n0, int64_t cols, const int bf16,
                        const int dp, const int packed) {
  float out[VEC_LANES];
  const int tiled = cols == TILE_COLS && K % VEC_LANES == 0;
  const int64_t step = tiled ? TILE_COLS : 1; /* weight rows per call */
  for (int64_t m = 0; m < M; m += ROW_TILE) {
    const int64_t rows = M - m < ROW_TILE ? M - m : ROW_TILE;
    const void *x_rows = element_at(x, m * K, dp);
    for (int64_t n = n0; n < n0 + cols; n += step) {
      const void *w_rows = element_at(w, n * K, bf16);
#ifdef SKINNY_DPBF16
      if (dp && tiled)
        dp_tile_any(x_rows, w_rows, out, rows, K, m == 0, packed);
      else if (dp)
        dp_row(x_rows, w_rows, out, rows, K, m == 0);
      else
#endif
          if (tiled)
        tile_any(x_rows, w_rows, out, rows, K, m == 0, bf16);
      else
        dot_tile(x_rows, w_rows, out, rows, K, m == 0, bf16);
      if (tiled)
        store_tile(y, N, m, n, loadn(out), rows, b, bf16);
      else /* one weight row: out[i] for x row m + i */
        for (int64_t i = 0; i < rows; i++)
          store1_as(y, (m + i) * N + n, b ? out[i] + load1_as(b, n, bf16) : out[i], bf16);
    }
  }
}

/* The bytes of x that each thread's weight tiles go over before the next rows: a block stays
 * in L2 (256 KiB: a quarter of Zen 4's, half of Zen 3's) while the weights stream past it.
 * Past a block's rows each weight tile is read again, from L3 or memory, but by then it has
 * done a block's worth of work. Against no blocks, over the default model's decoder
 * matrices on one Zen 4 core: 2,048 rows 1.08-1.1x faster, 64-512 rows level; 64 KiB to
 * 512 KiB within 4% of each other. Re-measure: pagedllm bench linear (--dtype, --isa). */
#define X_BLOCK_BYTES (256 * 1024)

/* Rows of x per block: as many whole tiles as fit in X_BLOCK_BYTES. */
INLINE int64_t block_rows(int64_t K, int dp) {
  const int64_t rows = X_BLOCK_BYTES / (K * (dp ? 2 : 4)) / ROW_TILE * ROW_TILE;
  return rows > ROW_TILE ? rows : ROW_TILE;
}

/* The weight type is chosen inside the loop: OpenMP outlines the loop's body before inlining,
 * so a bf16 passed into it would not be a constant there. */
static void run(const void *x, const void *w, const void *b, void *y, int64_t M, int64_t N,
                int64_t K, int bf16, int dp, int packed, int num_threads) {
  const int64_t tiles = (N + TILE_COLS - 1) / TILE_COLS, block = block_rows(K, dp);
#pragma omp parallel num_threads(num_threads)
  for (int64_t m0 = 0; m0 < M; m0 += block) {
    const int64_t rows = M - m0 < block ? M - m0 : block;
    const void *xb = element_at(x, m0 * K, dp);
    void *yb = element_at(y, m0 * N, bf16);
#pragma omp for schedule(static) nowait
    for (int64_t t = 0; t < tiles; t++) {
      const int64_t n0 = TILE_COLS * t, cols = N - n0 < TILE_COLS ? N - n0 : TILE_COLS;
      if (packed)
        weight_rows(xb, w, b, yb, rows, N, K, n0, cols, 1, 1, 1);
      else if (dp)
        weight_rows(xb, w, b, yb, rows, N, K, n0, cols, 1, 1, 0);
      else if (bf16)
        weight_rows(xb, w, b, yb, rows, N, K, n0, cols, 1, 0, 0);
      else
        weight_rows(xb, w, b, yb, rows, N, K, n0, cols, 0, 0, 0);
    }
  }
}

#ifdef SKINNY_PANEL
#include "skinny_gemm_panel.h"
#endif

/* Returns 0; -1 when x's float32 copy cannot be allocated; -2 for a packed weight that this
 * build does not read (skinny_gemm_reads_packed: skinny_pack's order in the avx512_bf16
 * build, bf16 with K % DP_STEP == 0 and N % TILE_COLS == 0; panels in the AVX2 build,
 * float32 with K % VEC_LANES == 0 and N % PANEL == 0). */
int ISA(skinny_gemm_run)(const void *x, const void *w, const void *b, void *y, int64_t M,
                         int64_t N, int64_t K, int bf16, int packed, int num_threads) {
#ifdef SKINNY_DPBF16
  if (bf16 && K % DP_STEP == 0 && (!packed || N % TILE_COLS == 0)) {
    run(x, w, b, y, M, N, K, 1, 1, packed, num_threads);
    return 0;
  }
#endif
#ifdef SKINNY_PANEL
  if (!bf16 && K % VEC_LANES == 0 && (!packed || N % PANEL == 0)) {
    panel_run(x, w, b, y, M, N, K, packed, num_threads);
    return 0;
  }
#endif
  if (packed) return -2;
  if (!bf16) {
    run(x, w, b, y, M, N, K, 0, 0, 0, num_threads);
    return 0;
  }
  float *xf = malloc((size_t)(M * K) * sizeof(float));
  if (xf == NULL) return -1;
  convert(xf, 0, x, 1, M * K);
  run(xf, w, b, y, M, N, K, 1, 0, 0, num_threads);
  free(xf);
  return 0;
}
