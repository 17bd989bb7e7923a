/* skinny_gemm and skinny_gemm_bf16 for one instruction set: a guarded header, included once
 * by each of skinny_gemm_avx512_bf16.c, _avx512.c, _avx2.c and _portable.c after its target
 * pragma, with these defined first:
 *
 *   VEC_LANES      the register width in floats (4, 8 or 16)
 *   ISA(name)      name with the build's suffix: ISA(skinny_gemm_run) is the build's entry,
 *                  which skinny_gemm.c picks at run time
 *   SKINNY_DPBF16  optional (the avx512_bf16 build): bf16 x and weights multiplied as they
 *                  are, by dot products (skinny_gemm_dpbf16.h), where K is a multiple of
 *                  DP_STEP
 *   SKINNY_PANEL   optional (the AVX2 build): float32 multiplied on transposed panels
 *                  (skinny_gemm_panel.h)
 *
 * Everything else runs skinny_gemm_tile.h's dot-product tiles: weights, bias and y float32
 * or bfloat16, x float32 (bfloat16 x is widened once first).
 *
 * Which tiles sum an output depends on N, K, its column and the weight's dtype, never on M
 * or on x: every row count gives a row the same bits (batch invariance).
 */
#ifndef PAGEDLLM_SKINNY_GEMM_KERNEL_H
#define PAGEDLLM_SKINNY_GEMM_KERNEL_H

#if !defined(VEC_LANES) || !defined(ISA)
#error "define VEC_LANES and ISA(name) before including skinny_gemm_kernel.h"
#endif

#include <omp.h>
#include <stdlib.h>

#include "ops.h"
#include "skinny_gemm_tile.h"
#ifdef SKINNY_DPBF16
#include "skinny_gemm_dpbf16.h"
#endif
#ifdef SKINNY_PANEL
#include "skinny_gemm_panel.h"
#endif

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
 * in L2 (256 KiB: half or less of an x86-64 core's 512 KiB - 2 MiB) while the weights stream
 * past it. Past a block's rows each weight tile is read again, from L3 or memory, but by then
 * it has done a block's worth of work: 1.08-1.1x faster than no blocks at 2,048 rows, level
 * at 64-512; blocks of 64 KiB to 512 KiB within 4% of each other. `pagedllm bench linear`
 * (--dtype, --isa) re-measures it. */
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
/* skinny_gemm on float32 by panels (K % VEC_LANES == 0), blocks of x rows as run() takes
 * them; weight rows past the last whole panel go to the dot-product tiles. */
static void panel_run(const float *x, const float *w, const float *b, float *y, int64_t M,
                      int64_t N, int64_t K, int packed, int num_threads) {
  const int64_t panels = N / PANEL, n_tail = panels * PANEL, block = block_rows(K, 0);
  const int64_t tiles = panels + (N - n_tail + TILE_COLS - 1) / TILE_COLS;
#pragma omp parallel num_threads(num_threads)
  for (int64_t m0 = 0; m0 < M; m0 += block) {
    const int64_t rows = M - m0 < block ? M - m0 : block;
    const float *xb = x + m0 * K;
    float *yb = y + m0 * N;
#pragma omp for schedule(static) nowait
    for (int64_t t = 0; t < tiles; t++) {
      if (t < panels) {
        panel_rows(xb, w, b, yb, rows, N, K, PANEL * t, packed);
      } else {
        const int64_t n0 = n_tail + TILE_COLS * (t - panels);
        weight_rows(xb, w, b, yb, rows, N, K, n0, N - n0 < TILE_COLS ? N - n0 : TILE_COLS, 0, 0,
                    0);
      }
    }
  }
}
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

#endif
