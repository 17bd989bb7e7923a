/* GGUF blocks as stored in a file (gguf.h) <-> the matmul's packed groups (gguf_packed.h).
 *
 * gguf_pack runs once per weight at load; gguf_unpack_rows reads weight rows back as float32
 * (embedding lookups of a packed vocabulary, the float fallback), bit-equal to
 * gguf.quants.dequantize: the same float32 operations in the same order as gguf_dequant.c
 * (d * q + m is a multiply, then an add: never fused).
 */
#pragma GCC optimize("fp-contract=off")
#include <string.h>

#include "fp16.h"
#include "gguf_packed.h"
#include "ops.h"

#define INLINE static inline __attribute__((always_inline))

/* One weight row's stretch of a unit (a block of 32, or a super block of 256), decoded: its
 * codes (unsigned, gguf_packed.h), its fp16 d and m / dmin bits as stored, and K-quants'
 * sub-block scales and mins (Q6_K: 16 int8 scales). */
typedef struct {
  uint8_t u[256];
  uint16_t d, m;
  uint8_t sc[16], mn[8];
} unit_codes;

INLINE uint16_t fp16_bits(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

INLINE void decode_block32(const int qt, const uint8_t *b, unit_codes *out) {
  out->d = fp16_bits(b);
  out->m = 0;
  if (qt == GGUF_Q8_0) {
    for (int i = 0; i < 32; i++) out->u[i] = b[2 + i] ^ 0x80; /* int8 + 128 */
    return;
  }
  const int five = qt == GGUF_Q5_0 || qt == GGUF_Q5_1, min = gguf_has_min(qt);
  if (min) out->m = fp16_bits(b + 2);
  const uint8_t *qh = b + (min ? 4 : 2), *qs = qh + (five ? 4 : 0);
  const uint32_t high = five ? (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
                                   (uint32_t)qh[3] << 24
                             : 0;
  for (int i = 0; i < 16; i++) {
    out->u[i] = (uint8_t)((qs[i] & 0x0F) | ((high >> i) & 1) << 4);
    out->u[i + 16] = (uint8_t)((qs[i] >> 4) | ((high >> (i + 16)) & 1) << 4);
  }
}

INLINE void decode_k45(const int qt, const uint8_t *b, unit_codes *out) {
  out->d = fp16_bits(b);
  out->m = fp16_bits(b + 2);
  const uint8_t *s = b + 4, *qh = b + 16, *qs = b + (qt == GGUF_Q4_K ? 16 : 48);
  for (int j = 0; j < 8; j++) {
    out->sc[j] = (uint8_t)(j < 4 ? s[j] & 63 : (s[j + 4] & 15) | (s[j - 4] >> 6) << 4);
    out->mn[j] = (uint8_t)(j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | (s[j] >> 6) << 4);
    for (int i = 0; i < 32; i++) {
      uint8_t q = (uint8_t)((j % 2 ? qs[32 * (j / 2) + i] >> 4 : qs[32 * (j / 2) + i]) & 0x0F);
      if (qt == GGUF_Q5_K) q |= (uint8_t)(((qh[i] >> j) & 1) << 4);
      out->u[32 * j + i] = q;
    }
  }
}

INLINE void decode_q6_k(const uint8_t *b, unit_codes *out) {
  out->d = fp16_bits(b + 208);
  out->m = 0;
  memcpy(out->sc, b + 192, 16);
  for (int j = 0; j < 8; j++) {
    const int h = j / 4, k = j % 4;
    for (int i = 0; i < 32; i++) {
      const uint8_t ql = b[64 * h + 32 * (k % 2) + i], qh = b[128 + 32 * h + i];
      out->u[32 * j + i] = (uint8_t)(((k / 2 ? ql >> 4 : ql) & 0x0F) | ((qh >> (2 * k)) & 3) << 4);
    }
  }
}

INLINE void decode_unit(const int qt, const uint8_t *b, unit_codes *out) {
  if (qt == GGUF_Q4_K || qt == GGUF_Q5_K)
    decode_k45(qt, b, out);
  else if (qt == GGUF_Q6_K)
    decode_q6_k(b, out);
  else
    decode_block32(qt, b, out);
}

/* Where code k of column c lies in a block's code bytes (gguf_packed.h): the byte of its low
 * bits (8-bit types: all of them) and the shift there. */
INLINE int64_t code_byte(int bits, int c, int k, int *shift) {
  const int j = k / 4, lane_byte = 4 * c + k % 4;
  *shift = bits == 8 ? 0 : j / 4 * 4;
  return bits == 8 ? 64 * j + lane_byte : 64 * (j % 4) + lane_byte;
}

INLINE void put_code(uint8_t *codes, int bits, int c, int k, uint8_t u) {
  int shift;
  const int64_t at = code_byte(bits, c, k, &shift);
  const int j = k / 4, lane_byte = 4 * c + k % 4;
  if (bits == 8) {
    codes[at] = u;
    return;
  }
  codes[at] |= (uint8_t)((u & 0x0F) << shift);
  if (bits == 5) codes[256 + 8 * j + lane_byte / 8] |= (uint8_t)(((u >> 4) & 1) << (lane_byte % 8));
  if (bits == 6)
    codes[256 + 64 * (j / 4) + lane_byte] |= (uint8_t)(((u >> 4) & 3) << (2 * (j % 4)));
}

static uint8_t get_code(const uint8_t *codes, int bits, int c, int k) {
  int shift;
  const int64_t at = code_byte(bits, c, k, &shift);
  const int j = k / 4, lane_byte = 4 * c + k % 4;
  if (bits == 8) return codes[at];
  uint8_t u = (codes[at] >> shift) & 0x0F;
  if (bits == 5) u |= (uint8_t)(((codes[256 + 8 * j + lane_byte / 8] >> (lane_byte % 8)) & 1) << 4);
  if (bits == 6)
    u |= (uint8_t)(((codes[256 + 64 * (j / 4) + lane_byte] >> (2 * (j % 4))) & 3) << 4);
  return u;
}

INLINE void put_fp16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

/* Column c of a group from one weight row: unit t's decoded codes and scales. */
INLINE void put_unit(const int qt, uint8_t *group, gguf_sections s, int c, int64_t t,
                     const unit_codes *uc) {
  const int bits = gguf_code_bits(qt), blocks = gguf_is_k_quant(qt) ? 8 : 1;
  for (int j = 0; j < blocks; j++) {
    uint8_t *codes = group + (t * blocks + j) * gguf_code_bytes(qt);
    for (int k = 0; k < 32; k++) put_code(codes, bits, c, k, uc->u[32 * j + k]);
  }
  put_fp16(group + s.scales + (t * GROUP_COLS + c) * 2, uc->d);
  if (gguf_has_min(qt)) put_fp16(group + s.mins + (t * GROUP_COLS + c) * 2, uc->m);
  if (qt == GGUF_Q6_K)
    for (int h = 0; h < 16; h++) group[s.subs + (t * 16 + h) * GROUP_COLS + c] = uc->sc[h];
  else if (gguf_is_k_quant(qt))
    for (int j = 0; j < 8; j++) {
      group[s.subs + (t * 16 + j) * GROUP_COLS + c] = uc->sc[j];
      group[s.subs + (t * 16 + 8 + j) * GROUP_COLS + c] = uc->mn[j];
    }
}

int64_t gguf_packed_bytes(int qtype, int64_t N, int64_t K) {
  return gguf_groups(N) * gguf_layout(qtype, K).group_bytes;
}

/* Group g (rows g * 16 .. , those past N left zero) of a weight of type qt. */
INLINE void pack_group(const int qt, const uint8_t *w, uint8_t *group, gguf_sections s,
                       int64_t g, int64_t N, int64_t K) {
  const int64_t units = K / gguf_scale_unit(qt);
  const int64_t row_bytes = K / gguf_block_elems(qt) * gguf_block_bytes(qt);
  memset(group, 0, (size_t)s.group_bytes);
  for (int c = 0; c < GROUP_COLS && g * GROUP_COLS + c < N; c++) {
    const uint8_t *row = w + (g * GROUP_COLS + c) * row_bytes;
    for (int64_t t = 0; t < units; t++) {
      unit_codes uc;
      decode_unit(qt, row + t * (row_bytes / units), &uc);
      put_unit(qt, group, s, c, t, &uc);
    }
  }
}

void gguf_pack(const uint8_t *w, uint8_t *packed, int qtype, int64_t N, int64_t K,
               int num_threads) {
  const gguf_sections s = gguf_layout(qtype, K);
#pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t g = 0; g < gguf_groups(N); g++) {
    uint8_t *group = packed + g * s.group_bytes;
    switch (qtype) { /* the type as a constant, so that decoding and placing codes unroll */
      case GGUF_Q4_0: pack_group(GGUF_Q4_0, w, group, s, g, N, K); break;
      case GGUF_Q4_1: pack_group(GGUF_Q4_1, w, group, s, g, N, K); break;
      case GGUF_Q5_0: pack_group(GGUF_Q5_0, w, group, s, g, N, K); break;
      case GGUF_Q5_1: pack_group(GGUF_Q5_1, w, group, s, g, N, K); break;
      case GGUF_Q8_0: pack_group(GGUF_Q8_0, w, group, s, g, N, K); break;
      case GGUF_Q4_K: pack_group(GGUF_Q4_K, w, group, s, g, N, K); break;
      case GGUF_Q5_K: pack_group(GGUF_Q5_K, w, group, s, g, N, K); break;
      case GGUF_Q6_K: pack_group(GGUF_Q6_K, w, group, s, g, N, K); break;
    }
  }
}

/* Unit t of column c back as float32 values (32 or 256), as gguf_dequant.c computes them. */
static void unpack_unit(int qt, const uint8_t *group, gguf_sections s, int c, int64_t t,
                        float *out) {
  const int bits = gguf_code_bits(qt), blocks = gguf_is_k_quant(qt) ? 8 : 1;
  const float d = load_fp16(group + s.scales + (t * GROUP_COLS + c) * 2);
  const float m = gguf_has_min(qt) ? load_fp16(group + s.mins + (t * GROUP_COLS + c) * 2) : 0;
  const int offset = gguf_code_offset(qt);
  for (int j = 0; j < blocks; j++) {
    const uint8_t *codes = group + (t * blocks + j) * gguf_code_bytes(qt);
    const uint8_t *sub = group + s.subs + t * 16 * GROUP_COLS + c;
    for (int k = 0; k < 32; k++) {
      const int u = get_code(codes, bits, c, k);
      float v;
      if (qt == GGUF_Q4_K || qt == GGUF_Q5_K)
        v = d * (float)sub[j * GROUP_COLS] * (float)u - m * (float)sub[(8 + j) * GROUP_COLS];
      else if (qt == GGUF_Q6_K)
        v = d * (float)(int8_t)sub[(2 * j + k / 16) * GROUP_COLS] * (float)(u - offset);
      else if (qt == GGUF_Q8_0)
        v = (float)(u - offset) * d;
      else
        v = gguf_has_min(qt) ? d * (float)u + m : d * (float)(u - offset);
      out[32 * j + k] = v;
    }
  }
}

void gguf_unpack_rows(const uint8_t *packed, float *out, int qtype, int64_t K,
                      const int64_t *rows, int64_t n, int num_threads) {
  const gguf_sections s = gguf_layout(qtype, K);
  const int64_t unit = gguf_scale_unit(qtype);
#pragma omp parallel for schedule(static) num_threads(num_threads) if (n * K > 32768)
  for (int64_t i = 0; i < n; i++) {
    const uint8_t *group = packed + rows[i] / GROUP_COLS * s.group_bytes;
    for (int64_t t = 0; t < K / unit; t++)
      unpack_unit(qtype, group, s, (int)(rows[i] % GROUP_COLS), t, out + i * K + t * unit);
  }
}
