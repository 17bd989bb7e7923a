/* bfloat16 <-> float32 for the kernels: a bfloat16 is the top half of a float32's bits.
 *
 * Widening is exact (a shift: vecn.h's loadn_bf16, bf16_to_float); narrowing rounds to
 * nearest even and gives torch's quiet NaN 0x7fc0 for any NaN, as c10::BFloat16 does, so a
 * kernel's bf16 output equals torch's rounding of the same float32 value. */
#ifndef PAGEDLLM_BF16_H
#define PAGEDLLM_BF16_H

#include "vec.h"

INLINE vec16 load16_bf16(const uint16_t *p) { return loadn_bf16(p); }

INLINE uint16_t float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Each lane of v as the bits of a bfloat16 (in the low half of a 32-bit lane), rounded. */
INLINE uvec16 to_bf16_bits16(vec16 v) {
  const uvec16 u = (uvec16)v;
  const uvec16 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const ivec16 nan = (ivec16)((u & 0x7fffffffu) > 0x7f800000u);
  const vec16 quiet_nan = (vec16)((uvec16){0} + 0x7fc0u);
  return (uvec16)select16(nan, quiet_nan, (vec16)rounded);
}

INLINE void store16_bf16(uint16_t *p, vec16 v) {
  const bf16xn h = __builtin_convertvector(to_bf16_bits16(v), bf16xn);
  memcpy(p, &h, sizeof h);
}

/* v rounded to bfloat16 and widened back: what torch's float32 -> bfloat16 cast keeps. */
INLINE vec16 round16_bf16(vec16 v) { return (vec16)(to_bf16_bits16(v) << 16); }

INLINE float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

/* Element i of an array of float32 (bf16 = 0) or bfloat16 (bf16 = 1) elements, read or
 * written as float32 (rounded to nearest even when stored as bfloat16). Kernels that take
 * either call these with a constant bf16, so each copy keeps one branch. */
INLINE void *element_at(const void *p, int64_t i, int bf16) {
  return (char *)p + i * (bf16 ? 2 : 4);
}

INLINE vec16 load16_as(const void *p, int64_t i, int bf16) {
  return bf16 ? load16_bf16(element_at(p, i, 1)) : load16(element_at(p, i, 0));
}

INLINE float load1_as(const void *p, int64_t i, int bf16) {
  return bf16 ? bf16_to_float(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

INLINE void store16_as(void *p, int64_t i, vec16 v, int bf16) {
  if (bf16)
    store16_bf16(element_at(p, i, 1), v);
  else
    store16(element_at(p, i, 0), v);
}

INLINE void store1_as(void *p, int64_t i, float v, int bf16) {
  if (bf16)
    ((uint16_t *)p)[i] = float_to_bf16(v);
  else
    ((float *)p)[i] = v;
}

#endif
