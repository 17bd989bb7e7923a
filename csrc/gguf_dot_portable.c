/* gguf_dot.h in plain C, for any CPU: one block per step, the primitives as loops. */
#include <math.h>

#include "fp16.h"
#define STEP 1
#include "gguf_vec.h"

#define ISA(name) name##_portable

/* Loops over arrays (not vector elements, which compilers keep in memory). */
INLINE ivec dot_u8(ivec acc, cvec u, svec a) {
  uint8_t ub[32];
  int8_t ab[32];
  int32_t lanes[8];
  memcpy(ub, &u, 32);
  memcpy(ab, &a, 32);
  memcpy(lanes, &acc, 32);
  for (int l = 0; l < 8; l++)
    lanes[l] += ub[4 * l] * ab[4 * l] + ub[4 * l + 1] * ab[4 * l + 1] +
                ub[4 * l + 2] * ab[4 * l + 2] + ub[4 * l + 3] * ab[4 * l + 3];
  return LOAD(ivec, lanes);
}

INLINE ivec dot_q8(svec w, svec a, ivec lane_sum) {
  (void)lane_sum;
  int8_t wb[32], ab[32];
  int32_t lanes[8];
  memcpy(wb, &w, 32);
  memcpy(ab, &a, 32);
  for (int l = 0; l < 8; l++)
    lanes[l] = wb[4 * l] * ab[4 * l] + wb[4 * l + 1] * ab[4 * l + 1] +
               wb[4 * l + 2] * ab[4 * l + 2] + wb[4 * l + 3] * ab[4 * l + 3];
  return LOAD(ivec, lanes);
}

INLINE cvec fifth_bits(uint64_t qh) {
  uint8_t v[32];
  for (int i = 0; i < 32; i++) v[i] = (uint8_t)(((qh >> i) & 1) << 4);
  return LOAD(cvec, v);
}

INLINE cvec nibbles(const uint8_t *p, int64_t stride) {
  (void)stride;
  uint8_t v[32];
  for (int i = 0; i < 16; i++) {
    v[i] = p[i] & 0x0F;
    v[i + 16] = p[i] >> 4;
  }
  return LOAD(cvec, v);
}

INLINE float quantize_block(const float *x, int8_t *q, int32_t *sum) {
  float amax = 0;
  for (int i = 0; i < 32; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
  const float d = amax / 127.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
  *sum = 0;
  for (int i = 0; i < 32; i++) {
    q[i] = (int8_t)rintf(x[i] * inv); /* half to even in the default rounding mode */
    *sum += q[i];
  }
  return d;
}

INLINE float f16(const uint8_t *p) { return load_fp16(p); }

INLINE f32x8 bytes_to_f32x8(uint64_t v) {
  f32x8 f;
  for (int i = 0; i < 8; i++) f[i] = (float)((v >> (8 * i)) & 0xFF);
  return f;
}

INLINE f32x8 int8s_to_f32x8(uint64_t v) {
  f32x8 f;
  for (int i = 0; i < 8; i++) f[i] = (float)(int8_t)(v >> (8 * i));
  return f;
}

INLINE void f16x8_pairs(const uint8_t *p, int64_t stride, int n, f32x8 *lo, f32x8 *hi) {
  *lo = (f32x8){0};
  if (hi) *hi = (f32x8){0};
  for (int j = 0; j < n; j++) {
    (*lo)[j] = load_fp16(p + j * stride);
    if (hi) (*hi)[j] = load_fp16(p + j * stride + 2);
  }
}

INLINE cvec load_blocks(const uint8_t *p, int64_t stride) {
  (void)stride;
  return LOAD(cvec, p);
}

INLINE cvec repeat32(const uint8_t *p) { return LOAD(cvec, p); }

#include "gguf_dot.h"
