/* IEEE half -> float in plain C, exact for every input (subnormals, infinities, NaN). */
#ifndef PAGEDLLM_FP16_H
#define PAGEDLLM_FP16_H

#include <stdint.h>
#include <string.h>

static inline float fp16_to_fp32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  uint32_t bits;
  if (exponent == 0) { /* zero or subnormal: mantissa * 2^-24, exact in float */
    float f = (float)mantissa * 0x1p-24f;
    return sign ? -f : f;
  }
  if (exponent == 0x1F)
    bits = sign | 0x7F800000u | (mantissa << 13);
  else
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* The fp16 stored little-endian at p. */
static inline float load_fp16(const uint8_t *p) {
  return fp16_to_fp32((uint16_t)(p[0] | p[1] << 8));
}

#endif
