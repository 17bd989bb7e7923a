/* The quantized matmul for one instruction set: a guarded header, included once by each of
 * gguf_mm_avx512.c, _avx2.c and _portable.c after it defines
 *
 *   INLINE                  static inline, always inlined
 *   VCOLS, TILE_R, TILE_C   columns per vector; x rows (<= 4) and vectors of a register tile
 *   ISA(name)               name with the instruction set's suffix
 *   ivec, fvec, bvec        VCOLS int32 / float lanes, 4 * VCOLS bytes (GCC vector types)
 *   Q8_SIGNED_DOT           1 when dot4_q8 sums (u - 128) * a itself, 0 when u * a
 *   ivec dot4(acc, u, a4)   acc + per lane the 4 products of codes u (<= 63) and the int8s a4
 *   ivec dot4_q8(acc,u,a4)  dot4 for Q8_0's codes (<= 255), see Q8_SIGNED_DOT
 *   bvec load_codes(p)      4 * VCOLS bytes at p
 *   bvec fifth_bits(p)      0x10 in byte i where bit i of the 4 * VCOLS bits at p is set
 *   fvec load_f16(p), load_u8(p), load_i8(p)   VCOLS fp16s / uint8s / int8s as floats
 *   fvec to_float(ivec)     fvec fmadd(a, b, c): a * b + c, fused
 *
 * and compute y = x @ W^T by gguf_packed.h's arithmetic: a tile of TILE_R x rows by TILE_C
 * vectors of columns keeps its int32 block sums and float32 accumulators in registers, each
 * loaded code vector feeding TILE_R dot products. Every output is summed in the same order
 * whatever the tile, so a row's result does not depend on the rows beside it. The build's
 * entry is ISA(gguf_mm_groups), which gguf_mm.c picks at run time.
 */
#ifndef PAGEDLLM_GGUF_MM_KERNEL_H
#define PAGEDLLM_GGUF_MM_KERNEL_H

#if !defined(INLINE) || !defined(VCOLS) || !defined(TILE_R) || !defined(TILE_C) || \
    !defined(Q8_SIGNED_DOT) || !defined(ISA)
#error "define INLINE, VCOLS, TILE_R, TILE_C, Q8_SIGNED_DOT and ISA(name) before gguf_mm_kernel.h"
#endif

#include <string.h>

#include "gguf_mm.h"
#include "prefetch.h"

#define VPG (GROUP_COLS / VCOLS) /* vectors per group */

typedef uint16_t hvec __attribute__((vector_size(4 * VCOLS)));
typedef uint32_t uvec __attribute__((vector_size(4 * VCOLS)));

#define LOAD(type, p)                      \
  ({                                       \
    type loaded_;                          \
    memcpy(&loaded_, (p), sizeof loaded_); \
    loaded_;                               \
  })

/* Where vector v's columns lie: its group's bytes, and its offset within each 64-byte row
 * of codes (lane), 16-column row of scales (col) and 64-bit mask (bit bytes). */
typedef struct {
  const uint8_t *group;
  int64_t lane, col, mask;
} vector_at;

INLINE vector_at locate(const gguf_mm_args *a, int64_t v) {
  const int64_t part = v % VPG;
  return (vector_at){a->w + v / VPG * a->sec.group_bytes, part * 4 * VCOLS, part * VCOLS,
                     part * VCOLS / 2};
}

/* Sub-group j (elements 4j .. 4j + 3) of block b's codes, as unsigned bytes. */
INLINE bvec codes_of(const int qt, const vector_at *at, int64_t b, const int j) {
  const uint8_t *codes = at->group + b * gguf_code_bytes(qt);
  const int bits = gguf_code_bits(qt);
  if (bits == 8) return load_codes(codes + 64 * j + at->lane);
  const bvec v = load_codes(codes + 64 * (j % 4) + at->lane);
  bvec u = j < 4 ? v & 0x0F : (bvec)(((hvec)v >> 4) & 0x0F0F);
  if (bits == 5) u |= fifth_bits(codes + 256 + 8 * j + at->mask);
  if (bits == 6) {
    const hvec high = (hvec)load_codes(codes + 256 + 64 * (j / 4) + at->lane);
    u |= (bvec)(((high >> (2 * (j % 4))) & 0x0303) << 4);
  }
  return u;
}

/* Block b's weight scales (ws[1]: Q6_K's second half block) and min of vector `at`. */
INLINE void block_scales(const gguf_mm_args *a, const int qt, const vector_at *at, int64_t b,
                         fvec ws[2], fvec *wm) {
  const gguf_sections s = a->sec;
  if (!gguf_is_k_quant(qt)) {
    ws[0] = load_f16(at->group + s.scales + (b * GROUP_COLS + at->col) * 2);
    if (gguf_has_min(qt)) *wm = load_f16(at->group + s.mins + (b * GROUP_COLS + at->col) * 2);
    return;
  }
  const int64_t t = b / 8, j = b % 8;
  const fvec d = load_f16(at->group + s.scales + (t * GROUP_COLS + at->col) * 2);
  const uint8_t *sub = at->group + s.subs + t * 16 * GROUP_COLS + at->col;
  if (qt == GGUF_Q6_K) {
    ws[0] = load_i8(sub + 2 * j * GROUP_COLS) * d;
    ws[1] = load_i8(sub + (2 * j + 1) * GROUP_COLS) * d;
    return;
  }
  ws[0] = load_u8(sub + j * GROUP_COLS) * d;
  const fvec dmin = load_f16(at->group + s.mins + (t * GROUP_COLS + at->col) * 2);
  *wm = -(load_u8(sub + (8 + j) * GROUP_COLS) * dmin);
}

/* The int32 a half (Q6_K) or whole block's dot starts from: -offset * sum(q). */
INLINE ivec dot_start(const gguf_mm_args *a, const int qt, int64_t m, int64_t b, int half) {
  const int offset = qt == GGUF_Q8_0 && Q8_SIGNED_DOT ? 0 : gguf_code_offset(qt);
  if (offset == 0) return (ivec){0};
  const int32_t *sums = a->sum16 + (m * (a->K / 32) + b) * 2;
  const int32_t sum = qt == GGUF_Q6_K ? sums[half] : sums[0] + sums[1];
  return (ivec){0} - offset * sum;
}

/* acc[r][c] for x rows m0 + r (r < rows) and column vectors vs[c] (c < TILE_C), over K. */
INLINE void tile_sums(const gguf_mm_args *a, const int qt, const vector_at vs[TILE_C],
                      int64_t m0, const int rows, fvec acc[TILE_R][TILE_C]) {
  const int64_t blocks = a->K / 32, halves = qt == GGUF_Q6_K ? 2 : 1;
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < TILE_C; c++) acc[r][c] = (fvec){0};
  for (int64_t b = 0; b < blocks; b++) {
    fvec ws[TILE_C][2], wm[TILE_C];
    for (int c = 0; c < TILE_C; c++) {
      if (a->M <= TILE_R && vs[c].lane == 0) /* one pass over the weight: keep reads ahead */
        prefetch_ahead(vs[c].group + b * gguf_code_bytes(qt), gguf_code_bytes(qt));
      block_scales(a, qt, &vs[c], b, ws[c], &wm[c]);
    }
    for (int h = 0; h < halves; h++) {
      ivec sum[TILE_R][TILE_C];
      for (int r = 0; r < rows; r++)
        for (int c = 0; c < TILE_C; c++) sum[r][c] = dot_start(a, qt, m0 + r, b, h);
      for (int j = 8 / halves * h; j < 8 / halves * (h + 1); j++) {
        bvec u[TILE_C];
        for (int c = 0; c < TILE_C; c++) u[c] = codes_of(qt, &vs[c], b, j);
        for (int r = 0; r < rows; r++) {
          const int32_t a4 = LOAD(int32_t, a->q + (m0 + r) * a->K + 32 * b + 4 * j);
          for (int c = 0; c < TILE_C; c++)
            sum[r][c] = qt == GGUF_Q8_0 ? dot4_q8(sum[r][c], u[c], a4) : dot4(sum[r][c], u[c], a4);
        }
      }
      for (int r = 0; r < rows; r++) {
        const fvec da = (fvec){0} + a->d[(m0 + r) * blocks + b];
        for (int c = 0; c < TILE_C; c++)
          acc[r][c] = fmadd(to_float(sum[r][c]), ws[c][h] * da, acc[r][c]);
      }
    }
    if (!gguf_has_min(qt)) continue;
    for (int r = 0; r < rows; r++) {
      const fvec ds = (fvec){0} + a->ds[(m0 + r) * blocks + b];
      for (int c = 0; c < TILE_C; c++) acc[r][c] = fmadd(wm[c], ds, acc[r][c]);
    }
  }
}

/* v rounded to bfloat16 bits (in the low half of each lane) as torch rounds: to nearest even,
 * 0x7fc0 for NaN. */
INLINE uvec bf16_bits(fvec v) {
  const uvec u = (uvec)v, rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uvec nan = (uvec)((u & 0x7fffffffu) > 0x7f800000u);
  return (rounded & ~nan) | (0x7fc0u & nan);
}

INLINE float bf16_value(uint16_t h) {
  const uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* y[m, n0 .. n0 + n) = v (+ bias), n <= VCOLS. */
INLINE void store_row(const gguf_mm_args *a, int64_t m, int64_t n0, int64_t n, fvec v) {
  if (!a->y_bf16 && !a->bias && n == VCOLS) {
    memcpy((float *)a->y + m * a->N + n0, &v, sizeof v);
    return;
  }
  float out[VCOLS];
  memcpy(out, &v, sizeof out);
  if (a->bias)
    for (int64_t i = 0; i < n; i++)
      out[i] += a->y_bf16 ? bf16_value(((const uint16_t *)a->bias)[n0 + i])
                          : ((const float *)a->bias)[n0 + i];
  if (a->y_bf16) {
    fvec r;
    memcpy(&r, out, sizeof r);
    const uvec bits = bf16_bits(r);
    uint16_t *y = (uint16_t *)a->y + m * a->N + n0;
    for (int64_t i = 0; i < n; i++) y[i] = (uint16_t)bits[i];
  } else {
    memcpy((float *)a->y + m * a->N + n0, out, (size_t)n * sizeof(float));
  }
}

/* The tile of column vectors [v, v + TILE_C) (those past v1 repeat the last: computed,
 * not stored) and rows [m0, m0 + rows). */
INLINE void tile(const gguf_mm_args *a, const int qt, int64_t v, int64_t v1, int64_t m0,
                 const int rows) {
  vector_at vs[TILE_C];
  for (int c = 0; c < TILE_C; c++) vs[c] = locate(a, v + c < v1 ? v + c : v1 - 1);
  fvec acc[TILE_R][TILE_C];
  tile_sums(a, qt, vs, m0, rows, acc);
  for (int c = 0; c < TILE_C && v + c < v1; c++) {
    const int64_t n0 = (v + c) * VCOLS, n = a->N - n0 < VCOLS ? a->N - n0 : VCOLS;
    if (n > 0)
      for (int r = 0; r < rows; r++) store_row(a, m0 + r, n0, n, acc[r][c]);
  }
}

/* A thread's column groups [g0, g1) against every row: in blocks of groups whose weights
 * (about WEIGHT_BLOCK_BYTES) stay in L2 while each tile of rows multiplies them, so that a
 * prefill reads the weights once per block rather than once per tile of rows, and writes y
 * a block's width of a row at a time. */
#define WEIGHT_BLOCK_BYTES (256 * 1024)

INLINE void groups_of_type(const gguf_mm_args *a, const int qt, int64_t g0, int64_t g1) {
  const int64_t per_block = WEIGHT_BLOCK_BYTES / a->sec.group_bytes / TILE_C * TILE_C;
  const int64_t block_groups = per_block > TILE_C ? per_block : TILE_C;
  for (int64_t b0 = g0; b0 < g1; b0 += block_groups) {
    const int64_t v0 = b0 * VPG, v1 = (b0 + block_groups < g1 ? b0 + block_groups : g1) * VPG;
    for (int64_t m0 = 0; m0 < a->M; m0 += TILE_R) {
      const int64_t rows = a->M - m0 < TILE_R ? a->M - m0 : TILE_R;
      for (int64_t v = v0; v < v1; v += TILE_C) {
        switch (rows) { /* rows as a constant, so that the tile's loops unroll */
#if TILE_R > 1
          case 1: tile(a, qt, v, v1, m0, 1); break;
#endif
#if TILE_R > 2
          case 2: tile(a, qt, v, v1, m0, 2); break;
#endif
#if TILE_R > 3
          case 3: tile(a, qt, v, v1, m0, 3); break;
#endif
          default: tile(a, qt, v, v1, m0, TILE_R);
        }
      }
    }
  }
}

void ISA(gguf_mm_groups)(const gguf_mm_args *a, int64_t g0, int64_t g1) {
  switch (a->qtype) {
    case GGUF_Q4_0: groups_of_type(a, GGUF_Q4_0, g0, g1); break;
    case GGUF_Q4_1: groups_of_type(a, GGUF_Q4_1, g0, g1); break;
    case GGUF_Q5_0: groups_of_type(a, GGUF_Q5_0, g0, g1); break;
    case GGUF_Q5_1: groups_of_type(a, GGUF_Q5_1, g0, g1); break;
    case GGUF_Q8_0: groups_of_type(a, GGUF_Q8_0, g0, g1); break;
    case GGUF_Q4_K: groups_of_type(a, GGUF_Q4_K, g0, g1); break;
    case GGUF_Q5_K: groups_of_type(a, GGUF_Q5_K, g0, g1); break;
    case GGUF_Q6_K: groups_of_type(a, GGUF_Q6_K, g0, g1); break;
  }
}

#endif
