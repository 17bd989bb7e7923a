/* skinny_gemm_bf16's tiles on AVX-512 BF16 dot products: a guarded header, included by
 * skinny_gemm_kernel.h in the avx512_bf16 build (SKINNY_DPBF16 defined), which defines
 * VEC_LANES 16 and enables avx512bf16 (skinny_gemm_avx512_bf16.c's target pragma) first.
 *
 * One vdpbf16ps multiplies 16 lanes' pairs of bf16 x and weight values (exact in float32)
 * and adds both products to the lane's float32 sum: twice the products of an FMA on widened
 * weights, with neither x nor the weights widened first. The instruction treats denormal
 * inputs as zero, flushes denormal sums to zero and rounds to nearest even, whatever MXCSR
 * says. Tiles and their order are tile()'s and dot_tile()'s (skinny_gemm_tile.h) with DP_STEP
 * values a step, so a row's results do not depend on the other rows (batch invariance) here
 * either. K must be a multiple of DP_STEP.
 */
#ifndef PAGEDLLM_SKINNY_GEMM_DPBF16_H
#define PAGEDLLM_SKINNY_GEMM_DPBF16_H

#if VEC_LANES != 16 || !defined(__AVX512BF16__)
#error "skinny_gemm_dpbf16.h needs VEC_LANES 16 and avx512bf16 (skinny_gemm_avx512_bf16.c)"
#endif

#include <immintrin.h>

#include "ops.h"
#include "prefetch.h"
#include "skinny_gemm_tile.h"

#define DP_STEP 32 /* bf16 values in a vector */
_Static_assert(TILE_COLS == SKINNY_PACK_ROWS && DP_STEP == SKINNY_PACK_K,
               "skinny_gemm_bf16's packed order is this build's tile by step");

INLINE __m512bh load_pairs(const uint16_t *p) { return (__m512bh)_mm512_loadu_si512(p); }

INLINE vecn dot_pairs(vecn acc, const uint16_t *x, __m512bh w) {
  return (vecn)_mm512_dpbf16_ps((__m512)acc, load_pairs(x), w);
}

/* out[TILE_COLS * i + j] = x[i, :] . w[j, :] for rows (a constant at each call) x rows and
 * the TILE_COLS weight rows at w, one stretch of memory: row after row, or, `packed` (a
 * constant at each call), in skinny_pack's order, whose DP_STEP values of each row for
 * one step lie side by side, so the tile is read front to back. Same products and sums in
 * the same order either way. */
INLINE void dp_tile(const uint16_t *x, const uint16_t *w, float *out, const int rows,
                    int64_t K, int prefetch, const int packed) {
  vecn acc[VEC_LANES] = {0};
  for (int64_t k = 0; k < K; k += DP_STEP) {
    if (prefetch) prefetch_ahead(w + TILE_COLS * k, TILE_COLS * DP_STEP * 2);
    __m512bh wv[TILE_COLS];
    for (int j = 0; j < TILE_COLS; j++)
      wv[j] = load_pairs(packed ? w + TILE_COLS * k + j * DP_STEP : w + j * K + k);
    for (int i = 0; i < rows; i++)
      for (int j = 0; j < TILE_COLS; j++)
        acc[TILE_COLS * i + j] = dot_pairs(acc[TILE_COLS * i + j], x + i * K + k, wv[j]);
  }
  storen(out, transpose_sumn(acc));
}

INLINE void dp_tile_any(const uint16_t *x, const uint16_t *w, float *out, int64_t rows,
                        int64_t K, int prefetch, const int packed) {
  switch (rows) {
    case 1: dp_tile(x, w, out, 1, K, prefetch, packed); return;
    case 2: dp_tile(x, w, out, 2, K, prefetch, packed); return;
    case 3: dp_tile(x, w, out, 3, K, prefetch, packed); return;
    default: dp_tile(x, w, out, ROW_TILE, K, prefetch, packed);
  }
}

/* out[m] = x[m, :] . w_row for m < rows (<= ROW_TILE): weight rows outside whole tiles. */
INLINE void dp_row(const uint16_t *x, const uint16_t *w_row, float *out, int64_t rows,
                   int64_t K, int prefetch) {
  vecn acc[ROW_TILE] = {0};
  for (int64_t k = 0; k < K; k += DP_STEP) {
    if (prefetch) prefetch_ahead(w_row + k, DP_STEP * 2);
    const __m512bh w = load_pairs(w_row + k);
    for (int64_t m = 0; m < rows; m++) acc[m] = dot_pairs(acc[m], x + m * K + k, w);
  }
  for (int64_t m = 0; m < rows; m++) out[m] = hsumn(acc[m]);
}

#endif
