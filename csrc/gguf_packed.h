/* GGUF weights repacked at load for the quantized matmul (gguf_mm.c), and its arithmetic.
 *
 * A weight [N, K] of one GGUF type (gguf.h) is cut into groups of 16 output rows (16
 * columns of y), the last padded with zero rows; a group is one stretch of group_bytes:
 *
 *   section  shape                      holds
 *   codes    [K / 32][code_bytes]       16 columns x 32 elements of K per block of 32
 *   scales   [K / unit][16] fp16        d: per block of 32, or per super block of 256 (K-quants)
 *   mins     [K / unit][16] fp16        m (Q4_1, Q5_1) or dmin (Q4_K, Q5_K)
 *   subs     [K / 256][8][16] u8 x 2    Q4_K/Q5_K: the 6-bit sc_j, then the 6-bit m_j
 *            [K / 256][16][16] int8     Q6_K: the scale of each 16 elements
 *
 * fp16 values are the file's bits. Every code is unsigned (u) and element values are
 *   Q4_0  d (u - 8)     Q5_0  d (u - 16)    Q8_0  d (u - 128)    Q6_K  d sc (u - 32)
 *   Q4_1  d u + m       Q5_1  d u + m       Q4_K/Q5_K  d sc_j u - dmin m_j
 * Within a block of 32, sub-group j < 8 holds elements 4j .. 4j + 3: its 64-byte vector has
 * byte 4c + i = u(column c, element 4j + i), the operand layout of vpdpbusd (an int32 lane per
 * column, four products each). Stored as: 8-bit types the 8 vectors; 4-bit types 4 vectors,
 * vector v holding sub-group v in its low nibbles and v + 4 in its high ones; 5-bit types
 * those 4 plus 8 64-bit masks, bit 4c + i of mask j the fifth bit of that code; Q6_K the 4
 * nibble vectors plus 2 vectors whose bits 2s, 2s + 1 of byte 4c + i (vector h) are bits 4-5
 * of sub-group 4h + s's code.
 *
 * The matmul's arithmetic, the same whatever the row count or instruction set (so a row's
 * result depends on that row alone): each x row is quantized to 8-bit blocks of 32 (q =
 * round-half-even(x / da), da = amax / 127; sum16: the sums of q over each half block; ds =
 * da * sum(q) in float32); then for each output, over the blocks of K in order,
 *   isum = sum(u * q) - offset * sum(q)                   exact int32 (Q6_K: per half block)
 *   acc  = fma((float)isum, wscale * da, acc)             wscale: d, d * sc_j, d * sc (exact)
 *   acc  = fma(wmin, ds, acc)                             types with a min: m or -dmin * m_j
 * from acc = 0, then y = acc (+ bias), rounded to y's dtype.
 */
#ifndef PAGEDLLM_GGUF_PACKED_H
#define PAGEDLLM_GGUF_PACKED_H

#include <stdint.h>

#include "gguf.h"

#define GROUP_COLS 16 /* output columns of a group */

static inline int gguf_is_k_quant(int qt) {
  return qt == GGUF_Q4_K || qt == GGUF_Q5_K || qt == GGUF_Q6_K;
}

static inline int gguf_has_min(int qt) {
  return qt == GGUF_Q4_1 || qt == GGUF_Q5_1 || qt == GGUF_Q4_K || qt == GGUF_Q5_K;
}

/* Bits of a code: 4, 5, 6 or 8. */
static inline int gguf_code_bits(int qt) {
  switch (qt) {
    case GGUF_Q5_0:
    case GGUF_Q5_1:
    case GGUF_Q5_K: return 5;
    case GGUF_Q6_K: return 6;
    case GGUF_Q8_0: return 8;
    default: return 4;
  }
}

/* The value subtracted from a code: Q4_0 8, Q5_0 16, Q6_K 32, Q8_0 128, else 0. */
static inline int gguf_code_offset(int qt) {
  switch (qt) {
    case GGUF_Q4_0: return 8;
    case GGUF_Q5_0: return 16;
    case GGUF_Q6_K: return 32;
    case GGUF_Q8_0: return 128;
    default: return 0;
  }
}

/* Bytes of a block's codes for 16 columns. */
static inline int64_t gguf_code_bytes(int qt) {
  switch (gguf_code_bits(qt)) {
    case 5: return 320;
    case 6: return 384;
    case 8: return 512;
    default: return 256;
  }
}

/* Elements per entry of the scales section: 256 for K-quants, else 32. */
static inline int64_t gguf_scale_unit(int qt) { return gguf_is_k_quant(qt) ? 256 : 32; }

/* Where a group's sections start, in bytes from the group, and its padded size. */
typedef struct {
  int64_t scales, mins, subs, group_bytes;
} gguf_sections;

static inline gguf_sections gguf_layout(int qt, int64_t K) {
  gguf_sections s;
  const int64_t units = K / gguf_scale_unit(qt), fp16s = units * GROUP_COLS * 2;
  s.scales = K / 32 * gguf_code_bytes(qt);
  s.mins = s.scales + fp16s;
  s.subs = s.mins + (gguf_has_min(qt) ? fp16s : 0);
  const int64_t subs = qt == GGUF_Q6_K ? units * 16 * GROUP_COLS
                       : gguf_is_k_quant(qt) ? units * 2 * 8 * GROUP_COLS
                                             : 0;
  s.group_bytes = (s.subs + subs + 63) / 64 * 64;
  return s;
}

static inline int64_t gguf_groups(int64_t N) { return (N + GROUP_COLS - 1) / GROUP_COLS; }

#endif
