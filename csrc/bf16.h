/* bfloat16 <-> float32 for the kernels: a bfloat16 is the top half of a float32's bits.
 *
 * Widening is exact (a shift); narrowing rounds to nearest even and gives torch's quiet NaN
 * 0x7fc0 for any NaN, as c10::BFloat16 does, so a kernel's bf16 output equals torch's
 * rounding of the same float32 value. */
#ifndef PAGEDLLM_BF16_H
#define PAGEDLLM_BF16_H

#include "vec.h"

typedef uint16_t bf16x16 __attribute__((vector_size(32)));
typedef uint32_t uvec16 __attribute__((vector_size(64)));

INLINE vec16 load16_bf16(const uint16_t *p) {
  bf16x16 h;
  memcpy(&h, p, sizeof h);
  return (vec16)(__builtin_convertvector(h, uvec16) << 16);
}

INLINE float bf16_to_float(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

INLINE uint16_t float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

INLINE void store16_bf16(uint16_t *p, vec16 v) {
  const uvec16 u = (uvec16)v;
  const uvec16 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const ivec16 nan = (ivec16)((u & 0x7fffffffu) > 0x7f800000u);
  const vec16 quiet_nan = (vec16)((uvec16){0} + 0x7fc0u);
  const bf16x16 h = __builtin_convertvector((uvec16)select16(nan, quiet_nan, (vec16)rounded),
                                            bf16x16);
  memcpy(p, &h, sizeof h);
}

#endif
