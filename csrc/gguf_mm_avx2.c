/* gguf_mm_kernel.h for AVX2 + FMA + F16C (AMD Zen 2/3, Intel Haswell on): 8 columns per
 * vector, dots by maddubs and madd. */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define VCOLS 8
#define TILE_R 2
#define TILE_C 2
#define Q8_SIGNED_DOT 1
#define ISA(name) name##_avx2

typedef int32_t ivec __attribute__((vector_size(32)));
typedef float fvec __attribute__((vector_size(32)));
typedef uint8_t bvec __attribute__((vector_size(32)));

/* maddubs adds two u8 * s8 products into an int16, saturating: exact for codes <= 63 (2 * 63
 * * 127 < 2^15); madd then adds pairs of those into the int32 lanes. Adding a run of
 * sub-groups' maddubs in int16 lanes first (4-bit codes allow 8) and widening once per run
 * saves the madds but ran slower on Zen 3 (one x row 1.4x the time, 16 rows 1.1x: the
 * compiler's tiles spill), so each sub-group widens at once; `pagedllm bench latency
 * --batch-size 1` on the default model shows the difference. */
INLINE ivec dot4(ivec acc, bvec u, int32_t a4) {
  const __m256i pairs = _mm256_maddubs_epi16((__m256i)u, _mm256_set1_epi32(a4));
  return acc + (ivec)_mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

/* Q8_0's weights w = u - 128: |w| (<= 128) times a with w's sign, within maddubs' range. */
INLINE ivec dot4_q8(ivec acc, bvec u, int32_t a4) {
  const __m256i w = (__m256i)(u ^ 0x80);
  const __m256i a = _mm256_sign_epi8(_mm256_set1_epi32(a4), w);
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), a);
  return acc + (ivec)_mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

/* Byte i of the 32-bit mask broadcast to bytes 8i .. 8i + 7, then each byte keeps its bit. */
INLINE bvec fifth_bits(const uint8_t *p) {
  uint32_t mask;
  memcpy(&mask, p, sizeof mask);
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)mask), spread);
  v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
  return (bvec)_mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

INLINE bvec load_codes(const uint8_t *p) { return (bvec)_mm256_loadu_si256((const __m256i *)p); }

INLINE fvec load_f16(const uint8_t *p) {
  return (fvec)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

INLINE fvec load_u8(const uint8_t *p) {
  return (fvec)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

INLINE fvec load_i8(const uint8_t *p) {
  return (fvec)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

INLINE fvec to_float(ivec v) { return (fvec)_mm256_cvtepi32_ps((__m256i)v); }

INLINE fvec fmadd(fvec a, fvec b, fvec c) {
  return (fvec)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
}

#include "gguf_mm_kernel.h"
#endif
