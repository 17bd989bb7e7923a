/* The gguf_dot.h primitives that AVX2 and AVX-512 share: activation quantization, F16C
 * conversions, an AVX2 gather. Included after the file's target pragma and STEP. */
#ifndef PAGEDLLM_GGUF_X86_H
#define PAGEDLLM_GGUF_X86_H

#include <immintrin.h>

#include "gguf_vec.h"

/* q[0 .. 32) = the block x quantized (see gguf.h; cvtps2dq rounds as MXCSR says, half to
 * even by default); returns d, and the sum of q in *sum. */
INLINE float quantize_block(const float *x, int8_t *q, int32_t *sum) {
  __m256 v[4], amax = _mm256_setzero_ps();
  for (int k = 0; k < 4; k++) {
    v[k] = _mm256_loadu_ps(x + 8 * k);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v[k]));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float d = _mm_cvtss_f32(m) / 127.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
  __m256i i[4];
  for (int k = 0; k < 4; k++) i[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], _mm256_set1_ps(inv)));
  /* packs work per 128-bit half: dwords come out as a0-3 b0-3 c0-3 d0-3 a4-7 b4-7 ... */
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]),
                                           _mm256_packs_epi32(i[2], i[3]));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(bytes, order));
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  *sum = _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1)));
  return d;
}

INLINE float f16(const uint8_t *p) { return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8)); }

INLINE f32x8 bytes_to_f32x8(uint64_t v) {
  return (f32x8)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)v)));
}

INLINE f32x8 int8s_to_f32x8(uint64_t v) {
  return (f32x8)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128((long long)v)));
}

/* The 16 bytes at p, twice. */
INLINE u8x32 dup16(const uint8_t *p) {
  return (u8x32)_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
}

/* The fp16 pairs at p + j * stride for j < n (<= 8), else 0: their first halves to *lo and
 * (when hi is not NULL) their second to *hi; one gather of 8 dwords. */
INLINE void f16x8_pairs(const uint8_t *p, int64_t stride, int n, f32x8 *lo, f32x8 *hi) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i index = _mm256_mullo_epi32(lane, _mm256_set1_epi32((int)stride));
  const __m256i valid = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane);
  const __m256i g = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)p, index,
                                                valid, 1);
  const __m256i first = _mm256_and_si256(g, _mm256_set1_epi32(0xFFFF));
  const __m256i second = hi ? _mm256_srli_epi32(g, 16) : _mm256_setzero_si256();
  /* halves [first 0-3, second 0-3 | first 4-7, second 4-7] -> [first 0-7 | second 0-7] */
  const __m256i halves = _mm256_permute4x64_epi64(_mm256_packus_epi32(first, second), 0xD8);
  *lo = (f32x8)_mm256_cvtph_ps(_mm256_castsi256_si128(halves));
  if (hi) *hi = (f32x8)_mm256_cvtph_ps(_mm256_extracti128_si256(halves, 1));
}

#endif
