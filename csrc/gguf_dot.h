/* The quantized matmul's body, compiled once per instruction set: each gguf_dot_<isa>.c sets
 * STEP (32-element blocks per vector step), defines these primitives, then includes this file.
 *
 *   ISA(name)                         name with the ISA's suffix
 *   ivec dot_u8(acc, cvec u, svec a)  acc + lane dots of unsigned u (<= 63, or 1) and int8 a
 *   ivec dot_q8(w, a, lane_sum)       lane dots of int8 w and int8 a, exact (lane_sum: a's,
 *                                     negated, for paths that offset w to unsigned)
 *   cvec fifth_bits(uint64_t qh)      0x10 in byte i where bit i of qh is set
 *   cvec nibbles(p, stride)           per block i of the step, the low nibbles of the 16 bytes
 *                                     at p + i * stride, then their high nibbles
 *   cvec load_blocks(p, stride)       per block i, the 32 bytes at p + i * stride
 *   cvec repeat32(p)                  the 32 bytes at p, once per block
 *   float quantize_block(x, q, sum)   q[0 .. 32) = x's block quantized (gguf.h); returns d,
 *                                     and the sum of q in *sum
 *   float f16(p)                      the fp16 at p
 *   f16x8_pairs(p, stride, n, lo, hi) the fp16s at p + j * stride (to lo) and 2 bytes on (to
 *                                     hi, unless NULL) for j < n (<= 8), else 0
 *   f32x8 bytes_to_f32x8(uint64_t v)  the 8 bytes of v as floats (int8s_to_f32x8: signed)
 *
 * Weights are read a group at a time: 8 blocks of 32 (one super block of a K-quant). A group's
 * scales are multiplied by the activation scales into a small table first, so that each step
 * costs only its unpacking, one integer dot per x row and one float multiply-add. A step's
 * dot has 8 int32 lanes per block, lane l summing the block's elements 4l .. 4l + 3.
 */
#include "gguf.h"
#include "prefetch.h"

#define ROW_TILE 4 /* x rows per pass over a weight row */
#define STEP_LANES (LANES * STEP)

#include "gguf_codes.h"

INLINE fvec splat(float v) {
  fvec r;
  for (int i = 0; i < STEP_LANES; i++) r[i] = v;
  return r;
}

/* f32x8 -> fvec (its first 8 lanes) and back (the sum of its 8-lane halves). */
INLINE fvec widen(f32x8 v) {
#if STEP == 2
  return __builtin_shufflevector(v, (f32x8){0}, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                                 15);
#else
  return v;
#endif
}

/* [lo, hi] when a step holds both, else lo. */
INLINE fvec join(f32x8 lo, f32x8 hi) {
#if STEP == 2
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  (void)hi;
  return lo;
#endif
}

INLINE f32x8 narrow(fvec v) {
#if STEP == 2
  return __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
         __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  return v;
#endif
}

/* Lane j: the sum of v[j]'s lanes, for 8 vectors at once (a transposing tree of adds). */
INLINE f32x8 hsum8(const f32x8 v[8]) {
  f32x8 a[4], b[2];
  for (int i = 0; i < 4; i++) /* lanes 0-3: v[2i]'s halves added; 4-7: v[2i + 1]'s */
    a[i] = __builtin_shufflevector(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
           __builtin_shufflevector(v[2 * i], v[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  for (int i = 0; i < 2; i++) /* two lanes each of v[4i], v[4i + 1], v[4i + 2], v[4i + 3] */
    b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15);
  return __builtin_shufflevector(b[0], b[1], 0, 2, 4, 6, 8, 10, 12, 14) +
         __builtin_shufflevector(b[0], b[1], 1, 3, 5, 7, 9, 11, 13, 15);
}

void ISA(gguf_quantize_rows)(const float *x, const q8_act *a, int64_t m0, int64_t m1) {
  const int64_t nb = a->K / QK;
  const cvec ones = (cvec){0} + 1;
  for (int64_t m = m0; m < m1; m++) {
    int8_t *q = a->q + m * a->q_stride;
    float *d = a->d + m * a->nb8, *ds = a->ds + m * a->nb8;
    int32_t *lane_sum = a->lane_sum + m * a->nb8 * LANES;
    for (int64_t b = 0; b < nb; b++) {
      int32_t sum;
      d[b] = quantize_block(x + m * a->K + b * QK, q + b * QK, &sum);
      ds[b] = d[b] * (float)sum;
    }
    memset(q + nb * QK, 0, (size_t)(a->q_stride - nb * QK));
    for (int64_t b = 0; b < nb; b += STEP)
      STORE(lane_sum + b * LANES, -dot_u8((ivec){0}, ones, LOAD(svec, q + b * QK)));
  }
}

/* Floats per block in a row's scale table: one, broadcast to the block's lanes, or one per
 * lane (Q6_K, with two scales per block; and wide steps, which load two blocks' at once). */
INLINE int table_stride(int qt) { return qt == GGUF_Q6_K || STEP > 1 ? LANES : 1; }

/* Independent accumulators per x row (4 in all), so that consecutive multiply-adds overlap:
 * row m's are acc[m * chains .. (m + 1) * chains), the first of which each step adds to
 * before they rotate (constant indices, so they stay in registers). */
INLINE int chains(int rows) { return ROW_TILE / rows; }

INLINE void accumulate(fvec acc[ROW_TILE], int m, int rows, fvec v) {
  const int first = m * chains(rows), last = first + chains(rows) - 1;
  const fvec sum = acc[first] + v;
  for (int c = first; c < last; c++) acc[c] = acc[c + 1];
  acc[last] = sum;
}

/* Per x row of the tile: the table of weight-times-activation scales of a group, and the
 * group's min terms added to an accumulator of the row. */
INLINE void group_table(int qt, const uint8_t *g, int n, const q8_act *a, int64_t m0, int rows,
                        int64_t b0, float table[][64], fvec acc[ROW_TILE]) {
  f32x8 scale, min;
  group_scales(qt, g, n, &scale, &min);
  for (int m = 0; m < rows; m++) {
    const f32x8 d = LOAD(f32x8, a->d + (m0 + m) * a->nb8 + b0);
    if (has_min(qt))
      acc[m * chains(rows)] += widen(min * LOAD(f32x8, a->ds + (m0 + m) * a->nb8 + b0));
    const f32x8 s = scale * d;
    if (table_stride(qt) == 1) {
      STORE(table[m], s);
      continue;
    }
    /* one store per step, of the width the step loads back (so that it is forwarded) */
    const fvec first = join(scale, min), second = STEP == 1 ? widen(min) : first; /* Q6_K */
    for (int j = 0; j < n; j += STEP) {
      const ivec block = j + (ivec)lane_block(), half = (ivec)lane_in_block() / 4;
      if (qt == GGUF_Q6_K)
        STORE(table[m] + LANES * j, __builtin_shuffle(first, second, 2 * block + half) *
                                        __builtin_shuffle(widen(d), block));
      else
        STORE(table[m] + LANES * j, __builtin_shuffle(widen(s), block));
    }
  }
}

/* Blocks j .. j + STEP - 1 of a group against the tile's x rows. */
INLINE void step_dot(int qt, const uint8_t *g, int j, const q8_act *a, int64_t m0, int rows,
                     int64_t b, float table[][64], fvec acc[ROW_TILE]) {
  const cvec u = step_codes(qt, g, j);
  for (int m = 0; m < rows; m++) {
    const svec x = LOAD(svec, a->q + (m0 + m) * a->q_stride + b * QK);
    const ivec lane_sum = LOAD(ivec, a->lane_sum + ((m0 + m) * a->nb8 + b) * LANES);
    ivec dot;
    if (qt == GGUF_Q8_0)
      dot = dot_q8((svec)u, x, lane_sum);
    else
      dot = dot_u8(offset_shift(qt) ? lane_sum << offset_shift(qt) : (ivec){0}, u, x);
    const fvec s = table_stride(qt) == 1 ? splat(table[m][j]) : LOAD(fvec, table[m] + LANES * j);
    accumulate(acc, m, rows, __builtin_convertvector(dot, fvec) * s);
  }
}

/* A group of n blocks (n < 8 only for a row's last group of 32-element blocks; a step may run
 * past n, into a block whose scale group_scales gave as 0). */
INLINE void group_dot(int qt, const uint8_t *g, int n, const q8_act *a, int64_t m0, int rows,
                      int64_t b0, fvec acc[ROW_TILE]) {
  float table[ROW_TILE][64] __attribute__((aligned(64)));
  group_table(qt, g, n, a, m0, rows, b0, table, acc);
  /* Forget the table's values: each step then loads its scales from memory rather than
   * shuffling them out of a register, on the port the unpacking needs. */
  __asm__("" : "+m"(table));
#pragma GCC unroll 8
  for (int j = 0; j < n; j += STEP) step_dot(qt, g, j, a, m0, rows, b0 + j, table, acc);
}

/* part[m][col]: 8 lanes summing to y[m0 + m, n], for one weight row n. */
INLINE void row_tile(int qt, const gguf_problem *p, int64_t n, int64_t m0, int rows,
                     f32x8 part[ROW_TILE][8], int col) {
  const q8_act act = *p->act, *a = &act; /* a copy the table's stores cannot alias */
  const uint8_t *w = p->w + n * p->row_bytes;
  const int64_t nb = a->K / QK, ts = gguf_block_bytes(qt);
  const int64_t group_bytes = is_k_quant(qt) ? ts : 8 * ts;
  fvec acc[ROW_TILE] = {{0}};
  int64_t b0 = 0;
  for (; b0 + 8 <= nb; b0 += 8) {
    const uint8_t *g = w + b0 / 8 * group_bytes;
    prefetch_ahead(g, group_bytes);
    group_dot(qt, g, 8, a, m0, rows, b0, acc);
  }
  if (!is_k_quant(qt) && b0 < nb) { /* fewer than 8 blocks of 32 left */
    const uint8_t *g = w + b0 / 8 * group_bytes;
    const int n = (int)(nb - b0);
    uint8_t copy[8 * 34];
    if (n % STEP) { /* the last step would read past the row: a copy, zeros after */
      memset(copy, 0, sizeof copy);
      memcpy(copy, g, (size_t)(n * ts));
      g = copy;
    }
    group_dot(qt, g, n, a, m0, rows, b0, acc);
  }
  for (int m = 0; m < rows; m++) {
    fvec sum = acc[m * chains(rows)];
    for (int c = 1; c < chains(rows); c++) sum += acc[m * chains(rows) + c];
    part[m][col] = narrow(sum);
  }
}

/* y[m0 .. m0 + rows, n0 .. n0 + cols) (cols <= 8) from the weight rows' partial sums: their
 * horizontal sums 8 at a time, rather than one chain of shuffles per row. */
INLINE void store_tile(const gguf_problem *p, int64_t n0, int cols, int64_t m0, int rows,
                       f32x8 part[ROW_TILE][8]) {
  for (int m = 0; m < rows; m++) {
    const f32x8 y = hsum8(part[m]);
    float *out = p->y + (m0 + m) * p->N + n0;
    for (int c = 0; c < cols; c++) out[c] = p->bias ? y[c] + p->bias[n0 + c] : y[c];
  }
}

/* Weight rows 8 at a time, each against every tile of x rows (the 8 stay in cache). */
INLINE void rows_of_type(int qt, const gguf_problem *p, int64_t n0, int64_t n1) {
  f32x8 part[ROW_TILE][8] = {{{0}}};
  for (int64_t n8 = n0; n8 < n1; n8 += 8) {
    const int cols = n1 - n8 < 8 ? (int)(n1 - n8) : 8;
    for (int64_t m0 = 0; m0 < p->M; m0 += ROW_TILE) {
      const int rows = p->M - m0 < ROW_TILE ? (int)(p->M - m0) : ROW_TILE;
      for (int c = 0; c < cols; c++) {
        switch (rows) {
          case 1: row_tile(qt, p, n8 + c, m0, 1, part, c); break;
          case 2: row_tile(qt, p, n8 + c, m0, 2, part, c); break;
          case 3: row_tile(qt, p, n8 + c, m0, 3, part, c); break;
          default: row_tile(qt, p, n8 + c, m0, 4, part, c);
        }
      }
      store_tile(p, n8, cols, m0, rows, part);
    }
  }
}

void ISA(gguf_dot_rows)(const gguf_problem *p, int64_t n0, int64_t n1) {
  switch (p->qtype) {
    case GGUF_Q4_0: rows_of_type(GGUF_Q4_0, p, n0, n1); break;
    case GGUF_Q4_1: rows_of_type(GGUF_Q4_1, p, n0, n1); break;
    case GGUF_Q5_0: rows_of_type(GGUF_Q5_0, p, n0, n1); break;
    case GGUF_Q5_1: rows_of_type(GGUF_Q5_1, p, n0, n1); break;
    case GGUF_Q8_0: rows_of_type(GGUF_Q8_0, p, n0, n1); break;
    case GGUF_Q4_K: rows_of_type(GGUF_Q4_K, p, n0, n1); break;
    case GGUF_Q5_K: rows_of_type(GGUF_Q5_K, p, n0, n1); break;
    case GGUF_Q6_K: rows_of_type(GGUF_Q6_K, p, n0, n1); break;
  }
}
