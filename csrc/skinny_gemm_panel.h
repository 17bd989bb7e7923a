/* skinny_gemm's float32 tiles as outer products on a transposed panel of weights: a guarded
 * header, included by skinny_gemm_kernel.h in the builds that define SKINNY_PANEL (the AVX2
 * build, VEC_LANES 8, where the 4 x 2 dot-product tiles of skinny_gemm_tile.h run 0.55-0.75x
 * as fast from 64 rows: 8 accumulators, no more than FMA latency hides).
 *
 * A panel is PANEL weight rows (two vectors' worth), PANEL_K values of K at a time in
 * transposed order (buf[k][j] = w[n0 + j][k], in L1): read as it lies from a weight that
 * skinny_pack packed at load ([N / PANEL, K, PANEL]), else copied so from a plain weight
 * into a stack buffer. Every tile of up to PANEL_ROWS x rows then reads it as outer
 * products: for each k, the two weight vectors at k times the broadcast x[i][k] into 2 x
 * PANEL_ROWS accumulators, the standard GEMM micro kernel (12 FMAs per 2 loads and 6
 * broadcasts, 15 of AVX2's 16 registers). Each output is one FMA chain over k in order,
 * carried through y between chunks of K (exact), so its bits depend neither on the rows
 * around it nor on the chunking nor on the weight's layout. Packed, one row of x streams
 * each panel front to back: 1.6x the dot-product tiles at 1 row, level at 4-8 rows,
 * 1.4-1.9x from 64; copying the panel on every call instead costs 2-3x at 1-4 rows, so
 * only plain weights (MoE experts) pay it. `pagedllm bench linear --isa avx2` re-measures
 * it.
 */
#ifndef PAGEDLLM_SKINNY_GEMM_PANEL_H
#define PAGEDLLM_SKINNY_GEMM_PANEL_H

#if VEC_LANES != 8
#error "skinny_gemm_panel.h needs VEC_LANES 8 (two vectors make the SKINNY_PANEL_ROWS of a panel)"
#endif

#include "ops.h"
#include "prefetch.h"
#include "vecn.h"

#define PANEL (2 * VEC_LANES)
#define PANEL_ROWS 6
#define PANEL_K 512
_Static_assert(PANEL == SKINNY_PANEL_ROWS, "skinny_gemm's packed float32 order is this panel");

/* buf[k * PANEL + j] = w[j * K + k] for j < PANEL, k < kc (a multiple of VEC_LANES): the
 * panel's rows w (K apart), VEC_LANES x VEC_LANES blocks at a time. */
INLINE void pack_panel(float *buf, const float *w, int64_t K, int64_t kc) {
  for (int h = 0; h < 2; h++)
    for (int64_t k = 0; k < kc; k += VEC_LANES) {
      vecn block[VEC_LANES];
      for (int i = 0; i < VEC_LANES; i++) {
        const float *row = w + (h * VEC_LANES + i) * K + k;
        prefetch_ahead(row, VEC_LANES * sizeof(float));
        block[i] = loadn(row);
      }
      transposen(block);
      for (int i = 0; i < VEC_LANES; i++) storen(buf + (k + i) * PANEL + h * VEC_LANES, block[i]);
    }
}

/* y[i][0 .. PANEL) for the rows (a constant at each call) x rows at x (K apart), over the kc
 * values of K in buf: starting from 0 (first) or from y's partial sums, adding b at the end
 * of K (last, b not NULL). */
INLINE void panel_tile(const float *x, const float *buf, const float *b, float *y, const int rows,
                       int64_t K, int64_t N, int64_t kc, int first, int last) {
  vecn acc[PANEL_ROWS][2];
  for (int i = 0; i < rows; i++)
    for (int h = 0; h < 2; h++) acc[i][h] = first ? splatn(0) : loadn(y + i * N + h * VEC_LANES);
  for (int64_t k = 0; k < kc; k++) {
    const vecn w0 = loadn(buf + k * PANEL), w1 = loadn(buf + k * PANEL + VEC_LANES);
    for (int i = 0; i < rows; i++) {
      const vecn xi = broadcastn(x + i * K + k);
      acc[i][0] += xi * w0;
      acc[i][1] += xi * w1;
    }
  }
  for (int i = 0; i < rows; i++)
    for (int h = 0; h < 2; h++) {
      if (last && b) acc[i][h] += loadn(b + h * VEC_LANES);
      storen(y + i * N + h * VEC_LANES, acc[i][h]);
    }
}

/* y[:, n0 .. n0 + PANEL) for M rows of x (K % VEC_LANES == 0); w plain [N, K], its panel
 * transposed into a stack buffer chunk by chunk, or `packed` in that order already
 * ([N / PANEL, K, PANEL]). */
static void panel_rows(const float *x, const float *w, const float *b, float *y, int64_t M,
                       int64_t N, int64_t K, int64_t n0, int packed) {
  float local[PANEL_K * PANEL] __attribute__((aligned(64)));
  const float *bias = b ? b + n0 : NULL;
  const int64_t chunks = (K + PANEL_K - 1) / PANEL_K; /* of about equal size */
  const int64_t step = ((K + chunks - 1) / chunks + VEC_LANES - 1) / VEC_LANES * VEC_LANES;
  for (int64_t k0 = 0; k0 < K; k0 += step) {
    const int64_t kc = K - k0 < step ? K - k0 : step;
    const int first = k0 == 0, last = k0 + kc == K;
    const float *buf = packed ? w + n0 * K + k0 * PANEL : local;
    if (!packed) pack_panel(local, w + n0 * K + k0, K, kc);
    for (int64_t m = 0; m < M; m += PANEL_ROWS) {
      const float *xm = x + m * K + k0;
      float *ym = y + m * N + n0;
      switch (M - m < PANEL_ROWS ? M - m : PANEL_ROWS) {
        case 1: panel_tile(xm, buf, bias, ym, 1, K, N, kc, first, last); break;
        case 2: panel_tile(xm, buf, bias, ym, 2, K, N, kc, first, last); break;
        case 3: panel_tile(xm, buf, bias, ym, 3, K, N, kc, first, last); break;
        case 4: panel_tile(xm, buf, bias, ym, 4, K, N, kc, first, last); break;
        case 5: panel_tile(xm, buf, bias, ym, 5, K, N, kc, first, last); break;
        default: panel_tile(xm, buf, bias, ym, PANEL_ROWS, K, N, kc, first, last);
      }
    }
  }
}

#endif
