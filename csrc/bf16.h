/* bfloat16 <-> float32 for the 16-lane (vec.h) kernels: 16-lane names for vecn.h's widening,
 * narrowing (rounded as its float_to_bf16 rounds: to nearest even, torch's quiet NaN for any
 * NaN) and element access. */
#ifndef PAGEDLLM_BF16_H
#define PAGEDLLM_BF16_H

#include "vec.h"

INLINE vec16 load16_bf16(const uint16_t *p) { return loadn_bf16(p); }

INLINE uvec16 to_bf16_bits16(vec16 v) { return to_bf16_bitsn(v); }

INLINE void store16_bf16(uint16_t *p, vec16 v) {
  const bf16xn h = to_bf16n(v);
  memcpy(p, &h, sizeof h);
}

/* v rounded to bfloat16 and widened back: what torch's float32 -> bfloat16 cast keeps. */
INLINE vec16 round16_bf16(vec16 v) { return (vec16)(to_bf16_bits16(v) << 16); }

INLINE float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

INLINE vec16 load16_as(const void *p, int64_t i, int bf16) { return loadn_as(p, i, bf16); }

INLINE void store16_as(void *p, int64_t i, vec16 v, int bf16) {
  if (bf16)
    store16_bf16(element_at(p, i, 1), v);
  else
    store16(element_at(p, i, 0), v);
}

#endif
