/* GGUF block types and the 8-bit activation blocks the quantized matmul multiplies them with.
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
 * nibble; Q5's fifth bit of element i is bit i of qh. K-quants hold 8 sub-blocks j of 32 (see
 * gguf_codes.h for where each sub-block's bits lie); Q4_K/Q5_K give each a 6-bit scale sc_j
 * and min m_j, Q6_K an int8 scale per 16 elements.
 *
 * Every type thus splits into blocks of 32, and each x row is quantized to blocks of 32 too
 * (q8_act): y = sum over blocks of (weight scale * act scale) * integer dot, plus the weight
 * min times the activation block's sum. The integer dots run in 8 lanes of 4 products each,
 * the layout of _mm256_dpbusd_epi32 and of _mm256_madd_epi16(_mm256_maddubs_epi16(..)).
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

#define QK 32   /* elements per activation block */
#define LANES 8 /* int32 lanes of one block's dot product, 4 products each */

/* x [M, K] as 8-bit blocks of 32. Block b of row m: q[b * 32 + i] = round_half_even(x[b * 32
 * + i] * (1 / d)) with d = amax / 127 (1 / d = 0 when amax = 0); ds[b] = d * sum(q);
 * lane_sum[b * 8 + l] = -(q[4l] + ... + q[4l + 3]). Every array is padded with zeros, q to
 * whole 64-byte pairs of blocks and the others to whole groups of 8 blocks, so that vector
 * loads may run past the last block. */
typedef struct {
  int8_t *q;               /* [M, q_stride] */
  float *d;                /* [M, nb8] */
  float *ds;               /* [M, nb8] */
  int32_t *lane_sum;       /* [M, nb8 * 8], negated */
  int64_t K, q_stride, nb8; /* q_stride = K rounded up to 64; nb8 = K / 32 rounded up to 8 */
} q8_act;

/* y [M, N] = x @ dequant(w)^T (+ bias) for the weight rows [n0, n1) of one call. */
typedef struct {
  const q8_act *act;
  const uint8_t *w; /* [N, row_bytes] */
  const float *bias;
  float *y;
  int64_t M, N, row_bytes;
  int qtype;
} gguf_problem;

/* One instruction set's kernels (gguf_dot.h compiled per ISA). */
typedef void (*gguf_quantize_fn)(const float *x, const q8_act *a, int64_t m0, int64_t m1);
typedef void (*gguf_rows_fn)(const gguf_problem *p, int64_t n0, int64_t n1);

#define GGUF_ISA_DECLARE(suffix)                                                     \
  void gguf_quantize_rows_##suffix(const float *x, const q8_act *a, int64_t m0,     \
                                   int64_t m1);                                     \
  void gguf_dot_rows_##suffix(const gguf_problem *p, int64_t n0, int64_t n1);

GGUF_ISA_DECLARE(avx512_vnni)
GGUF_ISA_DECLARE(avx2)
GGUF_ISA_DECLARE(portable)

#endif
