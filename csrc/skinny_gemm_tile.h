/* skinny_gemm's dot-product tiles for one instruction set's vector width: a guarded header,
 * included once per build (skinny_gemm_kernel.h, skinny_gemm_dpbf16.h) with VEC_LANES (the
 * register width in floats: 4, 8 or 16) defined, as vecn.h needs.
 *
 * Tiles of up to ROW_TILE x rows by TILE_COLS = VEC_LANES / 4 weight rows keep their
 * VEC_LANES accumulators in registers (16 on AVX-512 and on AVX2: half of AVX-512's 32
 * registers, all of AVX2's 16 with the loaded vectors beside them), each loaded weight vector
 * feeding four FMAs, and one transpose_sumn gives the tile's VEC_LANES results.
 *
 * Weights, bias and y are float32 or bfloat16 (`bf16`, a constant at each call, as in
 * vecn.h's loadn_as); x is float32, the products and sums float32, a bfloat16 y rounded as
 * torch rounds.
 */
#ifndef PAGEDLLM_SKINNY_GEMM_TILE_H
#define PAGEDLLM_SKINNY_GEMM_TILE_H

#ifndef VEC_LANES
#error "define VEC_LANES (4, 8 or 16) before including skinny_gemm_tile.h"
#endif

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

#endif
