/* gguf_dot.h for AVX-512 F/BW/VL + VNNI (Intel Ice Lake, Sapphire Rapids on): two blocks per
 * 512-bit step, dots by vpdpbusd, Q5's fifth bits by mask registers. */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#define STEP 2
#include "gguf_x86.h"

#define ISA(name) name##_avx512_vnni

INLINE ivec dot_u8(ivec acc, cvec u, svec a) {
  return (ivec)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)u, (__m512i)a);
}

/* w + 128 is unsigned; its dot with a exceeds w's by 128 * sum(a), which lane_sum takes off. */
INLINE ivec dot_q8(svec w, svec a, ivec lane_sum) {
  return dot_u8(lane_sum << 7, (cvec)w ^ 0x80, a);
}

INLINE cvec fifth_bits(uint64_t qh) {
  return (cvec)_mm512_maskz_mov_epi8((__mmask64)qh, _mm512_set1_epi8(0x10));
}

/* Two blocks' 16 bytes, at p and p + stride, each twice with the second copy's dwords shifted
 * right by 4: low nibbles, then high ones (masked). */
INLINE cvec nibbles(const uint8_t *p, int64_t stride) {
  const __m512i first = _mm512_castsi256_si512((__m256i)dup16(p));
  const cvec both = (cvec)_mm512_inserti64x4(first, (__m256i)dup16(p + stride), 1);
  return (cvec)((uvec)both >> (uvec){0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4}) & 0x0F;
}

INLINE cvec load_blocks(const uint8_t *p, int64_t stride) {
  const __m512i first = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p));
  return (cvec)_mm512_inserti64x4(first, _mm256_loadu_si256((const __m256i *)(p + stride)), 1);
}

INLINE cvec repeat32(const uint8_t *p) {
  return (cvec)_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
}

#include "gguf_dot.h"
#endif
