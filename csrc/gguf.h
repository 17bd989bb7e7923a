/* GGUF block types as stored in a file: their codes, sizes and layouts.
 *
 * A weight row is that row's GGUF blocks, exactly as in the file (little-endian, fp16 scales):
 *
 *   type  elems bytes  layout (d, m, dmin: fp16)                value of element i
 *   Q4_0   32    18    d, qs[16]                                d * (q - 8)
 *   Q4_1   32    20    d, m, qs[16]                             d * q + m
 *   Q5_0   32    22    d, qh u32, qs[16]                        d * (q - 16)
 *   Q5_1   32    24    d, m, qh u32, qs[16]                     d * q + m
 *   Q8_0   32    34    d, qs int8[32]                           d * q
 *   Q4_K  256   144    d, dmin, scales[12], qs[128]             d * sc_j * q - dmin * m_j
 *   Q5_K  256   176    d, dmin, scales[12], qh[32], qs[128]     d * sc_j * q - dmin * m_j
 *   Q6_K  256   210    ql[128], qh[64], sc int8[16], d          d * sc_(i/16) * (q - 32)
 *
 * 32-element blocks: element i < 16 is the low nibble of qs[i], element 16 + i its high
 * nibble; Q5's fifth bit of element i is bit i of qh. K-quants hold 8 sub-blocks j of 32:
 * Q4_K/Q5_K give each a 6-bit scale sc_j and min m_j (12 packed bytes), their codes the low
 * (even j) or high (odd j) nibbles of qs[32 (j / 2) ..] (Q5_K: plus bit j of qh[i]); Q6_K an
 * int8 scale per 16 elements, sub-block j = 4h + k taking its low 4 bits from nibble k / 2 of
 * ql[64h + 32 (k % 2) ..] and its top 2 from bits 2k of qh[32h ..].
 */
#ifndef PAGEDLLM_GGUF_H
#define PAGEDLLM_GGUF_H

#include <stdint.h>

enum gguf_type {
  GGUF_Q4_0 = 2,
  GGUF_Q4_1 = 3,
  GGUF_Q5_0 = 6,
  GGUF_Q5_1 = 7,
  GGUF_Q8_0 = 8,
  GGUF_Q4_K = 12,
  GGUF_Q5_K = 13,
  GGUF_Q6_K = 14,
};

/* Elements and bytes per block of a supported type; 0 for any other type. */
static inline int64_t gguf_block_elems(int qtype) {
  switch (qtype) {
    case GGUF_Q4_0:
    case GGUF_Q4_1:
    case GGUF_Q5_0:
    case GGUF_Q5_1:
    case GGUF_Q8_0: return 32;
    case GGUF_Q4_K:
    case GGUF_Q5_K:
    case GGUF_Q6_K: return 256;
    default: return 0;
  }
}

static inline int64_t gguf_block_bytes(int qtype) {
  switch (qtype) {
    case GGUF_Q4_0: return 18;
    case GGUF_Q4_1: return 20;
    case GGUF_Q5_0: return 22;
    case GGUF_Q5_1: return 24;
    case GGUF_Q8_0: return 34;
    case GGUF_Q4_K: return 144;
    case GGUF_Q5_K: return 176;
    case GGUF_Q6_K: return 210;
    default: return 0;
  }
}

#endif
