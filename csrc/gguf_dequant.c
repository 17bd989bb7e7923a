/* GGUF blocks -> float32 rows, bit-equal to gguf.quants.dequantize: the same float32
 * operations in the same order (d * q + m is a multiply, then an add: never fused), fp16
 * converted exactly. Layouts: gguf.h. */
#pragma GCC optimize("fp-contract=off")
#include "fp16.h"
#include "gguf.h"
#include "ops.h"
#include "vec.h"

#define BLOCK_INLINE static inline __attribute__((always_inline))

typedef uint8_t u8x16 __attribute__((vector_size(16)));

BLOCK_INLINE u8x16 load_u8x16(const uint8_t *p) {
  u8x16 v;
  memcpy(&v, p, sizeof v);
  return v;
}

/* out[0 .. 16) = scale * (q - offset) (+ min when has_min): 16 codes at a time. */
BLOCK_INLINE void affine16(float *out, ivec16 q, float scale, int offset, float min,
                           int has_min) {
  const vec16 v = scale * __builtin_convertvector(q - offset, vec16);
  store16(out, has_min ? v + min : v);
}

BLOCK_INLINE ivec16 widen16(u8x16 v) { return __builtin_convertvector(v, ivec16); }

/* Bits `shift` .. of a 32-bit word, one per lane: lane i gets bit shift + i, as 16 (Q5's
 * fifth bit). */
BLOCK_INLINE ivec16 fifth_bits16(uint32_t qh, int shift) {
  const ivec16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return (((ivec16){0} + (int32_t)(qh >> shift)) >> lane & 1) << 4;
}

/* Q4_0/Q4_1/Q5_0/Q5_1/Q8_0: element i < 16 the low nibble of qs[i], 16 + i its high nibble
 * (Q5: plus bit i of qh as bit 4); value d * (q - offset) (+ m). */
BLOCK_INLINE void block32(int qtype, const uint8_t *b, float *out) {
  const float d = load_fp16(b);
  if (qtype == GGUF_Q8_0) {
    for (int i = 0; i < 32; i++) out[i] = (float)(int8_t)b[2 + i] * d;
    return;
  }
  const int five = qtype == GGUF_Q5_0 || qtype == GGUF_Q5_1;
  const int has_min = qtype == GGUF_Q4_1 || qtype == GGUF_Q5_1;
  const int offset = qtype == GGUF_Q4_0 ? 8 : qtype == GGUF_Q5_0 ? 16 : 0;
  const float m = has_min ? load_fp16(b + 2) : 0;
  const uint8_t *qh = b + (has_min ? 4 : 2), *qs = qh + (five ? 4 : 0);
  uint32_t high = 0;
  if (five) memcpy(&high, qh, sizeof high); /* little-endian, as GGUF */
  const u8x16 v = load_u8x16(qs);
  ivec16 lo = widen16(v & 0x0F), hi = widen16(v >> 4);
  if (five) {
    lo |= fifth_bits16(high, 0);
    hi |= fifth_bits16(high, 16);
  }
  affine16(out, lo, d, offset, m, has_min);
  affine16(out + 16, hi, d, offset, m, has_min);
}

/* Q4_K/Q5_K: sub-block j = d * sc_j * q - dmin * m_j, 6-bit sc_j and m_j as in gguf.h;
 * q the low (even j) or high (odd j) nibbles of qs[32 (j / 2) ...], Q5_K: plus bit j of qh. */
BLOCK_INLINE void block_k45(int qtype, const uint8_t *b, float *out) {
  const float d = load_fp16(b), dmin = load_fp16(b + 2);
  const uint8_t *s = b + 4, *qh = b + 16, *qs = b + (qtype == GGUF_Q4_K ? 16 : 48);
  for (int j = 0; j < 8; j++) {
    const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
    const int mn = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    const float scale = d * (float)sc, min = dmin * (float)mn;
    for (int half = 0; half < 2; half++) {
      const u8x16 ql = load_u8x16(qs + 32 * (j / 2) + 16 * half);
      ivec16 q = widen16((j % 2 ? ql >> 4 : ql) & 0x0F);
      if (qtype == GGUF_Q5_K) q |= widen16((load_u8x16(qh + 16 * half) >> j) & 1) << 4;
      store16(out + 32 * j + 16 * half, scale * __builtin_convertvector(q, vec16) - min);
    }
  }
}

/* Q6_K: element e = d * sc_(e / 16) * (q - 32); sub-block j = 4h + k: low 4 bits from
 * nibble k / 2 of ql[64h + 32 (k % 2) ...], top 2 from bits 2k of qh[32h ...]. */
BLOCK_INLINE void block_q6_k(const uint8_t *b, float *out) {
  const float d = load_fp16(b + 208);
  for (int j = 0; j < 8; j++) {
    const int h = j / 4, k = j % 4;
    for (int half = 0; half < 2; half++) {
      const u8x16 ql = load_u8x16(b + 64 * h + 32 * (k % 2) + 16 * half);
      const u8x16 qh = load_u8x16(b + 128 + 32 * h + 16 * half);
      const ivec16 q = widen16(((k / 2 ? ql >> 4 : ql) & 0x0F) | ((qh >> (2 * k)) & 3) << 4);
      affine16(out + 32 * j + 16 * half, q, d * (float)(int8_t)b[192 + 2 * j + half], 32, 0, 0);
    }
  }
}

/* A row of one type's blocks (qtype constant once inlined). */
BLOCK_INLINE void row_of_type(int qtype, const uint8_t *w, float *out, int64_t K) {
  const int64_t bs = gguf_block_elems(qtype), ts = gguf_block_bytes(qtype);
  for (int64_t b = 0; b < K / bs; b++, w += ts, out += bs) {
    if (qtype == GGUF_Q4_K || qtype == GGUF_Q5_K)
      block_k45(qtype, w, out);
    else if (qtype == GGUF_Q6_K)
      block_q6_k(w, out);
    else
      block32(qtype, w, out);
  }
}

CPU_DISPATCH
static void dequantize_row(int qtype, const uint8_t *w, float *out, int64_t K) {
  switch (qtype) {
    case GGUF_Q4_0: row_of_type(GGUF_Q4_0, w, out, K); break;
    case GGUF_Q4_1: row_of_type(GGUF_Q4_1, w, out, K); break;
    case GGUF_Q5_0: row_of_type(GGUF_Q5_0, w, out, K); break;
    case GGUF_Q5_1: row_of_type(GGUF_Q5_1, w, out, K); break;
    case GGUF_Q8_0: row_of_type(GGUF_Q8_0, w, out, K); break;
    case GGUF_Q4_K: row_of_type(GGUF_Q4_K, w, out, K); break;
    case GGUF_Q5_K: row_of_type(GGUF_Q5_K, w, out, K); break;
    default: row_of_type(GGUF_Q6_K, w, out, K);
  }
}

void gguf_dequantize(const uint8_t *w, float *out, int qtype, int64_t rows, int64_t K,
                     int num_threads) {
  const int64_t row_bytes = K / gguf_block_elems(qtype) * gguf_block_bytes(qtype);
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows * K > 32768)
  for (int64_t r = 0; r < rows; r++) dequantize_row(qtype, w + r * row_bytes, out + r * K, K);
}
