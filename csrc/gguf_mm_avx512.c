/* gguf_mm_kernel.h for AVX-512 F/BW/VL + VNNI (Intel Ice Lake, Sapphire Rapids on; AMD Zen 4
 * on): 16 columns per vector, dots by vpdpbusd, Q5's fifth bits by mask registers. */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define VCOLS 16
#define TILE_R 4
#define TILE_C 2
#define Q8_SIGNED_DOT 0
#define ISA(name) name##_avx512_vnni

typedef int32_t ivec __attribute__((vector_size(64)));
typedef float fvec __attribute__((vector_size(64)));
typedef uint8_t bvec __attribute__((vector_size(64)));

INLINE ivec dot4(ivec acc, bvec u, int32_t a4) {
  return (ivec)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)u, _mm512_set1_epi32(a4));
}

/* vpdpbusd multiplies unsigned bytes by signed ones without saturating: any code works. */
INLINE ivec dot4_q8(ivec acc, bvec u, int32_t a4) { return dot4(acc, u, a4); }

INLINE bvec load_codes(const uint8_t *p) { return (bvec)_mm512_loadu_si512(p); }

INLINE bvec fifth_bits(const uint8_t *p) {
  uint64_t mask;
  memcpy(&mask, p, sizeof mask);
  return (bvec)_mm512_maskz_mov_epi8((__mmask64)mask, _mm512_set1_epi8(0x10));
}

INLINE fvec load_f16(const uint8_t *p) {
  return (fvec)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

INLINE fvec load_u8(const uint8_t *p) {
  return (fvec)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

INLINE fvec load_i8(const uint8_t *p) {
  return (fvec)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

INLINE fvec to_float(ivec v) { return (fvec)_mm512_cvtepi32_ps((__m512i)v); }

INLINE fvec fmadd(fvec a, fvec b, fvec c) {
  return (fvec)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
}

#include "gguf_mm_kernel.h"
#endif
