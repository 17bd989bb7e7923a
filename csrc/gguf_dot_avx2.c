/* gguf_dot.h for AVX2 + FMA + F16C (AMD Zen 2/3, Intel Haswell on): one block per 256-bit
 * step, dots by maddubs/madd. */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#define STEP 1
#include "gguf_x86.h"

#define ISA(name) name##_avx2

/* maddubs adds two u8 * s8 products into an int16, saturating: safe for codes <= 63 (2 * 63 *
 * 127 < 2^15); madd then adds pairs of those into int32 lanes. */
INLINE ivec dot_u8(ivec acc, cvec u, svec a) {
  const __m256i pairs = _mm256_maddubs_epi16((__m256i)u, (__m256i)a);
  return acc + (ivec)_mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

/* Signed weights: |w| (<= 128) times a with w's sign, within maddubs' range. */
INLINE ivec dot_q8(svec w, svec a, ivec lane_sum) {
  (void)lane_sum;
  const __m256i signed_a = _mm256_sign_epi8((__m256i)a, (__m256i)w);
  return dot_u8((ivec){0}, (cvec)_mm256_abs_epi8((__m256i)w), (svec)signed_a);
}

/* Byte i of qh broadcast to bytes 8i .. 8i + 7, then each byte keeps its own bit. */
INLINE cvec fifth_bits(uint64_t qh) {
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
  v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
  return (cvec)_mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* The 16 bytes at p twice, the second copy's dwords shifted right by 4: low nibbles, then
 * high ones (masked). */
INLINE cvec nibbles(const uint8_t *p, int64_t stride) {
  (void)stride;
  return (cvec)((uvec)dup16(p) >> (uvec){0, 0, 0, 0, 4, 4, 4, 4}) & 0x0F;
}

INLINE cvec load_blocks(const uint8_t *p, int64_t stride) {
  (void)stride;
  return LOAD(cvec, p);
}

INLINE cvec repeat32(const uint8_t *p) { return LOAD(cvec, p); }

#include "gguf_dot.h"
#endif
